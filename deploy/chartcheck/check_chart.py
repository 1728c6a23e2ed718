#!/usr/bin/python3
"""Render-and-validate checks of the echokv Helm chart, without Helm or a cluster.

  check_chart.py --renderer BIN cases     # defaults + every documented example
  check_chart.py --renderer BIN schema    # values.schema.json: good and bad values
  check_chart.py --renderer BIN planted   # planted errors must be caught
  check_chart.py --renderer BIN render [-f VALUES]... [--kube-version V]
                 [--api-versions G/V]... [--plant NAME]   # one render, checked

BIN is echokv-chart-render (deploy/chartrender, Helm's template engine offline).
Every rendered object is checked against the Kubernetes API models
(k8s_check.py), the gateway's Envoy config against envoy-gateway.schema.json, a
ServiceMonitor against servicemonitor.schema.json, and the pieces against each
other: server flags (known names, integer numbers), StatefulSet and probes,
routes <-> replicas, mounts <-> files. Run by ctest (label unit); see
docs/DEPLOY.md "How the chart is checked".
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

DEPLOY = os.path.dirname(HERE)
REPO = os.path.dirname(DEPLOY)
CHART = os.path.join(DEPLOY, "helm", "echokv")
EXAMPLES = os.path.join(DEPLOY, "helm", "examples")
DEPLOY_MD = os.path.join(REPO, "docs", "DEPLOY.md")
NAMESPACE = "echokv-ns"  # not "default", so a template that forgets the namespace shows
HEALTH_SERVICE = "echokv.v1.EchoKV"

# echokv-server's flags (server/main.cc, plus those of the session-memory, routing,
# HTTP and security issues) by kind. A flag the server does not know makes it refuse
# to start, so an unknown name here is an error.
INT_FLAGS = {
    "port", "metrics_port", "http_port", "threads", "prefill_chunk", "default_budget",
    "default_lookahead", "default_workspace", "default_window", "max_context_tokens",
    "max_new_tokens", "max_sessions", "max_kv_bytes", "max_cold_bytes",
    "max_concurrent_streams", "max_request_bytes", "max_streams_per_connection",
    "metrics_threads", "http_threads", "http_send_buffer_bytes", "http_max_body_bytes",
    "max_step_tokens",
}
DURATION_FLAGS = {"session_ttl", "max_session_ttl", "shutdown_grace", "tls_refresh_interval",
                  "max_connection_idle", "max_connection_age", "max_connection_age_grace",
                  "http_read_timeout", "http_write_timeout", "http_keep_alive_timeout", "stuck_after"}
ENUM_FLAGS = {
    "device": r"cpu|cuda(:[0-9]+)?",
    "dtype": r"float32|bfloat16|float16",
    "default_policy": r"full|streamingllm|h2o|snapkv|pyramidkv|laq|echokv",
    "default_memory": r"tiered|evict",
    "fsync": r"always|none",
    "insecure": r"true|false",
    "reflection": r"true|false",
}
PATH_FLAGS = {"model", "state_dir", "auth_tokens_file", "tls_cert", "tls_key", "tls_client_ca",
              "flagfile", "port_file", "chat_template"}
STRING_FLAGS = {"host", "metrics_host", "replica_id", "http_host", "served_model_name"}
KNOWN_FLAGS = INT_FLAGS | DURATION_FLAGS | set(ENUM_FLAGS) | PATH_FLAGS | STRING_FLAGS
# absl's own flags, accepted by every binary.
ABSL_FLAGS = {"flagfile"}
SERVER_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server", "main.cc")


def server_flag_drift():
    """The flag names this check knows vs those server/main.cc defines: (missing, extra).
    A flag the server gained must be classified here, one it lost must go."""
    with open(SERVER_MAIN) as f:
        defined = set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*([a-z0-9_]+)\s*,", f.read()))
    known = KNOWN_FLAGS - ABSL_FLAGS
    return sorted(defined - known), sorted(known - defined)


def as_int(v, default=0):
    """int(v), or `default` for a value already reported as malformed."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def parse_quantity(q):
    """A Kubernetes quantity as a number (bytes or cores)."""
    q = str(q)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3}
    for suf, mul in suffixes.items():
        if q.endswith(suf):
            return float(q[:-len(suf)]) * mul
    return float(q)


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
        obj = yaml.safe_load(doc)
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
    """```yaml blocks of docs/DEPLOY.md whose first line is `# values: NAME`, as files."""
    if not os.path.exists(DEPLOY_MD):
        return []
    with open(DEPLOY_MD) as f:
        text = f.read()
    out = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        m = re.match(r"# values: (\S+)\n", block)
        if not m:
            continue
        path = os.path.join(tmpdir, f"docs-{m.group(1)}.yaml")
        with open(path, "w") as f:
            f.write(block)
        out.append(path)
    return out


