"""Checks rendered Kubernetes objects against the API's typed models, offline.

The models are Debian's python3-kubernetes (22.6.0: the Kubernetes 1.22 API). Every
object is walked against its model's `openapi_types` / `attribute_map`: an unknown
field (a typo), a value of the wrong JSON type, or a missing required field is an
error naming the object and the path. The API server would silently drop an unknown
field (Helm does not ask for strict field validation), so a typo in a template
would otherwise go unnoticed until the pod misbehaves.

Fields newer than the 1.22 models are declared in NEWER_FIELDS with the Kubernetes
version that added them; only those the chart uses are listed (probe.grpc: alpha
1.23, beta and on by default 1.24, GA 1.27).

On top of the per-field types, `check_objects` runs the checks the API server or the
running cluster would make across fields and objects (names, label syntax, port
names, volume and ConfigMap references, Service and StatefulSet selectors), so a
chart whose pieces do not fit together fails here too.
"""

import difflib
import re

import kubernetes
import kubernetes.client as kc

MODELS_VERSION = kubernetes.__version__  # "22.6.0" -> Kubernetes 1.22 API
KUBE_API_OF_MODELS = "1.22"

# model -> {json field: (type string, added in)} for fields the 1.22 models lack.
NEWER_FIELDS = {
    "V1Probe": {"grpc": ("V1GRPCAction", "1.27 (GA; beta from 1.24)")},
    # Native sidecars: an init container with restartPolicy Always runs beside the
    # main containers and stops after them (beta and on by default from 1.29).
    "V1Container": {"restartPolicy": ("str", "1.29 (beta, on by default; GA 1.33)")},
    "V1StatefulSetSpec": {"persistentVolumeClaimRetentionPolicy": (
        "V1StatefulSetPersistentVolumeClaimRetentionPolicy", "1.27 (beta, on by default; GA 1.32)")},
}
# Models newer than 1.22: json field -> (type string, required).
NEWER_MODELS = {
    "V1GRPCAction": {"port": ("int", True), "service": ("str", False)},
    "V1StatefulSetPersistentVolumeClaimRetentionPolicy": {
        "whenScaled": ("str", False), "whenDeleted": ("str", False)},
}
# Enum values of the newer fields above (the models do not check enums).
NEWER_ENUMS = {
    ("V1Container", "restartPolicy"): {"Always"},
    ("V1StatefulSetPersistentVolumeClaimRetentionPolicy", "whenScaled"): {"Retain", "Delete"},
    ("V1StatefulSetPersistentVolumeClaimRetentionPolicy", "whenDeleted"): {"Retain", "Delete"},
}
# autoscaling/v2 (GA in 1.23) has the fields of v2beta2, which the 1.22 models carry:
# its objects are checked against those models.
MODEL_ALIASES = {"V2HorizontalPodAutoscaler": "V2beta2HorizontalPodAutoscaler"}
# Custom resources: checked against a JSON schema of this folder instead.
CRD_SCHEMAS = {
    "ServiceMonitor": "servicemonitor.schema.json",
    "PrometheusRule": "prometheusrule.schema.json",
    "ScaledObject": "scaledobject.schema.json",
}

# Fields whose model type is str but whose API type is resource.Quantity, which
# also accepts a JSON number.
QUANTITY_FIELDS = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "sizeLimit"),
    ("V1ResourceFieldSelector", "divisor"),
}
QUANTITY_RE = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+)?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class Errors:
    """Collects errors, each prefixed with the object it is about."""

    def __init__(self):
        self.items = []

    def add(self, where, msg):
        self.items.append(f"{where}: {msg}")

    def __bool__(self):
        return bool(self.items)


def model_class(obj):
    """apiVersion + kind -> the python3-kubernetes model class name, e.g.
    apps/v1 StatefulSet -> V1StatefulSet."""
    version = obj.get("apiVersion", "").split("/")[-1]
    name = version[:1].upper() + version[1:] + obj.get("kind", "")
    return MODEL_ALIASES.get(name, name)


