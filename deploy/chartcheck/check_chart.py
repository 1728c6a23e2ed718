#!/usr/bin/python3
"""Render-and-validate checks of the echokv Helm chart, without Helm or a cluster.

  check_chart.py --renderer BIN cases     # defaults + every documented example
  check_chart.py --renderer BIN schema    # values.schema.json: good and bad values
  check_chart.py --renderer BIN planted   # planted errors (issue 32's defects) must be caught
  check_chart.py --renderer BIN alerts    # promtool test rules on the rendered alerts
  check_chart.py --renderer BIN render [-f VALUES]... [--kube-version V]
                 [--api-versions G/V]... [--plant NAME] [--print]   # one render, checked

BIN is echokv-chart-render (deploy/chartrender, Helm's template engine offline).
Every rendered object is checked against the Kubernetes API models (k8s_check.py),
custom resources against their schemas, the Envoy configs against
envoy-gateway.schema.json, the PromQL of the alerts and the dashboard with promtool,
and the pieces against each other (server_checks.py, envoy_checks.py,
obs_checks.py). Run by ctest (label unit); see docs/DEPLOY.md "How the chart is
checked".
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k8s_check  # noqa: E402
import envoy_checks  # noqa: E402
import obs_checks  # noqa: E402
import server_checks  # noqa: E402
from chart_common import NAMESPACE, server_flag_drift  # noqa: E402

DEPLOY = os.path.dirname(HERE)
REPO = os.path.dirname(DEPLOY)
CHART = os.path.join(DEPLOY, "helm", "echokv")
EXAMPLES = os.path.join(DEPLOY, "helm", "examples")
DEPLOY_MD = os.path.join(REPO, "docs", "DEPLOY.md")
ALERTS_TEST = os.path.join(HERE, "alerts_test.yaml")


# ------------------------------------------------------------------ rendering

def render(renderer, chart, values=(), kube_version=None, api_versions=(), name="echokv"):
    cmd = [renderer, "--chart", chart, "--name", name, "--namespace", NAMESPACE]
    for v in values:
        cmd += ["-f", v]
    if kube_version:
        cmd += ["--kube-version", kube_version]
    for a in api_versions:
        cmd += ["--api-versions", a]
    notes = tempfile.NamedTemporaryFile(suffix=".txt", delete=False)
    notes.close()
    cmd += ["--notes", notes.name]
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(notes.name) as f:
        notes_text = f.read()
    os.unlink(notes.name)
    return p.returncode, p.stdout, p.stderr, notes_text


def parse_manifests(text):
    """`helm template` output -> [(source, object)]."""
    out = []
    for doc in re.split(r"(?m)^---\s*$", text):
        if not doc.strip():
            continue
        m = re.search(r"(?m)^# Source: (\S+)$", doc)
        source = m.group(1) if m else "?"
        obj = yaml.load(doc, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        out.append((source, obj))
    return out


def read_headers(path):
    """`# key: value` lines at the top of an example/values file."""
    headers = {"external": [], "kube-version": None, "api-versions": [], "expect": None}
    with open(path) as f:
        for line in f:
            m = re.match(r"^#\s*(external|kube-version|api-versions|expect):\s*(.*)$", line)
            if not m:
                if line.startswith("#") or not line.strip():
                    continue
                break
            key, val = m.group(1), m.group(2).strip()
            if key in ("external", "api-versions"):
                headers[key] += [x for x in re.split(r"[,\s]+", val) if x]
            else:
                headers[key] = val
    return headers


def docs_snippets(tmpdir):
    """```yaml blocks of docs/DEPLOY.md whose first line is `# values: NAME`, as files.
    A block may start with `# values: NAME (after OTHER)`: its values go on top of the
    block OTHER, the way an operator layers -f files."""
    if not os.path.exists(DEPLOY_MD):
        return []
    with open(DEPLOY_MD) as f:
        text = f.read()
    out, by_name = [], {}
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        m = re.match(r"# values: (\S+)(?: \(after (\S+)\))?\n", block)
        if not m:
            continue
        path = os.path.join(tmpdir, f"docs-{m.group(1)}.yaml")
        with open(path, "w") as f:
            f.write(block)
        files = (by_name[m.group(2)] if m.group(2) else []) + [path]
        by_name[m.group(1)] = files
        out.append((m.group(1), files))
    return out


# ------------------------------------------------------------------ checks

def schema_errors(schema, doc, where, errors):
    v = jsonschema.Draft7Validator(schema)
    for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in e.absolute_path)
        errors.add(where, f"{path}: {e.message}")


def check_manifests(text, external, errors, tmpdir):
    objs = parse_manifests(text)
    ext = []
    for e in external:
        kind, _, name = e.partition("/")
        ext.append((kind, name))
    ext.append(("ConfigMap", "kube-root-ca.crt"))  # in every namespace (Kubernetes >= 1.21)
    by_kind = k8s_check.check_objects(objs, errors, external_names=ext)
    if by_kind is None:
        return None
    for kind in ("ServiceMonitor", "ScaledObject"):
        for where, obj in by_kind.get(kind, []):
            with open(os.path.join(HERE, k8s_check.CRD_SCHEMAS[kind])) as f:
                schema_errors(json.load(f), obj, where, errors)
    info = server_checks.check_server(by_kind, errors)
    server_checks.check_autoscaling(by_kind, info, errors)
    envoy_checks.check_gateway(by_kind, info, errors)
    server_checks.check_test_hook(by_kind, info, errors)
    obs_checks.check_rules(by_kind, errors, tmpdir)
    obs_checks.check_dashboard(by_kind, errors, tmpdir)
    return by_kind


def run_case(renderer, chart, values, headers, label, expect_probe=None):
    """Renders and checks one case; returns (errors, objects by kind, manifests)."""
    kube = headers.get("kube-version")
    rc, out, err, notes = render(renderer, chart, values, kube, headers.get("api-versions", []))
    errors = k8s_check.Errors()
    if rc != 0:
        errors.add(label, f"render failed: {err.strip()}")
        return errors, None, None
    tmp = tempfile.mkdtemp()
    try:
        by_kind = check_manifests(out, headers.get("external", []), errors, tmp)
    finally:
        shutil.rmtree(tmp)
    if by_kind is None:
        return errors, None, out
    if not notes.strip():
        errors.add(label, "NOTES.txt rendered empty")
    if "<no value>" in out or "<no value>" in notes:
        errors.add(label, "<no value> in the output")
    if expect_probe and not errors:
        server = next(c for c in by_kind["StatefulSet"][0][1]["spec"]["template"]["spec"]["containers"]
                      if c["name"] == "echokv-server")
        if expect_probe not in server["livenessProbe"]:
            errors.add(label, f"expected {expect_probe} probes on Kubernetes {kube}")
    return errors, by_kind, out


def gateway_objects(text):
    """The gateway's Deployment and ConfigMap of a render, as comparable text."""
    out = []
    for _, o in parse_manifests(text):
        labels = (o.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/component") == "gateway" and o["kind"] in ("Deployment", "ConfigMap"):
            out.append(yaml.safe_dump(o, sort_keys=True))
    return out


def check_scaling_keeps_gateway(renderer, chart, values, headers, by_kind, out, errors, label):
    """D3: scaling the servers (replicaCount + 1) must neither change the gateway's
    config nor roll its pods."""
    if not by_kind.get("Deployment") or "replicas" not in by_kind["StatefulSet"][0][1]["spec"]:
        return
    replicas = by_kind["StatefulSet"][0][1]["spec"]["replicas"]
    extra = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    extra.write(f"replicaCount: {replicas + 1}\n")
    extra.close()
    try:
        rc, out2, err, _ = render(renderer, chart, list(values) + [extra.name], headers.get("kube-version"),
                                  headers.get("api-versions", []))
    finally:
        os.unlink(extra.name)
    if rc != 0:
        return  # e.g. routeReplicas == replicaCount: the render refuses, which is fine
    if gateway_objects(out) != gateway_objects(out2):
        errors.add(label, f"changing replicaCount ({replicas} -> {replicas + 1}) changes the gateway's Deployment "
                          "or config: every scale would roll the gateway and cut its streams")


def print_result(label, errors, by_kind):
    if errors:
        print(f"FAIL {label}:")
        for e in errors.items:
            print(f"  {e}")
        return 1
    n = sum(len(v) for v in by_kind.values())
    print(f"ok   {label}: {n} objects")
    return 0


# ------------------------------------------------------------------ commands

def cmd_cases(args):
    missing, extra = server_flag_drift()
    if missing or extra:
        print("FAIL: the chart check's flag list differs from server/main.cc: unclassified "
              f"{missing}, gone {extra}")
        return 1
    tmp = tempfile.mkdtemp()
    try:
        none = {"api-versions": [], "external": []}
        cases = [("defaults (Kubernetes 1.29)", [], dict(none, **{"kube-version": "1.29.0"}), "grpc"),
                 ("defaults (Kubernetes 1.27)", [], dict(none, **{"kube-version": "1.27.0"}), "grpc"),
                 ("defaults (Kubernetes 1.23: exec probes)", [], dict(none, **{"kube-version": "1.23.0"}), "exec")]
        examples = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".yaml"))
        for f in examples:
            path = os.path.join(EXAMPLES, f)
            h = read_headers(path)
            if h.get("expect") is None:
                cases.append((f"examples/{f}", [path], h, None))
        snippets = docs_snippets(tmp)
        if not snippets:
            print("FAIL: docs/DEPLOY.md has no `# values:` yaml snippets")
            return 1
        for name, files in snippets:
            h = read_headers(files[0])
            for f in files[1:]:
                hf = read_headers(f)
                h["external"] += hf["external"]
                h["api-versions"] += hf["api-versions"]
                h["kube-version"] = hf["kube-version"] or h["kube-version"]
            cases.append((f"DEPLOY.md {name}", files, h, None))
        with open(DEPLOY_MD) as f:
            doc = f.read()
        failed = 0
        for f in examples:
            if f"examples/{f}" not in doc:
                print(f"FAIL: deploy/helm/examples/{f} is not referenced in docs/DEPLOY.md")
                failed += 1
        # Plain manifests the docs ask operators to apply (e.g. filling a model claim).
        mdir = os.path.join(EXAMPLES, "manifests")
        for f in sorted(os.listdir(mdir)) if os.path.isdir(mdir) else []:
            if not f.endswith(".yaml"):
                continue
            with open(os.path.join(mdir, f)) as fh:
                objs = [(f"examples/manifests/{f}", o) for o in yaml.safe_load_all(fh) if o]
            errors = k8s_check.Errors()
            k8s_check.check_objects(objs, errors)
            if f"examples/manifests/{f}" not in doc:
                errors.add(f, "not referenced in docs/DEPLOY.md")
            if errors:
                failed += 1
                print(f"FAIL examples/manifests/{f}:\n  " + "\n  ".join(errors.items))
            else:
                print(f"ok   examples/manifests/{f}: {len(objs)} objects")
        for label, values, headers, probe in cases:
            errors, by_kind, out = run_case(args.renderer, args.chart, values, headers, label, probe)
            if by_kind is not None and not errors:
                check_scaling_keeps_gateway(args.renderer, args.chart, values, headers, by_kind, out, errors, label)
            failed += print_result(label, errors, by_kind)
        print(f"{len(cases) - failed}/{len(cases)} cases pass (Kubernetes models: python3-kubernetes "
              f"{k8s_check.MODELS_VERSION}, API {k8s_check.KUBE_API_OF_MODELS} + {sorted(k8s_check.NEWER_FIELDS)})")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp)


