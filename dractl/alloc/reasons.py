"""Why an allocation failed, in words a person can act on.

Part of the allocator (`dractl.alloc`): from the core's per-alternative statistics of a failed
search, one reason per request that something is known to stop (too few free devices, a
counter, capacity or constraint refusal, All mode, the claim limit), else one per request and
a claim-level reason that they only fail together; the pool problems of the candidate nodes;
the selector error a search met. Reads the core's usage (`Core.count_free`), changes nothing.
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
        for options in plan.requests:
            rows = [
                _alt_message(
                    alt,
                    core=core,
                    index=index,
                    row=stats[alt_index + i],
                    plan=plan,
                    constraint_base=constraint_base,
                    nodes=nodes,
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
) -> tuple[bool, str]:
    """The reason text for one alternative, and whether it is known to stop the claim."""
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
    return refused or free < max(alt.count, 1), "; ".join(parts)


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
