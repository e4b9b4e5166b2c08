"""Property tests: releases are exact. After any sequence of allocations and releases, the
long-lived allocator's usage tables equal those of a fresh allocator given only the claims
still held, and both make the same next choice (no history dependence)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import strategies

from dractl import alloc

POLICIES = pytest.mark.parametrize(
    "policy", [alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK], ids=["first-fit", "binpack"]
)


@POLICIES
@strategies.settings_for(100)
@given(instance=strategies.instances(max_claims=4), data=st.data())
def test_usage_after_releases_equals_a_fresh_allocator(
    policy: alloc.Policy, instance: strategies.Instance, data: st.DataObject
) -> None:
    """Allocate every claim, release a random subset (snapshot claims included): the tables
    equal a fresh allocator's built from what is still held, and the next choice agrees."""
    snapshot = instance.cluster.snapshot
    live = alloc.Allocator(snapshot, policy=policy)
    for claim in instance.claims:
        live.allocate([claim])
    held = [c for c in (*snapshot.allocated_claims, *instance.claims) if live.held(alloc.claim_id(c)) is not None]
    released = data.draw(st.lists(st.sampled_from(held), unique_by=alloc.claim_id) if held else st.just([]))
    for claim in released:
        assert live.release(alloc.claim_id(claim))
    still = [
        dataclasses.replace(c, allocation=live.held(alloc.claim_id(c)))
        for c in held
        if live.held(alloc.claim_id(c)) is not None
    ]
    fresh = alloc.Allocator(dataclasses.replace(snapshot, allocated_claims=tuple(still)), policy=policy)
    assert live.usage() == fresh.usage()
    # Binpack keeps devices for the request shapes it knows: the restarted allocator is told
    # the same ones, as a controller tells it every pending claim.
    fresh.consider(instance.claims)
    probe = dataclasses.replace(instance.claims[0], meta=dataclasses.replace(instance.claims[0].meta, uid="probe"))
    assert live.allocate([probe]) == fresh.allocate([probe])
