"""Field helpers shared by every kind: typed field access, the API's limits, name formats and metadata.

What it does: reads one field of a decoded mapping with the type the API expects, reporting a wrong type or an
unknown key through `problems.Report`; checks names (DNS labels and subdomains, label keys, qualified names) against
the API's formats and limits. What it must not do: know about any one kind's shape. Pure; the name checks are
memoised because the same names repeat across thousands of devices.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from dractl.model import limits, quantity, types
from dractl.model.decode import problems

# Limits of resource.k8s.io/v1 (see research/k8s-dra-core.md section 1.8).
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_ALLOCATION_CONFIGS = 64
MAX_REQUEST_REFS = 32
MAX_TOLERATIONS = 16
MAX_CEL_BYTES = 10 * 1024
MAX_OPAQUE_BYTES = 10 * 1024
MAX_RESULTS = limits.MAX_RESULTS  # shared with the allocator, defined once in dractl.model.limits
MAX_RESERVED_FOR = limits.MAX_RESERVED_FOR
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMES_COUNTERS = 2
MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ATTRIBUTE_LENGTH = 64
MAX_TAINTS = 16
_MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = 10
MAX_REPLICAS = 100_000  # dractl's own bound: every replica becomes a Pod value
NVIDIA_DOMAIN = "gpu.nvidia.com"
NO_HINTS: Mapping[str, str] = {}


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def quote(value: object) -> str:
    """A value quoted the way YAML and JSON users read it."""
    return json.dumps(value, default=str, ensure_ascii=False)


def check_keys(
    o: problems.Report, raw: Mapping[str, Any], path: str, allowed: frozenset[str], hints: Mapping[str, str] = NO_HINTS
) -> None:
    if raw.keys() <= allowed:
        return
    for key in raw:
        if key in allowed:
            continue
        hint = hints.get(key)
        if hint is None:
            import difflib  # imported here: only unknown fields need it, and valid manifests have none

            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = (
                f"unknown field; did you mean {close[0]}?"
                if close
                else f"unknown field (fields here: {', '.join(sorted(allowed))})"
            )
        o.error(join(path, str(key)), hint)


def as_map(
    o: problems.Report,
    raw: object,
    path: str,
    allowed: frozenset[str] | None = None,
    hints: Mapping[str, str] = NO_HINTS,
) -> dict[str, Any] | None:
    """A mapping field (None when absent or invalid); unknown keys are reported when `allowed` is given."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        o.error(path, f"must be an object (a YAML mapping), got {kind_of(raw)}")
        return None
    if allowed is not None:
        check_keys(o, raw, path, allowed, hints)
    return raw


def kind_of(raw: object) -> str:
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, (int, float)):
        return f"the number {raw:.6g}" if isinstance(raw, float) else "a number"
    if isinstance(raw, str):
        if len(raw) > 64:
            # Hostile input may be megabytes long: one message line must stay readable.
            return f'the string {quote(raw[:40])[:-1]}..." ({len(raw)} characters)'
        return f"the string {quote(raw)}"
    if isinstance(raw, list):
        return "a list"
    if isinstance(raw, dict):
        return "an object"
    return "null" if raw is None else type(raw).__name__


