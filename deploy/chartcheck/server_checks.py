"""Checks of the rendered server side of the chart: the StatefulSet (flags, threads,
memory, GPU, probes, lifecycle, the scale-down drain), the HTTP API's TLS proxy, the
helm test hook and the autoscaler. Each check names the defect of issue 32 it guards
(D1 .. D8) where it has one; docs/DEPLOY.md "How the chart is checked" lists them.

    info = check_server(by_kind, errors)      # None when there is no StatefulSet
    check_test_hook(by_kind, info, errors)
    check_autoscaling(by_kind, info, errors)
"""

import os
import re

import yaml

from chart_common import (HEALTH_SERVICE, NAMESPACE, address_family, as_int, ceil_div, check_flag,
                          cli_lines, is_dns_name, mounted_file, parse_cli, parse_flags, parse_quantity,
                          seconds, server_metrics, volume_of)

LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}


def family_of_services(by_kind):
    """The address family the Services ask for: 'ipv4', 'ipv6', 'dual' (None: unset)."""
    fams = set()
    for _, svc in by_kind.get("Service", []):
        f = svc["spec"].get("ipFamilies")
        if f:
            fams.add("dual" if len(f) > 1 else f[0].lower())
    return fams.pop() if len(fams) == 1 else None


def configmap_key(by_kind, container, pod, path, where, errors, what):
    """The text of the ConfigMap key mounted at `path`, or None (reported)."""
    m = mounted_file(container, pod, path, where, errors, what)
    vol = next((v for v in pod.get("volumes", []) if m and v["name"] == m["name"]), {})
    cm_name = (vol.get("configMap") or {}).get("name")
    cms = [o for _, o in by_kind.get("ConfigMap", []) if o["metadata"]["name"] == cm_name]
    key = os.path.basename(path)
    if not cms or key not in (cms[0].get("data") or {}):
        errors.add(where, f"{what} {path}: ConfigMap {cm_name!r} has no key {key}")
        return None, None
    return cms[0]["data"][key], f"ConfigMap/{cm_name} {key}"


def check_cli_tls(cli, info, container, pod, where, errors, what, server_name=True):
    """D1/D5: an echokv-cli call to this release's servers carries the TLS flags the
    servers require: with TLS a CA (mounted) and, when it dials an address that is not
    in the certificate (localhost, a Service name), --tls-server-name with a DNS name;
    with mTLS a client certificate and key (mounted); on plaintext no TLS flag (the
    handshake would fail)."""
    g = cli.globals
    if info["tls"]:
        if "tls-ca" not in g:
            errors.add(where, f"{what}: the server speaks TLS but the call has no --tls-ca (it cannot verify the server)")
        else:
            mounted_file(container, pod, g["tls-ca"], where, errors, f"{what} --tls-ca")
        if server_name and not is_dns_name(g.get("tls-server-name")):
            errors.add(where, f"{what}: dials {g.get('server')} over TLS without --tls-server-name naming a DNS "
                              f"name of the certificate (got {g.get('tls-server-name')!r}): the name check fails")
        if info["mtls"]:
            for f in ("tls-cert", "tls-key"):
                if f not in g:
                    errors.add(where, f"{what}: the server requires client certificates (--tls_client_ca) "
                                      f"but the call has no --{f}")
                else:
                    mounted_file(container, pod, g[f], where, errors, f"{what} --{f}")
    else:
        for f in ("tls-ca", "tls-cert", "tls-key", "tls-server-name"):
            if f in g:
                errors.add(where, f"{what}: --{f} against a plaintext server (the TLS handshake fails)")


