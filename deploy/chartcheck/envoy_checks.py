"""Checks of the rendered Envoy gateway: its config against envoy-gateway.schema.json
(the subset of Envoy's v3 API the chart uses, every object closed), then against the
servers: a route per pod on the x-echokv-session prefix to that pod's headless name,
the heirs' fallback routes of the scale-down drain, a least-request catch-all, health
checks that mean something (D4), retries only where they are safe (D4), TLS that
matches the servers' ports (D2), the overload manager and a current Envoy (D4), and a
shutdown that drains (D3); the pod spreads over nodes (D8).

    check_gateway(by_kind, server_info, errors)
"""

import json
import os
import re

import jsonschema
import yaml

from chart_common import HEALTH_SERVICE, NAMESPACE, address_family, as_int, mounted_file, seconds

HERE = os.path.dirname(os.path.abspath(__file__))
# The Envoy release whose API envoy-gateway.schema.json was checked against
# (data-plane-api 84e84367, 2026-01-29): an older image may lack what the config uses.
ENVOY_API_LINE = (1, 37)
# The calls that may be sent twice: reads (and the health check).
IDEMPOTENT_GRPC = {"GetServerInfo", "GetSession", "ListSessions", "InspectCache", "ExportSession"}
# retry_on conditions under which a call never reached a server: safe for any call.
SAFE_RETRY = {"connect-failure", "refused-stream"}
# ... and those that mean "it did nothing": NOT_FOUND (gRPC status 5, HTTP 404).
NOT_FOUND_RETRY = {"retriable-headers", "retriable-status-codes"}


def _schema():
    with open(os.path.join(HERE, "envoy-gateway.schema.json")) as f:
        return json.load(f)


