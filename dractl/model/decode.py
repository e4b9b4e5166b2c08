"""Decode and validate manifests (YAML or JSON) into model values, with the API's defaults applied.

What it does: reads files, directories (recursively: `*.yaml`, `*.yml`, `*.json`, sorted by
path), multi-document YAML, JSON and `kind: List` (or any `*List` with `items`), and turns
`resource.k8s.io/v1` DeviceClass, ResourceSlice, ResourceClaim and ResourceClaimTemplate
objects plus core/v1 Pod and Node into `types` values. `v1beta2` has the same shape as `v1`;
`v1beta1` is converted (request fields inline instead of under `exactly`, devices wrapped in
`basic`). Defaults are the API server's: `allocationMode` ExactCount, `count` 1 (also for an
explicit 0; 0 for All), toleration operator Equal, namespace "default", pool generation 0.

Workloads with a pod template are expanded into Pods, as their controllers would create them:
apps/v1 Deployment, ReplicaSet and StatefulSet (`spec.replicas`, default 1) and batch/v1 Job
(`spec.parallelism`, default 1) become Pods named `<name>-0`, `<name>-1`, ... in the
workload's namespace, with the template's labels and pod spec. Every other kind (Service,
ConfigMap, Namespace, ...) is skipped and recorded in `Objects.warnings`, as is legal input
that DRA ignores (`nvidia.com/gpu` device-plugin limits).

Validation follows the API server's rules and limits for creating these objects. Every
problem in every document is collected and raised once as `DecodeError`; each message reads
`<file>: <Kind> <ns>/<name>: <field.path>: <message>`. Patterns from older articles
(`v1alpha2` ResourceClass and claim parameters, `v1alpha3` shapes, v1beta1-style requests in
a v1 object, plain attribute values, constraints with CEL) get a message saying what to
write instead.

What it must not do: compile or evaluate CEL (`dractl.cel` does, one layer up; only empty
and over-long expressions are refused here), check that referenced DeviceClasses exist (the
allocator reports missing classes), talk to an API server, or allocate. Pure apart from
reading the given paths.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from dractl.model import quantity, semver, types

_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Limits of resource.k8s.io/v1 (see research/k8s-dra-core.md section 1.8).
_MAX_REQUESTS = 32
_MAX_SUBREQUESTS = 8
_MAX_SELECTORS = 32
_MAX_CONSTRAINTS = 32
_MAX_CONFIGS = 32
_MAX_ALLOCATION_CONFIGS = 64
_MAX_REQUEST_REFS = 32
_MAX_TOLERATIONS = 16
_MAX_CEL_BYTES = 10 * 1024
_MAX_OPAQUE_BYTES = 10 * 1024
_MAX_RESULTS = 32
_MAX_RESERVED_FOR = 256
_MAX_DEVICES = 128
_MAX_DEVICES_ADVANCED = 64
_MAX_COUNTER_SETS = 8
_MAX_COUNTERS = 32
_MAX_CONSUMES_COUNTERS = 2
_MAX_ATTRIBUTES_AND_CAPACITY = 32
_MAX_ATTRIBUTE_VALUES = 48
_MAX_ATTRIBUTE_LENGTH = 64
_MAX_TAINTS = 16
_MAX_BINDING_CONDITIONS = 4
_MAX_VALID_VALUES = 10
_MAX_REPLICAS = 100_000  # dractl's own bound: every replica becomes a Pod value

_GROUP = "resource.k8s.io"
_RESOURCE_KINDS = frozenset({"DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate"})
_CLUSTER_SCOPED = frozenset({"DeviceClass", "ResourceSlice", "Node", "ResourceClass", "Namespace", "ClusterRole",
                             "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass", "PersistentVolume",
                             "PriorityClass", "RuntimeClass", "DeviceTaintRule", "PodGroup"})
_WORKLOADS = {("apps/v1", "Deployment"): "replicas", ("apps/v1", "ReplicaSet"): "replicas",
              ("apps/v1", "StatefulSet"): "replicas", ("batch/v1", "Job"): "parallelism"}
_NVIDIA_DOMAIN = "gpu.nvidia.com"


class DecodeError(ValueError):
    """Manifests that the API server would reject. `problems` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def load_paths(paths: Sequence[str | os.PathLike[str]]) -> types.Objects:
    """Decode files and directories (recursively, `*.yaml`/`*.yml`/`*.json`, sorted).

    Raises `DecodeError` with every problem of every file. Reads the files; otherwise pure.
    """
    out = _Out()
    for given in paths:
        path = pathlib.Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))
            if not files:
                out.problems.append(f"{path}: no manifests (*.yaml, *.yml, *.json) in this directory")
        elif path.is_file():
            files = [path]
        else:
            out.problems.append(f"{path}: no such file or directory")
            continue
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                out.problems.append(f"{file}: cannot read: {error}")
                continue
            _load_text(out, text, str(file))
    return out.finish()


def load_text(text: str, *, file: str = "<input>") -> types.Objects:
    """Decode one manifest text (YAML, possibly multi-document, or JSON). Pure.

    Raises `DecodeError` with every problem; `file` names the text in messages.
    """
    out = _Out()
    _load_text(out, text, file)
    return out.finish()


def load_documents(documents: Sequence[object], *, file: str = "<input>") -> types.Objects:
    """Decode already-parsed objects (dicts as `json.loads` returns them). Pure.

    For callers that hold raw API JSON; raises `DecodeError` like `load_text`.
    """
    out = _Out()
    for index, document in enumerate(documents):
        _document(out, document, file, index)
    return out.finish()


# --- Accumulating results ------------------------------------------------------------------


class _Out:
    """Everything decoded so far, in input order, plus problems and warnings."""

    __slots__ = ("classes", "slices", "claims", "templates", "pods", "nodes", "warnings", "problems")

    def __init__(self) -> None:
        self.classes: list[types.DeviceClass] = []
        self.slices: list[types.ResourceSlice] = []
        self.claims: list[types.ResourceClaim] = []
        self.templates: list[types.ResourceClaimTemplate] = []
        self.pods: list[types.Pod] = []
        self.nodes: list[types.Node] = []
        self.warnings: list[str] = []
        self.problems: list[str] = []

    def finish(self) -> types.Objects:
        if self.problems:
            raise DecodeError(self.problems)
        return types.Objects(
            device_classes=tuple(self.classes),
            resource_slices=tuple(self.slices),
            resource_claims=tuple(self.claims),
            resource_claim_templates=tuple(self.templates),
            pods=tuple(self.pods),
            nodes=tuple(self.nodes),
            warnings=tuple(self.warnings),
        )


class _Object:
    """The problems and warnings of one object; each starts with `<file>: <Kind> <ns>/<name>: `.

    `beta1` is set for resource.k8s.io/v1beta1 objects, whose older shapes (request fields
    inline, devices wrapped in `basic`) are converted silently instead of reported.
    """

    __slots__ = ("prefix", "problems", "warnings", "beta1")

    def __init__(self, prefix: str, out: _Out) -> None:
        self.prefix = prefix
        self.problems = out.problems
        self.warnings = out.warnings
        self.beta1 = False

    def error(self, path: str, message: str) -> None:
        self.problems.append(f"{self.prefix}{path}: {message}")

    def warn(self, path: str, message: str) -> None:
        """Legal input that will not do what the author probably expects."""
        self.warnings.append(f"{self.prefix}{path}: {message}")


# --- Reading text --------------------------------------------------------------------------


def _load_text(out: _Out, text: str, file: str) -> None:
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        # JSON is far faster through the json module than through a YAML parser.
        try:
            data = json.loads(text)
        except ValueError:
            pass  # YAML flow style also starts with a brace; let the YAML parser judge it.
        else:
            documents = data if isinstance(data, list) else [data]
            for index, document in enumerate(documents):
                _document(out, document, file, index)
            return
    index = 0
    try:
        for document in yaml.load_all(text, Loader=_LOADER):
            if document is not None:
                _document(out, document, file, index)
            index += 1
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(part for part in (error.context, error.problem) if part)
        out.problems.append(f"{file}: {where}YAML syntax error: {problem}")
    except yaml.YAMLError as error:
        out.problems.append(f"{file}: YAML syntax error: {str(error).splitlines()[0]}")


def _document(out: _Out, raw: object, file: str, index: int) -> None:
    where = f"{file}: document {index + 1}"
    if not isinstance(raw, dict):
        out.problems.append(f"{where}: must be a Kubernetes object (a mapping with apiVersion and kind)")
        return
    kind = raw.get("kind")
    api_version = raw.get("apiVersion")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(raw.get("items"), list):
        for item in raw["items"]:
            _document(out, item, file, index)
        return
    if not isinstance(kind, str) or not kind:
        out.problems.append(f"{where}: kind: required (for example DeviceClass, ResourceClaim, Pod)")
        return
    if not isinstance(api_version, str) or not api_version:
        out.problems.append(f"{where}: apiVersion: required (for example resource.k8s.io/v1 or v1)")
        return
    group, _, version = api_version.rpartition("/")
    source = types.Source(file=file, document=index)
    o = _Object(_prefix(raw, kind, file, index), out)
    if group == _GROUP:
        _resource(out, o, raw, kind, version, source)
    elif kind in _RESOURCE_KINDS:
        o.error("apiVersion", f"{kind} belongs to resource.k8s.io: write apiVersion: resource.k8s.io/v1")
    elif kind in ("Pod", "Node"):
        if api_version != "v1":
            o.error("apiVersion", f"{kind} is core/v1: write apiVersion: v1")
        elif kind == "Pod":
            _top_keys(o, raw, _TOP_KEYS_WITH_STATUS)
            meta = _meta(o, raw, namespaced=True)
            spec = _map(o, raw.get("spec"), "spec") or {}
            out.pods.append(types.Pod(meta=meta, source=source, **_pod_spec(o, spec, "spec")))
        else:
            _top_keys(o, raw, _TOP_KEYS_WITH_STATUS)
            out.nodes.append(types.Node(meta=_meta(o, raw, namespaced=False), source=source))
    elif (api_version, kind) in _WORKLOADS:
        out.pods.extend(_workload(o, raw, _WORKLOADS[api_version, kind], source))
    else:
        skipped = o.prefix + "skipped (not used by allocation)"
        if kind.endswith(("ClaimParameters", "ClassParameters")):
            skipped += "; " + _NO_CLAIM_PARAMETERS.format(path="the claim's spec")
        out.warnings.append(skipped)


def _prefix(raw: Mapping[str, Any], kind: str, file: str, index: int) -> str:
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name")
    shown = name if isinstance(name, str) and name else f"(document {index + 1})"
    if kind in _CLUSTER_SCOPED:
        return f"{file}: {kind} {shown}: "
    namespace = meta.get("namespace")
    namespace = namespace if isinstance(namespace, str) and namespace else "default"
    return f"{file}: {kind} {namespace}/{shown}: "


