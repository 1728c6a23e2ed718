#!/usr/bin/python3
"""The chart's probes and helm test, run for real in every security mode (issue 32,
D1 and D5): the chart is rendered for plaintext, tokens, TLS, and mTLS with tokens;
a real echokv-server starts with the rendered flagfile (the pod's file paths mapped
into a temporary folder holding a throwaway CA, certificates signed for the chart's
names only, not localhost, and a tokens file); then the rendered liveness probe
command and the rendered helm test commands run against it and must succeed.

Each mode also checks that what the chart adds is what makes them work: the probe
without --tls-server-name fails (the certificate does not name localhost), without the
client certificate it fails under mTLS, and `info` without the token fails with tokens
on.

    ECHOKV_TEST_DATA=/work/shared /usr/bin/python3 deploy/tests/probe_matrix_test.py \
        --renderer build/bin/echokv-chart-render --server-binary build/bin/echokv-server \
        --cli build/bin/echokv-cli

Exits 77 (ctest: skipped) without $ECHOKV_TEST_DATA; needs the openssl CLI.
"""

import argparse
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "chartcheck"))
import check_chart  # noqa: E402
from chart_common import NAMESPACE  # noqa: E402

SKIP = 77
ARGS = None
TOKEN = "probe-matrix-token-0123456789abcdef"
SERVER_NAME = f"echokv.{NAMESPACE}.svc"  # the chart's default tls.serverName

TOKENS = """auth:
  insecure: false
  tokensSecret: tokens
drain:
  tokensSecret: drain
tests:
  tokenSecret: test-token
"""
TLS = """tls:
  enabled: true
  secretName: server-tls
"""
MTLS = TLS + """  clientCASecret: client-ca
  clientCertSecret: probe-client
"""
MODES = {
    "plaintext": "",
    "tokens": TOKENS,
    "tls": TLS + "ports:\n  http: 0\n",
    "mtls+tokens": MTLS + TOKENS + "ports:\n  http: 0\n",
}


def sh(cmd, cwd):
    subprocess.run(cmd, shell=True, check=True, cwd=cwd, capture_output=True)


def make_pki(d):
    """A CA; a server certificate for the chart's names (not localhost); a client CA
    and a client certificate."""
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    sh(f"openssl req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=echokv-test-ca", d)
    sh(f"openssl req -x509 {ec} -keyout cca.key -out cca.crt -days 2 -subj /CN=echokv-client-ca", d)
    for name, ca, ext in (
            ("server", "ca", f"subjectAltName=DNS:{SERVER_NAME},DNS:*.echokv-headless.{NAMESPACE}.svc.cluster.local"),
            ("client", "cca", "extendedKeyUsage=clientAuth")):
        sh(f"openssl req {ec} -keyout {name}.key -out {name}.csr -subj /CN={name}", d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        sh(f"openssl x509 -req -in {name}.csr -CA {ca}.crt -CAkey {ca}.key -CAcreateserial -out {name}.crt "
           f"-days 2 -extfile {name}.ext", d)


def lay_out_pod_files(root, pki):
    """The files the pod would see under /etc/echokv, from the Secrets the chart names."""
    files = {
        "tls/tls.crt": "server.crt", "tls/tls.key": "server.key",
        "server-ca/ca.crt": "ca.crt", "client-ca/ca.crt": "cca.crt",
        "client-tls/tls.crt": "client.crt", "client-tls/tls.key": "client.key",
    }
    for rel, src in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(pki, src)) as f, open(os.path.join(root, rel), "w") as g:
            g.write(f.read())
    os.makedirs(os.path.join(root, "auth"), exist_ok=True)
    with open(os.path.join(root, "auth", "tokens"), "w") as f:
        f.write("tenant-a %s\n" % hashlib.sha256(TOKEN.encode()).hexdigest())
    os.makedirs(os.path.join(root, "test-token"), exist_ok=True)
    with open(os.path.join(root, "test-token", "token"), "w") as f:
        f.write(TOKEN + "\n")