def cmd_schema(args):
    """Good values render and pass; bad values fail with the expected message."""
    failed = total = 0
    for kind in ("values-good", "values-bad"):
        d = os.path.join(HERE, kind)
        for f in sorted(os.listdir(d)):
            if not f.endswith(".yaml"):
                continue
            total += 1
            path = os.path.join(d, f)
            h = read_headers(path)
            if kind == "values-good":
                errors, _, _ = run_case(args.renderer, args.chart, [path], h, f)
                if errors:
                    failed += 1
                    print(f"FAIL {kind}/{f} should pass:\n  " + "\n  ".join(errors.items))
                else:
                    print(f"ok   {kind}/{f}")
                continue
            if not h.get("expect"):
                failed += 1
                print(f"FAIL {kind}/{f}: no `# expect:` header")
                continue
            rc, out, err, _ = render(args.renderer, args.chart, [path], h.get("kube-version"),
                                     h.get("api-versions", []))
            if rc == 0:
                failed += 1
                print(f"FAIL {kind}/{f}: rendered, but should fail with {h['expect']!r}")
            elif h["expect"] not in err:
                failed += 1
                print(f"FAIL {kind}/{f}: failed, but not with {h['expect']!r}:\n  {err.strip()}")
            else:
                print(f"ok   {kind}/{f}: {h['expect']}")
    print(f"{total - failed}/{total} values files behave as expected")
    return 1 if failed else 0