def schema_ok(cfg, where, errors):
    """Envoy config `cfg` against the schema; False (with the errors) when it fails."""
    v = jsonschema.Draft7Validator(_schema())
    errs = sorted(v.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    for e in errs:
        errors.add(where, f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}")
    return not errs


def check_listen_family(listener, family, where, errors):
    """D8: a listener binds the wildcard of the cluster's address family."""
    sa = listener["address"]["socket_address"]
    fam = address_family(sa["address"])
    if family == "ipv4" and fam != "ipv4":
        errors.add(where, f"listener {listener['name']} binds {sa['address']}: an IPv6 wildcard on an IPv4-only "
                          "cluster (fails where the node has IPv6 off)")
    if family == "dual" and not (fam == "ipv6" and sa.get("ipv4_compat")):
        errors.add(where, f"listener {listener['name']} binds {sa['address']} without ipv4_compat on a dual-stack "
                          "cluster")
    if family == "ipv6" and fam != "ipv6":
        errors.add(where, f"listener {listener['name']} binds {sa['address']} on an IPv6 cluster")


def _idempotent_match(match, api):
    """True when a route matches only idempotent calls (gRPC: the read methods and
    grpc.health.v1 Check by path; HTTP: GET)."""
    if api == "grpc":
        rx = (match.get("safe_regex") or {}).get("regex")
        if rx is None:
            return False
        samples = [f"/echokv.v1.EchoKV/{m}" for m in ("CreateSession", "AppendToSession", "Generate", "ForkSession",
                                                      "DeleteSession", "Compress", "ImportSession")]
        if any(re.search(rx, s) for s in samples):
            return False
        return all(re.search(rx, f"/echokv.v1.EchoKV/{m}") for m in IDEMPOTENT_GRPC)
    return any(h.get("name") == ":method" and (h.get("string_match") or {}).get("exact") in ("GET", "HEAD")
               for h in match.get("headers") or [])


def _header(match, name):
    return next((h for h in match.get("headers") or [] if h.get("name") == name), None)


def check_routes(api, hcm, clusters, sts, sports, replicas, errors, cwhere):
    """Routes <-> pods <-> clusters of one API; returns the names of the clusters used."""
    used = set()
    name = sts["metadata"]["name"]
    domain = f"{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    owner, heirs = {}, {}
    catchall = []
    for r in routes:
        match, action = r["match"], r["route"]
        hdr = _header(match, "x-echokv-session")
        c = clusters.get(action["cluster"])
        if c is None:
            errors.add(cwhere, f"{api}: route to unknown cluster {action['cluster']}")
            continue
        used.add(c["name"])
        if action.get("timeout") != "0s":
            errors.add(cwhere, f"route to {c['name']}: streams need timeout 0s (no route timeout)")
        check_retry(api, r, c, errors, cwhere)
        if hdr is None:
            catchall.append((r, c))
            continue
        prefix = (hdr.get("string_match") or {}).get("prefix", "")
        pm = re.fullmatch(re.escape(name) + r"-([0-9]+)\.", prefix)
        if not pm:
            errors.add(cwhere, f"{api}: route {c['name']} does not match x-echokv-session by prefix <pod>. (got {hdr})")
            continue
        i = int(pm.group(1))
        fb = _header(match, "x-echokv-fallback")
        hosts = [(e.get("priority", 0), lb["endpoint"]["address"]["socket_address"])
                 for e in c["load_assignment"]["endpoints"] for lb in e["lb_endpoints"]]
        for _, addr in hosts:
            if addr["port_value"] != sports[api]:
                errors.add(cwhere, f"{api}: cluster {c['name']} port {addr['port_value']} is not the server's {sports[api]}")
        if c.get("type") != "STRICT_DNS":
            errors.add(cwhere, f"{api}: cluster {c['name']} must resolve the pod names (STRICT_DNS)")
        if fb is None:
            owner.setdefault(i, []).append(c)
            want = f"{name}-{i}.{domain}"
            if [a["address"] for _, a in hosts] != [want]:
                errors.add(cwhere, f"{api}: sessions of pod {i} go to {[a['address'] for _, a in hosts]}, not {want}")
        else:
            heirs.setdefault(i, []).append(c)
            chain, j = [i], i
            while j > 0:
                j //= 2
                chain.append(j)
            want = [(p, f"{name}-{k}.{domain}") for p, k in enumerate(chain)]
            got = sorted((p, a["address"]) for p, a in hosts)
            if got != want:
                errors.add(cwhere, f"{api}: the fallback of pod {i} is {got}, not pod {i} then its heirs {want}")
    missing = sorted(set(range(replicas)) - set(owner))
    if missing:
        errors.add(cwhere, f"{api}: no route for the sessions of pod(s) {missing}")
    nofb = sorted(i for i in range(1, replicas) if i not in heirs)
    if nofb:
        errors.add(cwhere, f"{api}: no x-echokv-fallback route to the heirs of pod(s) {nofb} (drained sessions "
                           "unreachable)")
    if not catchall or routes[-1]["match"].get("headers") or routes[-1]["match"].get("prefix") != "/":
        errors.add(cwhere, f"{api}: the last route must be the catch-all for new sessions")
    for r, c in catchall:
        addr = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        if addr["address"] != domain or c.get("lb_policy") != "LEAST_REQUEST":
            errors.add(cwhere, f"{api}: new sessions must go least-request over {domain}")
        if "outlier_detection" not in c:
            errors.add(cwhere, f"{api}: cluster {c['name']} (new sessions over every pod) has no outlier detection")
    return used


def check_retry(api, route, cluster, errors, cwhere):
    """D4: retries only on idempotent calls, except where the call never reached a
    server or did nothing (NOT_FOUND, retried on the next of a pod's heirs)."""
    rp = route["route"].get("retry_policy")
    if rp is None:
        return
    conds = set(rp["retry_on"].split(","))
    unsafe = conds - SAFE_RETRY - NOT_FOUND_RETRY
    if unsafe and not _idempotent_match(route["match"], api):
        errors.add(cwhere, f"{api}: route to {cluster['name']} retries a non-idempotent call on {sorted(unsafe)} "
                           "(a Generate or Append could run twice)")
    if conds & NOT_FOUND_RETRY:
        if api == "grpc":
            hs = rp.get("retriable_headers") or []
            if [(h["name"], h.get("string_match")) for h in hs] != [("grpc-status", {"exact": "5"})]:
                errors.add(cwhere, f"{api}: route to {cluster['name']} retries on headers other than grpc-status 5")
        elif rp.get("retriable_status_codes") != [404]:
            errors.add(cwhere, f"{api}: route to {cluster['name']} retries on status codes other than 404")
        prios = {e.get("priority", 0) for e in cluster["load_assignment"]["endpoints"]}
        if len(prios) < 2 or (rp.get("retry_priority") or {}).get("name") != "envoy.retry_priorities.previous_priorities":
            errors.add(cwhere, f"{api}: a NOT_FOUND retry to {cluster['name']} must move to the next priority (heir)")
        if as_int(rp.get("num_retries")) < len(prios):
            errors.add(cwhere, f"{api}: {rp.get('num_retries')} retries cannot walk the {len(prios)} pods of "
                               f"{cluster['name']}")


def check_cluster_health(api, c, server_info, errors, cwhere):
    """D4: every upstream cluster health-checks what serves the API (gRPC health of the
    engine's service; the HTTP API's /health, not a TCP connect), never panics into
    unhealthy hosts, and speaks TLS exactly when the server port does (D2)."""
    hcs = c.get("health_checks") or []
    if not hcs:
        errors.add(cwhere, f"cluster {c['name']} has no health check")
    for hc in hcs:
        if "grpc_health_check" in hc:
            if api != "grpc":
                errors.add(cwhere, f"cluster {c['name']}: a gRPC health check on the HTTP API")
            if hc["grpc_health_check"].get("service_name") != HEALTH_SERVICE:
                errors.add(cwhere, f"cluster {c['name']}: health check must ask {HEALTH_SERVICE}")
        elif "http_health_check" in hc:
            if hc["http_health_check"]["path"] != "/health":
                errors.add(cwhere, f"cluster {c['name']}: the HTTP API's health is /health")
        else:
            errors.add(cwhere, f"cluster {c['name']} checks the {api} API by TCP only: a stuck or draining engine "
                               "still accepts connections (use /health or grpc.health.v1)")
    panic = ((c.get("common_lb_config") or {}).get("healthy_panic_threshold") or {}).get("value", 50)
    if panic != 0:
        errors.add(cwhere, f"cluster {c['name']}: healthy_panic_threshold {panic}: below it Envoy sends traffic to "
                           "unhealthy hosts (set 0)")
    opts = (c.get("typed_extension_protocol_options") or {}).get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {})
    h2 = "http2_protocol_options" in (opts.get("explicit_http_config") or {})
    if api == "grpc" and not h2:
        errors.add(cwhere, f"cluster {c['name']}: gRPC needs HTTP/2 upstream")
    if server_info is None:
        return
    port_tls = server_info["tls"]  # gRPC: the server's own TLS; HTTP: its TLS proxy
    up_tls = "transport_socket" in c
    if up_tls != port_tls:
        errors.add(cwhere, f"cluster {c['name']}: upstream {'TLS' if up_tls else 'plaintext'} to a "
                           f"{'TLS' if port_tls else 'plaintext'} {api} port")
    if up_tls:
        tc = c["transport_socket"]["typed_config"]
        if not (tc.get("auto_host_sni") and tc.get("auto_sni_san_validation")):
            errors.add(cwhere, f"cluster {c['name']}: upstream TLS without auto_host_sni / auto_sni_san_validation "
                               "(any certificate of the CA would pass for any pod)")
        ctx = tc["common_tls_context"]
        if server_info["mtls"] and not ctx.get("tls_certificates"):
            errors.add(cwhere, f"cluster {c['name']}: the servers require client certificates, the gateway has none")