class Mode:
    """One security mode: its render, its server, its commands with paths mapped."""

    def __init__(self, name, values, tmp):
        self.name = name
        self.root = os.path.join(tmp, name.replace("+", "-"), "etc-echokv")
        os.makedirs(self.root)
        lay_out_pod_files(self.root, os.path.join(tmp, "pki"))
        vfile = os.path.join(tmp, name.replace("+", "-"), "values.yaml")
        with open(vfile, "w") as f:
            f.write(values)
        rc, out, err, _ = check_chart.render(ARGS.renderer, ARGS.chart, [vfile])
        if rc != 0:
            raise AssertionError(f"{name}: render failed: {err}")
        objs = {(o["kind"], o["metadata"]["name"]): o for _, o in check_chart.parse_manifests(out)}
        sts = objs[("StatefulSet", "echokv")]
        container = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "echokv-server")
        self.flags = [l for l in objs[("ConfigMap", "echokv")]["data"]["echokv.flags"].splitlines() if l]
        self.probe = container["livenessProbe"]
        test = objs[("Pod", "echokv-test")]
        script = test["spec"]["containers"][0]["command"][-1]
        self.test_lines = [shlex.split(l) for l in script.splitlines() if l.strip().startswith("echokv-cli ")]
        self.server = None

    def map_path(self, word):
        return word.replace("/etc/echokv/", self.root + "/")

    def start(self):
        flags = [self.map_path(f) for f in self.flags
                 if not f.startswith(("--http_port=", "--http_host=", "--fsync="))]
        port_file = os.path.join(os.path.dirname(self.root), "ports")
        self.log = open(os.path.join(os.path.dirname(self.root), "server.log"), "w")
        self.server = subprocess.Popen(
            [ARGS.server_binary, "--model", ARGS.model, "--host", "127.0.0.1", "--port", "0", "--metrics-port=-1",
             "--port-file", port_file] + flags, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise AssertionError(f"{self.name}: server exited {self.server.returncode}: {self.tail()}")
            if os.path.exists(port_file):
                with open(port_file) as f:
                    ports = f.read().split()
                if len(ports) >= 2:
                    self.port = int(ports[0])
                    return
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no port file")

    def tail(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-2000:]

    def stop(self):
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=60)
        if self.server is not None:
            self.log.close()

    def run(self, words):
        """An echokv-cli command line of the render, with the pod's paths and the Service
        names mapped to this server; returns (exit code, output)."""
        out = []
        for w in words:
            w = self.map_path(w)
            w = re.sub(r"^(localhost|echokv|echokv-gateway):[0-9]+$", f"localhost:{self.port}", w)
            out.append(w)
        out[0] = ARGS.cli
        p = subprocess.run(out, capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout + p.stderr


def without(words, flag, n=1):
    """`words` with `flag` and its n values removed."""
    if flag not in words:
        raise AssertionError(f"{flag} is not in {words}")
    i = words.index(flag)
    return words[:i] + words[i + 1 + n:]


class ProbeMatrixTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="echokv-probes-")
        os.mkdir(os.path.join(cls.tmp.name, "pki"))
        make_pki(os.path.join(cls.tmp.name, "pki"))
        cls.modes = {}
        try:
            for name, values in MODES.items():
                cls.modes[name] = Mode(name, values, cls.tmp.name)
                cls.modes[name].start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for m in cls.modes.values():
            m.stop()
        cls.tmp.cleanup()

    def check_mode(self, name):
        m = self.modes[name]
        self.assertIn("exec" if "tls" in name else "grpc", m.probe)
        if "exec" in m.probe:
            words = m.probe["exec"]["command"]
        else:
            # kubelet's gRPC probe: grpc.health.v1 Check of the service, no credentials.
            words = ["echokv-cli", "--server", "localhost:%d" % m.probe["grpc"]["port"], "health", "--service",
                     m.probe["grpc"]["service"]]
        rc, out = m.run(words)
        self.assertEqual(rc, 0, f"{name}: the rendered liveness probe fails:\n{out}\n{m.tail()}")
        self.assertIn("SERVING", out)
        for words in m.test_lines:
            rc, out = m.run(words)
            self.assertEqual(rc, 0, f"{name}: helm test's {' '.join(words)} fails:\n{out}")
        return m

    def test_plaintext(self):
        m = self.check_mode("plaintext")
        self.assertEqual(m.probe["grpc"]["service"], "echokv.v1.EchoKV")

    def test_tokens(self):
        m = self.check_mode("tokens")
        info = next(w for w in m.test_lines if w[-1] == "info")
        rc, out = m.run(without(info, "--token-file"))
        self.assertNotEqual(rc, 0, "info without the token succeeded: the check is not testing tokens")
        self.assertIn("UNAUTHENTICATED", out)

    def test_tls(self):
        m = self.check_mode("tls")
        probe = m.probe["exec"]["command"]
        rc, out = m.run(without(probe, "--tls-server-name"))
        self.assertNotEqual(rc, 0, "the probe passed without --tls-server-name: the certificate names localhost?")
        rc, _ = m.run(without(without(probe, "--tls-server-name"), "--tls-ca"))
        self.assertNotEqual(rc, 0, "a plaintext probe passed against the TLS port")

    def test_mtls_with_tokens(self):
        m = self.check_mode("mtls+tokens")
        probe = m.probe["exec"]["command"]
        rc, _ = m.run(without(without(probe, "--tls-cert"), "--tls-key"))
        self.assertNotEqual(rc, 0, "the probe passed without a client certificate under mTLS")


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--renderer", required=True)
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--chart", default=check_chart.CHART, help="(to try a planted defect on a copy)")
    args, rest = parser.parse_known_args()
    data = os.environ.get("ECHOKV_TEST_DATA")
    if not data:
        print("SKIP: $ECHOKV_TEST_DATA is not set (needs models/stories260K)")
        return SKIP
    args.model = os.path.join(data, "models", "stories260K")
    ARGS = args
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
