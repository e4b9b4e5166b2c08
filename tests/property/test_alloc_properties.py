"""Property tests: the allocator against the brute-force oracle on small random clusters.

For both policies: (1) allocation on one node succeeds exactly when the oracle finds an
allocation there; (2) every allocation returned passes every rule of `oracle.check`; (3)
first-fit and binpack agree on which claims are allocatable in isolation; (4) sequences of
committed allocations never double-allocate a dedicated device nor overdraw counters or
capacity, and a claim is refused only when no node can take it. Failure messages print the
instance compactly (`strategies.describe`).

Selectors may fail at run time on some devices. Under first-fit the allocator gives upstream's
answer exactly: the oracle's allocation, its "none", or the same CEL error (same device, same
expression). Binpack tries failing devices after every candidate, in its own order: where the
oracle finds nothing it finds nothing either and reports no error; otherwise it may allocate
or report an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import example, given
from support import oracle, strategies

from dractl import alloc, model

_FAILED_ON = " failed on device "

POLICIES = pytest.mark.parametrize(
    "policy", [alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK], ids=["first-fit", "binpack"]
)


def _outcome(outcome: alloc.Outcome) -> str:
    if outcome.allocations is None:
        reasons = "\n".join(f"    {r.claim} {r.request or ''}: {r.message}" for r in outcome.reasons)
        return f"allocator: FAILED\n{reasons}"
    lines = [f"allocator: node={outcome.node}"]
    lines.extend(f"    {strategies.describe_allocation(a)}" for a in outcome.allocations)
    return "\n".join(lines)


def _report(headline: str, snapshot: alloc.Snapshot, claims: Sequence[model.ResourceClaim], *details: str) -> str:
    return "\n".join((headline, strategies.describe(snapshot, claims), *details))


def _cel_error(outcome: alloc.Outcome) -> str | None:
    """The device path a CEL runtime error names, when the allocator failed on one."""
    for reason in outcome.reasons:
        if _FAILED_ON in reason.message:
            return reason.message.split(_FAILED_ON, 1)[1].split(":", 1)[0]
    return None


def _verdict(answer: tuple[model.AllocationResult, ...] | oracle.CelError | None) -> str:
    if isinstance(answer, oracle.CelError):
        return f"error on {answer.ref}"
    return "ok" if answer is not None else "none"


def _allocator_verdict(outcome: alloc.Outcome) -> str:
    failed = _cel_error(outcome)
    if failed is not None:
        return f"error on {failed}"
    return "ok" if outcome.ok else "none"


def _agrees(
    policy: alloc.Policy, expected: tuple[model.AllocationResult, ...] | oracle.CelError | None, outcome: alloc.Outcome
) -> bool:
    """First-fit gives the oracle's verdict exactly; binpack refuses (without error) exactly
    where the oracle finds nothing, and otherwise allocates or reports a CEL error."""
    if policy is alloc.Policy.FIRST_FIT:
        return _verdict(expected) == _allocator_verdict(outcome)
    if expected is None:
        return _allocator_verdict(outcome) == "none"
    return outcome.ok or _cel_error(outcome) is not None


def _oracle_answer(found: tuple[model.AllocationResult, ...] | oracle.CelError | None) -> str:
    if isinstance(found, oracle.CelError):
        return f"oracle: the search meets a failing selector: {found}"
    if found is None:
        return "oracle: no allocation exists"
    return "oracle: e.g.\n" + "\n".join(f"    {strategies.describe_allocation(a)}" for a in found)


@POLICIES
@strategies.settings_for(150)
@given(instance=strategies.instances())
@example(instance=strategies.regression("all-untolerated-taint"))
@example(instance=strategies.regression("explain-constraint-of-other-claim"))
def test_allocation_on_one_node_exists_exactly_when_the_oracle_finds_one(
    policy: alloc.Policy, instance: strategies.Instance
) -> None:
    """Completeness and soundness of the verdict: ok on a given node iff an allocation exists there."""
    node = instance.node
    expected = oracle.decide(instance.snapshot, instance.claims, node)
    outcome = alloc.Allocator(instance.snapshot, policy=policy).allocate(instance.claims, nodes=[node])
    if not _agrees(policy, expected, outcome):
        headline = f"{policy.value} on {node}: allocator {_allocator_verdict(outcome)}, oracle {_verdict(expected)}"
        pytest.fail(_report(headline, instance.snapshot, instance.claims, _oracle_answer(expected), _outcome(outcome)))


@POLICIES
@strategies.settings_for(200)
@given(instance=strategies.instances())
@example(instance=strategies.regression("all-untolerated-taint"))
def test_every_returned_allocation_satisfies_every_rule(policy: alloc.Policy, instance: strategies.Instance) -> None:
    """Every allocation the allocator returns passes the oracle's check (selectors, in-use,
    taints, counters, capacity, constraints, counts, All sets, API shape, node selector)."""
    node = instance.node
    outcome = alloc.Allocator(instance.snapshot, policy=policy).allocate(instance.claims, nodes=[node])
    if outcome.allocations is None:
        return
    violations = oracle.check(instance.snapshot, instance.claims, node, outcome.allocations)
    if outcome.node not in (node, None):
        violations.append(f"outcome.node is {outcome.node}, only {node} was offered")
    if violations:
        pytest.fail(
            _report(
                f"{policy.value} on {node}: invalid allocation",
                instance.snapshot,
                instance.claims,
                _outcome(outcome),
                "violations:",
                *(f"    {v}" for v in violations),
            )
        )


@strategies.settings_for(150)
@given(instance=strategies.instances(min_claims=1, max_claims=3))
def test_policies_agree_on_which_claims_are_allocatable_in_isolation(instance: strategies.Instance) -> None:
    """first-fit and binpack (fresh allocators, any node) accept and refuse the same claims
    (when neither meets a failing selector, whose place depends on the search order)."""
    for claim in instance.claims:
        first_fit = alloc.Allocator(instance.snapshot, policy=alloc.Policy.FIRST_FIT).allocate([claim])
        binpack = alloc.Allocator(instance.snapshot, policy=alloc.Policy.BINPACK).allocate([claim])
        if _cel_error(first_fit) is not None or _cel_error(binpack) is not None:
            continue
        if first_fit.ok != binpack.ok:
            nodes = [
                n
                for n in instance.cluster.node_names
                if not isinstance(a := oracle.decide(instance.snapshot, [claim], n), oracle.CelError) and a is not None
            ]
            pytest.fail(
                _report(
                    f"{claim.key}: first-fit ok={first_fit.ok}, binpack ok={binpack.ok}; oracle: allocatable on "
                    f"{nodes or 'no node'}",
                    instance.snapshot,
                    [claim],
                    "first-fit " + _outcome(first_fit),
                    "binpack " + _outcome(binpack),
                )
            )


@POLICIES
@strategies.settings_for(100)
@given(instance=strategies.instances(min_claims=2, max_claims=4))
@example(instance=strategies.regression("all-after-committed-share"))
def test_sequences_never_double_allocate_or_overdraw(policy: alloc.Policy, instance: strategies.Instance) -> None:
    """Claims allocated one after another (any node) never share a dedicated device nor overdraw
    counters or capacity; each success is valid against the state before it, and each refusal
    happens only when the oracle finds no node for the claim."""
    allocator = alloc.Allocator(instance.snapshot, policy=policy)
    names = instance.cluster.node_names
    done: list[model.ResourceClaim] = []
    for claim in instance.claims:
        before = dataclasses.replace(instance.snapshot, allocated_claims=(*instance.snapshot.allocated_claims, *done))
        outcome = allocator.allocate([claim])
        history = [f"    {c.key}: {strategies.describe_allocation(c.allocation)}" for c in done]
        if outcome.allocations is None:
            if _cel_error(outcome) is not None:
                continue  # which node's error ends the attempt depends on the search order
            # Without an error, every node's search ran to the end without meeting one.
            answers = {n: oracle.decide(before, [claim], n) for n in names}
            feasible = [n for n, a in answers.items() if a is not None]
            if feasible:
                found = answers[feasible[0]]
                pytest.fail(
                    _report(
                        f"{policy.value}: {claim.key} refused without an error, but the oracle answers "
                        f"{_verdict(found)} on {feasible[0]}",
                        instance.snapshot,
                        instance.claims,
                        "committed before:",
                        *history,
                        _oracle_answer(found),
                        _outcome(outcome),
                    )
                )
            continue
        # node None means the devices are reachable from every node; the allocation must then be
        # valid on at least one node (a node may still refuse it, e.g. All with an incomplete pool).
        candidates = [outcome.node] if outcome.node is not None else names
        per_node = {node: oracle.check(before, [claim], node, outcome.allocations) for node in candidates}
        violations = (
            []
            if any(not v for v in per_node.values())
            else [f"on {node}: {v}" for node, vs in per_node.items() for v in vs]
        )
        done.append(dataclasses.replace(claim, allocation=outcome.allocations[0]))
        violations.extend(oracle.ledger_violations(instance.snapshot, done))
        if violations:
            pytest.fail(
                _report(
                    f"{policy.value}: {claim.key} allocated against committed state",
                    instance.snapshot,
                    instance.claims,
                    "committed before:",
                    *history,
                    _outcome(outcome),
                    "violations:",
                    *(f"    {v}" for v in violations),
                )
            )


@POLICIES
@strategies.settings_for(150)
@given(instance=strategies.partition_instances())
def test_partitioned_gpus_allocate_exactly_when_the_oracle_finds_one(
    policy: alloc.Policy, instance: strategies.Instance
) -> None:
    """On MIG-like partitioned GPUs (counters, over-committed parents, admin access, two drivers'
    pools with one name, constraints on the parent): ok iff an allocation exists, and valid."""
    outcome = alloc.Allocator(instance.snapshot, policy=policy).allocate(instance.claims, nodes=["node-0"])
    expected = oracle.decide(instance.snapshot, instance.claims, "node-0")
    if not _agrees(policy, expected, outcome):
        headline = f"{policy.value}: allocator {_allocator_verdict(outcome)}, oracle {_verdict(expected)}"
        pytest.fail(_report(headline, instance.snapshot, instance.claims, _oracle_answer(expected), _outcome(outcome)))
    if outcome.allocations is not None:
        violations = oracle.check(instance.snapshot, instance.claims, "node-0", outcome.allocations)
        if violations:
            pytest.fail(
                _report(
                    f"{policy.value}: invalid allocation",
                    instance.snapshot,
                    instance.claims,
                    _outcome(outcome),
                    "violations:",
                    *(f"    {v}" for v in violations),
                )
            )