def _json_fields(cls_name):
    """{json field: type string} of a model, with NEWER_FIELDS merged in."""
    if cls_name in NEWER_MODELS:
        return {k: t for k, (t, _) in NEWER_MODELS[cls_name].items()}
    cls = getattr(kc, cls_name)
    fields = {cls.attribute_map[attr]: t for attr, t in cls.openapi_types.items()}
    for k, (t, _) in NEWER_FIELDS.get(cls_name, {}).items():
        fields[k] = t
    return fields


def _type_name(v):
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "object"
    if v is None:
        return "null"
    return type(v).__name__


def walk(value, type_str, path, errors, where, owner=None, field=None):
    """Checks `value` against a python3-kubernetes type string."""
    if value is None:
        return  # null is "unset" for every optional field
    if (owner, field) in QUANTITY_FIELDS:
        items = value.items() if type_str.startswith("dict(") else [(None, value)]
        if type_str.startswith("dict(") and not isinstance(value, dict):
            errors.add(where, f"{path}: expected a map of quantities, got {_type_name(value)}")
            return
        for k, q in items:
            p = f"{path}.{k}" if k is not None else path
            if isinstance(q, bool) or not isinstance(q, (str, int, float)):
                errors.add(where, f"{p}: expected a quantity, got {_type_name(q)}")
            elif isinstance(q, str) and not QUANTITY_RE.match(q):
                errors.add(where, f"{p}: {q!r} is not a quantity")
        return
    if type_str.startswith("list["):
        if not isinstance(value, list):
            errors.add(where, f"{path}: expected a list, got {_type_name(value)}")
            return
        inner = type_str[5:-1]
        for i, item in enumerate(value):
            walk(item, inner, f"{path}[{i}]", errors, where)
        return
    if type_str.startswith("dict("):
        if not isinstance(value, dict):
            errors.add(where, f"{path}: expected a map, got {_type_name(value)}")
            return
        inner = type_str[type_str.index(",") + 1:-1].strip()
        for k, item in value.items():
            if not isinstance(k, str):
                errors.add(where, f"{path}: map key {k!r} is not a string")
            walk(item, inner, f"{path}.{k}", errors, where)
        return
    if type_str == "str":
        if not isinstance(value, str):
            errors.add(where, f"{path}: expected a string, got {_type_name(value)} {value!r}")
        return
    if type_str == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errors.add(where, f"{path}: expected an integer, got {_type_name(value)} {value!r}")
        return
    if type_str == "bool":
        if not isinstance(value, bool):
            errors.add(where, f"{path}: expected a boolean, got {_type_name(value)} {value!r}")
        return
    if type_str == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.add(where, f"{path}: expected a number, got {_type_name(value)}")
        return
    if type_str == "object":
        # IntOrString in every model the chart uses (ports, maxUnavailable).
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            errors.add(where, f"{path}: expected an integer or a string, got {_type_name(value)}")
        return
    if type_str in ("datetime", "date"):
        if not isinstance(value, str):
            errors.add(where, f"{path}: expected a timestamp string")
        return
    # A model.
    if not isinstance(value, dict):
        errors.add(where, f"{path}: expected an object ({type_str}), got {_type_name(value)}")
        return
    fields = _json_fields(type_str)
    for k, v in value.items():
        if k not in fields:
            close = difflib.get_close_matches(str(k), list(fields), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.add(where, f"{path}.{k}: unknown field of {type_str}{hint}")
            continue
        walk(v, fields[k], f"{path}.{k}", errors, where, owner=type_str, field=k)
        allowed = NEWER_ENUMS.get((type_str, k))
        if allowed is not None and v not in allowed:
            errors.add(where, f"{path}.{k}: {v!r} is not one of {sorted(allowed)}")
    if type_str in NEWER_MODELS:
        for k, (_, required) in NEWER_MODELS[type_str].items():
            if required and k not in value:
                errors.add(where, f"{path}: {type_str} requires {k}")


def construct(value, type_str):
    """Builds the python3-kubernetes model (its constructors reject a missing
    required field with ValueError). Fields of NEWER_FIELDS are left out."""
    if value is None:
        return None
    if type_str.startswith("list["):
        return [construct(v, type_str[5:-1]) for v in value]
    if type_str.startswith("dict("):
        inner = type_str[type_str.index(",") + 1:-1].strip()
        return {k: construct(v, inner) for k, v in value.items()}
    if type_str in ("str", "int", "bool", "float", "object", "datetime", "date"):
        return value
    if type_str in NEWER_MODELS:
        return value
    cls = getattr(kc, type_str)
    reverse = {j: a for a, j in cls.attribute_map.items()}
    kwargs = {}
    for k, v in value.items():
        if k in NEWER_FIELDS.get(type_str, {}):
            continue
        attr = reverse[k]
        kwargs[attr.lstrip("_") if attr == "_exec" else attr] = construct(v, cls.openapi_types[attr])
    if "_exec" in cls.openapi_types and "exec" in kwargs:
        kwargs["_exec"] = kwargs.pop("exec")
    return cls(**kwargs)


def check_typed(obj, errors, where):
    """Field-by-field check of one object against its model, then construction."""
    cls_name = model_class(obj)
    if not hasattr(kc, cls_name):
        errors.add(where, f"no Kubernetes {KUBE_API_OF_MODELS} model for apiVersion "
                          f"{obj.get('apiVersion')!r} kind {obj.get('kind')!r}")
        return
    before = len(errors.items)
    walk(obj, cls_name, "", errors, where)
    if len(errors.items) == before:
        try:
            construct(obj, cls_name)
        except (ValueError, TypeError, KeyError) as e:
            errors.add(where, f"{cls_name}: {e}")


# ------------------------------------------------------------------ semantics

def _labels_ok(labels, path, errors, where):
    for k, v in (labels or {}).items():
        name = k.split("/")[-1]
        prefix = k[:-len(name) - 1] if "/" in k else ""
        if len(name) > 63 or not LABEL_NAME.match(name) or (prefix and not DNS1123_SUBDOMAIN.match(prefix)):
            errors.add(where, f"{path}: invalid label key {k!r}")
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            errors.add(where, f"{path}.{k}: invalid label value {v!r}")


def _selector_matches(selector, labels):
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def pod_spec_of(obj):
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec", {}), obj.get("metadata", {}).get("labels", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        tpl = obj.get("spec", {}).get("template", {})
        return tpl.get("spec", {}), tpl.get("metadata", {}).get("labels", {})
    return None, None


def check_pod_spec(spec, extra_volumes, errors, where):
    """Volume, port, env and probe references inside one pod spec."""
    volumes = {v.get("name") for v in spec.get("volumes", []) or []} | set(extra_volumes)
    names = [v.get("name") for v in spec.get("volumes", []) or []]
    for n in set(names):
        if names.count(n) > 1:
            errors.add(where, f"spec.volumes: duplicate name {n!r}")
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    cnames = [c.get("name") for c in containers]
    for c in containers:
        cw = f"container {c.get('name')}"
        if not DNS1123_LABEL.match(c.get("name", "")):
            errors.add(where, f"{cw}: name is not a DNS label")
        if cnames.count(c.get("name")) > 1:
            errors.add(where, f"{cw}: duplicate container name")
        port_names = set()
        for p in c.get("ports", []) or []:
            n = p.get("name")
            if n is not None:
                if len(n) > 15 or not IANA_SVC_NAME.match(n) or not re.search("[a-z]", n):
                    errors.add(where, f"{cw}: port name {n!r} is not an IANA service name (<= 15 chars)")
                port_names.add(n)
            if not 1 <= p.get("containerPort", 0) <= 65535:
                errors.add(where, f"{cw}: containerPort {p.get('containerPort')} out of range")
        mounts = [m.get("mountPath") for m in c.get("volumeMounts", []) or []]
        for m in c.get("volumeMounts", []) or []:
            if m.get("name") not in volumes:
                errors.add(where, f"{cw}: volumeMount {m.get('name')!r} names no volume")
            if mounts.count(m.get("mountPath")) > 1:
                errors.add(where, f"{cw}: mountPath {m.get('mountPath')} mounted twice")
        for e in c.get("env", []) or []:
            if not ENV_NAME.match(e.get("name", "")):
                errors.add(where, f"{cw}: env name {e.get('name')!r} is invalid")
            ref = ((e.get("valueFrom") or {}).get("resourceFieldRef") or {})
            if ref and ref.get("containerName", c.get("name")) not in cnames:
                errors.add(where, f"{cw}: env {e.get('name')} resourceFieldRef names no container")
            if "value" in e and "valueFrom" in e:
                errors.add(where, f"{cw}: env {e.get('name')} has both value and valueFrom")
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c.get(probe_name)
            if probe is None:
                continue
            handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if h in probe]
            if len(handlers) != 1:
                errors.add(where, f"{cw}: {probe_name} needs exactly one handler, has {handlers}")
            for h in ("httpGet", "tcpSocket"):
                port = (probe.get(h) or {}).get("port")
                if isinstance(port, str) and port not in port_names:
                    errors.add(where, f"{cw}: {probe_name}.{h}.port {port!r} names no container port")
            grpc = probe.get("grpc")
            if grpc and not 1 <= grpc.get("port", 0) <= 65535:
                errors.add(where, f"{cw}: {probe_name}.grpc.port out of range")
            if probe_name == "livenessProbe" and probe.get("successThreshold", 1) != 1:
                errors.add(where, f"{cw}: livenessProbe.successThreshold must be 1")