def _resource(out: _Out, o: _Object, raw: dict[str, Any], kind: str, version: str, source: types.Source) -> None:
    if kind in _REMOVED_KINDS or version == "v1alpha2":
        _removed_alpha2(o, raw, kind, version)
        return
    if kind not in _RESOURCE_KINDS:
        out.warnings.append(o.prefix + "skipped (not used by allocation)")
        return
    if version == "v1alpha3":
        o.error("apiVersion", f"resource.k8s.io/v1alpha3 is no longer served: write apiVersion: resource.k8s.io/v1{_ALPHA3_CHANGES[kind]}")
        discard = _Out()
        _resource(discard, o, raw, kind, "v1", source)  # report the old shapes field by field
        return
    if version not in ("v1", "v1beta2", "v1beta1"):
        o.error("apiVersion", f"resource.k8s.io/{version} is not a served version: write apiVersion: resource.k8s.io/v1")
        return
    o.beta1 = version == "v1beta1"
    if kind == "DeviceClass":
        _top_keys(o, raw, _TOP_KEYS, _CLASS_TOP_HINTS)
        out.classes.append(_device_class(o, raw, source))
    elif kind == "ResourceSlice":
        _top_keys(o, raw, _TOP_KEYS)
        out.slices.append(_resource_slice(o, raw, source))
    elif kind == "ResourceClaim":
        _top_keys(o, raw, _TOP_KEYS_WITH_STATUS)
        out.claims.append(_resource_claim(o, raw, source))
    else:
        _top_keys(o, raw, _TOP_KEYS)
        out.templates.append(_resource_claim_template(o, raw, source))


# --- Removed API versions ------------------------------------------------------------------

_REMOVED_KINDS = frozenset({"ResourceClass", "ResourceClaimParameters", "ResourceClassParameters", "PodSchedulingContext"})
_ALPHA3_CHANGES = {
    "DeviceClass": " (spec.selectors[].cel.expression keeps its shape)",
    "ResourceClaim": ", where each request's deviceClassName, selectors, count and allocationMode move under `exactly:`",
    "ResourceClaimTemplate": ", where each request's deviceClassName, selectors, count and allocationMode move under `exactly:`",
    "ResourceSlice": (
        ", where the `basic:` wrapper of devices is gone (attributes and capacity sit on the device), "
        "attributes take typed values such as {string: \"...\"}, {int: ...}, {version: \"...\"}, "
        "and capacity entries are {value: <quantity>}"
    ),
}
_NO_CLAIM_PARAMETERS = (
    "claim parameters objects are gone from DRA: express the requirements as CEL in "
    "{path}.devices.requests[].exactly.selectors[].cel.expression, "
    "e.g. device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"16Gi\")) >= 0"
)


def _removed_alpha2(o: _Object, raw: Mapping[str, Any], kind: str, version: str) -> None:
    """Objects of the removed `v1alpha2` API (classic DRA): say what replaces each part."""
    if kind in _REMOVED_KINDS:
        gone = f"{kind} was removed from Kubernetes together with resource.k8s.io/v1alpha2"
    else:
        gone = f"resource.k8s.io/{version} is no longer served"
    if kind == "ResourceClass":
        driver = raw.get("driverName")
        driver = driver if isinstance(driver, str) and driver else _NVIDIA_DOMAIN
        o.error("apiVersion", f"{gone}: write a resource.k8s.io/v1 DeviceClass with spec.selectors[].cel.expression, e.g. `device.driver == \"{driver}\"`")
        if "driverName" in raw:
            selector = f"[{{cel: {{expression: 'device.driver == \"{driver}\"'}}}}]"
            o.error("driverName", f"DeviceClass has no driverName: select the driver in CEL: spec.selectors: {selector}")
        if "structuredParameters" in raw:
            o.error("structuredParameters", "removed: every v1 driver publishes its devices in ResourceSlices; delete this field")
        if "suitableNodes" in raw:
            o.error("suitableNodes", "removed: nodes come from the driver's ResourceSlices; select devices with spec.selectors[].cel.expression")
        if "parametersRef" in raw:
            o.error("parametersRef", "removed: put driver configuration in the DeviceClass's spec.config[].opaque {driver, parameters}")
        return
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        path = "spec.spec" if kind == "ResourceClaimTemplate" else "spec"
        o.error("apiVersion", f"{gone}: write apiVersion: resource.k8s.io/v1 with {path}.devices.requests[].exactly.deviceClassName and CEL selectors")
        spec = raw.get("spec")
        if kind == "ResourceClaimTemplate" and isinstance(spec, dict):
            spec = spec.get("spec")
        if isinstance(spec, dict):
            _alpha2_claim_spec(o, spec, path)
        return
    if kind in ("ResourceClaimParameters", "ResourceClassParameters"):
        o.error("apiVersion", f"{gone}: {_NO_CLAIM_PARAMETERS.format(path='the claim spec')}")
        return
    o.error("apiVersion", f"{gone}: DRA objects are resource.k8s.io/v1 DeviceClass, ResourceClaim, ResourceClaimTemplate and ResourceSlice")


def _alpha2_claim_spec(o: _Object, spec: Mapping[str, Any], path: str) -> None:
    class_name = spec.get("resourceClassName")
    if "resourceClassName" in spec:
        shown = class_name if isinstance(class_name, str) and class_name else "<class>"
        requests = f"[{{name: gpu, exactly: {{deviceClassName: {shown}}}}}]"
        o.error(f"{path}.resourceClassName", f"removed: write {path}.devices.requests: {requests} naming a DeviceClass")
    for key in ("parametersRef", "parameters"):
        if key in spec:
            o.error(f"{path}.{key}", _NO_CLAIM_PARAMETERS.format(path=path))
    if "allocationMode" in spec:
        o.error(f"{path}.allocationMode", "removed: v1 claims are allocated when the first pod using them is scheduled; delete this field")


# --- Common field helpers ------------------------------------------------------------------

_NO_HINTS: Mapping[str, str] = {}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _q(value: object) -> str:
    """A value quoted the way YAML and JSON users read it."""
    return json.dumps(value, default=str, ensure_ascii=False)


def _check_keys(o: _Object, raw: Mapping[str, Any], path: str, allowed: frozenset[str], hints: Mapping[str, str] = _NO_HINTS) -> None:
    if raw.keys() <= allowed:
        return
    for key in raw:
        if key in allowed:
            continue
        hint = hints.get(key)
        if hint is None:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"unknown field; did you mean {close[0]}?" if close else f"unknown field (fields here: {', '.join(sorted(allowed))})"
        o.error(_join(path, str(key)), hint)


def _map(o: _Object, raw: object, path: str, allowed: frozenset[str] | None = None, hints: Mapping[str, str] = _NO_HINTS) -> dict[str, Any] | None:
    """A mapping field (None when absent or invalid); unknown keys are reported when `allowed` is given."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {_kind_of(raw)}")
        return None
    if allowed is not None:
        _check_keys(o, raw, path, allowed, hints)
    return raw


def _kind_of(raw: object) -> str:
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, (int, float)):
        return "a number"
    if isinstance(raw, str):
        return f"the string {_q(raw)}"
    if isinstance(raw, list):
        return "a list"
    if isinstance(raw, dict):
        return "an object"
    return "null" if raw is None else type(raw).__name__


def _list(o: _Object, raw: object, path: str, limit: int | None = None) -> list[Any]:
    """A list field; over the limit it is reported and treated as empty, like the API server does."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        o.error(path, f"must be a list, got {_kind_of(raw)}")
        return []
    if limit is not None and len(raw) > limit:
        o.error(path, f"must have at most {limit} items, got {len(raw)}")
        return []
    return raw


def _str(o: _Object, m: Mapping[str, Any], key: str, path: str) -> str | None:
    value = m.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return _timestamp(value)
    o.error(_join(path, key), f"must be a string, got {_kind_of(value)}")
    return None


def _required_str(o: _Object, m: Mapping[str, Any], key: str, path: str, example: str = "") -> str:
    value = _str(o, m, key, path)
    if value == "" or (value is None and m.get(key) is None):
        o.error(_join(path, key), f"required{example}")
    return value or ""


def _int(o: _Object, m: Mapping[str, Any], key: str, path: str) -> int | None:
    value = m.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    o.error(_join(path, key), f"must be an integer, got {_kind_of(value)}")
    return None


def _bool(o: _Object, m: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = m.get(key)
    if value is None or isinstance(value, bool):
        return value
    o.error(_join(path, key), f"must be true or false, got {_kind_of(value)}")
    return None


def _strings(o: _Object, m: Mapping[str, Any], key: str, path: str, limit: int | None = None) -> tuple[str, ...]:
    items = _list(o, m.get(key), _join(path, key), limit)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            o.error(f"{_join(path, key)}[{i}]", f"must be a string, got {_kind_of(item)}")
            return ()
    return tuple(items)


def _string_map(o: _Object, m: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = _map(o, m.get(key), _join(path, key))
    if raw is None:
        return {}
    for k, v in raw.items():
        if not isinstance(k, str):
            o.error(f"{_join(path, key)}[{k}]", f"keys must be strings: quote it, e.g. {_q(_yaml_scalar(k))}")
        elif isinstance(v, (bool, int, float)):
            o.error(f"{_join(path, key)}[{k}]", f"must be a string, got {_kind_of(v)}: quote it, e.g. {k}: {_q(_yaml_scalar(v))}")
        elif not isinstance(v, str):
            o.error(f"{_join(path, key)}[{k}]", f"must be a string, got {_kind_of(v)}")
    return raw


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _timestamp(value: datetime.date) -> str:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return value.isoformat() + "Z"
    return value.isoformat()


# The same sizes repeat on every device; `typed` keeps 1, 1.0 and True apart.
_parse_quantity = functools.lru_cache(maxsize=65536, typed=True)(quantity.parse)


def _quantity(o: _Object, raw: object, path: str) -> quantity.Quantity:
    try:
        if isinstance(raw, (str, int, float)):
            return _parse_quantity(raw)
        return quantity.parse(raw)
    except quantity.QuantityError as error:
        o.error(path, str(error))
        return quantity.from_int(0)


def _check(o: _Object, path: str, problem: str | None) -> None:
    if problem is not None:
        o.error(path, problem)


# --- Name formats (memoised: the same names repeat across thousands of devices) ---------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


@functools.lru_cache(maxsize=16384)
def _dns_label(value: str) -> str | None:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        return f"{_q(value)} is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    return None


@functools.lru_cache(maxsize=16384)
def _dns_subdomain(value: str) -> str | None:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        return f"{_q(value)} is not a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    return None


@functools.lru_cache(maxsize=4096)
def _driver_name(value: str) -> str | None:
    if len(value) > 63 or not _DNS_SUBDOMAIN.match(value.lower()):
        return f"{_q(value)} is not a driver name: a DNS subdomain of at most 63 characters such as \"gpu.nvidia.com\""
    return None


@functools.lru_cache(maxsize=16384)
def _pool_name(value: str) -> str | None:
    if len(value) > 253 or any(_dns_subdomain(part) for part in value.split("/")):
        return f"{_q(value)} is not a pool name: DNS subdomains separated by '/', at most 253 characters"
    return None


def _c_identifier(value: str) -> str | None:
    if len(value) <= 32 and _C_IDENTIFIER.match(value):
        return None
    message = f"{_q(value)} is not a C identifier: at most 32 letters, digits and '_', not starting with a digit"
    suggestion = _identifier_suggestion(value)
    return f"{message} (e.g. {suggestion})" if suggestion else message


def _identifier_suggestion(value: str) -> str | None:
    """`cuda-version` -> `cudaVersion`, the NVIDIA driver's spelling; None when nothing fits."""
    parts = [part for part in re.split(r"[^A-Za-z0-9_]+", value) if part]
    suggestion = parts[0] + "".join(part[:1].upper() + part[1:] for part in parts[1:]) if parts else ""
    return suggestion if len(suggestion) <= 32 and _C_IDENTIFIER.match(suggestion) else None


@functools.lru_cache(maxsize=16384)
def _qualified_name(value: str) -> str | None:
    """A device attribute or capacity name: `id` (the driver's domain) or `domain/id`."""
    if value.count("/") > 1:
        return f"{_q(value)} must not contain more than one '/'"
    domain, slash, ident = value.partition("/")
    if not slash:
        return _c_identifier(value)
    if not domain:
        return f"{_q(value)}: the domain before '/' must not be empty"
    if not ident:
        return f"{_q(value)}: the name after '/' must not be empty"
    return _driver_name(domain) or _c_identifier(ident)


def _fully_qualified_name(value: str) -> str | None:
    problem = _qualified_name(value)
    if problem is None and "/" not in value:
        problem = f"{_q(value)} must be fully qualified, a domain and a name separated by '/', e.g. \"{_NVIDIA_DOMAIN}/{value}\""
    return problem


@functools.lru_cache(maxsize=4096)
def _label_key(value: str) -> str | None:
    prefix, slash, name = value.rpartition("/")
    if (slash and (not prefix or _dns_subdomain(prefix))) or not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"{_q(value)} is not a label key: an optional DNS subdomain prefix and '/', "
            "then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    return None


@functools.lru_cache(maxsize=4096)
def _label_value(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return f"{_q(value)} is not a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    return None


def _extended_resource_name(value: str) -> str | None:
    if "/" not in value or "kubernetes.io/" in value or _label_key("requests." + value):
        return f"{_q(value)} is not an extended resource name: a domain outside kubernetes.io, '/', and a name, e.g. \"example.com/gpu\""
    return None


# --- Metadata ------------------------------------------------------------------------------

_TOP_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})
_TOP_KEYS_WITH_STATUS = _TOP_KEYS | {"status"}
_META_KEYS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
})