# ------------------------------------------------------------------ checks

def load_schema(name):
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


def schema_errors(schema, doc, where, errors):
    v = jsonschema.Draft7Validator(schema)
    for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in e.absolute_path)
        errors.add(where, f"{path}: {e.message}")


def parse_flags(text, where, errors):
    """The flagfile -> {name: value}; every line --name=value with a known name and a
    value of the flag's kind (numbers as plain integers: never 4e+06)."""
    flags = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^--([a-z0-9_]+)=(.*)$", line)
        if not m:
            errors.add(where, f"flagfile line {line!r} is not --name=value")
            continue
        name, value = m.group(1), m.group(2)
        check_flag(name, value, where, errors)
        if name in flags:
            errors.add(where, f"--{name} given twice")
        flags[name] = value
    return flags


def check_flag(name, value, where, errors):
    if name not in KNOWN_FLAGS:
        errors.add(where, f"--{name}: echokv-server has no such flag (it would refuse to start)")
    elif name in INT_FLAGS and not re.fullmatch(r"-?[0-9]+", value):
        errors.add(where, f"--{name}={value}: not an integer (the flag parser refuses it)")
    elif name in DURATION_FLAGS and not re.fullmatch(r"[0-9]+(ms|s|m|h)", value):
        errors.add(where, f"--{name}={value}: not a duration like 30s")
    elif name in ENUM_FLAGS and not re.fullmatch(ENUM_FLAGS[name], value):
        errors.add(where, f"--{name}={value}: not one of {ENUM_FLAGS[name]}")
    elif name in PATH_FLAGS and not value.startswith("/"):
        errors.add(where, f"--{name}={value}: not an absolute path")
    elif name in STRING_FLAGS and value == "":
        errors.add(where, f"--{name} is empty")


def mounted_file(container, spec, path, where, errors, what):
    """`path` must lie under a volumeMount of `container`; a Secret/ConfigMap volume
    with `items` must project that file."""
    for m in container.get("volumeMounts", []) or []:
        mp = m["mountPath"].rstrip("/")
        if path.startswith(mp + "/"):
            rel = path[len(mp) + 1:]
            vol = next((v for v in spec.get("volumes", []) or [] if v["name"] == m["name"]), None)
            src = (vol or {}).get("secret") or (vol or {}).get("configMap") or {}
            items = src.get("items")
            if items is not None and rel not in [i["path"] for i in items]:
                errors.add(where, f"{what} {path}: volume {m['name']} does not project {rel}")
            return m
    errors.add(where, f"{what} {path} is under no volumeMount of container {container['name']}")
    return None


