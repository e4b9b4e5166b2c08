"""The what-if: which held claims, moved, let a refused claim fit, and where they go."""

from __future__ import annotations

import dataclasses

from support import alloc_inputs
from support.alloc_inputs import allocator, claim, reasons, request
from support.devices import devices, rslice

from dractl import alloc, model


def held(name: str, *names: str, pool: str) -> model.ResourceClaim:
    """A claim holding `names` on `pool` whose spec asks for as many devices: moved, it takes as many again."""
    holding = alloc_inputs.held(name, *names, pool=pool)
    return dataclasses.replace(holding, spec=claim(name, request("req-0", count=len(names))).spec)


def _two_nodes_fragmented() -> alloc.Allocator:
    """node-1 and node-2, 4 devices each: node-1 holds a 1-device claim (a) and node-2 a 2-device claim (b), so 5
    devices are free but no node has 4."""
    slices = [rslice(*devices(4), node="node-1"), rslice(*devices(4), node="node-2")]
    allocated = [held("a", "device-2", pool="node-1"), held("b", "device-1", "device-3", pool="node-2")]
    return allocator(slices, allocated=allocated)


def test_one_move_admits_the_claim() -> None:
    """Moving the smallest claim off the best node admits the refused one: the plan names it, its new place, and
    the refused claim's allocation."""
    a = _two_nodes_fragmented()
    plan = a.repack([claim("c", request("gpu", count=4))])
    assert plan is not None
    assert [(m.claim, m.before_node, m.after_node) for m in plan.moves] == [("default/a", "node-1", "node-2")]
    assert plan.node == "node-1"
    assert [r.device for r in plan.allocations[0].results] == ["device-1", "device-2", "device-3", "device-4"]
    assert plan.moves[0].after.results[0].device in {"device-2", "device-4"}
    assert (
        plan.describe() == f"move default/a (device-2 on node-1 -> {plan.moves[0].after.results[0].device} on node-2)"
    )


def test_the_allocator_is_unchanged_afterwards() -> None:
    """The what-if leaves usage, holdings and the next choice exactly as they were."""
    a = _two_nodes_fragmented()
    before = a.usage()
    held_before = (a.held("default/a"), a.held("default/b"))
    assert a.repack([claim("c", request("gpu", count=4))]) is not None
    assert a.repack([claim("d", request("gpu", count=8))]) is None
    assert a.usage() == before
    assert (a.held("default/a"), a.held("default/b")) == held_before
    assert a.allocate([claim("e", request("gpu", count=2))]) == _two_nodes_fragmented().allocate(
        [claim("e", request("gpu", count=2))]
    )


def test_a_shortage_has_no_plan() -> None:
    """When the claims held plus the refused one exceed the cluster, no repack admits it."""
    assert _two_nodes_fragmented().repack([claim("c", request("gpu", count=6))]) is None


def test_a_claim_that_fits_needs_no_moves() -> None:
    """A claim that fits as things are gets a plan without moves, and holds nothing afterwards."""
    a = _two_nodes_fragmented()
    plan = a.repack([claim("c", request("gpu", count=2))])
    assert plan is not None and plan.moves == () and plan.node == "node-1"
    assert a.held("default/c") is None


def test_fewest_moves_then_fewest_devices() -> None:
    """Among plans, one move beats two, and moving one device beats moving two."""
    slices = [rslice(*devices(4), node=f"node-{i}") for i in (1, 2, 3)]
    allocated = [
        held("a1", "device-1", pool="node-1"),
        held("a2", "device-2", pool="node-1"),
        held("b", "device-1", "device-2", pool="node-2"),
        held("c", "device-1", pool="node-3"),
    ]
    plan = allocator(slices, allocated=allocated).repack([claim("x", request("gpu", count=4))])
    assert plan is not None and [m.claim for m in plan.moves] == ["default/c"]


def test_two_moves_when_one_does_not_suffice() -> None:
    """When no single claim's move frees enough, two are moved, each to a place that fits at once."""
    slices = [rslice(*devices(4), node="node-1"), rslice(*devices(4), node="node-2")]
    allocated = [held("a1", "device-1", pool="node-1"), held("a2", "device-2", pool="node-1")]
    plan = allocator(slices, allocated=allocated).repack([claim("x", request("gpu", count=4))], nodes=("node-1",))
    assert plan is not None and sorted(m.claim for m in plan.moves) == ["default/a1", "default/a2"]
    assert {m.after_node for m in plan.moves} == {"node-2"}
    assert len({r.device for m in plan.moves for r in m.after.results}) == 2
    assert (
        allocator(slices, allocated=allocated).repack(
            [claim("x", request("gpu", count=4))], nodes=("node-1",), max_moves=1
        )
        is None
    )


def test_the_refusal_reason_names_the_repack() -> None:
    """A refusal that a repack of at most two moves would admit says so, naming the claim moved and both places;
    nothing moves."""
    a = _two_nodes_fragmented()
    before = a.usage()
    text = reasons(a.allocate([claim("c", request("gpu", count=4))]))
    assert text.endswith(
        "no node has 4 free: the best, node-1, has 3\n"
        "None: a repack would admit it: move default/a (device-2 on node-1 -> device-2 on node-2)"
    )
    assert a.usage() == before


def test_a_refusal_without_a_repack_is_asked_again_after_a_release() -> None:
    """The what-if's answer "no repack" is remembered only while nothing held changes: after a release the same
    refusal names the repack that now exists."""
    slices = [rslice(*devices(4), node="node-1"), rslice(*devices(4), node="node-2")]
    allocated = [
        held("a", "device-1", "device-2", pool="node-1"),
        held("b", "device-1", "device-2", "device-3", pool="node-2"),
        held("d", "device-4", pool="node-2"),
    ]
    a = allocator(slices, allocated=allocated)
    wanted = claim("c", request("gpu", count=4))
    assert "repack" not in reasons(a.allocate([wanted]))
    assert "repack" not in reasons(a.allocate([wanted]))
    assert a.release("default/b")
    assert reasons(a.allocate([wanted])).endswith(
        "a repack would admit it: move default/d (device-4 on node-2 -> device-3 on node-1)"
    )
