"""core/v1 Pods and the workloads that make them (Deployment, ReplicaSet, StatefulSet, Job).

What it does: keeps the fields allocation needs (resource claims, container claims, node name and selector,
scheduler name, the PodGroup joined) and expands a workload into the Pods its controller would create, bounded by
`MAX_REPLICAS`.
What it must not do: schedule pods (the simulation does). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl.model import types
from dractl.model.decode import common, pod_groups, problems, resource_claims, seed_hints

_POD_CLAIM_KEYS = frozenset({"name", "resourceClaimName", "resourceClaimTemplateName"})
_POD_CLAIM_KEYS_WITH_SOURCE = _POD_CLAIM_KEYS | {"source"}  # reported with its own hint
_CONTAINER_CLAIM_KEYS = frozenset({"name", "request"})


def pod_spec_fields(
    o: problems.Report, spec: Mapping[str, Any], path: str, *, labels: Mapping[str, str], labels_path: str
) -> dict[str, Any]:
    """The allocation-relevant fields of a pod spec, as keyword arguments of `types.Pod`; `labels`
    (at `labels_path`) are the pod's, which may name its PodGroup."""
    if "resourceClaimTemplates" in spec:
        o.error(
            f"{path}.resourceClaimTemplates", seed_hints.inline_templates_hint(spec["resourceClaimTemplates"], path)
        )
    claims = []
    claim_names: set[str] = set()
    for i, item in enumerate(common.as_list(o, spec.get("resourceClaims"), f"{path}.resourceClaims")):
        cpath = f"{path}.resourceClaims[{i}]"
        if isinstance(item, dict) and "source" in item:
            o.error(f"{cpath}.source", seed_hints.claim_source_hint(item["source"]))
        c = common.as_map(o, item, cpath, _POD_CLAIM_KEYS_WITH_SOURCE)
        if c is None:
            continue
        claims.append(common.claim_entry(o, c, cpath, seen=claim_names, sourced="source" in c))
    container_claims = []
    for group in ("initContainers", "containers"):
        for i, item in enumerate(common.as_list(o, spec.get(group), f"{path}.{group}")):
            kpath = f"{path}.{group}[{i}]"
            container = common.as_map(o, item, kpath)
            if container is None:
                continue
            container_name = common.required_str(o, container, "name", kpath)
            resources = common.as_map(o, container.get("resources"), f"{kpath}.resources") or {}
            _device_plugin_resources(o, resources, f"{kpath}.resources")
            _claim_env(o, container, kpath)
            for j, claim in enumerate(common.as_list(o, resources.get("claims"), f"{kpath}.resources.claims")):
                rpath = f"{kpath}.resources.claims[{j}]"
                r = common.as_map(o, claim, rpath, _CONTAINER_CLAIM_KEYS)
                if r is None:
                    continue
                name = common.required_str(o, r, "name", rpath)
                if name and name not in claim_names:
                    entry = f"{{name: {name}, resourceClaimTemplateName: <template>}}"
                    o.error(
                        f"{rpath}.name",
                        f"{common.quote(name)} is not in {path}.resourceClaims: add {entry} "
                        "(or resourceClaimName) there",
                    )
                container_claims.append(
                    types.ContainerClaim(
                        container=container_name, name=name, request=common.as_str(o, r, "request", rpath) or ""
                    )
                )
    return {
        "resource_claims": tuple(claims),
        "container_claims": tuple(container_claims),
        "node_name": common.as_str(o, spec, "nodeName", path) or "",
        "node_selector": common.as_string_map(o, spec, "nodeSelector", path),
        "scheduler_name": common.as_str(o, spec, "schedulerName", path) or "default-scheduler",
        "pod_group": pod_groups.pod_group_ref(o, labels=labels, spec=spec, path=path, labels_path=labels_path),
    }


def _device_plugin_resources(o: problems.Report, resources: Mapping[str, Any], path: str) -> None:
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
                    "(exactly: {deviceClassName: gpu.nvidia.com}), "
                    "reference it in spec.resourceClaims and list it in resources.claims",
                )


def _claim_env(o: problems.Report, container: Mapping[str, Any], path: str) -> None:
    """`env[].valueFrom.resourceFieldRef.resource: claims/...` (seed 003) does not exist:
    say what provides the devices."""
    env = container.get("env")
    for i, item in enumerate(env if isinstance(env, list) else ()):
        value_from = item.get("valueFrom") if isinstance(item, dict) else None
        ref = value_from.get("resourceFieldRef") if isinstance(value_from, dict) else None
        resource = ref.get("resource") if isinstance(ref, dict) else None
        if isinstance(resource, str) and resource.startswith("claims/"):
            o.error(
                f"{path}.env[{i}].valueFrom.resourceFieldRef.resource",
                f"{common.quote(resource)} is not a container resource: the DRA driver injects the allocated devices "
                "(and NVIDIA_VISIBLE_DEVICES) through CDI; delete this env entry",
            )


def workload(o: problems.Report, raw: Mapping[str, Any], count_field: str, source: types.Source) -> list[types.Pod]:
    meta = common.object_meta(o, raw, namespaced=True)
    spec = common.as_map(o, raw.get("spec"), "spec") or {}
    count = common.as_int(o, spec, count_field, "spec")
    if count is None:
        count = 1
    elif count < 0:
        o.error(f"spec.{count_field}", "must be >= 0")
    elif count > common.MAX_REPLICAS:
        o.error(
            f"spec.{count_field}", f"must be at most {common.MAX_REPLICAS}: dractl expands every replica into a Pod"
        )
        count = 0
    template = common.as_map(o, spec.get("template"), "spec.template", resource_claims.TEMPLATE_SPEC_KEYS)
    if template is None:
        o.error("spec.template", "required: the pod template")
        return []
    template_meta = common.object_meta(o, template, namespaced=False, path="spec.template.metadata", required=False)
    pod_spec = common.as_map(o, template.get("spec"), "spec.template.spec") or {}
    fields = pod_spec_fields(
        o, pod_spec, "spec.template.spec", labels=template_meta.labels, labels_path="spec.template.metadata.labels"
    )
    return [
        types.Pod(
            meta=types.ObjectMeta(
                name=f"{meta.name}-{i}",
                namespace=meta.namespace,
                labels=template_meta.labels,
                annotations=template_meta.annotations,
            ),
            source=source,
            **fields,
        )
        for i in range(max(count, 0))
    ]
