"""Property tests: the allocator's what-if (`Allocator.repack`) against the brute-force oracle on small instances.

Held claims come from allocating all but the last claim of an instance in turn; the last one is the claim to admit.
(1) Every plan the what-if returns is valid: each node's claims after the plan (the refused claim and the moved ones
where they land, with everything not moved still held) pass every rule of `oracle.check`, so all claims are satisfied
and nothing is used twice. (2) When releasing one held claim lets the refused claim and that claim fit together on one
node (the oracle decides), the what-if finds a plan with exactly one move (unless the refusal is a selector that
fails at run time: that is not about where claims sit). (3) The allocator's usage is the same
afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given
from support import oracle, strategies

from dractl import alloc, model

_FAILED_ON = " failed on device "

POLICIES = pytest.mark.parametrize(
    "policy", [alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK], ids=["first-fit", "binpack"]
)


def _with(claim: model.ResourceClaim, allocation: model.AllocationResult | None) -> model.ResourceClaim:
    return dataclasses.replace(claim, allocation=allocation)


def _one_release_suffices(
    snapshot: alloc.Snapshot, held: Sequence[model.ResourceClaim], new: model.ResourceClaim, nodes: Sequence[str]
) -> bool:
    """Whether some held claim, released, fits together with `new` on one node (oracle; a CEL error counts as no)."""
    for moved in held:
        if all(r.admin_access for r in moved.allocation.results if moved.allocation is not None):
            continue
        others = tuple(c for c in held if c is not moved)
        rest = dataclasses.replace(snapshot, allocated_claims=others)
        for node in nodes:
            if isinstance(oracle.decide(rest, [new, _with(moved, None)], node), tuple):
                return True
    return False


def _check_plan(
    snapshot: alloc.Snapshot,
    held: Sequence[model.ResourceClaim],
    new: model.ResourceClaim,
    plan: alloc.Repack,
    nodes: Sequence[str],
) -> list[str]:
    """Every rule the state after the plan breaks: each claim placed (the refused one and each moved one) is checked
    on its node against everything else as held, so a device used twice breaks a rule. A placement without a node
    (its devices are usable on every node) must be valid on some node: the one the search chose."""
    moved = {m.claim: m for m in plan.moves}
    placed: list[tuple[model.ResourceClaim, model.AllocationResult, str | None]] = [
        (new, plan.allocations[0], plan.node)
    ]
    placed.extend((c, moved[c.key].after, moved[c.key].after_node) for c in held if c.key in moved)
    assert len(placed) == len(plan.moves) + 1, "a move names a claim that is not held"
    kept = [c for c in held if c.key not in moved]
    problems: list[str] = []
    for claim, allocation, node in placed:
        others = [_with(c, a) for c, a, _ in placed if c is not claim]
        rest = dataclasses.replace(snapshot, allocated_claims=(*kept, *others))
        found = [oracle.check(rest, [claim], n, [allocation]) for n in ((node,) if node is not None else nodes)]
        if all(found):
            problems.extend(found[0])
    return problems


@POLICIES
@strategies.settings_for(150)
@given(instance=strategies.instances(min_claims=4, max_claims=7))
def test_plans_are_valid_and_one_move_is_found_when_it_suffices(
    policy: alloc.Policy, instance: strategies.Instance
) -> None:
    """A plan the what-if returns is valid; where one held claim's release suffices it moves exactly one; the
    allocator is unchanged afterwards."""
    snapshot = instance.cluster.snapshot
    allocator = alloc.Allocator(snapshot, policy=policy)
    *first, new = instance.claims
    for claim in first:
        allocator.allocate([claim])
    held = [
        _with(c, allocator.held(alloc.claim_id(c)))
        for c in (*snapshot.allocated_claims, *first)
        if allocator.held(alloc.claim_id(c)) is not None
    ]
    before = allocator.usage()
    plan = allocator.repack([new], max_moves=2)
    assert allocator.usage() == before
    nodes = instance.cluster.node_names
    state = dataclasses.replace(snapshot, allocated_claims=tuple(held))
    report = strategies.describe(state, [new])
    if plan is not None:
        problems = _check_plan(state, held, new, plan, nodes)
        assert not problems, f"{report}\nplan: {plan}\n" + "\n".join(problems)
    fits = allocator.allocate([new])
    if fits.ok:
        assert plan is not None and plan.moves == (), report
        return
    # A refusal for a selector that fails at run time is not about where claims sit: no repack answers it.
    if any(_FAILED_ON in r.message for r in fits.reasons):
        return
    if _one_release_suffices(state, held, new, nodes):
        assert plan is not None and len(plan.moves) == 1, f"{report}\nplan: {plan}\n{fits.reasons}"