def check_server(by_kind, errors):
    """The StatefulSet and its flags, probes, threads, memory and lifecycle."""
    stss = by_kind.get("StatefulSet", [])
    if len(stss) != 1:
        errors.add("chart", f"expected one StatefulSet, got {len(stss)}")
        return None
    where, sts = stss[0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    if spec.get("podManagementPolicy") != "Parallel":
        errors.add(where, "podManagementPolicy must be Parallel")
    us = spec.get("updateStrategy", {})
    if us.get("type") != "RollingUpdate" or "maxUnavailable" in (us.get("rollingUpdate") or {}):
        errors.add(where, "updateStrategy must be RollingUpdate, one pod at a time (no maxUnavailable)")
    server = next((c for c in pod["containers"] if c["name"] == "echokv-server"), None)
    if server is None:
        errors.add(where, "no echokv-server container")
        return None
    env = {e["name"]: e for e in server.get("env", []) or []}
    ports = {p["name"]: p["containerPort"] for p in server.get("ports", []) or []}

    # Flags: the flagfile of the ConfigMap plus the container args.
    args = server.get("args", []) or []
    flagfile = next((a.split("=", 1)[1] for a in args if a.startswith("--flagfile=")), None)
    flags = {}
    if flagfile is None:
        errors.add(where, "no --flagfile argument")
    else:
        m = mounted_file(server, pod, flagfile, where, errors, "--flagfile")
        vol = next((v for v in pod.get("volumes", []) if m and v["name"] == m["name"]), {})
        cm_name = (vol.get("configMap") or {}).get("name")
        cms = [o for _, o in by_kind.get("ConfigMap", []) if o["metadata"]["name"] == cm_name]
        key = os.path.basename(flagfile)
        if not cms or key not in (cms[0].get("data") or {}):
            errors.add(where, f"--flagfile {flagfile}: ConfigMap {cm_name!r} has no key {key}")
        else:
            flags = parse_flags(cms[0]["data"][key], f"ConfigMap/{cm_name} {key}", errors)
    for a in args:
        m = re.match(r"^--([a-z0-9_-]+)=(.*)$", a)
        if m and m.group(1) != "flagfile":
            name = m.group(1).replace("-", "_")
            value = m.group(2)
            if not re.fullmatch(r"\$\([A-Z_]+\)", value):
                check_flag(name, value, where, errors)
            flags[name] = value
    if flags.get("replica_id") != "$(POD_NAME)":
        errors.add(where, "--replica_id must be $(POD_NAME) (the owner prefix of session ids)")
    if (env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            != "metadata.name"):
        errors.add(where, "env POD_NAME must come from fieldRef metadata.name")
    for e in env.values():
        if "value" in e and not isinstance(e["value"], str):
            errors.add(where, f"env {e['name']}: value must be a string")
    for n in ("ECHOKV_GRPC_PORT", "ECHOKV_METRICS_PORT"):
        if n in env and not re.fullmatch(r"[0-9]+", env[n].get("value", "")):
            errors.add(where, f"env {n}={env[n].get('value')!r}: not an integer")
    if env.get("ECHOKV_GRPC_PORT", {}).get("value") != str(ports.get("grpc")):
        errors.add(where, "ECHOKV_GRPC_PORT differs from the grpc container port")
    if env.get("ECHOKV_METRICS_PORT", {}).get("value") != str(ports.get("metrics")):
        errors.add(where, "ECHOKV_METRICS_PORT differs from the metrics container port")
    if "http_port" in flags and as_int(flags["http_port"]) != ports.get("http"):
        errors.add(where, "--http_port differs from the http container port")
    if env.get("ECHOKV_HOST", {}).get("value") not in ("[::]", "::"):
        errors.add(where, "ECHOKV_HOST should be [::] (dual-stack)")
    for f in ("auth_tokens_file", "tls_cert", "tls_key", "tls_client_ca"):
        if f in flags:
            mounted_file(server, pod, flags[f], where, errors, f"--{f}")
    if ("auth_tokens_file" in flags) == (flags.get("insecure") == "true"):
        errors.add(where, "exactly one of --auth_tokens_file and --insecure=true must be set")

    # Threads: the CPU request through the Downward API, in whole cores.
    threads = env.get("ECHOKV_THREADS")
    requests = (server.get("resources") or {}).get("requests") or {}
    if threads is not None:
        ref = (threads.get("valueFrom") or {}).get("resourceFieldRef") or {}
        if ref.get("resource") != "requests.cpu" or str(ref.get("divisor")) != "1":
            errors.add(where, "ECHOKV_THREADS must be resourceFieldRef requests.cpu with divisor 1")
        if "cpu" not in requests:
            errors.add(where, "ECHOKV_THREADS from requests.cpu, but no CPU request")
        if "threads" in flags:
            errors.add(where, "both --threads and ECHOKV_THREADS are set")
    elif "threads" not in flags and "cpu" in requests:
        errors.add(where, "a CPU request but neither ECHOKV_THREADS nor --threads")

    # State: the volume claim template mounted where ECHOKV_STATE_DIR points.
    state_dir = env.get("ECHOKV_STATE_DIR", {}).get("value")
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", []) or []]
    if state_dir:
        m = mounted_file(server, pod, state_dir, where, errors, "ECHOKV_STATE_DIR")
        if m and m["name"] not in claims:
            errors.add(where, f"the state dir is on volume {m['name']}, not a volumeClaimTemplate")
        if "fsync" not in flags:
            errors.add(where, "a state dir without --fsync")
    elif claims:
        errors.add(where, "volumeClaimTemplates without ECHOKV_STATE_DIR")

    # Memory: at least weights-independent KV budgets.
    mem = requests.get("memory")
    need = as_int(flags.get("max_kv_bytes"))
    if flags.get("default_memory") == "tiered":
        need += as_int(flags.get("max_cold_bytes"))
    if mem is None or parse_quantity(mem) < need:
        errors.add(where, f"memory request {mem} is below max_kv_bytes (+ max_cold_bytes) = {need}")
    limits = (server.get("resources") or {}).get("limits") or {}
    if "memory" in limits and mem is not None and parse_quantity(limits["memory"]) < parse_quantity(mem):
        errors.add(where, "memory limit below the request")

    # Probes ask for the engine's health service.
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = server.get(name)
        if probe is None:
            continue
        if "grpc" in probe:
            if probe["grpc"].get("service") != HEALTH_SERVICE:
                errors.add(where, f"{name}.grpc.service must be {HEALTH_SERVICE} (\"\" is answered by gRPC itself)")
            if probe["grpc"].get("port") != ports.get("grpc"):
                errors.add(where, f"{name}.grpc.port is not the grpc container port")
        elif "exec" in probe:
            cmd = probe["exec"].get("command", [])
            if (not cmd or cmd[0] != "echokv-cli" or "health" not in cmd
                    or cmd[cmd.index("health"):][1:3] != ["--service", HEALTH_SERVICE]):
                errors.add(where, f"{name}.exec must run echokv-cli ... health --service {HEALTH_SERVICE}")
        else:
            errors.add(where, f"{name} is neither grpc nor exec")

    # Lifecycle: the grace period covers the preStop sleep and the server's drain.
    grace = pod.get("terminationGracePeriodSeconds", 30)
    pre = ((server.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
    sleep = as_int(pre[1], None) if len(pre) == 2 and pre[0] == "sleep" else None
    if sleep is None:
        errors.add(where, "preStop must be [sleep, N]")
    drain = as_int(flags.get("shutdown_grace", "0s").rstrip("s"))
    if sleep is not None and grace < sleep + drain:
        errors.add(where, f"terminationGracePeriodSeconds {grace} < preStop {sleep} + shutdown_grace {drain}")

    # Scrape annotations name the metrics port.
    ann = spec["template"]["metadata"].get("annotations") or {}
    if ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") != str(ports.get("metrics")):
        errors.add(where, "prometheus.io/port is not the metrics container port")
    if not by_kind.get("PodDisruptionBudget"):
        errors.add(where, "no PodDisruptionBudget")
    return {"sts": sts, "server": server, "flags": flags, "ports": ports}


def check_gateway(by_kind, server_info, errors):
    """The Envoy config: schema, then routes <-> replicas <-> Services <-> ports."""
    gws = [(w, o) for w, o in by_kind.get("Deployment", [])
           if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "gateway"]
    if not gws:
        return
    where, dep = gws[0]
    pod = dep["spec"]["template"]["spec"]
    envoy = next((c for c in pod["containers"] if c["name"] == "envoy"), None)
    if envoy is None:
        errors.add(where, "no envoy container")
        return
    config_path = envoy["args"][envoy["args"].index("--config-path") + 1]
    m = mounted_file(envoy, pod, config_path, where, errors, "--config-path")
    vol = next((v for v in pod["volumes"] if m and v["name"] == m["name"]), {})
    cm_name = (vol.get("configMap") or {}).get("name")
    cms = [o for _, o in by_kind.get("ConfigMap", []) if o["metadata"]["name"] == cm_name]
    key = os.path.basename(config_path)
    if not cms or key not in (cms[0].get("data") or {}):
        errors.add(where, f"Envoy config {config_path}: ConfigMap {cm_name!r} has no key {key}")
        return
    cwhere = f"ConfigMap/{cm_name} {key}"
    cfg = yaml.safe_load(cms[0]["data"][key])
    before = len(errors.items)
    schema_errors(load_schema("envoy-gateway.schema.json"), cfg, cwhere, errors)
    if len(errors.items) != before:
        return  # the cross checks below assume the structure

    if server_info is None:
        return
    sts, sports = server_info["sts"], server_info["ports"]
    replicas = sts["spec"].get("replicas", 1)
    headless = sts["spec"]["serviceName"]
    domain = f"{headless}.{NAMESPACE}.svc.cluster.local"
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    if len(clusters) != len(cfg["static_resources"]["clusters"]):
        errors.add(cwhere, "duplicate cluster names")
    used = {"admin"}
    gports = {p["name"]: p["containerPort"] for p in envoy.get("ports", []) or []}
    listeners = {l["name"]: l for l in cfg["static_resources"]["listeners"]}
    for api in ("grpc", "http"):
        if api == "http" and "http" not in sports:
            if "http" in listeners:
                errors.add(cwhere, "an http listener but the server has no HTTP port")
            continue
        lst = listeners.get(api)
        if lst is None:
            errors.add(cwhere, f"no {api} listener")
            continue
        if lst["address"]["socket_address"]["port_value"] != gports.get(api):
            errors.add(cwhere, f"listener {api} port differs from the envoy container port {api}")
        hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
        routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        owner_routes = routes[:-1]
        last = routes[-1]
        if last["match"].get("headers") or last["match"].get("prefix") != "/":
            errors.add(cwhere, f"{api}: the last route must be the catch-all for new sessions")
        ordinals = set()
        for r in owner_routes:
            hdr = (r["match"].get("headers") or [{}])[0]
            prefix = (hdr.get("string_match") or {}).get("prefix", "")
            pm = re.fullmatch(re.escape(sts["metadata"]["name"]) + r"-([0-9]+)\.", prefix)
            if hdr.get("name") != "x-echokv-session" or not pm:
                errors.add(cwhere, f"{api}: route {r['route']['cluster']} does not match "
                                   f"x-echokv-session by prefix <pod>. (got {hdr})")
                continue
            i = int(pm.group(1))
            ordinals.add(i)
            c = clusters.get(r["route"]["cluster"])
            if c is None:
                errors.add(cwhere, f"{api}: route to unknown cluster {r['route']['cluster']}")
                continue
            used.add(c["name"])
            addr = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            want = f"{sts['metadata']['name']}-{i}.{domain}"
            if addr["address"] != want:
                errors.add(cwhere, f"{api}: sessions of pod {i} go to {addr['address']}, not {want}")
            if addr["port_value"] != sports[api]:
                errors.add(cwhere, f"{api}: cluster {c['name']} port {addr['port_value']} is not the server's {sports[api]}")
            if c.get("type") != "STRICT_DNS":
                errors.add(cwhere, f"{api}: cluster {c['name']} must resolve the pod name (STRICT_DNS)")
        missing = set(range(replicas)) - ordinals
        if missing:
            errors.add(cwhere, f"{api}: no route for the sessions of pod(s) {sorted(missing)}")
        c = clusters.get(last["route"]["cluster"])
        if c is None:
            errors.add(cwhere, f"{api}: catch-all route to unknown cluster")
        else:
            used.add(c["name"])
            addr = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            if addr["address"] != domain or c.get("lb_policy") != "LEAST_REQUEST":
                errors.add(cwhere, f"{api}: new sessions must go least-request over {domain}")
        for r in routes:
            c = clusters.get(r["route"]["cluster"])
            if c is None:
                continue
            h2 = "typed_extension_protocol_options" in c
            if api == "grpc" and not h2:
                errors.add(cwhere, f"cluster {c['name']}: gRPC needs HTTP/2 upstream")
            for hc in c.get("health_checks", []):
                if "grpc_health_check" in hc and hc["grpc_health_check"].get("service_name") != HEALTH_SERVICE:
                    errors.add(cwhere, f"cluster {c['name']}: health check must ask {HEALTH_SERVICE}")
                if "grpc_health_check" in hc and not h2:
                    errors.add(cwhere, f"cluster {c['name']}: a gRPC health check needs HTTP/2")
            if r["route"].get("timeout") != "0s":
                errors.add(cwhere, f"route to {c['name']}: streams need timeout 0s (no route timeout)")
    for name in clusters:
        if name not in used:
            errors.add(cwhere, f"cluster {name} is never routed to")
    mport = cfg["admin"]["address"]["socket_address"]
    if mport["address"] not in ("127.0.0.1", "::1"):
        errors.add(cwhere, "the admin interface must listen on loopback only")
    # Every file Envoy reads is mounted.
    for fname in re.findall(r"filename: (\S+)", cms[0]["data"][key]):
        mounted_file(envoy, pod, fname, where, errors, "Envoy file")
    # The gateway Service exposes the listeners.
    svcs = [o for _, o in by_kind.get("Service", []) if o["metadata"]["name"] == dep["metadata"]["name"]]
    if not svcs:
        errors.add(where, "no gateway Service")


def check_test_hook(by_kind, errors):
    pods = [(w, o) for w, o in by_kind.get("Pod", [])
            if "test" in ((o["metadata"].get("annotations") or {}).get("helm.sh/hook", ""))]
    if not pods:
        return
    where, pod = pods[0]
    script = " ".join(pod["spec"]["containers"][0].get("command", []))
    services = {(o["metadata"]["name"], p["port"]) for _, o in by_kind.get("Service", [])
                for p in o["spec"].get("ports", [])}
    targets = re.findall(r"echokv-cli --server (\S+):([0-9]+)", script)
    if not targets:
        errors.add(where, "the test runs no echokv-cli --server HOST:PORT")
    for host, port in targets:
        if (host, int(port)) not in services:
            errors.add(where, f"the test calls {host}:{port}, which no rendered Service exposes")
    if f"health --service {HEALTH_SERVICE}" not in script or " info" not in script:
        errors.add(where, f"the test must run health --service {HEALTH_SERVICE} and info")


def check_manifests(text, external, errors):
    objs = parse_manifests(text)
    ext = []
    for e in external:
        kind, _, name = e.partition("/")
        ext.append((kind, name))
    by_kind = k8s_check.check_objects(objs, errors, external_names=ext)
    if by_kind is None:
        return None
    for where, sm in by_kind.get("ServiceMonitor", []):
        schema_errors(load_schema("servicemonitor.schema.json"), sm, where, errors)
    info = check_server(by_kind, errors)
    check_gateway(by_kind, info, errors)
    check_test_hook(by_kind, errors)
    return by_kind


# ------------------------------------------------------------------ commands

def run_case(renderer, chart, values, headers, label, expect_probe=None):
    """Renders and checks one case; returns the error list (empty = pass)."""
    kube = headers.get("kube-version")
    rc, out, err, notes = render(renderer, chart, values, kube, headers.get("api-versions", []))
    errors = k8s_check.Errors()
    if rc != 0:
        errors.add(label, f"render failed: {err.strip()}")
        return errors, None
    by_kind = check_manifests(out, headers.get("external", []), errors)
    if by_kind is None:
        return errors, None
    if not notes.strip():
        errors.add(label, "NOTES.txt rendered empty")
    if "<no value>" in out or "<no value>" in notes:
        errors.add(label, "<no value> in the output")
    if expect_probe and not errors:
        server = next(c for c in by_kind["StatefulSet"][0][1]["spec"]["template"]["spec"]["containers"]
                      if c["name"] == "echokv-server")
        if expect_probe not in server["livenessProbe"]:
            errors.add(label, f"expected {expect_probe} probes on Kubernetes {kube}")
    return errors, by_kind


def cmd_cases(args):
    missing, extra = server_flag_drift()
    if missing or extra:
        print("FAIL: the chart check's flag list differs from server/main.cc: unclassified "
              f"{missing}, gone {extra}")
        return 1
    tmp = tempfile.mkdtemp()
    try:
        cases = [("defaults (Kubernetes 1.29)", [], {"kube-version": "1.29.0", "api-versions": [],
                                                    "external": []}, "grpc"),
                 ("defaults (Kubernetes 1.27)", [], {"kube-version": "1.27.0", "api-versions": [],
                                                    "external": []}, "grpc"),
                 ("defaults (Kubernetes 1.23: exec probes)", [],
                  {"kube-version": "1.23.0", "api-versions": [], "external": []}, "exec")]
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
        for path in snippets:
            cases.append((f"DEPLOY.md {os.path.basename(path)}", [path], read_headers(path), None))
        # Every example is documented.
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
            errors, by_kind = run_case(args.renderer, args.chart, values, headers, label, probe)
            if errors:
                failed += 1
                print(f"FAIL {label}:")
                for e in errors.items:
                    print(f"  {e}")
            else:
                n = sum(len(v) for v in by_kind.values())
                print(f"ok   {label}: {n} objects")
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
                errors, _ = run_case(args.renderer, args.chart, [path], h, f)
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


# Planted errors: (name, template file, old text, new text, extra values, expected
# message). Each is applied to a copy of the chart; the check must fail with the
# message, which proves the check can see that kind of error.
BIG_VALUES = "limits:\n  maxKvBytes: 17179869184\n"
PLANTED = [
    ("typo-field", "templates/statefulset.yaml", "terminationGracePeriodSeconds:",
     "terminationGracePeriodSecond:", "", "unknown field of V1PodSpec (did you mean"),
    ("float-flag", "templates/configmap.yaml", "--max_kv_bytes={{ int64 .maxKvBytes }}",
     "--max_kv_bytes={{ .maxKvBytes }}", BIG_VALUES, "--max_kv_bytes=1.7179869184e+10: not an integer"),
    ("string-replicas", "templates/statefulset.yaml", "replicas: {{ int64 .Values.replicaCount }}",
     "replicas: {{ int64 .Values.replicaCount | quote }}", "", "spec.replicas: expected an integer, got string"),
    ("probe-service", "templates/_helpers.tpl", 'service: {{ $ctx.Values.probes.service | quote }}',
     'service: ""', "", "livenessProbe.grpc.service must be echokv.v1.EchoKV"),
    ("service-port-typo", "templates/service.yaml", "targetPort: grpc", "targetPort: grcp", "",
     "targetPort 'grcp' names no container port"),
    ("headless-selector", "templates/service-headless.yaml",
     'selector:\n    {{- include "echokv.selectorLabels" . | nindent 4 }}',
     "selector:\n    app: other", "", "selects no workload's pods"),
    ("envoy-field-typo", "templates/gateway-configmap.yaml", "lb_policy: {{ $t.lb }}",
     "lb_polcy: {{ $t.lb }}", "gateway:\n  enabled: true\n",
     "Additional properties are not allowed ('lb_polcy' was unexpected)"),
    ("envoy-route-off-by-one", "templates/gateway-configmap.yaml",
     'prefix: {{ printf "%s-%d." $fullname $i | quote }}',
     'prefix: {{ printf "%s-%d." $fullname (add1 $i) | quote }}', "replicaCount: 3\ngateway:\n  enabled: true\n",
     "no route for the sessions of pod(s) [0]"),
    ("unknown-flag", "templates/configmap.yaml", "--prefill_chunk=", "--prefil_chunk=", "",
     "--prefil_chunk: echokv-server has no such flag"),
    ("grace-too-short", "templates/_helpers.tpl", "{{- if eq $set 0 }}{{ $needed }}",
     "{{- if eq $set 0 }}{{ 10 }}", "", "terminationGracePeriodSeconds 10 < preStop 5 + shutdown_grace 20"),
]


def plant(chart_copy, name):
    entry = next((p for p in PLANTED if p[0] == name), None)
    if entry is None:
        raise SystemExit(f"unknown planted error {name!r}; known: {[p[0] for p in PLANTED]}")
    _, rel, old, new, values, expect = entry
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
    return vfile, expect


def cmd_planted(args):
    failed = 0
    for name, *_ in PLANTED:
        tmp = tempfile.mkdtemp()
        try:
            chart_copy = os.path.join(tmp, "echokv")
            shutil.copytree(args.chart, chart_copy)
            vfile, expect = plant(chart_copy, name)
            headers = {"kube-version": None, "api-versions": [], "external": []}
            errors, _ = run_case(args.renderer, chart_copy, [vfile] if vfile else [], headers, name)
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
        if args.plant:
            chart = os.path.join(tmp, "echokv")
            shutil.copytree(args.chart, chart)
            vfile, _ = plant(chart, args.plant)
            if vfile:
                values.append(vfile)
        headers = {"kube-version": args.kube_version, "api-versions": args.api_versions,
                   "external": args.external}
        for v in args.values:
            h = read_headers(v)
            headers["external"] += h["external"]
        errors, by_kind = run_case(args.renderer, chart, values, headers, "render")
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
    r = sub.add_parser("render")
    r.add_argument("-f", "--values", action="append", default=[])
    r.add_argument("--kube-version")
    r.add_argument("--api-versions", action="append", default=[])
    r.add_argument("--external", action="append", default=[], help="Kind/name that exists outside the chart")
    r.add_argument("--plant", help="apply one planted error first (the check must then fail)")
    args = p.parse_args()
    return {"cases": cmd_cases, "schema": cmd_schema, "planted": cmd_planted, "render": cmd_render}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
