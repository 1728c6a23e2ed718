"""Checks of the observability assets: the PrometheusRule and the Grafana dashboard.
Both are PromQL: every expression goes through `promtool check rules` (Debian's
prometheus package; the dashboard's panel queries as recording rules, with Grafana's
variables filled in), and every echokv_* metric they name must be one echokv-server
exports (server/metrics.cc). `promtool test rules` runs the alerts against series in
alerts_test.yaml (check_chart.py alerts).

    check_rules(by_kind, errors, tmpdir)
    check_dashboard(by_kind, errors, tmpdir)
"""

import json
import os
import re
import shutil
import subprocess

import jsonschema
import yaml

from chart_common import server_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
# Metrics the rules may use that come from elsewhere: the scrape itself, the kubelet.
FOREIGN_METRICS = {"up", "container_memory_working_set_bytes"}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$namespace": "echokv-ns", "$pod": "echokv-.*"}


def metric_names(expr):
    """The echokv_* and container_* metric names an expression reads."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    return set(re.findall(r"\b((?:echokv|container)_[a-z0-9_]+)\b", expr))


def promtool(args, where, errors, what):
    p = subprocess.run([PROMTOOL] + args, capture_output=True, text=True)
    if p.returncode != 0:
        errors.add(where, f"{what}: promtool {' '.join(args[:2])} failed:\n    " +
                   (p.stdout + p.stderr).strip().replace("\n", "\n    "))
        return False
    return True


def check_metric_names(exprs, where, errors, what):
    exported = server_metrics() | FOREIGN_METRICS
    for e in exprs:
        for name in sorted(metric_names(e) - exported):
            errors.add(where, f"{what}: {name} is not a metric echokv-server exports ({e[:80]}...)")


def check_rules(by_kind, errors, tmpdir):
    """Schema of each PrometheusRule, promtool check rules on its groups, metric names.
    Returns the path of the last rules file written (for promtool test rules)."""
    with open(os.path.join(HERE, "prometheusrule.schema.json")) as f:
        schema = json.load(f)
    path = None
    for where, rule in by_kind.get("PrometheusRule", []):
        errs = sorted(jsonschema.Draft7Validator(schema).iter_errors(rule), key=lambda e: list(e.absolute_path))
        for e in errs:
            errors.add(where, f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}")
        if errs:
            continue
        path = os.path.join(tmpdir, f"{rule['metadata']['name']}.rules.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, sort_keys=False)
        promtool(["check", "rules", path], where, errors, "the alert rules")
        exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        check_metric_names(exprs, where, errors, "alert rule")
        alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
        for need in ("EchoKVEngineStuck", "EchoKVInterTokenLatencyHigh", "EchoKVStateWriteErrors",
                     "EchoKVHotKvNearLimit", "EchoKVRestoreFailures"):
            if need not in alerts:
                errors.add(where, f"no alert {need}")
    return path


def dashboard_exprs(dash):
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            if "expr" in t:
                out.append((p.get("title", "?"), t["expr"]))
    return out


def check_dashboard(by_kind, errors, tmpdir):
    """The dashboard ConfigMap: labelled for Grafana's sidecar, valid JSON whose panel
    queries parse (promtool) and name only the server's metrics."""
    for where, cm in by_kind.get("ConfigMap", []):
        data = cm.get("data") or {}
        if not any(k.endswith(".json") for k in data):
            continue
        if not (cm["metadata"].get("labels") or {}).get("grafana_dashboard"):
            errors.add(where, "a dashboard ConfigMap without the grafana_dashboard label (the sidecar ignores it)")
        for key, text in data.items():
            try:
                dash = json.loads(text)
            except ValueError as e:
                errors.add(where, f"{key}: not JSON ({e})")
                continue
            exprs = dashboard_exprs(dash)
            if not exprs:
                errors.add(where, f"{key}: no panel queries")
                continue
            filled = []
            for title, e in exprs:
                for var, val in GRAFANA_VARS.items():
                    e = e.replace(var, val)
                if "$" in e:
                    errors.add(where, f"{key}: panel {title!r}: an unknown variable in {e!r}")
                filled.append(e)
            rules = {"groups": [{"name": "dashboard", "rules": [
                {"record": f"dashboard:panel{i}", "expr": e} for i, e in enumerate(filled)]}]}
            path = os.path.join(tmpdir, f"{cm['metadata']['name']}-{key}.rules.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(rules, f, sort_keys=False)
            promtool(["check", "rules", path], where, errors, f"{key}'s panel queries")
            check_metric_names(filled, where, errors, f"{key} panel query")
            titles = " ".join(t for t, _ in exprs).lower()
            for need in ("memory saved", "lookahead", "streams", "tokens per second", "tenant"):
                if need not in titles:
                    errors.add(where, f"{key}: no panel about {need}")
