"""PodGroups of both APIs: Kubernetes 1.36's `scheduling.k8s.io/v1alpha2` and scheduler-plugins'
`scheduling.x-k8s.io/v1alpha1` CRD (the seed article's), and how a pod names the one it joins.

What it does: keeps what gang placement needs (the minimum count, the topology key, the group's own
claims, the v1alpha1 timeout and minimum resources) and reports every malformed field with the object
and its path. What it must not do: check that a named group is of the API that names it (`problems.Results`
does, once every document is read) or place anything. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl.model import types
from dractl.model.decode import common, problems

WORKLOAD_GROUP = "scheduling.k8s.io"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
POD_GROUP_LABEL = types.POD_GROUP_LABEL

# Kubernetes 1.36 takes one topology constraint per PodGroup.
MAX_TOPOLOGY_CONSTRAINTS = 1
_POLICY_KEYS = frozenset({"basic", "gang"})
_GANG_KEYS = frozenset({"minCount"})
_TOPOLOGY_KEYS = frozenset({"key"})
_CLAIM_KEYS = frozenset({"name", "resourceClaimName", "resourceClaimTemplateName"})
_SCHEDULING_GROUP_KEYS = frozenset({"podGroupName"})
_COSCHEDULING_SPEC_KEYS = frozenset({"minMember", "minResources", "scheduleTimeoutSeconds"})
# Fields of the other API, written into a v1alpha1 PodGroup.
_COSCHEDULING_HINTS = {
    "schedulingPolicy": f"a {WORKLOAD_GROUP}/v1alpha2 field: this API's gang minimum is spec.minMember",
    "minCount": f"a {WORKLOAD_GROUP}/v1alpha2 field (under schedulingPolicy.gang): this API's is spec.minMember",
    "schedulingConstraints": f"a {WORKLOAD_GROUP}/v1alpha2 field: this API has no topology constraint",
    "resourceClaims": f"a {WORKLOAD_GROUP}/v1alpha2 field: this API has no claims of its own",
}
_VERSIONS = {WORKLOAD_GROUP: "v1alpha2", COSCHEDULING_GROUP: "v1alpha1"}


def pod_group(o: problems.Report, raw: Mapping[str, Any], *, group: str, source: types.Source) -> types.PodGroup | None:
    """The PodGroup of `raw` (apiVersion in `group`), or None when its version is not one dractl reads."""
    version = str(raw.get("apiVersion")).rpartition("/")[2]
    if version != _VERSIONS[group]:
        o.error(
            "apiVersion",
            f"PodGroup is served as {group}/{_VERSIONS[group]}: write apiVersion: {group}/{_VERSIONS[group]}",
        )
        return None
    common.top_keys(o, raw, common.TOP_KEYS_WITH_STATUS)
    meta = common.object_meta(o, raw, namespaced=True)
    spec = common.as_map(o, raw.get("spec"), "spec")
    if spec is None:
        o.error("spec", "required: " + ("spec.schedulingPolicy" if group == WORKLOAD_GROUP else "spec.minMember"))
        spec = {}
    if group == WORKLOAD_GROUP:
        return _workload(o, meta, spec, source)
    return _coscheduling(o, meta, spec, source)


def _workload(
    o: problems.Report, meta: types.ObjectMeta, spec: Mapping[str, Any], source: types.Source
) -> types.PodGroup:
    min_count = None
    policy = common.as_map(o, spec.get("schedulingPolicy"), "spec.schedulingPolicy", _POLICY_KEYS)
    if policy is None or len(policy.keys() & _POLICY_KEYS) != 1:
        o.error("spec.schedulingPolicy", "exactly one of basic: {} or gang: {minCount: N} is required")
    elif "gang" in policy:
        gang = common.as_map(o, policy["gang"], "spec.schedulingPolicy.gang", _GANG_KEYS) or {}
        min_count = _positive(o, gang, "minCount", "spec.schedulingPolicy.gang")
    else:
        common.as_map(o, policy["basic"], "spec.schedulingPolicy.basic", frozenset())
    topology_key = None
    constraints = common.as_map(o, spec.get("schedulingConstraints"), "spec.schedulingConstraints") or {}
    path = "spec.schedulingConstraints.topology"
    topology = common.as_list(o, constraints.get("topology"), path)
    if len(topology) > MAX_TOPOLOGY_CONSTRAINTS:
        o.error(
            path,
            f"at most {MAX_TOPOLOGY_CONSTRAINTS} topology constraint in Kubernetes 1.36, got {len(topology)}: "
            "keep one key",
        )
    elif topology:
        item = common.as_map(o, topology[0], f"{path}[0]", _TOPOLOGY_KEYS) or {}
        topology_key = common.required_str(o, item, "key", f"{path}[0]", " (a node label key, e.g. rack)") or None
        if topology_key is not None:
            common.check(o, f"{path}[0].key", common.label_key(topology_key))
    return types.PodGroup(
        meta=meta,
        api=types.PodGroupApi.WORKLOAD,
        min_count=min_count,
        topology_key=topology_key,
        resource_claims=_claims(o, spec),
        source=source,
    )


def _claims(o: problems.Report, spec: Mapping[str, Any]) -> tuple[types.PodResourceClaim, ...]:
    claims = []
    names: set[str] = set()
    for i, item in enumerate(common.as_list(o, spec.get("resourceClaims"), "spec.resourceClaims")):
        path = f"spec.resourceClaims[{i}]"
        c = common.as_map(o, item, path, _CLAIM_KEYS)
        if c is None:
            continue
        claims.append(common.claim_entry(o, c, path, seen=names))
    return tuple(claims)


def _coscheduling(
    o: problems.Report, meta: types.ObjectMeta, spec: Mapping[str, Any], source: types.Source
) -> types.PodGroup:
    common.check_keys(o, spec, "spec", _COSCHEDULING_SPEC_KEYS, _COSCHEDULING_HINTS)
    min_member = _positive(o, spec, "minMember", "spec")
    timeout = common.as_int(o, spec, "scheduleTimeoutSeconds", "spec")
    if timeout is not None and timeout < 1:
        o.error("spec.scheduleTimeoutSeconds", f"must be a positive number of seconds, got {timeout}")
        timeout = None
    resources = common.as_map(o, spec.get("minResources"), "spec.minResources") or {}
    min_resources = {
        str(name): common.as_quantity(o, amount, f"spec.minResources[{name}]") for name, amount in resources.items()
    }
    return types.PodGroup(
        meta=meta,
        api=types.PodGroupApi.COSCHEDULING,
        min_count=min_member,
        schedule_timeout_seconds=timeout,
        min_resources=min_resources,
        source=source,
    )


def _positive(o: problems.Report, m: Mapping[str, Any], key: str, path: str) -> int | None:
    """The required positive integer `m[key]`, or None (reported) when it is missing or not one."""
    value = m.get(key)
    if value is None:
        o.error(f"{path}.{key}", "required: how many pods must have a place before any of them is bound")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        o.error(f"{path}.{key}", f"must be a positive integer (at most {2**31 - 1}), got {common.kind_of(value)}")
        return None
    return value


def pod_group_ref(
    o: problems.Report, *, labels: Mapping[str, str], spec: Mapping[str, Any], path: str, labels_path: str
) -> types.PodGroupRef | None:
    """The PodGroup a pod (or a workload's pod template) joins: `spec.schedulingGroup.podGroupName`
    (v1alpha2) or the label `scheduling.x-k8s.io/pod-group` (v1alpha1); both at once is a problem."""
    ref = None
    group = common.as_map(o, spec.get("schedulingGroup"), f"{path}.schedulingGroup", _SCHEDULING_GROUP_KEYS)
    if group is not None:
        name = common.required_str(o, group, "podGroupName", f"{path}.schedulingGroup")
        if name:
            common.check(o, f"{path}.schedulingGroup.podGroupName", common.dns_subdomain(name))
            ref = types.PodGroupRef(name=name, api=types.PodGroupApi.WORKLOAD)
    label = labels.get(POD_GROUP_LABEL)
    if isinstance(label, str) and label:
        if ref is not None:
            o.error(
                f"{path}.schedulingGroup",
                f"the pod joins PodGroup {ref.name} here and {label} by the label {POD_GROUP_LABEL} in {labels_path}: "
                "a pod joins one PodGroup, through one API: keep one",
            )
            return None
        ref = types.PodGroupRef(name=label, api=types.PodGroupApi.COSCHEDULING)
    return ref


def join_field(ref: types.PodGroupRef, *, path: str, labels_path: str) -> str:
    """The field by which a pod joins `ref`'s group, for messages. Pure."""
    if ref.api is types.PodGroupApi.WORKLOAD:
        return f"{path}.schedulingGroup.podGroupName"
    return f"{labels_path}[{POD_GROUP_LABEL}]"