def cmd_alerts(args):
    """The alert rules as rendered with prometheusRule enabled: promtool check rules,
    then promtool test rules with alerts_test.yaml (series in, alerts out)."""
    values = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    values.write("prometheusRule:\n  enabled: true\n")
    values.close()
    tmp = tempfile.mkdtemp()
    try:
        headers = {"kube-version": None, "api-versions": ["monitoring.coreos.com/v1"], "external": []}
        rc, out, err, _ = render(args.renderer, args.chart, [values.name], None, headers["api-versions"])
        if rc != 0:
            print(f"FAIL: render failed: {err}")
            return 1
        errors = k8s_check.Errors()
        by_kind = check_manifests(out, [], errors, tmp)
        if errors or by_kind is None:
            print("FAIL:\n  " + "\n  ".join(errors.items))
            return 1
        rules = obs_checks.check_rules(by_kind, errors, tmp)
        shutil.copy(ALERTS_TEST, os.path.join(tmp, "alerts_test.yaml"))
        os.rename(rules, os.path.join(tmp, "alerts.rules.yaml"))
        p = subprocess.run([obs_checks.PROMTOOL, "test", "rules", "alerts_test.yaml"], cwd=tmp,
                           capture_output=True, text=True)
        print(p.stdout + p.stderr)
        if p.returncode != 0:
            print("FAIL: promtool test rules")
            return 1
        print("ok   promtool check rules and test rules on the rendered alerts")
        return 0
    finally:
        os.unlink(values.name)
        shutil.rmtree(tmp)