def check_gateway(by_kind, server_info, errors):
    """The Envoy gateway's Deployment and config."""
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
    m = re.fullmatch(r"v([0-9]+)\.([0-9]+)(\.[0-9]+)?(-latest)?", envoy["image"].rpartition(":")[2])
    if not m:
        errors.add(where, f"Envoy image {envoy['image']}: tag is not vMAJOR.MINOR[-latest|.PATCH]")
    elif (int(m.group(1)), int(m.group(2))) < ENVOY_API_LINE:
        errors.add(where, f"Envoy image {envoy['image']} is older than v{ENVOY_API_LINE[0]}.{ENVOY_API_LINE[1]}, the "
                          "API the config was checked against (and out of Envoy's support window)")
    config_path = envoy["args"][envoy["args"].index("--config-path") + 1]
    mt = mounted_file(envoy, pod, config_path, where, errors, "--config-path")
    vol = next((v for v in pod["volumes"] if mt and v["name"] == mt["name"]), {})
    cm_name = (vol.get("configMap") or {}).get("name")
    cms = [o for _, o in by_kind.get("ConfigMap", []) if o["metadata"]["name"] == cm_name]
    key = os.path.basename(config_path)
    if not cms or key not in (cms[0].get("data") or {}):
        errors.add(where, f"Envoy config {config_path}: ConfigMap {cm_name!r} has no key {key}")
        return
    cwhere = f"ConfigMap/{cm_name} {key}"
    text = cms[0]["data"][key]
    cfg = yaml.safe_load(text)
    if not schema_ok(cfg, cwhere, errors):
        return  # the cross checks below assume the structure
    check_shutdown(dep, envoy, server_info, where, errors)
    check_overload(cfg, envoy, cwhere, errors)
    if pod.get("affinity", {}).get("podAntiAffinity") is None and not pod.get("topologySpreadConstraints"):
        errors.add(where, "the gateway pods have no anti-affinity / spread: one node can take every gateway down")
    if cfg["admin"]["address"]["socket_address"]["address"] not in ("127.0.0.1", "::1"):
        errors.add(cwhere, "the admin interface must listen on loopback only")
    for fname in re.findall(r"filename: (\S+)", text):
        mounted_file(envoy, pod, fname, where, errors, "Envoy file")
    svcs = [o for _, o in by_kind.get("Service", []) if o["metadata"]["name"] == dep["metadata"]["name"]]
    if not svcs:
        errors.add(where, "no gateway Service")
    if server_info is None:
        return
    sts, sports = server_info["sts"], dict(server_info["ports"])
    for c, p in [(c, p) for c in server_info["sidecars"] for p in c.get("ports", []) or []]:
        sports.setdefault(p["name"], p["containerPort"])
    replicas = max(sts["spec"].get("replicas", 1), server_info.get("max_replicas", 0))
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    if len(clusters) != len(cfg["static_resources"]["clusters"]):
        errors.add(cwhere, "duplicate cluster names")
    used = {"admin"}
    gports = {p["name"]: p["containerPort"] for p in envoy.get("ports", []) or []}
    listeners = {l["name"]: l for l in cfg["static_resources"]["listeners"]}
    for l in listeners.values():
        check_listen_family(l, server_info["family"], cwhere, errors)
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
        api_used = check_routes(api, hcm, clusters, sts, sports, replicas, errors, cwhere)
        for name in api_used:
            check_cluster_health(api, clusters[name], server_info, errors, cwhere)
            dns = clusters[name].get("dns_lookup_family")
            fam = server_info["family"]
            if (fam, dns) in (("ipv4", "V6_ONLY"), ("ipv6", "V4_ONLY")) or (fam == "ipv4" and dns not in ("V4_ONLY",)):
                errors.add(cwhere, f"cluster {name}: dns_lookup_family {dns} on an {fam} cluster")
        used |= api_used
    for name in clusters:
        if name not in used:
            errors.add(cwhere, f"cluster {name} is never routed to")