def as_list(o: problems.Report, raw: object, path: str, limit: int | None = None) -> list[Any]:
    """A list field; over the limit it is reported and treated as empty, like the API server does."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        o.error(path, f"must be a list, got {kind_of(raw)}")
        return []
    if limit is not None and len(raw) > limit:
        o.error(path, f"must have at most {limit} items, got {len(raw)}")
        return []
    return raw


def as_str(o: problems.Report, m: Mapping[str, Any], key: str, path: str) -> str | None:
    value = m.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return _timestamp(value)
    if isinstance(value, bool):
        # kubectl reads YAML 1.1: unquoted y, n, yes, no, on and off are booleans too.
        o.error(
            join(path, key),
            "must be a string, got a boolean: quote it (unquoted y, n, yes, no, on, off, true and false are booleans)",
        )
        return None
    o.error(join(path, key), f"must be a string, got {kind_of(value)}")
    return None


def required_str(o: problems.Report, m: Mapping[str, Any], key: str, path: str, example: str = "") -> str:
    value = as_str(o, m, key, path)
    if value == "" or (value is None and m.get(key) is None):
        o.error(join(path, key), f"required{example}")
    return value or ""


def as_int(o: problems.Report, m: Mapping[str, Any], key: str, path: str) -> int | None:
    value = m.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if value is not None and value not in INT64:
            o.error(join(path, key), f"must fit in 64 bits (at most {INT64.stop - 1}), got {value}")
            return None
        return value
    if isinstance(value, float) and (value.is_integer() or math.isinf(value)) and abs(value) >= 2**63:
        o.error(join(path, key), f"must fit in 64 bits (at most {INT64.stop - 1}), got {value:.6g}")
        return None
    o.error(join(path, key), f"must be an integer, got {kind_of(value)}")
    return None


def as_bool(o: problems.Report, m: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = m.get(key)
    if value is None or isinstance(value, bool):
        return value
    o.error(join(path, key), f"must be true or false, got {kind_of(value)}")
    return None


def as_strings(
    o: problems.Report, m: Mapping[str, Any], key: str, path: str, limit: int | None = None
) -> tuple[str, ...]:
    items = as_list(o, m.get(key), join(path, key), limit)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            o.error(f"{join(path, key)}[{i}]", f"must be a string, got {kind_of(item)}")
            return ()
    return tuple(items)


def as_string_map(o: problems.Report, m: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = as_map(o, m.get(key), join(path, key))
    if raw is None:
        return {}
    for k, v in raw.items():
        if not isinstance(k, str):
            o.error(f"{join(path, key)}[{k}]", f"keys must be strings: quote it, e.g. {quote(yaml_scalar(k))}")
        elif isinstance(v, (bool, int, float)):
            o.error(
                f"{join(path, key)}[{k}]",
                f"must be a string, got {kind_of(v)}: quote it, e.g. {k}: {quote(yaml_scalar(v))}",
            )
        elif not isinstance(v, str):
            o.error(f"{join(path, key)}[{k}]", f"must be a string, got {kind_of(v)}")
    return raw


def yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _timestamp(value: datetime.date) -> str:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat() + "Z"
    return value.isoformat()


# The same sizes repeat on every device; `typed` keeps 1, 1.0 and True apart.
_parse_quantity = functools.lru_cache(maxsize=65536, typed=True)(quantity.parse)


def as_quantity(o: problems.Report, raw: object, path: str) -> quantity.Quantity:
    """A quantity that fits in an int64: the allocator counts capacities and counters in int64,
    and resource.Quantity caps binary-suffixed values there."""
    try:
        if isinstance(raw, (str, int, float)):
            value = _parse_quantity(raw)
        else:
            value = quantity.parse(raw)
    except quantity.QuantityError as error:
        o.error(path, str(error))
        return quantity.from_int(0)
    if not quantity.fits_int64(value):
        o.error(path, f"{quantity.shown(value.text)} {_BEYOND_INT64}")
        return quantity.from_int(0)
    return value


_BEYOND_INT64 = "is larger than 2^63-1 (9223372036854775807, just under 8Ei), the most a capacity or counter holds"


def check(o: problems.Report, path: str, problem: str | None) -> None:
    if problem is not None:
        o.error(path, problem)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


@functools.lru_cache(maxsize=16384)
def dns_label(value: str) -> str | None:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        return (
            f"{quote(value)} is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending "
            "with a letter or digit"
        )
    return None


@functools.lru_cache(maxsize=16384)
def dns_subdomain(value: str) -> str | None:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        return (
            f"{quote(value)} is not a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting "
            "and ending with a letter or digit"
        )
    return None


@functools.lru_cache(maxsize=4096)
def driver_name(value: str) -> str | None:
    if len(value) > 63 or not _DNS_SUBDOMAIN.match(value.lower()):
        return f'{quote(value)} is not a driver name: a DNS subdomain of at most 63 characters such as "gpu.nvidia.com"'
    return None


@functools.lru_cache(maxsize=16384)
def pool_name(value: str) -> str | None:
    if len(value) > 253 or any(dns_subdomain(part) for part in value.split("/")):
        return f"{quote(value)} is not a pool name: DNS subdomains separated by '/', at most 253 characters"
    return None


def _c_identifier(value: str) -> str | None:
    if len(value) <= 32 and C_IDENTIFIER.match(value):
        return None
    message = f"{quote(value)} is not a C identifier: at most 32 letters, digits and '_', not starting with a digit"
    suggestion = identifier_suggestion(value)
    return f"{message} (e.g. {suggestion})" if suggestion else message


def identifier_suggestion(value: str) -> str | None:
    """`cuda-version` -> `cudaVersion`, the NVIDIA driver's spelling; None when nothing fits."""
    parts = [part for part in re.split(r"[^A-Za-z0-9_]+", value) if part]
    suggestion = parts[0] + "".join(part[:1].upper() + part[1:] for part in parts[1:]) if parts else ""
    return suggestion if len(suggestion) <= 32 and C_IDENTIFIER.match(suggestion) else None