# Planted errors: (name, template file, old text, new text, extra values, headers,
# expected message). Each is applied to a copy of the chart; the check must fail with
# the message, which proves the check can see that kind of error. The D1..D8 entries
# put issue 32's defects back.
BIG_VALUES = "limits:\n  maxKvBytes: 17179869184\n"
TLS_VALUES = """auth:
  insecure: false
  tokensSecret: t
drain:
  tokensSecret: d
tests:
  tokenSecret: tt
tls:
  enabled: true
  secretName: s
  clientCASecret: ca
  clientCertSecret: cc
gateway:
  enabled: true
  routeReplicas: 3
  tls:
    secretName: g
"""
TLS_EXT = ["Secret/t", "Secret/d", "Secret/tt", "Secret/s", "Secret/ca", "Secret/cc", "Secret/g"]
GW_VALUES = "replicaCount: 3\ngateway:\n  enabled: true\n  routeReplicas: 4\n"
GPU_VALUES = """server:
  device: cuda
gpu:
  count: 1
  image:
    repository: r/echokv-cuda
limits:
  maxKvBytes: 68719476736
"""
PLANTED = [
    ("typo-field", "templates/statefulset.yaml", "terminationGracePeriodSeconds:",
     "terminationGracePeriodSecond:", "", {}, "unknown field of V1PodSpec (did you mean"),
    ("float-flag", "templates/configmap.yaml", "--max_kv_bytes={{ int64 .maxKvBytes }}",
     "--max_kv_bytes={{ .maxKvBytes }}", BIG_VALUES, {}, "--max_kv_bytes=1.7179869184e+10: not an integer"),
    ("string-replicas", "templates/statefulset.yaml", "replicas: {{ int64 .Values.replicaCount }}",
     "replicas: {{ int64 .Values.replicaCount | quote }}", "", {}, "spec.replicas: expected an integer, got string"),
    ("probe-service", "templates/_helpers.tpl", 'service: {{ $ctx.Values.probes.service | quote }}',
     'service: ""', "", {}, "livenessProbe.grpc.service must be echokv.v1.EchoKV"),
    ("service-port-typo", "templates/service.yaml", "targetPort: grpc", "targetPort: grcp", "", {},
     "targetPort 'grcp' names no container port"),
    ("headless-selector", "templates/service-headless.yaml",
     'selector:\n    {{- include "echokv.selectorLabels" . | nindent 4 }}',
     "selector:\n    app: other", "", {}, "selects no workload's pods"),
    ("envoy-field-typo", "templates/gateway-configmap.yaml", "lb_policy: {{ $t.lb }}",
     "lb_polcy: {{ $t.lb }}", GW_VALUES, {}, "Additional properties are not allowed ('lb_polcy' was unexpected)"),
    ("envoy-route-off-by-one", "templates/gateway-configmap.yaml",
     '{{- $owner := printf "%s-%d." $fullname $i }}', '{{- $owner := printf "%s-%d." $fullname (add1 $i) }}',
     GW_VALUES, {}, "no route for the sessions of pod(s) [0]"),
    ("unknown-flag", "templates/configmap.yaml", "--prefill_chunk=", "--prefil_chunk=", "", {},
     "--prefil_chunk: echokv-server has no such flag"),
    ("grace-too-short", "templates/_helpers.tpl", "{{- if eq $set 0 }}{{ $needed }}",
     "{{- if eq $set 0 }}{{ 10 }}", "", {}, "terminationGracePeriodSeconds 10 < drain 300 + preStop 5 + shutdown_grace 120"),
    # D1: TLS probes: plaintext to the TLS port / no server name / no client certificate.
    ("D1-probe-plaintext", "templates/_helpers.tpl",
     '{{- range (include "echokv.cliTlsArgs" (dict "ctx" $ctx "serverName" (include "echokv.tlsServerName" $ctx)) | trim | splitList "\\n") }}',
     '{{- range list }}', TLS_VALUES, {"external": TLS_EXT},
     "livenessProbe: the server speaks TLS but the call has no --tls-ca"),
    ("D1-probe-no-server-name", "templates/_helpers.tpl", "{{- if .serverName }}\n--tls-server-name",
     "{{- if false }}\n--tls-server-name", TLS_VALUES, {"external": TLS_EXT},
     "livenessProbe: dials localhost:50051 over TLS without --tls-server-name"),
    ("D1-probe-no-client-cert", "templates/_helpers.tpl", "{{- if $v.tls.clientCASecret }}\n--tls-cert",
     "{{- if false }}\n--tls-cert", TLS_VALUES, {"external": TLS_EXT},
     "livenessProbe: the server requires client certificates (--tls_client_ca) but the call has no --tls-cert"),
    # D2: the HTTP door in plaintext next to TLS gRPC; the TLS proxy's listener in plaintext.
    ("D2-http-plaintext", "templates/configmap.yaml", "--http_host=127.0.0.1\n", "", TLS_VALUES,
     {"external": TLS_EXT}, "listens on every address: bearer tokens in plaintext"),
    ("D2-proxy-plaintext", "templates/tls-proxy-configmap.yaml", "          transport_socket:\n",
     "          transport_socket_off:\n", TLS_VALUES, {"external": TLS_EXT},
     "filter_chains.0: Additional properties are not allowed ('transport_socket_off' was unexpected)"),
    ("D2-gateway-http-plaintext-upstream", "templates/gateway-configmap.yaml",
     "        {{- if $ctx.Values.tls.enabled }}\n        transport_socket:",
     "        {{- if and $ctx.Values.tls.enabled $api.h2 }}\n        transport_socket:", TLS_VALUES,
     {"external": TLS_EXT}, "upstream plaintext to a TLS http port"),
    # D3: the gateway not drained; scaling rolls the gateway; a shutdown shorter than a generation.
    ("D3-gateway-no-drain", "templates/gateway-deployment.yaml", "printf 'POST /drain_listeners?graceful",
     "printf 'GET /ready",
     GW_VALUES, {}, "the gateway's preStop does not drain Envoy's listeners"),
    ("D3-routes-follow-replicas", "templates/_helpers.tpl", "{{- $n }}\n{{- end }}",
     "{{- add $n (int64 .Values.replicaCount) }}\n{{- end }}", GW_VALUES, {},
     "changing replicaCount (3 -> 4) changes the gateway's Deployment or config"),
    ("D3-shutdown-shorter-than-generation", "templates/_helpers.tpl",
     '{{- if lt (int64 .Values.limits.shutdownGraceSeconds) $longest }}', "{{- if false }}",
     "limits:\n  shutdownGraceSeconds: 20\n", {}, "--shutdown_grace=20s is shorter than the longest generation"),
    # D4: TCP health checks of the HTTP API; panic routing; an old Envoy; no overload manager;
    # retries of non-idempotent calls.
    ("D4-http-tcp-health", "templates/gateway-configmap.yaml", "http_health_check:\n            path: /health",
     "tcp_health_check: {}", GW_VALUES, {}, "checks the http API by TCP only"),
    ("D4-panic-threshold", "templates/gateway-configmap.yaml", "            value: 0\n", "            value: 50\n",
     GW_VALUES, {}, "healthy_panic_threshold 50"),
    ("D4-old-envoy", "values.yaml", "tag: v1.37-latest", "tag: v1.31-latest", GW_VALUES, {},
     "is older than v1.37"),
    ("D4-no-overload-manager", "templates/gateway-configmap.yaml", "    overload_manager:\n", "    overload_managr:\n",
     GW_VALUES, {}, "Additional properties are not allowed ('overload_managr' was unexpected)"),
    ("D4-retry-non-idempotent", "templates/gateway-configmap.yaml",
     'retry_on: {{ ternary $readRetry "connect-failure,refused-stream" $read | quote }}\n                        num_retries: {{ ternary (int64 $gw.retries) 1 $read }}\n                  {{- end }}\n                  {{- end }}',
     'retry_on: {{ $readRetry | quote }}\n                        num_retries: {{ ternary (int64 $gw.retries) 1 $read }}\n                  {{- end }}\n                  {{- end }}',
     GW_VALUES, {}, "retries a non-idempotent call on ['reset', 'unavailable']"),
    # D5: helm test without the token the servers check.
    ("D5-test-no-token", "templates/tests/test-connection.yaml",
     '{{- if .Values.auth.tokensSecret }}{{ $cli = printf " --token-file', '{{- if false }}{{ $cli = printf " --token-file',
     TLS_VALUES, {"external": TLS_EXT}, "the servers check tokens, and info needs one: no --token-file"),
    # D6: host memory counting the device-resident hot tier; no /dev/shm; two GPUs.
    ("D6-cuda-memory-as-host", "templates/_helpers.tpl", '{{- if not (include "echokv.cuda" .) }}\n{{- $terms',
     '{{- if true }}\n{{- $terms', GPU_VALUES, {}, "on CUDA the host memory counts the hot tier"),
    ("D6-cuda-no-shm", "templates/statefulset.yaml", "            - name: dshm\n              mountPath: /dev/shm\n", "",
     GPU_VALUES, {}, "CUDA without a memory-backed /dev/shm"),
    ("D6-two-gpus", "templates/_helpers.tpl", "{{- $_ := set $limits .Values.gpu.resourceName (int64 .Values.gpu.count) }}",
     "{{- $_ := set $limits .Values.gpu.resourceName 2 }}", GPU_VALUES, {}, "needs exactly one GPU in the limits"),
    # D7: threads from the CPU request rounded up.
    ("D7-threads-round-up", "templates/_helpers.tpl", "{{ max 1 (div $m 1000) }}", "{{ div (add $m 999) 1000 }}",
     "resources:\n  requests:\n    cpu: 2500m\n", {}, "--threads=3 exceeds the CPU request 2500m"),
    # D8: scrape annotations beside a ServiceMonitor; IPv6 wildcard on IPv4; no gateway
    # anti-affinity; a test pod without the servers' tolerations.
    ("D8-double-scrape", "templates/_helpers.tpl", '{{- if not (include "echokv.serviceMonitor" .) }}true{{ end }}',
     "true", "serviceMonitor:\n  enabled: true\n", {"api-versions": ["monitoring.coreos.com/v1"]},
     "a Prometheus that honours both scrapes every pod twice"),
    ("D8-ipv6-on-ipv4", "templates/_helpers.tpl", '{{- else if eq .Values.network.ipFamily "ipv4" }}0.0.0.0',
     '{{- else if eq .Values.network.ipFamily "ipv4" }}[::]', "", {}, "an IPv6 wildcard on an IPv4-only cluster"),
    ("D8-envoy-ipv6-on-ipv4", "templates/_helpers.tpl", 'address: {{ if eq $fam "ipv4" }}0.0.0.0{{ else }}"::"{{ end }}',
     'address: "::"', GW_VALUES, {}, "listener grpc binds ::: an IPv6 wildcard on an IPv4-only cluster"),
    ("D8-gateway-no-anti-affinity", "values.yaml", "podAntiAffinity: soft        # soft | hard | none: spread the gateway",
     "podAntiAffinity: none        # soft | hard | none: spread the gateway", GW_VALUES, {},
     "the gateway pods have no anti-affinity"),
    ("D8-test-no-tolerations", "templates/tests/test-connection.yaml",
     "{{- with (default .Values.tolerations .Values.tests.tolerations) }}", "{{- with .Values.tests.tolerations }}",
     "tolerations:\n  - key: nvidia.com/gpu\n    operator: Exists\n    effect: NoSchedule\n", {},
     "the test pod lacks the servers' tolerations"),
    # The drain: wrong peers, no RBAC, no tenant tokens.
    ("drain-peer-port", "templates/statefulset.yaml", "--peer '{pod}.{{ include \"echokv.headlessDomain\" . }}:{{ int64 .Values.ports.grpc }}'",
     "--peer '{pod}.{{ include \"echokv.headlessDomain\" . }}:{{ int64 .Values.ports.metrics }}'", "", {},
     "drain: --peer '{pod}.echokv-headless.echokv-ns.svc.cluster.local:9464' is not"),
    ("drain-no-rbac", "templates/rbac.yaml", 'verbs: ["get"]', 'verbs: ["list"]', "", {},
     "no Role bound to ServiceAccount echokv lets the drain get StatefulSet echokv"),
    ("drain-no-token-dir", "templates/statefulset.yaml", " --token-dir /etc/echokv/drain-tokens", "", TLS_VALUES,
     {"external": TLS_EXT}, "drain: the server checks tokens but the drain has no --token-dir"),
    # Autoscaling on CPU instead of a serving signal; scale-down of several pods at once.
    ("autoscale-fast-scale-down", "templates/_helpers.tpl", "    - type: Pods\n      value: 1\n",
     "    - type: Pods\n      value: 4\n", "autoscaling:\n  enabled: true\n", {"api-versions": ["keda.sh/v1alpha1"]},
     "scale-down must remove at most one pod per period"),
]


