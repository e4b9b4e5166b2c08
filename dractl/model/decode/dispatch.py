"""One decoded document -> the model value of its kind, chosen by apiVersion and kind.

What it does: unwraps `*List` objects, routes resource.k8s.io objects by version (v1, v1beta2, v1beta1; removed
versions get a hint), core/v1 Pods and Nodes, workloads with a pod template, and PodGroups of
scheduling.k8s.io and scheduling.x-k8s.io; records every other kind as
skipped. What it must not do: parse text (`loading` does) or validate fields itself. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from dractl.model import types
from dractl.model.decode import (
    common,
    device_classes,
    pod_groups,
    pods,
    problems,
    resource_claims,
    resource_slices,
    seed_hints,
)

_GROUP = "resource.k8s.io"
_RESOURCE_KINDS = frozenset({"DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate"})
_CLUSTER_SCOPED = frozenset(
    {
        "DeviceClass",
        "ResourceSlice",
        "Node",
        "ResourceClass",
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "StorageClass",
        "PersistentVolume",
        "PriorityClass",
        "RuntimeClass",
        "DeviceTaintRule",
    }
)
# Versions whose ResourceClaims `resource_claims.plain_claim` may take: those with v1's shape.
_PLAIN_CLAIM_VERSIONS = frozenset({f"{_GROUP}/v1", f"{_GROUP}/v1beta2"})
_WORKLOADS = {
    ("apps/v1", "Deployment"): "replicas",
    ("apps/v1", "ReplicaSet"): "replicas",
    ("apps/v1", "StatefulSet"): "replicas",
    ("batch/v1", "Job"): "parallelism",
}


def document(out: problems.Results, raw: object, file: str, index: int) -> None:
    if not isinstance(raw, dict):
        out.problems.append(
            f"{file}: document {index + 1}: must be a Kubernetes object (a mapping with apiVersion and kind)"
        )
        return
    kind = raw.get("kind")
    api_version = raw.get("apiVersion")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(raw.get("items"), list):
        for item in raw["items"]:
            document(out, item, file, index)
        return
    if not isinstance(kind, str) or not kind:
        out.problems.append(
            f"{file}: document {index + 1}: kind: required (for example DeviceClass, ResourceClaim, Pod)"
        )
        return
    if not isinstance(api_version, str) or not api_version:
        out.problems.append(
            f"{file}: document {index + 1}: apiVersion: required (for example resource.k8s.io/v1 or v1)"
        )
        return
    group, _, version = api_version.rpartition("/")
    source = _source(file, index)
    if kind == "ResourceClaim" and api_version in _PLAIN_CLAIM_VERSIONS:
        claim = resource_claims.plain_claim(raw, source)
        if claim is not None:
            out.claims.append(claim)
            return
    o = problems.Report(_prefix(raw, kind, file, index), out)
    if group == _GROUP:
        _resource(out, o, raw, kind, version, source)
    elif kind in _RESOURCE_KINDS:
        o.error("apiVersion", f"{kind} belongs to resource.k8s.io: write apiVersion: resource.k8s.io/v1")
    elif kind in ("Pod", "Node"):
        if api_version != "v1":
            o.error("apiVersion", f"{kind} is core/v1: write apiVersion: v1")
        elif kind == "Pod":
            common.top_keys(o, raw, common.TOP_KEYS_WITH_STATUS)
            meta = common.object_meta(o, raw, namespaced=True)
            spec = common.as_map(o, raw.get("spec"), "spec") or {}
            fields = pods.pod_spec_fields(o, spec, "spec", labels=meta.labels, labels_path="metadata.labels")
            pod = types.Pod(meta=meta, source=source, **fields)
            _joined(out, o, pod, path="spec", labels_path="metadata.labels")
            out.pods.append(pod)
        else:
            common.top_keys(o, raw, common.TOP_KEYS_WITH_STATUS)
            out.nodes.append(types.Node(meta=common.object_meta(o, raw, namespaced=False), source=source))
    elif (api_version, kind) in _WORKLOADS:
        made = pods.workload(o, raw, _WORKLOADS[api_version, kind], source)
        if made:
            _joined(out, o, made[0], path="spec.template.spec", labels_path="spec.template.metadata.labels")
        out.pods.extend(made)
    elif kind == "PodGroup" and group in (pod_groups.WORKLOAD_GROUP, pod_groups.COSCHEDULING_GROUP):
        pod_group = pod_groups.pod_group(o, raw, group=group, source=source)
        if pod_group is not None:
            out.pod_groups.append(pod_group)
    else:
        skipped = o.prefix + "skipped (not used by allocation)"
        if kind.endswith(("ClaimParameters", "ClassParameters")):
            skipped += "; " + seed_hints.NO_CLAIM_PARAMETERS.format(path="the claim's spec")
        out.warnings.append(skipped)


def _joined(out: problems.Results, o: problems.Report, pod: types.Pod, *, path: str, labels_path: str) -> None:
    """Remember the PodGroup the pod (or every pod of a workload) joins, for the check across documents."""
    ref = pod.pod_group
    if ref is not None:
        field = pod_groups.join_field(ref, path=path, labels_path=labels_path)
        out.joined.append(problems.Joined(prefix=o.prefix, field=field, namespace=pod.meta.namespace, ref=ref))


@functools.lru_cache(maxsize=1)
def _source(file: str, index: int) -> types.Source:
    """Where a document came from. The objects of one `List` (one document) share the value. Pure."""
    return types.Source(file=file, document=index)


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


def _resource(
    out: problems.Results, o: problems.Report, raw: dict[str, Any], kind: str, version: str, source: types.Source
) -> None:
    if kind in seed_hints.REMOVED_KINDS or version == "v1alpha2":
        seed_hints.removed_alpha2(o, raw, kind, version)
        return
    if kind not in _RESOURCE_KINDS:
        out.warnings.append(o.prefix + "skipped (not used by allocation)")
        return
    if version == "v1alpha3":
        o.error(
            "apiVersion",
            "resource.k8s.io/v1alpha3 is no longer served: write apiVersion: "
            f"resource.k8s.io/v1{seed_hints.ALPHA3_CHANGES[kind]}",
        )
        discard = problems.Results()
        _resource(discard, o, raw, kind, "v1", source)  # report the old shapes field by field
        return
    if version not in ("v1", "v1beta2", "v1beta1"):
        o.error(
            "apiVersion", f"resource.k8s.io/{version} is not a served version: write apiVersion: resource.k8s.io/v1"
        )
        return
    o.beta1 = version == "v1beta1"
    if kind == "DeviceClass":
        common.top_keys(o, raw, common.TOP_KEYS, device_classes.CLASS_TOP_HINTS)
        out.classes.append(device_classes.device_class(o, raw, source))
    elif kind == "ResourceSlice":
        common.top_keys(o, raw, common.TOP_KEYS)
        out.slices.append(resource_slices.resource_slice(o, raw, source))
    elif kind == "ResourceClaim":
        common.top_keys(o, raw, common.TOP_KEYS_WITH_STATUS)
        out.claims.append(resource_claims.resource_claim(o, raw, source))
    else:
        common.top_keys(o, raw, common.TOP_KEYS)
        out.templates.append(resource_claims.resource_claim_template(o, raw, source))