def _top_keys(o: _Object, raw: Mapping[str, Any], allowed: frozenset[str], hints: Mapping[str, str] = _NO_HINTS) -> None:
    _check_keys(o, raw, "", allowed, hints)


def _meta(o: _Object, raw: Mapping[str, Any], *, namespaced: bool, path: str = "metadata", required: bool = True) -> types.ObjectMeta:
    m = _map(o, raw.get("metadata"), path, _META_KEYS) or {}
    name = _str(o, m, "name", path) or ""
    if not name:
        if required:
            o.error(_join(path, "name"), "required")
    else:
        _check(o, _join(path, "name"), _dns_subdomain(name))
    namespace = ""
    if namespaced:
        namespace = _str(o, m, "namespace", path) or "default"
        _check(o, _join(path, "namespace"), _dns_label(namespace))
    labels = _string_map(o, m, "labels", path)
    for key, value in labels.items():
        if isinstance(key, str) and isinstance(value, str):
            _check(o, f"{path}.labels[{key}]", _label_key(key) or _label_value(value))
    owners = _list(o, m.get("ownerReferences"), _join(path, "ownerReferences"))
    for i, owner in enumerate(owners):
        _map(o, owner, f"{path}.ownerReferences[{i}]")
    return types.ObjectMeta(
        name=name,
        namespace=namespace,
        uid=_str(o, m, "uid", path) or "",
        generate_name=_str(o, m, "generateName", path) or "",
        labels=labels,
        annotations=_string_map(o, m, "annotations", path),
        resource_version=_str(o, m, "resourceVersion", path) or "",
        generation=_int(o, m, "generation", path) or 0,
        finalizers=_strings(o, m, "finalizers", path),
        owner_references=tuple(owner for owner in owners if isinstance(owner, dict)),
        deletion_timestamp=_str(o, m, "deletionTimestamp", path),
    )


# --- DeviceClass ---------------------------------------------------------------------------

_CLASS_SPEC_KEYS = frozenset({"selectors", "config", "extendedResourceName"})
_CLASS_TOP_HINTS = {
    "driverName": "DeviceClass has no driverName: select the driver with spec.selectors: [{cel: {expression: 'device.driver == \"gpu.nvidia.com\"'}}]",
}
_CLASS_SPEC_HINTS = {
    "driverName": _CLASS_TOP_HINTS["driverName"],
    "suitableNodes": "not a DeviceClass field: nodes come from the driver's ResourceSlices",
    "parametersRef": "not a DeviceClass field: put driver configuration in spec.config[].opaque {driver, parameters}",
}


def _device_class(o: _Object, raw: Mapping[str, Any], source: types.Source) -> types.DeviceClass:
    meta = _meta(o, raw, namespaced=False)
    spec = _map(o, raw.get("spec"), "spec", _CLASS_SPEC_KEYS, _CLASS_SPEC_HINTS) or {}
    configs = []
    for i, item in enumerate(_list(o, spec.get("config"), "spec.config", _MAX_CONFIGS)):
        path = f"spec.config[{i}]"
        m = _map(o, item, path, _CONFIG_KEYS)
        if m is not None:
            configs.append(_opaque_config(o, m, path))
    extended = _str(o, spec, "extendedResourceName", "spec")
    if extended is not None:
        _check(o, "spec.extendedResourceName", _extended_resource_name(extended))
    return types.DeviceClass(
        meta=meta,
        selectors=_selectors(o, spec, "spec"),
        config=tuple(configs),
        extended_resource_name=extended,
        source=source,
    )


_SELECTOR_KEYS = frozenset({"cel"})
_CEL_KEYS = frozenset({"expression"})
_SELECTOR_HINTS = {"expression": "the expression goes under cel: write - cel: {expression: ...}"}
_CONFIG_KEYS = frozenset({"opaque"})
_CLAIM_CONFIG_KEYS = frozenset({"requests", "opaque"})
_OPAQUE_KEYS = frozenset({"driver", "parameters"})


def _selectors(o: _Object, m: Mapping[str, Any], path: str) -> tuple[str, ...]:
    expressions = []
    base = _join(path, "selectors")
    for i, item in enumerate(_list(o, m.get("selectors"), base, _MAX_SELECTORS)):
        spath = f"{base}[{i}]"
        if isinstance(item, dict) and "cel" not in item and ("key" in item or "operator" in item):
            o.error(spath, _label_selector_hint(item))
            continue
        selector = _map(o, item, spath, _SELECTOR_KEYS, _SELECTOR_HINTS)
        if selector is None:
            continue
        cel = _map(o, selector.get("cel"), f"{spath}.cel", _CEL_KEYS)
        if cel is None:
            if selector.get("cel") is None:
                o.error(f"{spath}.cel", "required: write - cel: {expression: ...}")
            continue
        expression = _str(o, cel, "expression", f"{spath}.cel") or ""
        if not expression.strip():
            o.error(f"{spath}.cel.expression", "required (a CEL expression such as device.driver == \"gpu.nvidia.com\")")
        elif len(expression) > _MAX_CEL_BYTES // 4 and len(expression.encode()) > _MAX_CEL_BYTES:
            o.error(f"{spath}.cel.expression", f"must be at most {_MAX_CEL_BYTES} bytes, got {len(expression.encode())}")
        expressions.append(expression)
    return tuple(expressions)


def _label_selector_hint(item: Mapping[str, Any]) -> str:
    """Label-selector style (`key`/`operator`/`values`) selectors from old articles, as CEL."""
    key = str(item.get("key", "memory"))
    operator = str(item.get("operator", "In"))
    raw_values = item.get("values")
    values: list[Any] = raw_values if isinstance(raw_values, list) else []
    first = str(values[0]) if values else "..."
    comparisons = {"Gt": ">", "Lt": "<", "Ge": ">=", "Le": "<="}
    if key == "memory" and operator in comparisons:
        amount = f"{first}Mi" if first.isdigit() else first
        expression = f"device.capacity[\"{_NVIDIA_DOMAIN}\"].memory.compareTo(quantity(\"{amount}\")) {comparisons[operator]} 0"
    else:
        field = f"device.attributes[\"{_NVIDIA_DOMAIN}\"].{key}" if _C_IDENTIFIER.match(key) else f"device.attributes[\"{_NVIDIA_DOMAIN}\"][\"{key}\"]"
        if operator in comparisons:
            expression = f"{field} {comparisons[operator]} {first}"
        elif operator in ("Exists", "DoesNotExist"):
            test = f"\"{key}\" in device.attributes[\"{_NVIDIA_DOMAIN}\"]"
            expression = test if operator == "Exists" else f"!({test})"
        else:
            listed = ", ".join(_q(str(v)) for v in values)
            expression = f"{field} in [{listed}]" if operator == "In" else f"!({field} in [{listed}])"
    return f"selectors take CEL, not key/operator/values: write - cel: {{expression: '{expression}'}}"


def _opaque_config(o: _Object, m: Mapping[str, Any], path: str) -> types.OpaqueDeviceConfiguration:
    opaque = _map(o, m.get("opaque"), f"{path}.opaque", _OPAQUE_KEYS)
    if opaque is None:
        if m.get("opaque") is None:
            o.error(f"{path}.opaque", "required: write opaque: {driver: gpu.nvidia.com, parameters: {...}}")
        return types.OpaqueDeviceConfiguration(driver="", parameters={})
    opath = f"{path}.opaque"
    driver = _required_str(o, opaque, "driver", opath)
    if driver:
        _check(o, f"{opath}.driver", _driver_name(driver))
    parameters = opaque.get("parameters")
    if parameters is None:
        o.error(f"{opath}.parameters", "required (a JSON object for the driver)")
    elif not isinstance(parameters, dict):
        o.error(f"{opath}.parameters", f"must be a JSON object, got {_kind_of(parameters)}")
    else:
        try:
            size = len(json.dumps(parameters, separators=(",", ":"), default=str).encode())
        except ValueError:
            o.error(f"{opath}.parameters", "must not contain itself (a YAML alias to an enclosing value)")
        else:
            if size > _MAX_OPAQUE_BYTES:
                o.error(f"{opath}.parameters", f"must be at most {_MAX_OPAQUE_BYTES} bytes of JSON, got {size}")
    return types.OpaqueDeviceConfiguration(driver=driver, parameters=parameters)


# --- ResourceClaim and ResourceClaimTemplate --------------------------------------------------

_CLAIM_SPEC_KEYS = frozenset({"devices"})
_DEVICES_KEYS = frozenset({"requests", "constraints", "config"})