def plant(chart_copy, name):
    entry = next((p for p in PLANTED if p[0] == name), None)
    if entry is None:
        raise SystemExit(f"unknown planted error {name!r}; known: {[p[0] for p in PLANTED]}")
    _, rel, old, new, values, headers, expect = entry
    path = os.path.join(chart_copy, rel)
    with open(path) as f:
        text = f.read()
    if old not in text:
        raise SystemExit(f"planted error {name}: {old!r} is no longer in {rel}; update PLANTED")
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))
    vfile = None
    if values:
        vfile = os.path.join(chart_copy, "..", f"planted-{name}.yaml")
        with open(vfile, "w") as f:
            f.write(values)
    h = {"kube-version": None, "api-versions": [], "external": []}
    h.update(headers)
    return vfile, h, expect


def cmd_planted(args):
    failed = 0
    for name, *_ in PLANTED:
        tmp = tempfile.mkdtemp()
        try:
            chart_copy = os.path.join(tmp, "echokv")
            shutil.copytree(args.chart, chart_copy)
            vfile, headers, expect = plant(chart_copy, name)
            values = [vfile] if vfile else []
            errors, by_kind, out = run_case(args.renderer, chart_copy, values, headers, name)
            if by_kind is not None and not errors:
                check_scaling_keeps_gateway(args.renderer, chart_copy, values, headers, by_kind, out, errors, name)
            msgs = "\n  ".join(errors.items)
            if not errors:
                failed += 1
                print(f"FAIL planted {name}: the check passed; it must fail with {expect!r}")
            elif expect not in msgs:
                failed += 1
                print(f"FAIL planted {name}: failed, but not with {expect!r}:\n  {msgs}")
            else:
                print(f"ok   planted {name}: caught ({expect})")
        finally:
            shutil.rmtree(tmp)
    print(f"{len(PLANTED) - failed}/{len(PLANTED)} planted errors caught")
    return 1 if failed else 0