@functools.lru_cache(maxsize=16384)
def qualified_name(value: str) -> str | None:
    """A device attribute or capacity name: `id` (the driver's domain) or `domain/id`."""
    if value.count("/") > 1:
        return f"{quote(value)} must not contain more than one '/'"
    domain, slash, ident = value.partition("/")
    if not slash:
        return _c_identifier(value)
    if not domain:
        return f"{quote(value)}: the domain before '/' must not be empty"
    if not ident:
        return f"{quote(value)}: the name after '/' must not be empty"
    return driver_name(domain) or _c_identifier(ident)


def fully_qualified_name(value: str) -> str | None:
    problem = qualified_name(value)
    if problem is None and "/" not in value:
        problem = (
            f"{quote(value)} must be fully qualified, a domain and a name separated by '/', e.g. "
            f'"{NVIDIA_DOMAIN}/{value}"'
        )
    return problem


@functools.lru_cache(maxsize=4096)
def label_key(value: str) -> str | None:
    prefix, slash, name = value.rpartition("/")
    if (slash and (not prefix or dns_subdomain(prefix))) or not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"{quote(value)} is not a label key: an optional DNS subdomain prefix and '/', "
            "then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    return None


@functools.lru_cache(maxsize=4096)
def label_value(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            f"{quote(value)} is not a label value: at most 63 letters, digits, '-', '_' and '.', starting and "
            "ending with a letter or digit"
        )
    return None


def extended_resource_name(value: str) -> str | None:
    if "/" not in value or "kubernetes.io/" in value or label_key("requests." + value):
        return (
            f"{quote(value)} is not an extended resource name: a domain outside kubernetes.io, '/', and a name, "
            'e.g. "example.com/gpu"'
        )
    return None


TOP_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})
TOP_KEYS_WITH_STATUS = TOP_KEYS | {"status"}
_META_KEYS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


def top_keys(
    o: problems.Report, raw: Mapping[str, Any], allowed: frozenset[str], hints: Mapping[str, str] = NO_HINTS
) -> None:
    check_keys(o, raw, "", allowed, hints)


_NAME_ONLY = frozenset({"name", "namespace"})


def plain_object_meta(raw: Mapping[str, Any], *, namespaced: bool) -> types.ObjectMeta | None:
    """`object_meta` for the common case, `metadata` with just a valid name (and namespace),
    else None. Pure: thousands of generated claims and slices look like this, and the full
    checks cost ten lookups."""
    m = raw.get("metadata")
    if type(m) is dict and m.keys() <= _NAME_ONLY:
        name, namespace = m.get("name"), m.get("namespace") if namespaced else ""
        if (
            type(name) is str
            and name
            and dns_subdomain(name) is None
            and (namespace is None or (type(namespace) is str and namespace and dns_label(namespace) is None))
        ):
            return types.ObjectMeta(name=name, namespace=namespace if namespace is not None else "default")
    return None