@functools.lru_cache(maxsize=4)
def _claim_spec_hints(path: str) -> Mapping[str, str]:
    return {
        "resourceClassName": f"removed with resource.k8s.io/v1alpha2: name a DeviceClass in {path}.devices.requests[].exactly.deviceClassName",
        "parametersRef": _NO_CLAIM_PARAMETERS.format(path=path),
        "parameters": _NO_CLAIM_PARAMETERS.format(path=path),
        "requests": "requests go under devices: write devices: {requests: [...]}",
        "constraints": "constraints go under devices: write devices: {constraints: [...]}",
        "config": "config goes under devices: write devices: {config: [...]}",
    }


_REQUEST_KEYS = frozenset({"name", "exactly", "firstAvailable"})
_INLINE_KEYS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity")
_EXACT_KEYS = frozenset(_INLINE_KEYS)
_REQUEST_OR_INLINE_KEYS = _REQUEST_KEYS | _EXACT_KEYS
_SUBREQUEST_KEYS = frozenset({"name", "deviceClassName", "selectors", "allocationMode", "count", "tolerations", "capacity"})
_SUBREQUEST_HINTS = {"adminAccess": "not allowed in firstAvailable subrequests: use exactly: {adminAccess: true} on a request"}
_CONSTRAINT_KEYS = frozenset({"requests", "matchAttribute", "distinctAttribute"})
_CAPACITY_REQUEST_KEYS = frozenset({"requests"})
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _resource_claim(o: _Object, raw: Mapping[str, Any], source: types.Source) -> types.ResourceClaim:
    meta = _meta(o, raw, namespaced=True)
    spec, names = _claim_spec(o, raw.get("spec"), "spec")
    allocation, reserved = _claim_status(o, raw.get("status"), names)
    return types.ResourceClaim(meta=meta, spec=spec, allocation=allocation, reserved_for=reserved, source=source)


_TEMPLATE_SPEC_KEYS = frozenset({"metadata", "spec"})
_TEMPLATE_SPEC_HINTS = {
    key: f"the claim spec of a template goes under spec.spec: write spec: {{spec: {{{key}: ...}}}}" for key in ("devices", "requests")
}
_TEMPLATE_META_KEYS = frozenset({"labels", "annotations"})


def _resource_claim_template(o: _Object, raw: Mapping[str, Any], source: types.Source) -> types.ResourceClaimTemplate:
    meta = _meta(o, raw, namespaced=True)
    spec = _map(o, raw.get("spec"), "spec", _TEMPLATE_SPEC_KEYS, _TEMPLATE_SPEC_HINTS)
    if spec is None:
        o.error("spec", "required: write spec: {spec: {devices: {requests: [...]}}}")
        spec = {}
    template_meta = _map(o, spec.get("metadata"), "spec.metadata", _TEMPLATE_META_KEYS) or {}
    labels = _string_map(o, template_meta, "labels", "spec.metadata")
    annotations = _string_map(o, template_meta, "annotations", "spec.metadata")
    claim_spec, _ = _claim_spec(o, spec.get("spec"), "spec.spec")
    return types.ResourceClaimTemplate(meta=meta, spec=claim_spec, claim_labels=labels, claim_annotations=annotations, source=source)


# Request names of a claim: a request maps to its subrequest names (None for `exactly`).
_Names = dict[str, frozenset[str] | None]


def _claim_spec(o: _Object, raw: object, path: str) -> tuple[types.ResourceClaimSpec, _Names]:
    spec = _map(o, raw, path, _CLAIM_SPEC_KEYS, _claim_spec_hints(path)) or {}
    dpath = f"{path}.devices"
    devices = _map(o, spec.get("devices"), dpath, _DEVICES_KEYS) or {}
    requests = []
    names: _Names = {}
    for i, item in enumerate(_list(o, devices.get("requests"), f"{dpath}.requests", _MAX_REQUESTS)):
        rpath = f"{dpath}.requests[{i}]"
        request = _request(o, item, rpath)
        if request is None:
            continue
        if request.name in names:
            o.error(f"{rpath}.name", f"duplicate request name {_q(request.name)}")
        names[request.name] = frozenset(s.name for s in request.first_available) if request.first_available else None
        requests.append(request)
    constraints = []
    for i, item in enumerate(_list(o, devices.get("constraints"), f"{dpath}.constraints", _MAX_CONSTRAINTS)):
        constraint = _constraint(o, item, f"{dpath}.constraints[{i}]", names, path)
        if constraint is not None:
            constraints.append(constraint)
    configs = []
    for i, item in enumerate(_list(o, devices.get("config"), f"{dpath}.config", _MAX_CONFIGS)):
        cpath = f"{dpath}.config[{i}]"
        m = _map(o, item, cpath, _CLAIM_CONFIG_KEYS)
        if m is not None:
            refs = _request_refs(o, m, cpath, names)
            configs.append(types.DeviceClaimConfiguration(requests=refs, opaque=_opaque_config(o, m, cpath)))
    return types.ResourceClaimSpec(requests=tuple(requests), constraints=tuple(constraints), config=tuple(configs)), names


def _request(o: _Object, raw: object, path: str) -> types.DeviceRequest | None:
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {_kind_of(raw)}")
        return None
    inline = [key for key in _INLINE_KEYS if key in raw]
    _check_keys(o, raw, path, _REQUEST_OR_INLINE_KEYS)
    name = _required_str(o, raw, "name", path, " (a DNS label such as \"gpu\")")
    if name:
        _check(o, f"{path}.name", _dns_label(name))
    exactly_raw = raw.get("exactly")
    first_raw = raw.get("firstAvailable")
    exactly: types.ExactDeviceRequest | None = None
    first: tuple[types.DeviceSubRequest, ...] = ()
    if inline:
        fields = ", ".join(inline)
        if not o.beta1:
            are, them = ("is not a field", "it") if len(inline) == 1 else ("are not fields", "them")
            o.error(path, f"{fields} {are} of a resource.k8s.io/v1 request: move {them} under `exactly:`")
        elif first_raw is not None:
            o.error(path, f"exactly one of deviceClassName or firstAvailable is allowed, but both are set ({fields}, firstAvailable)")
        if exactly_raw is None and first_raw is None:
            # Decode the inline fields where they are, so later messages point at the user's lines.
            exactly = _exact(o, {key: raw[key] for key in inline}, path)
    if exactly_raw is not None and first_raw is not None:
        o.error(path, "exactly one of `exactly` or `firstAvailable` is allowed, but both are set")
    if exactly_raw is not None:
        m = _map(o, exactly_raw, f"{path}.exactly")
        if m is not None:
            exactly = _exact(o, m, f"{path}.exactly")
    if first_raw is not None:
        first = _first_available(o, first_raw, f"{path}.firstAvailable")
    if not inline and exactly_raw is None and first_raw is None:
        o.error(path, "exactly one of `exactly` or `firstAvailable` is required: write exactly: {deviceClassName: <class>}")
    return types.DeviceRequest(name=name, exactly=exactly, first_available=first)


def _exact(o: _Object, m: Mapping[str, Any], path: str) -> types.ExactDeviceRequest:
    _check_keys(o, m, path, _EXACT_KEYS, _NO_HINTS)
    mode, count = _mode_and_count(o, m, path)
    return types.ExactDeviceRequest(
        device_class_name=_class_name(o, m, path),
        selectors=_selectors(o, m, path),
        allocation_mode=mode,
        count=count,
        admin_access=_bool(o, m, "adminAccess", path),
        tolerations=_tolerations(o, m, path),
        capacity_requests=_capacity_requests(o, m, path),
    )


def _first_available(o: _Object, raw: object, path: str) -> tuple[types.DeviceSubRequest, ...]:
    items = _list(o, raw, path, _MAX_SUBREQUESTS)
    if raw == []:
        o.error(path, "must not be empty: list the alternatives in order of preference")
    subrequests = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        spath = f"{path}[{i}]"
        m = _map(o, item, spath, _SUBREQUEST_KEYS, _SUBREQUEST_HINTS)
        if m is None:
            continue
        name = _unique_label(o, m, "name", spath, seen=seen, what="subrequest name")
        mode, count = _mode_and_count(o, m, spath)
        subrequests.append(types.DeviceSubRequest(
            name=name,
            device_class_name=_class_name(o, m, spath),
            selectors=_selectors(o, m, spath),
            allocation_mode=mode,
            count=count,
            tolerations=_tolerations(o, m, spath),
            capacity_requests=_capacity_requests(o, m, spath),
        ))
    return tuple(subrequests)


def _class_name(o: _Object, m: Mapping[str, Any], path: str) -> str:
    name = _required_str(o, m, "deviceClassName", path, " (the name of a DeviceClass, e.g. gpu.nvidia.com)")
    if name:
        _check(o, f"{path}.deviceClassName", _dns_subdomain(name))
    return name


def _mode_and_count(o: _Object, m: Mapping[str, Any], path: str) -> tuple[types.AllocationMode, int]:
    mode_text = _str(o, m, "allocationMode", path) or "ExactCount"
    count = _int(o, m, "count", path)
    if mode_text == "All":
        if count:
            o.error(f"{path}.count", "must be 0 or unset when allocationMode is All")
        return types.AllocationMode.ALL, 0
    if mode_text != "ExactCount":
        o.error(f"{path}.allocationMode", f"must be ExactCount or All, got {_q(mode_text)}")
    if count is not None and count < 0:
        o.error(f"{path}.count", "must be >= 1")
    # Like the API server, an explicit 0 in ExactCount mode is defaulted to 1.
    return types.AllocationMode.EXACT_COUNT, count if count else 1


def _tolerations(o: _Object, m: Mapping[str, Any], path: str) -> tuple[types.DeviceToleration, ...]:
    base = f"{path}.tolerations"
    result = []
    for i, item in enumerate(_list(o, m.get("tolerations"), base, _MAX_TOLERATIONS)):
        tpath = f"{base}[{i}]"
        t = _map(o, item, tpath, _TOLERATION_KEYS)
        if t is not None:
            result.append(_toleration(o, t, tpath))
    return tuple(result)


def _toleration(o: _Object, t: Mapping[str, Any], path: str) -> types.DeviceToleration:
    key = _str(o, t, "key", path) or ""
    operator = _str(o, t, "operator", path) or "Equal"
    value = _str(o, t, "value", path) or ""
    effect = _str(o, t, "effect", path) or ""
    if key:
        _check(o, f"{path}.key", _label_key(key))
    if operator == "Exists":
        if value:
            o.error(f"{path}.value", "must be empty when operator is Exists")
    elif operator == "Equal":
        if not key:
            o.error(f"{path}.key", "required unless operator is Exists (an empty key with Exists tolerates every taint)")
        _check(o, f"{path}.value", _label_value(value))
    else:
        o.error(f"{path}.operator", f"must be Equal or Exists, got {_q(operator)}")
    if effect and effect not in _TAINT_EFFECTS:
        o.error(f"{path}.effect", f"must be empty, NoSchedule, NoExecute or None, got {_q(effect)}")
    return types.DeviceToleration(key=key, operator=operator, value=value, effect=effect, toleration_seconds=_int(o, t, "tolerationSeconds", path))


