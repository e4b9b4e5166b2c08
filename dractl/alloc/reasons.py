"""Why an allocation failed, in words a person can act on.

Part of the allocator (`dractl.alloc`): from the core's per-alternative statistics of a failed
search, one reason per request that something is known to stop (too few free devices, a
counter, capacity or constraint refusal, All mode, the claim limit), else one per request and
a claim-level reason that they only fail together; the pool problems of the candidate nodes;
the selector error a search met. Where enough devices are free in all but no one node (or, for a
`matchAttribute` constraint, no one value of its attribute on a node) has as many as a request
needs, the reason says so and names the best node: fragmentation, not a shortage. Reads the
core's usage (`Core.count_free`, `Core.free_per_node`, `Core.free_on`), changes nothing.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

from dractl import _alloc, model
from dractl.alloc import index as allocindex
from dractl.alloc import outcome
from dractl.alloc import plans as allocplans


def explain(
    claims: Sequence[model.ResourceClaim],
    plans: Sequence[allocplans.Plan],
    *,
    core: _alloc.Core,
    index: allocindex.Index,
    compiler: allocplans.Compiler,
    status: int,
    stats: Sequence[Sequence[int]],
    node_array: array.array[int] | None,
    all_nodes: array.array[int],
    limit: int,
) -> tuple[outcome.Reason, ...]:
    """The reasons for a search that ended with `status` (NO_FIT or SEARCH_LIMIT) over
    `node_array` (None: `all_nodes`) after `limit` steps at most."""
    reasons: list[outcome.Reason] = []
    first = claims[0].key
    if node_array is not None and not node_array:
        reasons.append(
            outcome.Reason(
                first, None, "none of the candidate nodes is known (no Node object or ResourceSlice names them)"
            )
        )
    if status == _alloc.SEARCH_LIMIT:
        reasons.append(
            outcome.Reason(
                first,
                None,
                f"search limit reached after {limit} steps without finding an allocation; the claims' "
                "constraints are too hard to satisfy together (raise the search limit or simplify the constraints)",
            )
        )
    nodes = node_array if node_array is not None else all_nodes
    # Requests are explained when something is known to stop them (too few free
    # devices, a counter, capacity or constraint refusal, the claim limit); when none
    # is, every request is explained and the claim-level reason says they only fail
    # together.
    explained: list[tuple[bool, outcome.Reason]] = []
    alt_index = 0
    # The core numbers constraints across all claims of the call, in claim order.
    constraint_base = 0
    for claim, plan in zip(claims, plans, strict=True):
        for r, options in enumerate(plan.requests):
            rows = [
                _alt_message(
                    alt,
                    core=core,
                    index=index,
                    row=stats[alt_index + i],
                    plan=plan,
                    constraint_base=constraint_base,
                    nodes=nodes,
                    matched=[
                        compiler.attribute_name(attr)
                        for kind, attr, _, members in plan.constraints
                        if kind == _alloc.MATCH and (r, i) in members
                    ],
                )
                for i, alt in enumerate(options)
            ]
            alt_index += len(options)
            blamed = any(b for b, _ in rows)
            explained.extend(
                (blamed, outcome.Reason(claim.key, alt.name, message))
                for alt, (_, message) in zip(options, rows, strict=True)
            )
        constraint_base += len(plan.constraints)
    if any(blamed for blamed, _ in explained):
        reasons.extend(reason for blamed, reason in explained if blamed)
    else:
        reasons.extend(reason for _, reason in explained)
        if status != _alloc.SEARCH_LIMIT and nodes:
            reasons.append(
                outcome.Reason(
                    first,
                    None,
                    f"every request has devices on its own, but none of the {len(nodes)} candidate "
                    f"node{_s(len(nodes))} has devices for all requests together",
                )
            )
    for problem in index.problems(node_array):
        reasons.append(outcome.Reason(first, None, problem.message()))
    return tuple(reasons)


def _alt_message(
    alt: allocplans.Alt,
    *,
    core: _alloc.Core,
    index: allocindex.Index,
    row: Sequence[int],
    plan: allocplans.Plan,
    constraint_base: int,
    nodes: array.array[int],
    matched: Sequence[str],
) -> tuple[bool, str]:
    """The reason text for one alternative, and whether it is known to stop the claim. `matched`: the attributes of
    the `matchAttribute` constraints over the alternative."""
    shape = alt.shape
    free = core.count_free(shape.shape_id, admin=alt.admin, nodes=nodes)
    parts = [f"device class {alt.class_name} matches {shape.class_matches} device{_s(shape.class_matches)}"]
    parts.append(f"{shape.selected} pass the request's selectors")
    if shape.fitting != shape.selected:
        parts.append(f"{shape.selected - shape.fitting} of those lack the requested capacity")
    if shape.candidates != shape.fitting:
        parts.append(f"{shape.fitting - shape.candidates} of those have a taint the request does not tolerate")
    need = "all of them" if alt.all_mode else f"{alt.count} needed"
    parts.append(f"{free} of those are free on the candidate nodes ({need})")
    fragmented = _fragmented(alt, core=core, index=index, nodes=nodes, free=free, matched=matched)
    if fragmented is not None:
        parts.append(fragmented)
    if row[_alloc.STAT_COUNTER]:
        driver, pool, counter_set, counter = index.counter_names[row[_alloc.STAT_LAST_COUNTER]]
        parts.append(f"counter {counter} of counter set {counter_set} in pool {driver}/{pool} ran out")
    if row[_alloc.STAT_CAPACITY]:
        d, name = index.slot_names[row[_alloc.STAT_LAST_SLOT]]
        parts.append(f"capacity {name} of device {index.devices[d].path} ran out")
    if row[_alloc.STAT_CONSTRAINT]:
        parts.append(
            f"constraint {plan.constraints[row[_alloc.STAT_LAST_CONSTRAINT] - constraint_base][2]} could not be met"
        )
    if row[_alloc.STAT_ALL_BLOCKED]:
        parts.append(
            "allocationMode All needs every matching device, but some are already allocated or have a taint the "
            "request does not tolerate"
        )
    if row[_alloc.STAT_BAD_POOL]:
        parts.append("allocationMode All cannot be used on nodes with an invalid or incomplete pool")
    if row[_alloc.STAT_SIZE]:
        parts.append(f"taking them all exceeds the claim limit of {allocplans.MAX_RESULTS} results")
    refused = any(
        row[k]
        for k in (
            _alloc.STAT_SHORT,
            _alloc.STAT_COUNTER,
            _alloc.STAT_CAPACITY,
            _alloc.STAT_CONSTRAINT,
            _alloc.STAT_ALL_BLOCKED,
            _alloc.STAT_BAD_POOL,
            _alloc.STAT_SIZE,
        )
    )
    return refused or fragmented is not None or free < max(alt.count, 1), "; ".join(parts)


def _fragmented(
    alt: allocplans.Alt,
    *,
    core: _alloc.Core,
    index: allocindex.Index,
    nodes: array.array[int],
    free: int,
    matched: Sequence[str],
) -> str | None:
    """Why `free` devices, enough in all, still cannot serve the alternative: no candidate node has `alt.count`
    free, or, for each `matchAttribute` attribute in `matched`, no node has that many free sharing one value of it.
    Names the best node (the first of the most free) and what it has. None when the devices are too few in all, the
    alternative takes one device or all of them, or some node (and value) has enough: the search's own statistics
    then tell the rest. Runs only when a search failed."""
    count = alt.count
    if alt.all_mode or count < 2 or free < count:
        return None
    shape = alt.shape.shape_id
    per_node = core.free_per_node(shape, admin=alt.admin, nodes=nodes)
    best = max(range(len(nodes)), key=lambda i: (per_node[i], -i))
    if per_node[best] < count:
        return f"no node has {count} free: the best, {_node(index, nodes[best])}, has {per_node[best]}"
    for qualified in matched:
        top: tuple[int, str, str] | None = None  # (free, node, value)
        for i, node in enumerate(nodes):
            if per_node[i] < count:
                continue
            # Values are told apart as the constraint tells them: by kind, and versions by their text.
            groups: dict[tuple[str, object], tuple[int, str]] = {}
            for d in core.free_on(shape, admin=alt.admin, node=node):
                attribute = allocindex.lookup_attribute(index.devices[d], qualified)
                if attribute is None:
                    continue
                texts = attribute.texts or tuple(str(v) for v in attribute.values)
                for value, text in zip(attribute.values, texts, strict=True):
                    key = (attribute.kind.value, text if attribute.kind is model.AttributeKind.VERSION else value)
                    n = groups.get(key, (0, text))[0]
                    groups[key] = (n + 1, text)
            for n, text in groups.values():
                if top is None or n > top[0]:
                    top = (n, _node(index, node), text)
        if top is None:
            return f"no node has {count} free with attribute {qualified} (matchAttribute)"
        if top[0] < count:
            return (
                f"no node has {count} free with one value of {qualified} (matchAttribute): the best, {top[1]} "
                f"({qualified} {top[2]}), has {top[0]}"
            )
    return None


def _node(index: allocindex.Index, node: int) -> str:
    name = index.node_names[node]
    return "the only node" if name is None else name


def cel_error(
    claims: Sequence[model.ResourceClaim], plans: Sequence[allocplans.Plan], *, alt: int, device: int
) -> outcome.Reason:
    """The reason for a search that met a device whose selector failed: the claim and
    (sub)request of core alternative `alt`, quoting the expression and the device."""
    for claim, plan in zip(claims, plans, strict=True):
        for options in plan.requests:
            if alt < len(options):
                return outcome.Reason(claim.key, options[alt].name, options[alt].shape.failed[device])
            alt -= len(options)
    raise AssertionError("the core named an alternative outside the plan")


def _s(n: int) -> str:
    return "" if n == 1 else "s"