def check_objects(objects, errors, external_names=()):
    """Typed check of every object, then cross-object references.

    objects: list of (source, dict). external_names: (kind, name) pairs that exist
    outside the render (Secrets and claims the operator creates). Returns
    {kind: [(where, object)]}, or None when an object failed its typed check."""
    by_kind = {}
    seen = set()
    for source, obj in objects:
        where = f"{source} {obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
            errors.add(source, "a document without apiVersion/kind")
            continue
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        key = (obj["kind"], name)
        if key in seen:
            errors.add(where, "rendered twice")
        seen.add(key)
        by_kind.setdefault(obj["kind"], []).append((where, obj))
        if obj["kind"] in CRD_SCHEMAS:
            continue  # a custom resource: checked against its schema (check_chart.py)
        check_typed(obj, errors, where)
        name_re = DNS1035_LABEL if obj["kind"] == "Service" else DNS1123_SUBDOMAIN
        if not name_re.match(name) or len(name) > (63 if obj["kind"] == "Service" else 253):
            errors.add(where, f"metadata.name {name!r} is invalid for a {obj['kind']}")
        _labels_ok(meta.get("labels"), "metadata.labels", errors, where)
        for k, v in (meta.get("annotations") or {}).items():
            if not isinstance(v, str):
                errors.add(where, f"metadata.annotations.{k}: must be a string, got {_type_name(v)}")

    if errors:
        # The checks below read fields by their types; report the typed errors alone.
        return None

    # Pods of every workload: (where, labels, spec, kind, obj).
    pods = []
    configmaps = {o["metadata"]["name"] for _, o in by_kind.get("ConfigMap", [])}
    secrets = {o["metadata"]["name"] for _, o in by_kind.get("Secret", [])}
    secrets |= {n for k, n in external_names if k == "Secret"}
    claims = {o["metadata"]["name"] for _, o in by_kind.get("PersistentVolumeClaim", [])}
    claims |= {n for k, n in external_names if k == "PersistentVolumeClaim"}
    for kind in ("Pod", "Deployment", "StatefulSet", "Job"):
        for where, obj in by_kind.get(kind, []):
            spec, labels = pod_spec_of(obj)
            if spec is None:
                continue
            _labels_ok(labels, "spec.template.metadata.labels", errors, where)
            extra = []
            if kind == "StatefulSet":
                extra = [t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", []) or []]
                sel = obj["spec"].get("selector", {}).get("matchLabels", {})
                if not _selector_matches(sel, labels):
                    errors.add(where, "spec.selector does not match the pod template labels")
                pod_max = f"{obj['metadata']['name']}-{max(obj['spec'].get('replicas', 1) - 1, 0)}"
                if len(obj["metadata"]["name"]) > 52:
                    errors.add(where, f"name longer than 52 characters (pod {pod_max})")
                svc = obj["spec"].get("serviceName")
                headless = [o for _, o in by_kind.get("Service", []) if o["metadata"]["name"] == svc]
                if not headless:
                    errors.add(where, f"spec.serviceName {svc!r} names no rendered Service")
                elif headless[0]["spec"].get("clusterIP") != "None":
                    errors.add(where, f"spec.serviceName {svc!r} is not a headless Service")
                elif not _selector_matches(headless[0]["spec"].get("selector"), labels):
                    errors.add(where, f"the headless Service {svc!r} does not select these pods")
            if kind == "Deployment":
                sel = obj["spec"].get("selector", {}).get("matchLabels", {})
                if not _selector_matches(sel, labels):
                    errors.add(where, "spec.selector does not match the pod template labels")
            check_pod_spec(spec, extra, errors, where)
            for v in spec.get("volumes", []) or []:
                cm = (v.get("configMap") or {}).get("name")
                if cm is not None and cm not in configmaps:
                    errors.add(where, f"volume {v['name']}: ConfigMap {cm!r} is not rendered")
                sec = (v.get("secret") or {}).get("secretName")
                if sec is not None and sec not in secrets:
                    errors.add(where, f"volume {v['name']}: Secret {sec!r} is neither rendered nor declared external")
                pvc = (v.get("persistentVolumeClaim") or {}).get("claimName")
                if pvc is not None and pvc not in claims:
                    errors.add(where, f"volume {v['name']}: claim {pvc!r} is neither rendered nor declared external")
            pods.append((where, labels, spec, kind, obj))

    def container_ports(spec):
        # Main containers and native sidecars (init containers that keep running).
        running = (spec.get("containers", []) or []) + [
            c for c in spec.get("initContainers", []) or [] if c.get("restartPolicy") == "Always"]
        return {p.get("name"): p.get("containerPort") for c in running for p in c.get("ports", []) or []}

    for where, svc in by_kind.get("Service", []):
        sel = svc["spec"].get("selector")
        targets = [p for p in pods if p[3] != "Pod" and _selector_matches(sel, p[1])]
        if not targets:
            errors.add(where, f"selector {sel} selects no workload's pods")
            continue
        if len({p[4]['metadata']['name'] for p in targets}) > 1:
            errors.add(where, f"selector {sel} selects pods of several workloads")
        ports = container_ports(targets[0][2])
        for p in svc["spec"].get("ports", []) or []:
            tp = p.get("targetPort", p.get("port"))
            if isinstance(tp, str) and tp not in ports:
                errors.add(where, f"port {p.get('name')}: targetPort {tp!r} names no container port")
            if not 1 <= p.get("port", 0) <= 65535:
                errors.add(where, f"port {p.get('name')}: port out of range")
    for where, cm in by_kind.get("ConfigMap", []):
        size = sum(len(str(v).encode()) for v in (cm.get("data") or {}).values())
        if size > 1048576:
            errors.add(where, f"data holds {size} bytes: a ConfigMap holds at most 1 MiB (1048576)")
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for where, obj in by_kind.get(kind, []):
            sel = (obj["spec"].get("selector") or obj["spec"].get("podSelector") or {}).get("matchLabels")
            if not any(_selector_matches(sel, p[1]) for p in pods if p[3] != "Pod"):
                errors.add(where, f"selector {sel} selects no workload's pods")
            if kind == "NetworkPolicy":
                target = [p for p in pods if _selector_matches(sel, p[1])]
                names = container_ports(target[0][2]) if target else {}
                for rule in obj["spec"].get("ingress", []) or []:
                    for p in rule.get("ports", []) or []:
                        if isinstance(p.get("port"), str) and p["port"] not in names:
                            errors.add(where, f"ingress port {p['port']!r} names no container port")
    return by_kind
