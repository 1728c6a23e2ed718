"""What the chart checks share: the server's flags and metrics (read from the
sources, so the checks follow the server), quantities, mounts, echokv-cli command
lines and the address families.

    flags = parse_flags(flagfile_text, "ConfigMap/echokv echokv.flags", errors)
    cli = parse_cli(["echokv-cli", "--server", "localhost:50051", "--tls-ca", "/x", "health"])
    cli.globals["tls-ca"], cli.command             # "/x", "health"
    mounted_file(container, pod_spec, "/etc/echokv/auth/tokens", where, errors, "--auth_tokens_file")
"""

import ipaddress
import math
import os
import re
import shlex

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SERVER_MAIN = os.path.join(REPO, "server", "main.cc")
SERVER_METRICS = os.path.join(REPO, "server", "metrics.cc")
NAMESPACE = "echokv-ns"  # not "default", so a template that forgets the namespace shows
HEALTH_SERVICE = "echokv.v1.EchoKV"

# echokv-server's flags (server/main.cc) by kind. A flag the server does not know
# makes it refuse to start, so an unknown name here is an error.
INT_FLAGS = {
    "port", "metrics_port", "http_port", "threads", "prefill_chunk", "default_budget",
    "default_lookahead", "default_workspace", "default_window", "max_context_tokens",
    "max_new_tokens", "max_sessions", "max_kv_bytes", "max_cold_bytes",
    "max_concurrent_streams", "max_request_bytes", "max_streams_per_connection",
    "metrics_threads", "http_threads", "http_send_buffer_bytes", "http_max_body_bytes",
    "max_step_tokens", "http_max_connections", "http_max_connections_per_peer",
}
DURATION_FLAGS = {"session_ttl", "max_session_ttl", "shutdown_grace", "tls_refresh_interval",
                  "max_connection_idle", "max_connection_age", "max_connection_age_grace",
                  "http_read_timeout", "http_write_timeout", "http_keep_alive_timeout", "stuck_after",
                  "http_header_timeout", "http_body_timeout"}
ENUM_FLAGS = {
    "device": r"cpu|cuda(:[0-9]+)?",
    "dtype": r"float32|bfloat16|float16",
    "default_policy": r"full|streamingllm|h2o|snapkv|pyramidkv|laq|echokv",
    "default_memory": r"tiered|evict",
    "default_cache_dtype": r"float32|int8",
    "weights": r"float32|native",
    "fsync": r"always|none",
    "insecure": r"true|false",
    "reflection": r"true|false",
}
PATH_FLAGS = {"model", "state_dir", "auth_tokens_file", "tls_cert", "tls_key", "tls_client_ca",
              "flagfile", "port_file", "chat_template"}
STRING_FLAGS = {"host", "metrics_host", "replica_id", "http_host", "served_model_name"}
KNOWN_FLAGS = INT_FLAGS | DURATION_FLAGS | set(ENUM_FLAGS) | PATH_FLAGS | STRING_FLAGS
ABSL_FLAGS = {"flagfile"}  # absl's own, accepted by every binary

# echokv-cli's global flags that take a value (client/cli_main.cc AddGlobalFlags).
CLI_GLOBAL_VALUE_FLAGS = {"server", "timeout", "token", "token-file", "tls-ca", "tls-cert", "tls-key",
                          "tls-server-name"}


def server_flag_drift():
    """The flag names this check knows vs those server/main.cc defines: (missing, extra)."""
    with open(SERVER_MAIN) as f:
        defined = set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*([a-z0-9_]+)\s*,", f.read()))
    known = KNOWN_FLAGS - ABSL_FLAGS
    return sorted(defined - known), sorted(known - defined)


def server_metrics():
    """The metric names echokv-server exports (server/metrics.cc), with the _bucket,
    _sum and _count series of its histograms."""
    with open(SERVER_METRICS) as f:
        text = f.read()
    names = set()
    for kind, name in re.findall(r"Build(Gauge|Counter|Histogram)\(\)\s*\.Name\(\"([a-z0-9_]+)\"\)", text):
        names.add(name)
        if kind == "Histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


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