def _capacity_requests(o: _Object, m: Mapping[str, Any], path: str) -> dict[str, quantity.Quantity]:
    capacity = _map(o, m.get("capacity"), f"{path}.capacity", _CAPACITY_REQUEST_KEYS)
    if capacity is None:
        return {}
    requests = _map(o, capacity.get("requests"), f"{path}.capacity.requests") or {}
    result = {}
    for name, raw in requests.items():
        rpath = f"{path}.capacity.requests[{name}]"
        _check(o, rpath, _qualified_name(str(name)))
        result[str(name)] = _quantity(o, raw, rpath)
    return result


def _constraint(o: _Object, raw: object, path: str, names: _Names, spec_path: str) -> types.DeviceConstraint | None:
    if isinstance(raw, dict) and "cel" in raw:
        o.error(f"{path}.cel", _constraint_cel_hint(raw, names, spec_path))
        return None
    m = _map(o, raw, path, _CONSTRAINT_KEYS)
    if m is None:
        return None
    refs = _request_refs(o, m, path, names)
    match = _str(o, m, "matchAttribute", path)
    distinct = _str(o, m, "distinctAttribute", path)
    if match is not None and distinct is not None:
        o.error(path, "exactly one of matchAttribute or distinctAttribute is allowed, but both are set")
    elif match is None and distinct is None:
        o.error(path, "exactly one of matchAttribute or distinctAttribute is required, e.g. matchAttribute: gpu.nvidia.com/parentUUID")
    for key, value in (("matchAttribute", match), ("distinctAttribute", distinct)):
        if value is not None:
            _check(o, f"{path}.{key}", _fully_qualified_name(value))
    return types.DeviceConstraint(requests=refs, match_attribute=match, distinct_attribute=distinct)


def _constraint_cel_hint(raw: Mapping[str, Any], names: _Names, spec_path: str) -> str:
    """Constraints with `cel:` (seed 003): say which request's selectors take the expression."""
    listed = raw.get("requests")
    targets: list[Any] = listed if isinstance(listed, list) else list(names)
    indexes = [i for i, name in enumerate(names) if name in targets]
    where = f"{spec_path}.devices.requests[{indexes[0]}]" if len(indexes) == 1 else f"{spec_path}.devices.requests[]"
    return (
        "constraints only support matchAttribute and distinctAttribute: put the expression under the "
        f"request's selectors, {where}.exactly.selectors: [{{cel: {{expression: ...}}}}]"
    )


def _request_refs(o: _Object, m: Mapping[str, Any], path: str, names: _Names) -> tuple[str, ...]:
    refs = _strings(o, m, "requests", path, _MAX_REQUEST_REFS)
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        rpath = f"{path}.requests[{i}]"
        if ref in seen:
            o.error(rpath, f"duplicate request {_q(ref)}")
        seen.add(ref)
        if not _has_request(names, ref):
            known = ", ".join(_all_refs(names)) or "none"
            o.error(rpath, f"{_q(ref)} is not a request of this claim (requests: {known}; a subrequest is written request/subrequest)")
    return refs


def _has_request(names: _Names, ref: str) -> bool:
    request, slash, sub = ref.partition("/")
    if request not in names:
        return False
    if not slash:
        return True
    subs = names[request]
    return subs is not None and sub in subs


def _all_refs(names: _Names) -> list[str]:
    refs = []
    for request, subs in names.items():
        refs.append(request)
        refs.extend(f"{request}/{sub}" for sub in sorted(subs or ()))
    return refs


# --- ResourceClaim status --------------------------------------------------------------------

_STATUS_KEYS = frozenset({"allocation", "reservedFor", "devices"})
_ALLOCATION_KEYS = frozenset({"devices", "nodeSelector", "allocationTimestamp"})
_RESULT_KEYS = frozenset({
    "request", "driver", "pool", "device", "adminAccess", "tolerations", "bindingConditions",
    "bindingFailureConditions", "shareID", "consumedCapacity",
})
_ALLOCATION_DEVICES_KEYS = frozenset({"results", "config"})
_ALLOCATION_CONFIG_KEYS = frozenset({"source", "requests", "opaque"})
_CONSUMER_KEYS = frozenset({"apiGroup", "resource", "name", "uid"})


def _claim_status(o: _Object, raw: object, names: _Names) -> tuple[types.AllocationResult | None, tuple[types.ResourceClaimConsumerReference, ...]]:
    status = _map(o, raw, "status", _STATUS_KEYS) or {}
    allocation = None
    a = _map(o, status.get("allocation"), "status.allocation", _ALLOCATION_KEYS)
    if a is not None:
        allocation = _allocation(o, a, "status.allocation", names)
    reserved = []
    uids: set[str] = set()
    for i, item in enumerate(_list(o, status.get("reservedFor"), "status.reservedFor", _MAX_RESERVED_FOR)):
        rpath = f"status.reservedFor[{i}]"
        r = _map(o, item, rpath, _CONSUMER_KEYS)
        if r is None:
            continue
        uid = _required_str(o, r, "uid", rpath)
        if uid in uids:
            o.error(f"{rpath}.uid", f"duplicate consumer uid {_q(uid)}")
        uids.add(uid)
        reserved.append(types.ResourceClaimConsumerReference(
            api_group=_str(o, r, "apiGroup", rpath) or "",
            resource=_required_str(o, r, "resource", rpath, " (e.g. pods)"),
            name=_required_str(o, r, "name", rpath),
            uid=uid,
        ))
    if reserved and allocation is None:
        o.error("status.reservedFor", "must be empty while status.allocation is not set")
    return allocation, tuple(reserved)


def _allocation(o: _Object, a: Mapping[str, Any], path: str, names: _Names) -> types.AllocationResult:
    devices = _map(o, a.get("devices"), f"{path}.devices", _ALLOCATION_DEVICES_KEYS) or {}
    results = []
    for i, item in enumerate(_list(o, devices.get("results"), f"{path}.devices.results", _MAX_RESULTS)):
        rpath = f"{path}.devices.results[{i}]"
        r = _map(o, item, rpath, _RESULT_KEYS)
        if r is not None:
            results.append(_result(o, r, rpath, names))
    configs = []
    for i, item in enumerate(_list(o, devices.get("config"), f"{path}.devices.config", _MAX_ALLOCATION_CONFIGS)):
        cpath = f"{path}.devices.config[{i}]"
        c = _map(o, item, cpath, _ALLOCATION_CONFIG_KEYS)
        if c is None:
            continue
        source = _required_str(o, c, "source", cpath, " (FromClass or FromClaim)")
        if source and source not in ("FromClass", "FromClaim"):
            o.error(f"{cpath}.source", f"must be FromClass or FromClaim, got {_q(source)}")
        configs.append(types.DeviceAllocationConfiguration(
            source=source, requests=_request_refs(o, c, cpath, names), opaque=_opaque_config(o, c, cpath)))
    selector = None
    if a.get("nodeSelector") is not None:
        selector = _node_selector(o, a["nodeSelector"], f"{path}.nodeSelector")
    return types.AllocationResult(
        results=tuple(results),
        config=tuple(configs),
        node_selector=selector,
        allocation_timestamp=_str(o, a, "allocationTimestamp", path),
    )


def _result(o: _Object, r: Mapping[str, Any], path: str, names: _Names) -> types.DeviceRequestAllocationResult:
    request = _required_str(o, r, "request", path)
    if request and not _has_request(names, request):
        o.error(f"{path}.request", f"{_q(request)} is not a request of this claim (requests: {', '.join(_all_refs(names)) or 'none'})")
    driver = _required_str(o, r, "driver", path)
    if driver:
        _check(o, f"{path}.driver", _driver_name(driver))
    pool = _required_str(o, r, "pool", path)
    if pool:
        _check(o, f"{path}.pool", _pool_name(pool))
    device = _required_str(o, r, "device", path)
    if device:
        _check(o, f"{path}.device", _dns_label(device))
    share_id = _str(o, r, "shareID", path)
    if share_id is not None and not _UUID.match(share_id):
        o.error(f"{path}.shareID", f"{_q(share_id)} must be a lowercase RFC 4122 UUID")
    consumed = {}
    for name, raw in (_map(o, r.get("consumedCapacity"), f"{path}.consumedCapacity") or {}).items():
        cpath = f"{path}.consumedCapacity[{name}]"
        _check(o, cpath, _qualified_name(str(name)))
        consumed[str(name)] = _quantity(o, raw, cpath)
    conditions, failures = _binding_conditions(o, r, path)
    admin = _bool(o, r, "adminAccess", path)
    return types.DeviceRequestAllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device,
        admin_access=True if admin else None,
        tolerations=_tolerations(o, r, path),
        binding_conditions=conditions,
        binding_failure_conditions=failures,
        share_id=share_id,
        consumed_capacity=consumed,
    )