def object_meta(
    o: problems.Report, raw: Mapping[str, Any], *, namespaced: bool, path: str = "metadata", required: bool = True
) -> types.ObjectMeta:
    plain = plain_object_meta(raw, namespaced=namespaced)
    if plain is not None:
        return plain
    m = as_map(o, raw.get("metadata"), path, _META_KEYS) or {}
    name = as_str(o, m, "name", path) or ""
    if not name:
        if required:
            o.error(join(path, "name"), "required")
    else:
        check(o, join(path, "name"), dns_subdomain(name))
    namespace = ""
    if namespaced:
        namespace = as_str(o, m, "namespace", path) or "default"
        check(o, join(path, "namespace"), dns_label(namespace))
    labels = as_string_map(o, m, "labels", path)
    for key, value in labels.items():
        if isinstance(key, str) and isinstance(value, str):
            check(o, f"{path}.labels[{key}]", label_key(key) or label_value(value))
    owners = as_list(o, m.get("ownerReferences"), join(path, "ownerReferences"))
    for i, owner in enumerate(owners):
        as_map(o, owner, f"{path}.ownerReferences[{i}]")
    return types.ObjectMeta(
        name=name,
        namespace=namespace,
        uid=as_str(o, m, "uid", path) or "",
        generate_name=as_str(o, m, "generateName", path) or "",
        labels=labels,
        annotations=as_string_map(o, m, "annotations", path),
        resource_version=as_str(o, m, "resourceVersion", path) or "",
        generation=as_int(o, m, "generation", path) or 0,
        finalizers=as_strings(o, m, "finalizers", path),
        owner_references=tuple(owner for owner in owners if isinstance(owner, dict)),
        deletion_timestamp=as_str(o, m, "deletionTimestamp", path),
    )


TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def binding_conditions(o: problems.Report, m: Mapping[str, Any], path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    conditions = as_strings(o, m, "bindingConditions", path, _MAX_BINDING_CONDITIONS)
    failures = as_strings(o, m, "bindingFailureConditions", path, _MAX_BINDING_CONDITIONS)
    for key, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        seen: set[str] = set()
        for i, value in enumerate(values):
            check(o, f"{path}.{key}[{i}]", label_key(value))
            if value in seen:
                o.error(f"{path}.{key}[{i}]", f"duplicate condition {quote(value)}")
            seen.add(value)
    for i, value in enumerate(failures):
        if value in conditions:
            o.error(f"{path}.bindingFailureConditions[{i}]", "must not overlap with bindingConditions")
    if conditions and not failures:
        o.error(f"{path}.bindingFailureConditions", "required when bindingConditions are set")
    if failures and not conditions:
        o.error(f"{path}.bindingConditions", "required when bindingFailureConditions are set")
    return conditions, failures


INT64 = range(-(2**63), 2**63)


def unique_label(o: problems.Report, m: Mapping[str, Any], key: str, path: str, *, seen: set[str], what: str) -> str:
    """The required DNS-label `m[key]`, reported when it repeats a name in `seen` (which it joins)."""
    name = required_str(o, m, key, path)
    if name:
        check(o, f"{path}.{key}", dns_label(name))
        if name in seen:
            o.error(f"{path}.{key}", f"duplicate {what} {quote(name)}")
        seen.add(name)
    return name


def claim_entry(
    o: problems.Report, entry: Mapping[str, Any], path: str, *, seen: set[str], sourced: bool = False
) -> types.PodResourceClaim:
    """One `resourceClaims[]` entry of a Pod or a PodGroup: a name unique among `seen`, and exactly one of
    `resourceClaimName` and `resourceClaimTemplateName`, a DNS subdomain. `sourced`: the entry has the removed
    `source` field, already reported with its hint, so the lack of both names is not reported again."""
    name = unique_label(o, entry, "name", path, seen=seen, what="claim name")
    claim_name = as_str(o, entry, "resourceClaimName", path)
    template_name = as_str(o, entry, "resourceClaimTemplateName", path)
    if claim_name is not None and template_name is not None:
        o.error(path, "exactly one of resourceClaimName or resourceClaimTemplateName is allowed, but both are set")
    elif claim_name is None and template_name is None and not sourced:
        o.error(path, "exactly one of resourceClaimName or resourceClaimTemplateName is required")
    for key, value in (("resourceClaimName", claim_name), ("resourceClaimTemplateName", template_name)):
        if value is not None:
            check(o, f"{path}.{key}", dns_subdomain(value) if value else "must not be empty")
    return types.PodResourceClaim(name=name, resource_claim_name=claim_name, resource_claim_template_name=template_name)