def cmd_render(args):
    tmp = tempfile.mkdtemp()
    try:
        chart = args.chart
        values = list(args.values)
        headers = {"kube-version": args.kube_version, "api-versions": list(args.api_versions),
                   "external": list(args.external)}
        if args.plant:
            chart = os.path.join(tmp, "echokv")
            shutil.copytree(args.chart, chart)
            vfile, h, _ = plant(chart, args.plant)
            if vfile:
                values.append(vfile)
            headers["external"] += h["external"]
            headers["api-versions"] += h["api-versions"]
        for v in args.values:
            h = read_headers(v)
            headers["external"] += h["external"]
            headers["api-versions"] += h["api-versions"]
            headers["kube-version"] = headers["kube-version"] or h["kube-version"]
        errors, by_kind, out = run_case(args.renderer, chart, values, headers, "render")
        if by_kind is not None and not errors:
            check_scaling_keeps_gateway(args.renderer, chart, values, headers, by_kind, out, errors, "render")
        if args.print and out:
            print(out)
        if errors:
            print("FAIL:\n  " + "\n  ".join(errors.items))
            return 1
        print(f"ok: {sum(len(v) for v in by_kind.values())} objects")
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--renderer", required=True, help="echokv-chart-render binary")
    p.add_argument("--chart", default=CHART)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cases")
    sub.add_parser("schema")
    sub.add_parser("planted")
    sub.add_parser("alerts")
    r = sub.add_parser("render")
    r.add_argument("-f", "--values", action="append", default=[])
    r.add_argument("--kube-version")
    r.add_argument("--api-versions", action="append", default=[])
    r.add_argument("--external", action="append", default=[], help="Kind/name that exists outside the chart")
    r.add_argument("--plant", help="apply one planted error first (the check must then fail)")
    r.add_argument("--print", action="store_true", help="print the manifests too")
    args = p.parse_args()
    return {"cases": cmd_cases, "schema": cmd_schema, "planted": cmd_planted, "alerts": cmd_alerts,
            "render": cmd_render}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