def check_shutdown(dep, envoy, server_info, where, errors):
    """D3: the preStop hook starts Envoy's graceful drain on its admin port and waits at
    least the servers' shutdown (the longest generation); the grace period covers it."""
    pre = ((envoy.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
    script = pre[-1] if pre else ""
    admin = next((a for a in re.findall(r"/dev/tcp/127\.0\.0\.1/([0-9]+)", script)), None)
    if "POST /drain_listeners?graceful" not in script or admin is None:
        errors.add(where, "the gateway's preStop does not drain Envoy's listeners (POST /drain_listeners?graceful): "
                          "SIGTERM alone closes every client connection at once")
    m = re.search(r"sleep ([0-9]+)\s*$", script)
    wait = int(m.group(1)) if m else 0
    args = envoy.get("args", [])
    drain_time = as_int(args[args.index("--drain-time-s") + 1]) if "--drain-time-s" in args else 600
    if drain_time > wait:
        errors.add(where, f"--drain-time-s {drain_time} exceeds the preStop wait {wait}")
    if server_info is not None:
        shutdown = seconds(server_info["flags"].get("shutdown_grace", "0s"))
        if wait < shutdown:
            errors.add(where, f"the gateway waits {wait} s on shutdown, less than the servers' shutdown_grace "
                              f"{shutdown} s: long generations through it are cut")
    grace = dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    if grace < wait:
        errors.add(where, f"gateway terminationGracePeriodSeconds {grace} < its drain {wait}")


def check_overload(cfg, envoy, cwhere, errors):
    """D4: an overload manager bounds connections and heap; its heap limit fits under
    the container's memory limit."""
    om = cfg.get("overload_manager")
    if om is None:
        errors.add(cwhere, "no overload manager: an overload grows Envoy into an OOM kill")
        return
    monitors = {m["name"]: m for m in om["resource_monitors"]}
    for need in ("envoy.resource_monitors.fixed_heap", "envoy.resource_monitors.global_downstream_max_connections"):
        if need not in monitors:
            errors.add(cwhere, f"overload manager without {need}")
    for a in om.get("actions", []) or []:
        for t in a["triggers"]:
            if t["name"] not in monitors:
                errors.add(cwhere, f"overload action {a['name']} triggers on undefined monitor {t['name']}")
    if not any(a["name"] == "envoy.overload_actions.stop_accepting_requests" for a in om.get("actions", []) or []):
        errors.add(cwhere, "overload manager never stops accepting requests")
    heap = monitors.get("envoy.resource_monitors.fixed_heap", {}).get("typed_config", {}).get("max_heap_size_bytes")
    limit = ((envoy.get("resources") or {}).get("limits") or {}).get("memory")
    if heap is not None and limit is not None:
        from chart_common import parse_quantity
        if heap >= parse_quantity(limit):
            errors.add(cwhere, f"max_heap_size_bytes {heap} is not below the memory limit {limit}")