def _binding_conditions(o: _Object, m: Mapping[str, Any], path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    conditions = _strings(o, m, "bindingConditions", path, _MAX_BINDING_CONDITIONS)
    failures = _strings(o, m, "bindingFailureConditions", path, _MAX_BINDING_CONDITIONS)
    for key, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        seen: set[str] = set()
        for i, value in enumerate(values):
            _check(o, f"{path}.{key}[{i}]", _label_key(value))
            if value in seen:
                o.error(f"{path}.{key}[{i}]", f"duplicate condition {_q(value)}")
            seen.add(value)
    for i, value in enumerate(failures):
        if value in conditions:
            o.error(f"{path}.bindingFailureConditions[{i}]", "must not overlap with bindingConditions")
    if conditions and not failures:
        o.error(f"{path}.bindingFailureConditions", "required when bindingConditions are set")
    if failures and not conditions:
        o.error(f"{path}.bindingConditions", "required when bindingFailureConditions are set")
    return conditions, failures


# --- Node selectors (core/v1) ------------------------------------------------------------------

_NODE_SELECTOR_KEYS = frozenset({"nodeSelectorTerms"})
_NODE_SELECTOR_TERM_KEYS = frozenset({"matchExpressions", "matchFields"})
_NODE_SELECTOR_REQUIREMENT_KEYS = frozenset({"key", "operator", "values"})
_NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _node_selector(o: _Object, raw: object, path: str) -> types.NodeSelector:
    m = _map(o, raw, path, _NODE_SELECTOR_KEYS) or {}
    terms = []
    for i, item in enumerate(_list(o, m.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")):
        tpath = f"{path}.nodeSelectorTerms[{i}]"
        t = _map(o, item, tpath, _NODE_SELECTOR_TERM_KEYS) or {}
        terms.append(types.NodeSelectorTerm(
            match_expressions=_requirements(o, t, "matchExpressions", tpath),
            match_fields=_requirements(o, t, "matchFields", tpath),
        ))
    if not terms:
        example = "[{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-1]}]}]"
        o.error(f"{path}.nodeSelectorTerms", f"required: at least one term, e.g. {example}")
    return types.NodeSelector(terms=tuple(terms))


def _requirements(o: _Object, t: Mapping[str, Any], key: str, path: str) -> tuple[types.NodeSelectorRequirement, ...]:
    result = []
    for i, item in enumerate(_list(o, t.get(key), f"{path}.{key}")):
        rpath = f"{path}.{key}[{i}]"
        r = _map(o, item, rpath, _NODE_SELECTOR_REQUIREMENT_KEYS)
        if r is None:
            continue
        label = _required_str(o, r, "key", rpath)
        operator = _required_str(o, r, "operator", rpath)
        values = _strings(o, r, "values", rpath)
        if key == "matchFields":
            if label and label != "metadata.name":
                o.error(f"{rpath}.key", "must be metadata.name (the only field nodes can be selected by)")
            if operator and operator not in ("In", "NotIn"):
                o.error(f"{rpath}.operator", "must be In or NotIn for matchFields")
        elif label:
            _check(o, f"{rpath}.key", _label_key(label))
        if operator and operator not in _NODE_SELECTOR_OPERATORS:
            o.error(f"{rpath}.operator", f"must be one of {', '.join(_NODE_SELECTOR_OPERATORS)}, got {_q(operator)}")
        elif operator in ("In", "NotIn") and not values:
            o.error(f"{rpath}.values", f"required for operator {operator}")
        elif operator in ("Exists", "DoesNotExist") and values:
            o.error(f"{rpath}.values", f"must be empty for operator {operator}")
        elif operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
            o.error(f"{rpath}.values", f"must be exactly one integer for operator {operator}")
        result.append(types.NodeSelectorRequirement(key=label, operator=operator, values=values))
    return tuple(result)


# --- ResourceSlice ---------------------------------------------------------------------------

_SLICE_SPEC_KEYS = frozenset({"driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection", "devices", "sharedCounters"})
_POOL_KEYS = frozenset({"name", "generation", "resourceSliceCount"})
_DEVICE_KEYS = frozenset({
    "name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes", "taints",
    "bindsToNode", "bindingConditions", "bindingFailureConditions", "allowMultipleAllocations",
})
_BASIC_KEYS = _DEVICE_KEYS - {"name"}
_WRAPPED_DEVICE_KEYS = frozenset({"name", "basic"})
_INT64 = range(-(2**63), 2**63)
_COUNTER_SET_KEYS = frozenset({"name", "counters"})
_COUNTER_KEYS = frozenset({"value"})
_CONSUMPTION_KEYS = frozenset({"counterSet", "counters"})
_TAINT_KEYS = frozenset({"key", "value", "effect", "timeAdded"})
_CAPACITY_KEYS = frozenset({"value", "requestPolicy"})
_POLICY_KEYS = frozenset({"default", "validValues", "validRange"})
_RANGE_KEYS = frozenset({"min", "max", "step"})
_SCALAR_KINDS = {kind.value: kind for kind in types.AttributeKind}
_LIST_KINDS = {kind.value + "s": kind for kind in types.AttributeKind}
_ATTRIBUTE_HINTS = {
    "quantity": "attributes have no quantity type: put sizes in the device's capacity, e.g. memory: {value: 80Gi}",
    "value": "attribute values are typed: write {string: ...}, {int: ...}, {bool: ...} or {version: ...} (value is for capacity)",
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE])(i?)B?\Z")
_VERSIONISH = re.compile(r"v?[0-9]+(\.[0-9]+){0,2}\Z")


def _resource_slice(o: _Object, raw: Mapping[str, Any], source: types.Source) -> types.ResourceSlice:
    meta = _meta(o, raw, namespaced=False)
    spec = _map(o, raw.get("spec"), "spec", _SLICE_SPEC_KEYS)
    if spec is None:
        o.error("spec", "required: a slice names its driver, pool, node and devices")
        spec = {}
    driver = _required_str(o, spec, "driver", "spec", " (the DRA driver's name, e.g. gpu.nvidia.com)")
    if driver:
        _check(o, "spec.driver", _driver_name(driver))
    pool = _pool(o, spec.get("pool"))
    node_name = _str(o, spec, "nodeName", "spec")
    node_selector = None
    if spec.get("nodeSelector") is not None:
        node_selector = _node_selector(o, spec["nodeSelector"], "spec.nodeSelector")
        if len(node_selector.terms) > 1:
            o.error("spec.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term")
    all_nodes = _bool(o, spec, "allNodes", "spec")
    per_device = _bool(o, spec, "perDeviceNodeSelection", "spec")
    _node_selection(o, "spec", options=_SLICE_NODE_OPTIONS, node_name=node_name, node_selector=node_selector, all_nodes=all_nodes, per_device=per_device)
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        o.error("spec", "only one of devices or sharedCounters is allowed: publish counter sets in a slice of their own")
    devices = _devices(o, spec.get("devices"), per_device=bool(per_device))
    counter_sets = [
        types.CounterSet(name=name, counters=counters)
        for name, counters in _named_counters(o, spec.get("sharedCounters"), "spec.sharedCounters", limit=_MAX_COUNTER_SETS, keys=_COUNTER_SET_KEYS, name_key="name")
    ]
    return types.ResourceSlice(
        meta=meta,
        driver=driver,
        pool=pool,
        node_name=node_name or None,
        node_selector=node_selector,
        all_nodes=bool(all_nodes),
        per_device_node_selection=bool(per_device),
        devices=devices,
        shared_counters=tuple(counter_sets),
        source=source,
    )


def _pool(o: _Object, raw: object) -> types.ResourcePool:
    p = _map(o, raw, "spec.pool", _POOL_KEYS)
    if p is None:
        o.error("spec.pool", "required: write pool: {name: <node name>, resourceSliceCount: 1}")
        return types.ResourcePool(name="")
    name = _required_str(o, p, "name", "spec.pool")
    if name:
        _check(o, "spec.pool.name", _pool_name(name))
    generation = _int(o, p, "generation", "spec.pool") or 0
    if generation < 0:
        o.error("spec.pool.generation", "must be >= 0")
    count = _int(o, p, "resourceSliceCount", "spec.pool")
    if p.get("resourceSliceCount") is None:
        o.error("spec.pool.resourceSliceCount", "required: the number of slices in this pool, usually 1")
    elif count is not None and count < 1:
        o.error("spec.pool.resourceSliceCount", "must be >= 1")
    return types.ResourcePool(name=name, generation=generation, resource_slice_count=count or 1)


_SLICE_NODE_OPTIONS = "nodeName, nodeSelector, allNodes or perDeviceNodeSelection"
_DEVICE_NODE_OPTIONS = "nodeName, nodeSelector or allNodes"


def _node_selection(
    o: _Object, path: str, *, options: str, node_name: str | None, node_selector: types.NodeSelector | None, all_nodes: bool | None, per_device: bool | None
) -> None:
    """Exactly one way of naming the nodes (a device has no perDeviceNodeSelection: pass None)."""
    chosen = []
    if node_name is not None:
        if node_name:
            chosen.append("nodeName")
            _check(o, f"{path}.nodeName", _dns_subdomain(node_name))
        else:
            o.error(f"{path}.nodeName", "must be unset or a node name")
    if node_selector is not None:
        chosen.append("nodeSelector")
    if all_nodes is not None:
        if all_nodes:
            chosen.append("allNodes")
        else:
            o.error(f"{path}.allNodes", "must be unset or true")
    if per_device is not None:
        if per_device:
            chosen.append("perDeviceNodeSelection")
        else:
            o.error(f"{path}.perDeviceNodeSelection", "must be unset or true")
    if not chosen:
        o.error(path, f"exactly one of {options} is required, e.g. nodeName: <node>")
    elif len(chosen) > 1:
        o.error(path, f"exactly one of {options} is allowed, but {', '.join(chosen)} are set")


def _devices(o: _Object, raw: object, *, per_device: bool) -> tuple[types.Device, ...]:
    items = _list(o, raw, "spec.devices", _MAX_DEVICES)
    devices = []
    names: set[str] = set()
    advanced = False
    for i, item in enumerate(items):
        path = f"spec.devices[{i}]"
        device = _device(o, item, path, per_device=per_device)
        if device is None:
            continue
        if device.name in names:
            o.error(f"{path}.name", f"duplicate device name {_q(device.name)}")
        names.add(device.name)
        advanced = advanced or bool(device.taints or device.consumes_counters or any(a.is_list for a in device.attributes.values()))
        devices.append(device)
    if advanced and len(devices) > _MAX_DEVICES_ADVANCED:
        limit = f"must have at most {_MAX_DEVICES_ADVANCED} items when devices use taints, consumesCounters or list attributes"
        o.error("spec.devices", f"{limit}, got {len(devices)}")
    return tuple(devices)


def _device(o: _Object, raw: object, path: str, *, per_device: bool) -> types.Device | None:
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {_kind_of(raw)}")
        return None
    m: dict[str, Any] = raw
    fields_path = path
    if "basic" in raw:
        # v1beta1 and v1alpha3 wrapped everything but the name in `basic`.
        basic = _map(o, raw["basic"], f"{path}.basic", _BASIC_KEYS)
        if not o.beta1:
            o.error(f"{path}.basic", "the basic: wrapper is gone in resource.k8s.io/v1: move its attributes and capacity up into the device")
        if basic is not None:
            fields_path = f"{path}.basic"
            m = {**basic, "name": raw.get("name")}
        _check_keys(o, raw, path, _WRAPPED_DEVICE_KEYS)
    else:
        _check_keys(o, raw, path, _DEVICE_KEYS)
    name = _required_str(o, raw, "name", path)
    if name:
        _check(o, f"{path}.name", _dns_label(name))
    allow_multiple = bool(_bool(o, m, "allowMultipleAllocations", fields_path))
    attributes = _attributes(o, m.get("attributes"), f"{fields_path}.attributes")
    capacity = _capacities(o, m.get("capacity"), f"{fields_path}.capacity", allow_multiple=allow_multiple)
    if len(attributes) + len(capacity) > _MAX_ATTRIBUTES_AND_CAPACITY:
        o.error(fields_path, f"must have at most {_MAX_ATTRIBUTES_AND_CAPACITY} attributes and capacities together, got {len(attributes) + len(capacity)}")
    values = sum(len(a.values) for a in attributes.values())
    if values > _MAX_ATTRIBUTE_VALUES:
        o.error(fields_path, f"must have at most {_MAX_ATTRIBUTE_VALUES} attribute values in total, got {values}")
    consumes = [
        types.DeviceCounterConsumption(counter_set=name, counters=counters)
        for name, counters in _named_counters(o, m.get("consumesCounters"), f"{fields_path}.consumesCounters", limit=_MAX_CONSUMES_COUNTERS, keys=_CONSUMPTION_KEYS, name_key="counterSet")
    ]
    node_name = _str(o, m, "nodeName", fields_path)
    node_selector = _node_selector(o, m["nodeSelector"], f"{fields_path}.nodeSelector") if m.get("nodeSelector") is not None else None
    all_nodes = _bool(o, m, "allNodes", fields_path)
    if per_device:
        _node_selection(o, fields_path, options=_DEVICE_NODE_OPTIONS, node_name=node_name, node_selector=node_selector, all_nodes=all_nodes, per_device=None)
    elif node_name is not None or node_selector is not None or all_nodes is not None:
        o.error(fields_path, "nodeName, nodeSelector and allNodes on a device need perDeviceNodeSelection: true in the slice spec")
    conditions, failures = ((), ()) if "bindingConditions" not in m and "bindingFailureConditions" not in m else _binding_conditions(o, m, fields_path)
    return types.Device(
        name=name,
        attributes=attributes,
        capacity=capacity,
        consumes_counters=tuple(consumes),
        node_name=node_name or None,
        node_selector=node_selector,
        all_nodes=bool(all_nodes),
        taints=_taints(o, m.get("taints"), f"{fields_path}.taints"),
        binds_to_node=bool(_bool(o, m, "bindsToNode", fields_path)),
        binding_conditions=conditions,
        binding_failure_conditions=failures,
        allow_multiple_allocations=allow_multiple,
    )


def _attributes(o: _Object, raw: object, path: str) -> dict[str, types.DeviceAttribute]:
    m = _map(o, raw, path)
    if not m:
        return {}
    result = {}
    for name, value in m.items():
        key = str(name)
        problem = _qualified_name(key)
        if problem is not None:
            o.error(f"{path}[{key}]", problem)
        # Fast path: a well-formed scalar, without building a path string.
        if type(value) is dict and len(value) == 1:
            for kind in value:
                item = value[kind]
            if type(item) in _FAST_TYPES.get(kind, ()):
                attribute = _scalar_attribute(kind, item)
                if attribute is not None:
                    result[key] = attribute
                    continue
        attribute = _attribute(o, key, value, f"{path}[{key}]")
        if attribute is not None:
            result[key] = attribute
    return result


_FAST_TYPES: Mapping[str, tuple[type, ...]] = {"string": (str,), "version": (str,), "int": (int,), "bool": (bool,)}


@functools.lru_cache(maxsize=65536)
def _scalar_attribute(kind: str, item: str | int | bool) -> types.DeviceAttribute | None:
    """A valid scalar attribute, or None to let `_attribute` report the problem.

    Equal values repeat on every device of a cluster (product names, driver versions);
    sharing one immutable value saves time and memory.
    """
    if isinstance(item, str):
        if len(item) > _MAX_ATTRIBUTE_LENGTH:
            return None
        if kind == "version":
            try:
                version = semver.parse(item)
            except semver.SemverError:
                return None
            return types.DeviceAttribute(kind=types.AttributeKind.VERSION, values=(version,), texts=(item,))
        return types.DeviceAttribute(kind=types.AttributeKind.STRING, values=(item,))
    if kind == "int" and item not in _INT64:
        return None
    return types.DeviceAttribute(kind=_SCALAR_KINDS[kind], values=(item,))


def _attribute(o: _Object, name: str, value: object, path: str) -> types.DeviceAttribute | None:
    if not isinstance(value, dict):
        o.error(path, _plain_attribute_hint(name, value))
        return None
    _check_keys(o, value, path, frozenset(_SCALAR_KINDS) | frozenset(_LIST_KINDS), _ATTRIBUTE_HINTS)
    present = [key for key in value if key in _SCALAR_KINDS or key in _LIST_KINDS]
    if len(present) != 1:
        if present:
            o.error(path, f"exactly one typed value is allowed, but {', '.join(present)} are set")
        elif value.keys() <= frozenset(_SCALAR_KINDS) | frozenset(_LIST_KINDS):
            o.error(path, "exactly one typed value is required: {string: ...}, {int: ...}, {bool: ...} or {version: ...}")
        return None
    key = present[0]
    is_list = key in _LIST_KINDS
    kind = _LIST_KINDS[key] if is_list else _SCALAR_KINDS[key]
    items = value[key]
    if is_list:
        if not isinstance(items, list):
            o.error(f"{path}.{key}", f"must be a list, got {_kind_of(items)}")
            return None
        if not items:
            o.error(f"{path}.{key}", "must not be empty")
            return None
    else:
        items = [items]
    values: list[types.AttributeScalar] = []
    texts: list[str] = []
    for i, item in enumerate(items):
        ipath = f"{path}.{key}[{i}]" if is_list else f"{path}.{key}"
        if kind is types.AttributeKind.INT:
            if not isinstance(item, int) or isinstance(item, bool):
                o.error(ipath, f"must be an integer, got {_kind_of(item)}")
                return None
            if item not in _INT64:
                o.error(ipath, "must fit in 64 bits")
            values.append(item)
        elif kind is types.AttributeKind.BOOL:
            if not isinstance(item, bool):
                o.error(ipath, f"must be true or false, got {_kind_of(item)}")
                return None
            values.append(item)
        elif not isinstance(item, str):
            o.error(ipath, f"must be a string, got {_kind_of(item)}: quote it, e.g. {_q(_yaml_scalar(item))}")
            return None
        else:
            if len(item) > _MAX_ATTRIBUTE_LENGTH:
                o.error(ipath, f"must be at most {_MAX_ATTRIBUTE_LENGTH} characters, got {len(item)}")
            if kind is types.AttributeKind.VERSION:
                try:
                    values.append(semver.parse(item))
                except semver.SemverError as error:
                    o.error(ipath, str(error))
                    return None
                texts.append(item)
            else:
                values.append(item)
    return types.DeviceAttribute(kind=kind, values=tuple(values), is_list=is_list, texts=tuple(texts))


def _plain_attribute_hint(name: str, value: object) -> str:
    """Attributes written as plain scalars (`memory: "24GB"`): say which typed value to write."""
    shown = _q(value) if isinstance(value, str) else _yaml_scalar(value)
    text = value if isinstance(value, str) else ""
    if "/" not in name and _qualified_name(name) is not None:
        name = _identifier_suggestion(name) or name
    size = _SIZE.match(text)
    if size:
        number, prefix, binary = size.groups()
        capacity = f"{number}{prefix}{binary}" if binary or prefix != "K" else f"{number}k"
        return f"{shown} is a plain value; a size belongs in the device's capacity: {name}: {{value: {capacity}}} (or write {name}: {{string: {shown}}})"
    if isinstance(value, bool):
        typed = f"{{bool: {shown}}}"
    elif isinstance(value, int):
        typed = f"{{int: {shown}}}"
    elif text.isdigit():
        typed = f"{{int: {text}}}"
    elif _VERSIONISH.match(text):
        parts = text.lstrip("v").split(".")
        typed = f"{{version: \"{'.'.join(parts + ['0'] * (3 - len(parts)))}\"}}"
    elif isinstance(value, str):
        typed = f"{{string: {shown}}}"
    else:
        return f"must be a typed value such as {{string: ...}}, {{int: ...}}, {{bool: ...}} or {{version: ...}}, got {_kind_of(value)}"
    return f"{shown} is a plain value; attributes are typed: write {name}: {typed} ({{string: ...}}, {{int: ...}}, {{bool: ...}} or {{version: ...}})"


def _capacities(o: _Object, raw: object, path: str, *, allow_multiple: bool) -> dict[str, types.DeviceCapacity]:
    m = _map(o, raw, path)
    if not m:
        return {}
    result = {}
    for name, value in m.items():
        key = str(name)
        cpath = f"{path}[{key}]"
        _check(o, cpath, _qualified_name(key))
        if not isinstance(value, dict):
            shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else _q(value)
            o.error(cpath, f"capacity entries are objects: write {key}: {{value: {shown}}}")
            continue
        _check_keys(o, value, cpath, _CAPACITY_KEYS)
        if value.get("value") is None:
            o.error(f"{cpath}.value", "required (a quantity such as 80Gi)")
            continue
        total = _quantity(o, value["value"], f"{cpath}.value")
        policy = None
        if value.get("requestPolicy") is not None:
            if not allow_multiple:
                o.error(f"{cpath}.requestPolicy", "only allowed when the device sets allowMultipleAllocations: true")
            policy = _request_policy(o, value["requestPolicy"], f"{cpath}.requestPolicy", total)
        result[key] = types.DeviceCapacity(value=total, request_policy=policy)
    return result


def _request_policy(o: _Object, raw: object, path: str, total: quantity.Quantity) -> types.CapacityRequestPolicy | None:
    p = _map(o, raw, path, _POLICY_KEYS)
    if p is None:
        return None
    default = _quantity(o, p["default"], f"{path}.default") if p.get("default") is not None else None
    if default is not None and total < default:
        o.error(f"{path}.default", f"must not be larger than the capacity value {total}")
    listed = _list(o, p.get("validValues"), f"{path}.validValues", _MAX_VALID_VALUES)
    valid_values = tuple(_quantity(o, v, f"{path}.validValues[{i}]") for i, v in enumerate(listed))
    valid_range = None
    if valid_values and p.get("validRange") is not None:
        o.error(path, "at most one of validValues or validRange is allowed")
    elif valid_values:
        for i, v in enumerate(valid_values):
            if i and not valid_values[i - 1] < v:
                o.error(f"{path}.validValues[{i}]", "values must be unique and in ascending order")
            if total < v:
                o.error(f"{path}.validValues[{i}]", f"must not be larger than the capacity value {total}")
        if default is None:
            o.error(f"{path}.default", "required when validValues is set")
        elif default not in valid_values:
            o.error(f"{path}.default", "must be one of validValues")
    elif p.get("validRange") is not None:
        valid_range = _valid_range(o, p["validRange"], f"{path}.validRange", total, default)
        if default is None:
            o.error(f"{path}.default", "required when validRange is set")
    return types.CapacityRequestPolicy(default=default, valid_values=valid_values, valid_range=valid_range)


def _valid_range(o: _Object, raw: object, path: str, total: quantity.Quantity, default: quantity.Quantity | None) -> types.CapacityRequestPolicyRange | None:
    r = _map(o, raw, path, _RANGE_KEYS)
    if r is None:
        return None
    if r.get("min") is None:
        o.error(f"{path}.min", "required when validRange is set")
        return None
    low = _quantity(o, r["min"], f"{path}.min")
    high = _quantity(o, r["max"], f"{path}.max") if r.get("max") is not None else None
    step = _quantity(o, r["step"], f"{path}.step") if r.get("step") is not None else None
    if low.value < 0:
        o.error(f"{path}.min", "must be >= 0")
    if total < low:
        o.error(f"{path}.min", f"must not be larger than the capacity value {total}")
    if default is not None and default < low:
        o.error(f"{path}.min", f"must not be larger than default {default}")
    if high is not None:
        if high < low:
            o.error(f"{path}.max", f"must not be smaller than min {low}")
        if total < high:
            o.error(f"{path}.max", f"must not be larger than the capacity value {total}")
        if default is not None and high < default:
            o.error(f"{path}.max", f"must not be smaller than default {default}")
    if step is not None:
        if step.value <= 0:
            o.error(f"{path}.step", "must be > 0")
        else:
            if total.value < low.value + step.value:
                o.error(f"{path}.step", f"min + step must not be larger than the capacity value {total}")
            for label, value in (("default", default), ("max", high)):
                if value is not None and (value.value - low.value) % step.value:
                    o.error(f"{path}.step", f"{label} {value} is not min {low} plus a multiple of step {step}")
    return types.CapacityRequestPolicyRange(min=low, max=high, step=step)


def _unique_label(o: _Object, m: Mapping[str, Any], key: str, path: str, *, seen: set[str], what: str) -> str:
    """The required DNS-label `m[key]`, reported when it repeats a name in `seen` (which it joins)."""
    name = _required_str(o, m, key, path)
    if name:
        _check(o, f"{path}.{key}", _dns_label(name))
        if name in seen:
            o.error(f"{path}.{key}", f"duplicate {what} {_q(name)}")
        seen.add(name)
    return name


def _named_counters(
    o: _Object, raw: object, path: str, *, limit: int, keys: frozenset[str], name_key: str
) -> list[tuple[str, dict[str, quantity.Quantity]]]:
    """A list of entries that each name a counter set (unique, a DNS label) and hold
    counters: a slice's `sharedCounters` or a device's `consumesCounters`."""
    entries = []
    seen: set[str] = set()
    for i, item in enumerate(_list(o, raw, path, limit)):
        cpath = f"{path}[{i}]"
        c = _map(o, item, cpath, keys)
        if c is None:
            continue
        name = _unique_label(o, c, name_key, cpath, seen=seen, what="counter set")
        entries.append((name, _counters(o, c, cpath)))
    return entries


def _counters(o: _Object, m: Mapping[str, Any], path: str) -> dict[str, quantity.Quantity]:
    raw = m.get("counters")
    counters = _map(o, raw, f"{path}.counters")
    if not counters:
        if raw is None or counters is not None:
            o.error(f"{path}.counters", "required: write counters: {<name>: {value: <quantity>}}")
        return {}
    if len(counters) > _MAX_COUNTERS:
        o.error(f"{path}.counters", f"must have at most {_MAX_COUNTERS} entries, got {len(counters)}")
        return {}
    result = {}
    for name, value in counters.items():
        cpath = f"{path}.counters[{name}]"
        _check(o, cpath, _dns_label(str(name)))
        if not isinstance(value, dict) or value.get("value") is None:
            o.error(cpath, f"counters are objects: write {name}: {{value: <quantity>}}")
            continue
        _check_keys(o, value, cpath, _COUNTER_KEYS)
        result[str(name)] = _quantity(o, value["value"], f"{cpath}.value")
    return result


def _taints(o: _Object, raw: object, path: str) -> tuple[types.DeviceTaint, ...]:
    result = []
    for i, item in enumerate(_list(o, raw, path, _MAX_TAINTS)):
        tpath = f"{path}[{i}]"
        t = _map(o, item, tpath, _TAINT_KEYS)
        if t is None:
            continue
        key = _required_str(o, t, "key", tpath)
        if key:
            _check(o, f"{tpath}.key", _label_key(key))
        value = _str(o, t, "value", tpath) or ""
        _check(o, f"{tpath}.value", _label_value(value))
        effect = _required_str(o, t, "effect", tpath, " (NoSchedule, NoExecute or None)")
        if effect and effect not in _TAINT_EFFECTS:
            o.error(f"{tpath}.effect", f"must be NoSchedule, NoExecute or None, got {_q(effect)}")
        result.append(types.DeviceTaint(key=key, value=value, effect=effect, time_added=_str(o, t, "timeAdded", tpath)))
    return tuple(result)


# --- Pods and workloads ----------------------------------------------------------------------

_POD_CLAIM_KEYS = frozenset({"name", "resourceClaimName", "resourceClaimTemplateName"})
_POD_CLAIM_KEYS_WITH_SOURCE = _POD_CLAIM_KEYS | {"source"}  # reported with its own hint
_CONTAINER_CLAIM_KEYS = frozenset({"name", "request"})


def _pod_spec(o: _Object, spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The allocation-relevant fields of a pod spec, as keyword arguments of `types.Pod`."""
    if "resourceClaimTemplates" in spec:
        o.error(f"{path}.resourceClaimTemplates", _inline_templates_hint(spec["resourceClaimTemplates"], path))
    claims = []
    claim_names: set[str] = set()
    for i, item in enumerate(_list(o, spec.get("resourceClaims"), f"{path}.resourceClaims")):
        cpath = f"{path}.resourceClaims[{i}]"
        if isinstance(item, dict) and "source" in item:
            o.error(f"{cpath}.source", _claim_source_hint(item["source"]))
        c = _map(o, item, cpath, _POD_CLAIM_KEYS_WITH_SOURCE)
        if c is None:
            continue
        name = _unique_label(o, c, "name", cpath, seen=claim_names, what="claim name")
        claim_name = _str(o, c, "resourceClaimName", cpath)
        template_name = _str(o, c, "resourceClaimTemplateName", cpath)
        if claim_name is not None and template_name is not None:
            o.error(cpath, "exactly one of resourceClaimName or resourceClaimTemplateName is allowed, but both are set")
        elif claim_name is None and template_name is None and "source" not in c:
            o.error(cpath, "exactly one of resourceClaimName or resourceClaimTemplateName is required")
        for key, value in (("resourceClaimName", claim_name), ("resourceClaimTemplateName", template_name)):
            if value is not None:
                _check(o, f"{cpath}.{key}", _dns_subdomain(value) if value else "must not be empty")
        claims.append(types.PodResourceClaim(name=name, resource_claim_name=claim_name, resource_claim_template_name=template_name))
    container_claims = []
    for group in ("initContainers", "containers"):
        for i, item in enumerate(_list(o, spec.get(group), f"{path}.{group}")):
            kpath = f"{path}.{group}[{i}]"
            container = _map(o, item, kpath)
            if container is None:
                continue
            container_name = _required_str(o, container, "name", kpath)
            resources = _map(o, container.get("resources"), f"{kpath}.resources") or {}
            _device_plugin_resources(o, resources, f"{kpath}.resources")
            _claim_env(o, container, kpath)
            for j, claim in enumerate(_list(o, resources.get("claims"), f"{kpath}.resources.claims")):
                rpath = f"{kpath}.resources.claims[{j}]"
                r = _map(o, claim, rpath, _CONTAINER_CLAIM_KEYS)
                if r is None:
                    continue
                name = _required_str(o, r, "name", rpath)
                if name and name not in claim_names:
                    entry = f"{{name: {name}, resourceClaimTemplateName: <template>}}"
                    o.error(f"{rpath}.name", f"{_q(name)} is not in {path}.resourceClaims: add {entry} (or resourceClaimName) there")
                container_claims.append(types.ContainerClaim(container=container_name, name=name, request=_str(o, r, "request", rpath) or ""))
    return {
        "resource_claims": tuple(claims),
        "container_claims": tuple(container_claims),
        "node_name": _str(o, spec, "nodeName", path) or "",
        "node_selector": _string_map(o, spec, "nodeSelector", path),
        "scheduler_name": _str(o, spec, "schedulerName", path) or "default-scheduler",
    }


def _device_plugin_resources(o: _Object, resources: Mapping[str, Any], path: str) -> None:
    """`nvidia.com/gpu` limits (the device plugin's API, seeds 000 and 003) are legal but not DRA: warn."""
    for section in ("limits", "requests"):
        amounts = resources.get(section)
        if not isinstance(amounts, dict):
            continue
        for name in amounts:
            if isinstance(name, str) and (name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-")):
                o.warn(
                    f"{path}.{section}[{name}]",
                    "a device-plugin resource, not allocated by DRA: request the GPU with a ResourceClaimTemplate "
                    "(exactly: {deviceClassName: gpu.nvidia.com}), reference it in spec.resourceClaims and list it in resources.claims",
                )


def _claim_env(o: _Object, container: Mapping[str, Any], path: str) -> None:
    """`env[].valueFrom.resourceFieldRef.resource: claims/...` (seed 003) does not exist: say what provides the devices."""
    env = container.get("env")
    for i, item in enumerate(env if isinstance(env, list) else ()):
        value_from = item.get("valueFrom") if isinstance(item, dict) else None
        ref = value_from.get("resourceFieldRef") if isinstance(value_from, dict) else None
        resource = ref.get("resource") if isinstance(ref, dict) else None
        if isinstance(resource, str) and resource.startswith("claims/"):
            o.error(
                f"{path}.env[{i}].valueFrom.resourceFieldRef.resource",
                f"{_q(resource)} is not a container resource: the DRA driver injects the allocated devices "
                "(and NVIDIA_VISIBLE_DEVICES) through CDI; delete this env entry",
            )


def _claim_source_hint(source: object) -> str:
    """`resourceClaims[].source` from 1.26-1.30 era articles."""
    if isinstance(source, dict):
        for key in ("resourceClaimName", "resourceClaimTemplateName"):
            if isinstance(source.get(key), str):
                return f"source: was removed from the Pod API: write {key}: {source[key]} directly on the entry"
    return "source: was removed from the Pod API: write resourceClaimName or resourceClaimTemplateName directly on the entry"


def _inline_templates_hint(raw: object, path: str) -> str:
    """`resourceClaimTemplates:` inside a pod spec (seed 003): pods only reference templates."""
    name = "<name>"
    if isinstance(raw, list) and raw and isinstance(raw[0], dict):
        meta = raw[0].get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            name = meta["name"]
    return (
        "not a Pod field: create a resource.k8s.io/v1 ResourceClaimTemplate object named "
        f"{name} and reference it with {path}.resourceClaims: [{{name: {name}, resourceClaimTemplateName: {name}}}]"
    )


def _workload(o: _Object, raw: Mapping[str, Any], count_field: str, source: types.Source) -> list[types.Pod]:
    meta = _meta(o, raw, namespaced=True)
    spec = _map(o, raw.get("spec"), "spec") or {}
    count = _int(o, spec, count_field, "spec")
    if count is None:
        count = 1
    elif count < 0:
        o.error(f"spec.{count_field}", "must be >= 0")
    elif count > _MAX_REPLICAS:
        o.error(f"spec.{count_field}", f"must be at most {_MAX_REPLICAS}: dractl expands every replica into a Pod")
        count = 0
    template = _map(o, spec.get("template"), "spec.template", _TEMPLATE_SPEC_KEYS)
    if template is None:
        o.error("spec.template", "required: the pod template")
        return []
    template_meta = _meta(o, template, namespaced=False, path="spec.template.metadata", required=False)
    pod_spec = _map(o, template.get("spec"), "spec.template.spec") or {}
    fields = _pod_spec(o, pod_spec, "spec.template.spec")
    return [
        types.Pod(
            meta=types.ObjectMeta(name=f"{meta.name}-{i}", namespace=meta.namespace, labels=template_meta.labels, annotations=template_meta.annotations),
            source=source,
            **fields,
        )
        for i in range(max(count, 0))
    ]