def check_server(by_kind, errors):
    """The StatefulSet and its flags, threads, memory, GPU, probes and lifecycle."""
    stss = by_kind.get("StatefulSet", [])
    if len(stss) != 1:
        errors.add("chart", f"expected one StatefulSet, got {len(stss)}")
        return None
    where, sts = stss[0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    ann = sts["metadata"].get("annotations") or {}
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
    sidecars = [c for c in pod.get("initContainers", []) or [] if c.get("restartPolicy") == "Always"]

    # Flags: the flagfile of the ConfigMap plus the container args.
    args = server.get("args", []) or []
    flagfile = next((a.split("=", 1)[1] for a in args if a.startswith("--flagfile=")), None)
    flags = {}
    if flagfile is None:
        errors.add(where, "no --flagfile argument")
    else:
        text, fwhere = configmap_key(by_kind, server, pod, flagfile, where, errors, "--flagfile")
        if text is not None:
            flags = parse_flags(text, fwhere, errors)
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
    for f in ("auth_tokens_file", "tls_cert", "tls_key", "tls_client_ca"):
        if f in flags:
            mounted_file(server, pod, flags[f], where, errors, f"--{f}")
    if ("auth_tokens_file" in flags) == (flags.get("insecure") == "true"):
        errors.add(where, "exactly one of --auth_tokens_file and --insecure=true must be set")
    info = {"where": where, "sts": sts, "pod": pod, "server": server, "flags": flags, "ports": ports,
            "tls": "tls_cert" in flags, "mtls": "tls_client_ca" in flags,
            "tokens": "auth_tokens_file" in flags, "sidecars": sidecars,
            "family": family_of_services(by_kind)}

    # D8: the listen address matches the cluster's address family.
    host = env.get("ECHOKV_HOST", {}).get("value")
    fam = address_family(host or "")
    if fam is None:
        errors.add(where, f"ECHOKV_HOST={host!r} is not a wildcard address")
    elif info["family"] == "ipv4" and fam != "ipv4":
        errors.add(where, f"ECHOKV_HOST={host}: an IPv6 wildcard on an IPv4-only cluster (fails to bind where "
                          "the node has IPv6 off)")
    elif info["family"] in ("ipv6", "dual") and fam != "ipv6":
        errors.add(where, f"ECHOKV_HOST={host}: an IPv4 wildcard on a {info['family']} cluster serves no IPv6")

    # D7: threads never exceed the CPU the pod may use (the request rounded down).
    resources = server.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    for e in env.values():
        if ((e.get("valueFrom") or {}).get("resourceFieldRef") or {}).get("resource", "").endswith("cpu"):
            errors.add(where, f"env {e['name']} from {e['valueFrom']['resourceFieldRef']['resource']}: the Downward "
                              "API rounds CPU up (2500m -> 3 threads on 2.5 cores)")
    if "threads" in flags and "cpu" in requests:
        # At most the whole cores of the CPU limit, else of the request.
        t = as_int(flags["threads"])
        bound, of = (limits["cpu"], "limit") if "cpu" in limits else (requests["cpu"], "request")
        cores = max(1, int(parse_quantity(bound)))
        if t > cores:
            errors.add(where, f"--threads={t} exceeds the CPU {of} {bound} (at most {cores} whole cores): "
                              "decode collapses with more threads than cores")
    elif "cpu" in requests and "threads" not in flags:
        errors.add(where, "a CPU request but no --threads: the server would guess from the node")

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

    check_memory(info, ann, requests, limits, errors)
    check_probes(info, errors)
    check_lifecycle(info, by_kind, errors)
    check_http_tls(info, by_kind, errors)

    # D8: one scrape configuration, not two.
    pann = spec["template"]["metadata"].get("annotations") or {}
    if pann.get("prometheus.io/scrape") == "true":
        if pann.get("prometheus.io/port") != str(ports.get("metrics")):
            errors.add(where, "prometheus.io/port is not the metrics container port")
        if by_kind.get("ServiceMonitor"):
            errors.add(where, "prometheus.io/scrape annotations and a ServiceMonitor: a Prometheus that honours "
                              "both scrapes every pod twice")
    if not by_kind.get("PodDisruptionBudget"):
        errors.add(where, "no PodDisruptionBudget")
    return info


def check_memory(info, ann, requests, limits, errors):
    """Memory: at least the KV budgets held in host memory. D6: on CUDA the hot tier
    and the weights live on the device and must not be counted as host memory; the
    GPU limit is one device, /dev/shm is a memory emptyDir counted in the request."""
    where, flags, pod, server = info["where"], info["flags"], info["pod"], info["server"]
    cuda = flags.get("device", "cpu").startswith("cuda")
    mem = requests.get("memory")
    cold = as_int(flags.get("max_cold_bytes")) if flags.get("default_memory") == "tiered" else 0
    shm = 0
    dshm = next((v for v in pod.get("volumes", []) or [] if v["name"] == "dshm"), None)
    if dshm is not None:
        shm = int(parse_quantity((dshm.get("emptyDir") or {}).get("sizeLimit", "0")))
    need = cold + shm + (0 if cuda else as_int(flags.get("max_kv_bytes")))
    if mem is None or parse_quantity(mem) < need:
        errors.add(where, f"memory request {mem} is below the host-resident budgets ({need} bytes)")
    if "memory" in limits and mem is not None and parse_quantity(limits["memory"]) < parse_quantity(mem):
        errors.add(where, "memory limit below the request")
    terms = ann.get("echokv.io/host-memory")
    if terms is not None and mem is not None:
        parts = dict((k, int(v)) for k, v in re.findall(r"([a-z]+) ([0-9]+)", terms))
        total = sum(parts.values())
        if parse_quantity(mem) != ceil_div(total, 2**20) * 2**20:
            errors.add(where, f"memory request {mem} is not the sum of echokv.io/host-memory ({terms})")
        if cuda and ("hot" in parts or "weights" in parts):
            errors.add(where, "on CUDA the host memory counts the hot tier / the weights, which live in device "
                              f"memory ({terms})")
        if not cuda and parts.get("hot") != as_int(flags.get("max_kv_bytes")):
            errors.add(where, f"echokv.io/host-memory's hot term is not --max_kv_bytes ({terms})")
        if parts.get("cold", 0) != cold:
            errors.add(where, f"echokv.io/host-memory's cold term is not the tiered cold budget {cold} ({terms})")
        if parts.get("shm", 0) != shm:
            errors.add(where, f"echokv.io/host-memory's shm term is not /dev/shm's size {shm} ({terms})")
    gpus = {k: v for k, v in limits.items() if k.endswith("/gpu")}
    if cuda:
        if list(gpus.values()) != [1]:
            errors.add(where, f"--device={flags['device']} needs exactly one GPU in the limits (got {gpus}): "
                              "echokv-server uses one device")
        if flags["device"] not in ("cuda", "cuda:0"):
            errors.add(where, f"--device={flags['device']}: the pod's one GPU is cuda:0")
        m = next((m for m in server.get("volumeMounts", []) or [] if m["mountPath"] == "/dev/shm"), None)
        if m is None or dshm is None or m["name"] != "dshm" or (dshm.get("emptyDir") or {}).get("medium") != "Memory":
            errors.add(where, "CUDA without a memory-backed /dev/shm (emptyDir medium Memory)")
    elif gpus:
        errors.add(where, f"GPUs {gpus} requested for --device={flags.get('device', 'cpu')}")


def check_probes(info, errors):
    """Probes ask for the engine's health service. D1: on a TLS server they are exec
    probes with the CA, the certificate's name and (mTLS) a client certificate."""
    where, server, pod, ports = info["where"], info["server"], info["pod"], info["ports"]
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = server.get(name)
        if probe is None:
            continue
        if "grpc" in probe:
            if probe["grpc"].get("service") != HEALTH_SERVICE:
                errors.add(where, f"{name}.grpc.service must be {HEALTH_SERVICE} (\"\" is answered by gRPC itself)")
            if probe["grpc"].get("port") != ports.get("grpc"):
                errors.add(where, f"{name}.grpc.port is not the grpc container port")
            if info["tls"]:
                errors.add(where, f"{name}: kubelet's gRPC probe speaks plaintext to a TLS server")
        elif "exec" in probe:
            cmd = probe["exec"].get("command", [])
            cli = parse_cli(cmd)
            if (not cmd or cmd[0] != "echokv-cli" or cli.command != "health"
                    or cli.flags.get("service") != HEALTH_SERVICE):
                errors.add(where, f"{name}.exec must run echokv-cli ... health --service {HEALTH_SERVICE}")
                continue
            if cli.globals.get("server") != f"localhost:{ports.get('grpc')}":
                errors.add(where, f"{name}.exec dials {cli.globals.get('server')}, not localhost:{ports.get('grpc')}")
            check_cli_tls(cli, info, server, pod, where, errors, name)
            for f in ("token", "token-file"):
                if f in cli.globals:
                    errors.add(where, f"{name}: --{f} in a probe (the health service needs none; a token in "
                                      "the pod spec leaks it)")
        else:
            errors.add(where, f"{name} is neither grpc nor exec")


def check_lifecycle(info, by_kind, errors):
    """The preStop hook: the drain of a scaled-away pod (when rendered), then the sleep;
    D3: the grace period covers the drain, the sleep and the server's shutdown, and the
    shutdown covers the longest generation (limits.maxNewTokens at the slowest rate)."""
    where, server, pod, flags, sts = info["where"], info["server"], info["pod"], info["flags"], info["sts"]
    pre = ((server.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
    script = pre[2] if len(pre) == 3 and pre[:2] == ["/bin/sh", "-c"] else None
    if script is None:
        errors.add(where, "preStop must be [/bin/sh, -c, SCRIPT]")
        return
    lines = [l.strip() for l in script.strip().splitlines() if l.strip()]
    m = re.fullmatch(r"sleep ([0-9]+)", lines[-1]) if lines else None
    if not m:
        errors.add(where, "the preStop script must end with `sleep N`")
        return
    sleep = int(m.group(1))
    drains = [c for c in cli_lines(script) if c.command == "drain"]
    deadline = 0
    if drains:
        deadline = check_drain(info, drains[0], by_kind, errors)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    shutdown = seconds(flags.get("shutdown_grace", "0s"))
    if grace < deadline + sleep + shutdown:
        errors.add(where, f"terminationGracePeriodSeconds {grace} < drain {deadline} + preStop {sleep} + "
                          f"shutdown_grace {shutdown}")
    rate = as_int((sts["metadata"].get("annotations") or {}).get("echokv.io/slowest-tokens-per-second"), 0)
    if rate <= 0:
        errors.add(where, "no echokv.io/slowest-tokens-per-second annotation (the rate the shutdown is sized for)")
    else:
        longest = ceil_div(as_int(flags.get("max_new_tokens"), 1024), rate)
        if shutdown < longest:
            errors.add(where, f"--shutdown_grace={flags.get('shutdown_grace')} is shorter than the longest "
                              f"generation ({flags.get('max_new_tokens')} tokens at {rate}/s = {longest} s): "
                              "a rollout cuts it")


def check_drain(info, cli, by_kind, errors):
    """The scale-down drain (preStop): it reads this StatefulSet's spec.replicas with a
    token that may do exactly that, exports to the other pods by their headless names,
    with the credentials the servers require. Returns its --deadline."""
    where, server, pod, sts, ports = info["where"], info["server"], info["pod"], info["sts"], info["ports"]
    name = sts["metadata"]["name"]
    f = cli.flags
    if cli.globals.get("server") != f"localhost:{ports.get('grpc')}":
        errors.add(where, f"drain: --server {cli.globals.get('server')} is not localhost:{ports.get('grpc')}")
    if f.get("statefulset") != name:
        errors.add(where, f"drain: --statefulset {f.get('statefulset')!r} is not {name!r}")
    if f.get("pod") != "$POD_NAME":
        errors.add(where, "drain: --pod must be $POD_NAME")
    domain = f"{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
    want = "{pod}." + f"{domain}:{ports.get('grpc')}"
    if f.get("peer") != want:
        errors.add(where, f"drain: --peer {f.get('peer')!r} is not {want!r} (the pods' headless names)")
    kube = f.get("kube-dir")
    if not kube:
        errors.add(where, "drain: no --kube-dir (the API token it reads spec.replicas with)")
    else:
        for file in ("token", "ca.crt", "namespace"):
            mounted_file(server, pod, f"{kube}/{file}", where, errors, "drain --kube-dir")
        vol = volume_of(server, pod, f"{kube}/token") or {}
        if "serviceAccountToken" not in str(vol.get("projected", {})):
            errors.add(where, "drain --kube-dir is not a projected serviceAccountToken volume")
        check_drain_rbac(info, by_kind, errors)
    if info["tokens"]:
        if "token-dir" not in f:
            errors.add(where, "drain: the server checks tokens but the drain has no --token-dir (a session can only "
                              "be exported by its tenant)")
        else:
            mounted_file(server, pod, f["token-dir"], where, errors, "drain --token-dir")
    check_cli_tls(cli, info, server, pod, where, errors, "drain")
    deadline = as_int(f.get("deadline"), 0)
    if deadline <= 0:
        errors.add(where, "drain: no --deadline")
    for nwhere, np in by_kind.get("NetworkPolicy", []):
        peers = [p for r in np["spec"].get("ingress", []) or [] for p in r.get("from", []) or []]
        sel = sts["spec"]["selector"]["matchLabels"]
        if not any((p.get("podSelector") or {}).get("matchLabels") == sel for p in peers):
            errors.add(nwhere, "the NetworkPolicy does not let the server pods reach each other (the drain "
                               "imports into them)")
    return deadline


def check_drain_rbac(info, by_kind, errors):
    where, pod, name = info["where"], info["pod"], info["sts"]["metadata"]["name"]
    sa = pod.get("serviceAccountName", "default")
    roles = {o["metadata"]["name"]: o for _, o in by_kind.get("Role", [])}
    ok = False
    for _, rb in by_kind.get("RoleBinding", []):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace") == NAMESPACE
                   for s in rb.get("subjects", []) or []):
            continue
        role = roles.get(rb["roleRef"]["name"]) if rb["roleRef"]["kind"] == "Role" else None
        for rule in (role or {}).get("rules", []) or []:
            if ("apps" in rule.get("apiGroups", []) and "statefulsets" in rule.get("resources", [])
                    and "get" in rule.get("verbs", []) and name in rule.get("resourceNames", [name])):
                ok = True
            if "*" in rule.get("verbs", []) or "*" in rule.get("resources", []) or not rule.get("resourceNames"):
                errors.add(where, f"Role {role['metadata']['name']}: grants more than get on StatefulSet {name}")
    if not ok:
        errors.add(where, f"no Role bound to ServiceAccount {sa} lets the drain get StatefulSet {name}")


def envoy_listener(cfg, port):
    for l in cfg.get("static_resources", {}).get("listeners", []) or []:
        if l["address"]["socket_address"]["port_value"] == port:
            return l
    return None


def check_http_tls(info, by_kind, errors):
    """D2: with TLS on, no port carries bearer tokens in plaintext. The server's HTTP
    door (plaintext only) listens on loopback and a native sidecar serves the pod's
    http port with the server's certificate (client certificates required under mTLS),
    forwarding to it; without TLS the server serves the http port itself."""
    import envoy_checks  # the schema of the Envoy configs
    where, flags, pod, server = info["where"], info["flags"], info["pod"], info["server"]
    if "http_port" not in flags:
        return
    http_host = flags.get("http_host", "")
    sidecar_http = [(c, p) for c in info["sidecars"] for p in c.get("ports", []) or [] if p.get("name") == "http"]
    if not info["tls"]:
        if http_host in LOOPBACK:
            errors.add(where, "--http_host is loopback but nothing forwards to it")
        if info["ports"].get("http") != as_int(flags["http_port"]):
            errors.add(where, "--http_port differs from the http container port")
        return
    if http_host not in LOOPBACK:
        errors.add(where, f"the server speaks TLS but its HTTP door (--http_port={flags['http_port']}, plaintext) "
                          f"listens on {http_host or flags.get('host') or 'every address'}: bearer tokens in plaintext")
    if "http" in info["ports"]:
        errors.add(where, "the server container exposes a plaintext http port next to TLS gRPC")
    if not sidecar_http:
        errors.add(where, "TLS with the HTTP API on, but no sidecar serves the http port with TLS")
        return
    proxy, port = sidecar_http[0]
    cpath = proxy["args"][proxy["args"].index("--config-path") + 1] if "--config-path" in proxy.get("args", []) else None
    if cpath is None:
        errors.add(where, f"sidecar {proxy['name']}: no --config-path")
        return
    text, cwhere = configmap_key(by_kind, proxy, pod, cpath, where, errors, f"sidecar {proxy['name']} --config-path")
    if text is None:
        return
    cfg = yaml.safe_load(text)
    if not envoy_checks.schema_ok(cfg, cwhere, errors):
        return
    lst = envoy_listener(cfg, port["containerPort"])
    if lst is None:
        errors.add(cwhere, f"no listener on the http container port {port['containerPort']}")
        return
    envoy_checks.check_listen_family(lst, info["family"], cwhere, errors)
    chain = lst["filter_chains"][0]
    ts = chain.get("transport_socket")
    if ts is None:
        errors.add(cwhere, f"the http port {port['containerPort']} is served in plaintext: bearer tokens in "
                           "plaintext (and the gateway's upstream TLS meets no TLS)")
        return
    tc = ts["typed_config"]
    certs = tc["common_tls_context"].get("tls_certificates", [])
    if not certs or certs[0]["certificate_chain"]["filename"] != flags["tls_cert"]:
        errors.add(cwhere, f"the http port's certificate is not the server's --tls_cert {flags['tls_cert']}")
    for c in certs:
        for k in ("certificate_chain", "private_key"):
            mounted_file(proxy, pod, c[k]["filename"], where, errors, f"sidecar {proxy['name']} {k}")
    if info["mtls"]:
        ca = ((tc["common_tls_context"].get("validation_context") or {}).get("trusted_ca") or {}).get("filename")
        if not tc.get("require_client_certificate") or ca is None:
            errors.add(cwhere, "the server requires client certificates on gRPC but the http port does not")
        else:
            mounted_file(proxy, pod, ca, where, errors, f"sidecar {proxy['name']} client CA")
    hcm = chain["filters"][0]["typed_config"]
    cluster_names = {r["route"]["cluster"] for vh in hcm["route_config"]["virtual_hosts"] for r in vh["routes"]}
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] not in cluster_names:
            continue
        addr = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        if addr["address"] not in LOOPBACK or addr["port_value"] != as_int(flags["http_port"]):
            errors.add(cwhere, f"cluster {c['name']} forwards to {addr['address']}:{addr['port_value']}, not the "
                               f"server's HTTP door {http_host}:{flags['http_port']}")


def check_test_hook(by_kind, info, errors):
    """helm test: every call reaches a rendered Service. D5: with the credentials the
    servers require (a token with auth on, TLS flags); D8: it may schedule where the
    servers do (their tolerations)."""
    pods = [(w, o) for w, o in by_kind.get("Pod", [])
            if "test" in ((o["metadata"].get("annotations") or {}).get("helm.sh/hook", ""))]
    if not pods:
        return
    where, tpod = pods[0]
    spec = tpod["spec"]
    c = spec["containers"][0]
    script = c.get("command", [])[-1] if c.get("command") else ""
    services = {(o["metadata"]["name"], p["port"]): o for _, o in by_kind.get("Service", [])
                for p in o["spec"].get("ports", [])}
    calls = cli_lines(script)
    if not calls:
        errors.add(where, "the test runs no echokv-cli --server HOST:PORT")
    gw_tls = gateway_listener_tls(by_kind)
    for cli in calls:
        host, _, port = (cli.globals.get("server") or "").rpartition(":")
        svc = services.get((host, as_int(port)))
        if svc is None:
            errors.add(where, f"the test calls {cli.globals.get('server')}, which no rendered Service exposes")
            continue
        is_gw = (svc["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "gateway"
        what = f"helm test {cli.command} on {cli.globals.get('server')}"
        if info is not None and not is_gw:
            check_cli_tls(cli, info, c, spec, where, errors, what)
        elif is_gw:
            if gw_tls and ("tls-ca" not in cli.globals or not is_dns_name(cli.globals.get("tls-server-name"))):
                errors.add(where, f"{what}: the gateway speaks TLS but the call has no --tls-ca / --tls-server-name")
            if not gw_tls and "tls-ca" in cli.globals:
                errors.add(where, f"{what}: --tls-ca against the gateway's plaintext listener")
        if info is not None and info["tokens"] and cli.command != "health":
            tf = cli.globals.get("token-file")
            if tf is None:
                errors.add(where, f"{what}: the servers check tokens, and {cli.command} needs one: no --token-file")
            else:
                mounted_file(c, spec, tf, where, errors, f"{what} --token-file")
    if f"health --service {HEALTH_SERVICE}" not in script or " info" not in script:
        errors.add(where, f"the test must run health --service {HEALTH_SERVICE} and info")
    if info is not None:
        stol = info["pod"].get("tolerations") or []
        ttol = spec.get("tolerations") or []
        missing = [t for t in stol if t not in ttol]
        if missing:
            errors.add(where, f"the test pod lacks the servers' tolerations {missing}: on a tainted pool (GPU "
                              "nodes) it never schedules")


def gateway_listener_tls(by_kind):
    """True when the gateway's gRPC listener speaks TLS."""
    for _, cm in by_kind.get("ConfigMap", []):
        if (cm["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "gateway":
            cfg = yaml.safe_load((cm.get("data") or {}).get("envoy.yaml", "{}")) or {}
            for l in cfg.get("static_resources", {}).get("listeners", []) or []:
                if l["name"] == "grpc":
                    return "transport_socket" in l["filter_chains"][0]
    return False


def check_autoscaling(by_kind, info, errors):
    """An autoscaler scales the StatefulSet on a metric the server exports, per pod,
    and down one pod at a time after a stabilization window (each pod that goes
    drains first); the StatefulSet then leaves replicas to it."""
    scalers = by_kind.get("HorizontalPodAutoscaler", []) + by_kind.get("ScaledObject", [])
    if not scalers or info is None:
        return
    sts, where = info["sts"], info["where"]
    exported = server_metrics()
    if len(scalers) > 1:
        errors.add(where, "more than one autoscaler for the StatefulSet")
    if "replicas" in sts["spec"]:
        errors.add(where, "spec.replicas is rendered while an autoscaler owns it: every helm upgrade would reset it")
    for swhere, s in scalers:
        ref = s["spec"]["scaleTargetRef"]
        if ref.get("kind") != "StatefulSet" or ref.get("name") != sts["metadata"]["name"]:
            errors.add(swhere, f"scaleTargetRef {ref} is not StatefulSet {sts['metadata']['name']}")
        if s["kind"] == "HorizontalPodAutoscaler":
            behavior = s["spec"].get("behavior") or {}
            for m in s["spec"].get("metrics", []):
                if m.get("type") != "Pods":
                    errors.add(swhere, f"metric of type {m.get('type')}: scale on a per-pod serving signal")
                    continue
                name = m["pods"]["metric"]["name"]
                if name not in exported or name not in ("echokv_streams_in_flight", "echokv_engine_queue_depth"):
                    errors.add(swhere, f"metric {name} is not a serving signal echokv-server exports")
            maxr = s["spec"]["maxReplicas"]
        else:
            behavior = ((s["spec"].get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior") or {}
            for t in s["spec"]["triggers"]:
                q = t["metadata"].get("query", "")
                names = set(re.findall(r"\b(echokv_[a-z_]+)\b", q))
                if t["type"] != "prometheus" or not names or not names <= exported:
                    errors.add(swhere, f"trigger {t['type']} {q!r}: not a Prometheus query on the server's metrics")
                if f'namespace="{NAMESPACE}"' not in q:
                    errors.add(swhere, f"trigger query {q!r} does not select this release's namespace")
                if t.get("metricType", "AverageValue") != "AverageValue":
                    errors.add(swhere, "the trigger's target must be per replica (AverageValue)")
            maxr = s["spec"].get("maxReplicaCount", 100)
        down = behavior.get("scaleDown") or {}
        pols = down.get("policies") or []
        if (down.get("stabilizationWindowSeconds", 0) < 60 or not pols
                or any(p["type"] != "Pods" or p["value"] > 1 for p in pols)):
            errors.add(swhere, "scale-down must remove at most one pod per period after a stabilization window "
                               "(each drains its sessions first)")
        info["max_replicas"] = maxr