def seconds(duration):
    """A flag duration ("120s", "2m", "500ms") in seconds."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h)", duration or "0s")
    if not m:
        return 0
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _volume_files(vol):
    """The file names a Secret / ConfigMap / projected volume shows, or None when it
    shows every key of its source (unknown here)."""
    src = vol.get("secret") or vol.get("configMap")
    if src is not None:
        items = src.get("items")
        return None if items is None else [i["path"] for i in items]
    if "projected" in vol:
        out = []
        for s in vol["projected"].get("sources", []) or []:
            if "serviceAccountToken" in s:
                out.append(s["serviceAccountToken"]["path"])
            for k in ("secret", "configMap"):
                if k in s:
                    if s[k].get("items") is None:
                        return None
                    out += [i["path"] for i in s[k]["items"]]
            if "downwardAPI" in s:
                out += [i["path"] for i in s["downwardAPI"].get("items", []) or []]
        return out
    return None


def mounted_file(container, spec, path, where, errors, what):
    """`path` must lie under a volumeMount of `container`; a volume that lists its files
    (Secret/ConfigMap items, projected sources) must show that file. Returns the mount."""
    for m in container.get("volumeMounts", []) or []:
        mp = m["mountPath"].rstrip("/")
        if path.startswith(mp + "/") or path == mp:
            rel = path[len(mp) + 1:]
            vol = next((v for v in spec.get("volumes", []) or [] if v["name"] == m["name"]), None)
            files = _volume_files(vol or {})
            if rel and files is not None and rel not in files:
                errors.add(where, f"{what} {path}: volume {m['name']} does not project {rel}")
            return m
    errors.add(where, f"{what} {path} is under no volumeMount of container {container['name']}")
    return None


def volume_of(container, spec, path):
    """The volume mounted where `path` lies, or None."""
    for m in container.get("volumeMounts", []) or []:
        mp = m["mountPath"].rstrip("/")
        if path.startswith(mp + "/") or path == mp:
            return next((v for v in spec.get("volumes", []) or [] if v["name"] == m["name"]), None)
    return None


class Cli:
    """One echokv-cli invocation: its global flags, command and the command's flags."""

    def __init__(self, words):
        self.globals, self.command, self.flags, self.positional = {}, None, {}, []
        i = 1 if words and os.path.basename(words[0]) == "echokv-cli" else 0
        while i < len(words):
            w = words[i]
            if w.startswith("--"):
                name, eq, value = w[2:].partition("=")
                name = name.replace("_", "-")
                takes = name in CLI_GLOBAL_VALUE_FLAGS or self.command is not None
                if not eq and takes and i + 1 < len(words) and not words[i + 1].startswith("--"):
                    value = words[i + 1]
                    i += 1
                elif not eq:
                    value = True
                target = self.flags if (self.command is not None and name not in CLI_GLOBAL_VALUE_FLAGS) else self.globals
                target[name] = value
            elif self.command is None:
                self.command = w
            else:
                self.positional.append(w)
            i += 1


def parse_cli(words):
    return Cli(words)


def cli_lines(script):
    """The echokv-cli command lines of a shell script, each as a Cli (the part after
    `||` or `;` is left out)."""
    out = []
    for line in script.splitlines():
        line = re.split(r"\|\||;|&&", line)[0].strip()
        if line.startswith("echokv-cli "):
            out.append(Cli(shlex.split(line)))
    return out


def is_dns_name(name):
    """A DNS name (not an IP address, not localhost): what a certificate's SAN holds."""
    if not isinstance(name, str) or name in ("localhost", ""):
        return False
    try:
        ipaddress.ip_address(name.strip("[]"))
        return False
    except ValueError:
        pass
    return re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name) is not None


def address_family(address):
    """'ipv4', 'ipv6' or None (a name) for a listen address such as 0.0.0.0 or [::]."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    return "ipv4" if ip.version == 4 else "ipv6"


def ceil_div(a, b):
    return int(math.ceil(a / b))
