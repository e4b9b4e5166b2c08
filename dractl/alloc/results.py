"""Allocations in the API's shape, built from the devices the core chose.

Part of the allocator (`dractl.alloc`): per claim the results (share ids, consumed capacity,
tolerations, binding conditions), the configuration of the chosen requests and the node
selector where the allocation is usable. Pure apart from the config cache of each plan.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence

from dractl import model
from dractl.alloc import index as allocindex
from dractl.alloc import outcome
from dractl.alloc import plans as allocplans

_SHARE_NAMESPACE = uuid.UUID("6c1b2f57-2f0a-4b5e-9b1e-0d5a1c3d7e21")
"""Namespace of the deterministic share ids (UUIDv5 of claim, request, device and position)."""


def build(
    claims: Sequence[model.ResourceClaim],
    plans: Sequence[allocplans.Plan],
    *,
    index: allocindex.Index,
    classes: Mapping[str, model.DeviceClass],
    node: int,
    alts: Sequence[int],
    devices: Sequence[int],
    requests: Sequence[int],
) -> tuple[outcome.Outcome, list[list[int]]]:
    """The allocations the core found (its chosen node, alternative per request, devices and
    request per device), and per claim the device index of every result."""
    node_name = index.node_names[node]
    refs = index.devices
    allocations: list[model.AllocationResult] = []
    taken: list[list[int]] = []
    alt_base = 0
    req_base = 0
    position = 0
    usable_everywhere = True
    for claim, plan in zip(claims, plans, strict=True):
        n_req = len(plan.requests)
        chosen: list[int] = []
        flat: list[allocplans.Alt] = []
        offset = alt_base
        for r, options in enumerate(plan.requests):
            chosen.append(alts[req_base + r] - offset)
            offset += len(options)
            flat.append(options[chosen[-1]])
        results: list[model.DeviceRequestAllocationResult] = []
        claim_refs: list[allocindex.DeviceRef] = []
        while position < len(devices) and requests[position] < req_base + n_req:
            ref = refs[devices[position]]
            results.append(_result(claim, flat[requests[position] - req_base], ref=ref, position=len(results)))
            claim_refs.append(ref)
            position += 1
        taken.append([ref.index for ref in claim_refs])
        selector = _node_selector(claim_refs, node_name)
        if selector is not None:
            usable_everywhere = False
        allocations.append(
            model.AllocationResult(
                results=tuple(results),
                config=_config(plan, classes=classes, chosen=tuple(chosen), flat=flat),
                node_selector=selector,
            )
        )
        alt_base = offset
        req_base += n_req
    return outcome.Outcome(node=None if usable_everywhere else node_name, allocations=tuple(allocations)), taken


def _result(
    claim: model.ResourceClaim, alt: allocplans.Alt, *, ref: allocindex.DeviceRef, position: int
) -> model.DeviceRequestAllocationResult:
    device = ref.device
    shared = device.allow_multiple_allocations
    return model.DeviceRequestAllocationResult(
        request=alt.name,
        driver=ref.driver,
        pool=ref.pool,
        device=device.name,
        admin_access=True if alt.admin else None,
        tolerations=alt.tolerations,
        binding_conditions=device.binding_conditions,
        binding_failure_conditions=device.binding_failure_conditions,
        share_id=str(uuid.uuid5(_SHARE_NAMESPACE, f"{claim.key}\x00{alt.name}\x00{ref.path}\x00{position}"))
        if shared
        else None,
        consumed_capacity=dict(alt.shape.consumed.get(ref.index, {})) if shared else {},
    )


def _config(
    plan: allocplans.Plan,
    *,
    classes: Mapping[str, model.DeviceClass],
    chosen: tuple[int, ...],
    flat: Sequence[allocplans.Alt],
) -> tuple[model.DeviceAllocationConfiguration, ...]:
    """Class configs (each class once, listing its requests), then claim configs that
    name something allocated; `requests` is cleared when it covers every request."""
    found = plan.configs.get(chosen)
    if found is not None:
        return found
    top = [alt.request for alt in flat]
    selected = {alt.name for alt in flat}
    entries: list[model.DeviceAllocationConfiguration] = []
    by_class: dict[str, list[str]] = {}
    for alt in flat:
        by_class.setdefault(alt.class_name, []).append(alt.name)
    for class_name, names in by_class.items():
        for opaque in classes[class_name].config:
            entries.append(
                model.DeviceAllocationConfiguration(
                    source="FromClass", requests=_scope(names, top=top, selected=selected), opaque=opaque
                )
            )
    for claim_config in plan.config:
        if claim_config.requests and not any(ref in top or ref in selected for ref in claim_config.requests):
            continue
        entries.append(
            model.DeviceAllocationConfiguration(
                source="FromClaim",
                requests=_scope(list(claim_config.requests), top=top, selected=selected),
                opaque=claim_config.opaque,
            )
        )
    result = plan.configs[chosen] = tuple(entries)
    return result


def _scope(names: list[str], *, top: list[str], selected: set[str]) -> tuple[str, ...]:
    """A config's `requests`: empty when the names cover every request of the claim."""
    covered = {n.partition("/")[0] for n in names if "/" not in n or n in selected}
    if all(t in covered for t in top):
        return ()
    return tuple(names)


def _node_selector(refs: Sequence[allocindex.DeviceRef], node: str | None) -> model.NodeSelector | None:
    """Where the allocation is usable: the node itself when any device is node-local,
    else the AND of the devices' selectors as one term, else None (everywhere)."""
    if node is not None:
        for ref in refs:
            if ref.node_local:
                return _name_selector(node)
    selectors: list[model.NodeSelector] = []
    for ref in refs:
        if ref.node_selector is not None and ref.node_selector not in selectors:
            selectors.append(ref.node_selector)
    if not selectors:
        return None
    if len(selectors) == 1:
        return selectors[0]
    if any(len(s.terms) != 1 for s in selectors):
        # Several multi-term selectors have no single-term AND; the node itself is exact.
        return _name_selector(node) if node is not None else selectors[0]
    expressions: list[model.NodeSelectorRequirement] = []
    fields: list[model.NodeSelectorRequirement] = []
    for s in selectors:
        for requirement in s.terms[0].match_expressions:
            if not any(_same_requirement(requirement, r) for r in expressions):
                expressions.append(requirement)
        for requirement in s.terms[0].match_fields:
            if not any(_same_requirement(requirement, r) for r in fields):
                fields.append(requirement)
    return model.NodeSelector(
        terms=(model.NodeSelectorTerm(match_expressions=tuple(expressions), match_fields=tuple(fields)),)
    )


def _same_requirement(a: model.NodeSelectorRequirement, b: model.NodeSelectorRequirement) -> bool:
    return a.key == b.key and a.operator == b.operator and set(a.values) == set(b.values)


@functools.lru_cache(maxsize=65536)
def _name_selector(node: str) -> model.NodeSelector:
    return model.NodeSelector(
        terms=(
            model.NodeSelectorTerm(
                match_fields=(model.NodeSelectorRequirement(key=allocindex.NAME_FIELD, operator="In", values=(node,)),)
            ),
        )
    )
