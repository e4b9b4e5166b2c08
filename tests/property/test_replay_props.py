"""Property tests of the trace replay on random clusters and random arrival/departure sequences.

For both policies, every allocation the replay makes is checked by the brute-force oracle
against the state just before it (the claims then held), and the held claims never
double-allocate a device nor overdraw counters or capacity (`oracle.ledger_violations`). A
departure gives back exactly what the claim held: the next step is checked against a state
without it. Replaying the same trace with a fresh allocator gives the same steps (binpack's
determinism, as after a restart).
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import given
from support import oracle, strategies

from dractl import alloc, config, model
from dractl.simulate import replay, trace

POLICIES = pytest.mark.parametrize("policy", list(config.Policy), ids=[p.value for p in config.Policy])


@st.composite
def traces(draw: st.DrawFn) -> tuple[strategies.Instance, trace.Trace]:
    """A random cluster (without held claims) and a trace: its claims arrive one a second, and
    after each arrival an earlier claim still present may depart."""
    instance = draw(strategies.instances(min_claims=3, max_claims=8))
    snapshot = instance.snapshot
    cluster = model.Objects(
        device_classes=tuple(snapshot.device_classes),
        resource_slices=tuple(snapshot.resource_slices),
        nodes=tuple(snapshot.nodes),
    )
    events: list[trace.Event] = []
    present: list[model.ResourceClaim] = []
    for i, claim in enumerate(instance.claims):
        events.append(trace.Arrival(at=float(i), object=claim, index=len(events)))
        present.append(claim)
        if draw(st.booleans()):
            leaving = present.pop(draw(st.integers(min_value=0, max_value=len(present) - 1)))
            events.append(
                trace.Departure(
                    at=i + 0.5,
                    kind="ResourceClaim",
                    namespace=leaving.meta.namespace,
                    name=leaving.meta.name,
                    index=len(events),
                )
            )
    empty = dataclasses.replace(snapshot, allocated_claims=())
    return strategies.Instance(strategies.Cluster(empty), instance.claims), trace.Trace(
        name="random", cluster=cluster, events=tuple(events), document={}
    )


def _steps(result: replay.Result) -> list[tuple[object, ...]]:
    return [(a.at, a.kind, a.work, a.node, tuple(c.allocation for c in a.claims)) for a in result.actions]


@POLICIES
@strategies.settings_for(60)
@given(case=traces())
def test_every_step_of_a_replay_is_a_valid_allocation(
    policy: config.Policy, case: tuple[strategies.Instance, trace.Trace]
) -> None:
    """Each allocation is valid for the oracle against the claims held just before it, the held
    claims never overdraw, and a released claim's devices are free again for the next step."""
    instance, tr = case
    result = replay.replay(tr, policy=policy, retry=config.Retry.ON_DEPARTURE)
    held: dict[str, model.ResourceClaim] = {}
    names = instance.cluster.node_names
    for action in result.actions:
        if action.kind is replay.ActionKind.RELEASE:
            assert held.pop(action.claims[0].key) == action.claims[0]
            continue
        if action.kind is not replay.ActionKind.ALLOCATE:
            continue
        before = dataclasses.replace(instance.snapshot, allocated_claims=tuple(held.values()))
        allocations = tuple(c.allocation for c in action.claims if c.allocation is not None)
        plain = [dataclasses.replace(c, allocation=None) for c in action.claims]
        candidates = [action.node] if action.node is not None else list(names)
        problems = {node: oracle.check(before, plain, node, allocations) for node in candidates}
        assert any(not p for p in problems.values()), (
            f"{policy.value}: step {action.work} at {action.at}s is invalid: {problems}\n"
            + strategies.describe(before, plain)
        )
        for claim in action.claims:
            held[claim.key] = claim
        violations = oracle.ledger_violations(
            dataclasses.replace(instance.snapshot, allocated_claims=()), list(held.values())
        )
        assert violations == [], f"{policy.value}: after {action.work}: {violations}"
    assert sorted(held) == sorted(c.key for c in result.held)


@strategies.settings_for(40)
@given(case=traces())
def test_binpack_replays_the_same_way_with_a_fresh_allocator(case: tuple[strategies.Instance, trace.Trace]) -> None:
    """The same trace replayed twice, each time with a new allocator, gives the same steps."""
    _, tr = case
    first = replay.replay(tr, policy=alloc.Policy.BINPACK)
    second = replay.replay(tr, policy=alloc.Policy.BINPACK)
    assert _steps(first) == _steps(second)
