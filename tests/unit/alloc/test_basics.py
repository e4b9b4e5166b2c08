"""Basics and node selection: upstream catalog group A."""

from __future__ import annotations

import pytest
from support.alloc_inputs import (
    DRIVER_B,
    ONE_DEVICE_TWO_CLAIMS,
    allocator,
    claim,
    held,
    memory_at_least,
    name_selector,
    node,
    picked,
    reasons,
    request,
    selector,
)
from support.devices import DRIVER, device, device_class, devices, rslice

from dractl import _alloc, alloc, model

SMALL = memory_at_least("1Gi")
LARGE = memory_at_least("2Gi")


def test_extension_is_compiled() -> None:
    """The Cython core is a compiled extension module, never a Python fallback."""
    assert _alloc.__file__ is not None and _alloc.__file__.endswith(".so")


def test_empty() -> None:
    """No claims: success with no allocations."""
    outcome = allocator([rslice(*devices(1))]).allocate([])
    assert outcome.ok and outcome.allocations == ()


def test_simple() -> None:
    """One device on a node-local slice: the result names it and pins the node."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim()])
    assert outcome.allocations is not None
    (allocation,) = outcome.allocations
    assert allocation.results == (
        model.DeviceRequestAllocationResult(request="req-0", driver=DRIVER, pool="node-1", device="device-1"),
    )
    assert allocation.node_selector == name_selector("node-1")
    assert outcome.node == "node-1"


def test_other_node() -> None:
    """Only the slices of the node being tried are used; nodes are tried in name order."""
    slices = [rslice(device("device-1"), node="node-2"), rslice(device("device-2"), node="node-3")]
    a = allocator(slices)
    outcome = a.allocate([claim()], nodes=["node-3"])
    assert picked(outcome) == [[("req-0", "device-2")]] and outcome.node == "node-3"
    outcome = a.allocate([claim("c2")])
    assert picked(outcome) == [[("req-0", "device-1")]] and outcome.node == "node-2"


def test_small_and_large() -> None:
    """Two requests with capacity selectors each get a matching device."""
    slices = [rslice(device("device-1", capacity={"memory": "1Gi"}), device("device-2", capacity={"memory": "2Gi"}))]
    outcome = allocator(slices).allocate(
        [claim("c", request("req-0", "class-a", SMALL), request("req-1", "class-a", LARGE))]
    )
    assert picked(outcome) == [[("req-0", "device-1"), ("req-1", "device-2")]]


def test_small_and_large_backtrack_requests() -> None:
    """Reversed device order: the first request's choice is undone for the second."""
    slices = [rslice(device("device-1", capacity={"memory": "2Gi"}), device("device-2", capacity={"memory": "1Gi"}))]
    outcome = allocator(slices).allocate(
        [claim("c", request("req-0", "class-a", SMALL), request("req-1", "class-a", LARGE))]
    )
    assert picked(outcome) == [[("req-0", "device-2"), ("req-1", "device-1")]]


def test_small_and_large_backtrack_claims() -> None:
    """Backtracking across two claims allocated jointly."""
    slices = [rslice(device("device-1", capacity={"memory": "2Gi"}), device("device-2", capacity={"memory": "1Gi"}))]
    outcome = allocator(slices).allocate(
        [claim("c0", request("req-0", "class-a", SMALL)), claim("c1", request("req-0", "class-a", LARGE))]
    )
    assert picked(outcome) == [[("req-0", "device-2")], [("req-0", "device-1")]]


def test_devices_split_across_different_slices() -> None:
    """Count 2 is satisfied from two pools of the node."""
    slices = [rslice(device("device-1"), pool="pool-1"), rslice(device("device-2"), pool="pool-2")]
    outcome = allocator(slices).allocate([claim("c", request(count=2))])
    assert outcome.allocations is not None
    assert [(r.pool, r.device) for r in outcome.allocations[0].results] == [
        ("pool-1", "device-1"),
        ("pool-2", "device-2"),
    ]


def test_no_slices() -> None:
    """Nothing published: the claim fails and says the class matches nothing."""
    outcome = allocator([]).allocate([claim()])
    assert "matches 0 devices" in reasons(outcome)


def test_not_enough_suitable_devices() -> None:
    """Two claims, one device: the joint allocation fails."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c0"), claim("c1")])
    assert reasons(outcome) == ONE_DEVICE_TWO_CLAIMS


@pytest.mark.parametrize("name", ["no-classes", "unknown-class"])
def test_unknown_class(name: str) -> None:
    """A request naming a class that does not exist fails with that class's name."""
    outcome = allocator([rslice(*devices(1))], classes=[] if name == "no-classes" else None).allocate(
        [claim("c", request("req-0", "class-x"))]
    )
    assert "device class class-x does not exist" in reasons(outcome)


def test_empty_class() -> None:
    """An empty deviceClassName is reported as such."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c", request("req-0", ""))])
    assert "names no device class" in reasons(outcome)


def test_already_allocated_devices() -> None:
    """A device held by an allocated claim in the input is not reused."""
    outcome = allocator([rslice(*devices(1))], allocated=[held("other", "device-1")]).allocate([claim()])
    assert "0 of those are free" in reasons(outcome)


@pytest.mark.parametrize("where", ["invalid-CEL-one-device", "invalid-CEL-one-device-class", "invalid-CEL-all-devices"])
def test_invalid_cel(where: str) -> None:
    """A selector that does not compile fails the request with the compiler's message."""
    bad = "noSuchVar.foo == 1"
    classes = [device_class(), device_class("class-bad", bad)]
    if where == "invalid-CEL-one-device":
        req = request("req-0", "class-a", bad)
    elif where == "invalid-CEL-one-device-class":
        req = request("req-0", "class-bad")
    else:
        req = request("req-0", "class-a", bad, all=True)
    text = reasons(allocator([rslice(*devices(1))], classes).allocate([claim("c", req)]))
    assert "noSuchVar" in text and "undeclared reference" in text


def test_cel_runtime_error_names_device() -> None:
    """A runtime error on a device the search reaches fails the request, quoting the
    expression and naming driver/pool/device (tests/unit/alloc/test_cel_errors.py has the
    search-order cases)."""
    expr = 'device.attributes["driver-a"].model == "x"'
    slices = [rslice(device("device-2"), device("device-1", attributes={"model": "x"}))]
    text = reasons(allocator(slices).allocate([claim("c", request("req-0", "class-a", expr))]))
    assert '`device.attributes["driver-a"].model == "x"`' in text
    assert "driver-a/node-1/device-2" in text and "no such key" in text


def test_cel_runtime_error_only_after_class_selectors() -> None:
    """Devices the class selectors reject are never evaluated by request selectors."""
    expr = 'device.attributes["driver-b"].model == "x"'
    slices = [
        rslice(device("device-1"), driver=DRIVER, pool="a"),
        rslice(device("device-2", attributes={"model": "x"}), driver=DRIVER_B, pool="b"),
    ]
    outcome = allocator(slices).allocate([claim("c", request("req-0", "class-b", expr))])
    assert picked(outcome) == [[("req-0", "device-2")]]


@pytest.mark.parametrize(
    ("name", "counts", "fails"),
    [
        ("too-many-devices-single-request", [500], True),
        ("many-devices-okay", [32], False),
        ("too-many-devices-total", [32, 1], True),
    ],
)
def test_claim_limit(name: str, counts: list[int], fails: bool) -> None:
    """More than 32 devices in one claim is refused before searching."""
    c = claim("c", *(request(f"req-{i}", count=n) for i, n in enumerate(counts)))
    outcome = allocator([]).allocate([c])
    assert ("exceeds the claim limit" in reasons(outcome)) == fails


def test_max_number_devices() -> None:
    """Exactly 32 devices can be allocated to one claim."""
    outcome = allocator([rslice(*devices(32))]).allocate([claim("c", request(count=32))])
    assert len(picked(outcome)[0]) == 32


def test_network_attached_device() -> None:
    """A slice with a node selector: the result carries that selector."""
    sel = selector(("region", "In", ("region-1",)))
    outcome = allocator(
        [rslice(*devices(1), node=None, pool="pool", node_selector=sel)], nodes=[node("node-1", region="region-1")]
    ).allocate([claim()])
    assert outcome.allocations is not None and outcome.allocations[0].node_selector == sel


def test_unsuccessful_allocation_network_attached_device() -> None:
    """A node selector that does not match the node hides the devices."""
    sel = selector(("region", "In", ("region-2",)))
    outcome = allocator(
        [rslice(*devices(1), node=None, pool="pool", node_selector=sel)], nodes=[node("node-1", region="region-1")]
    ).allocate([claim()])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)"
    )


def test_many_network_attached_devices() -> None:
    """Selectors of several devices are ANDed into one term; allNodes contributes nothing."""
    region = selector(("region", "In", ("region-1",)))
    planet = selector(("planet", "In", ("earth",)))
    by_name = selector(fields=[("metadata.name", "In", ("node-1",))])
    slices = [
        rslice(device("device-1"), node=None, pool="p1", node_selector=region),
        rslice(device("device-2"), node=None, pool="p2", all_nodes=True),
        rslice(device("device-3"), node=None, pool="p3", node_selector=planet),
        rslice(device("device-4"), node=None, pool="p4", node_selector=by_name),
    ]
    outcome = allocator(slices, nodes=[node("node-1", region="region-1", planet="earth")]).allocate(
        [claim("c", request(count=4))]
    )
    assert outcome.allocations is not None
    expected = selector(
        ("region", "In", ("region-1",)), ("planet", "In", ("earth",)), fields=[("metadata.name", "In", ("node-1",))]
    )
    assert outcome.allocations[0].node_selector == expected


def test_all_nodes_only_is_usable_everywhere() -> None:
    """Devices of an allNodes slice give no node selector and no node."""
    outcome = allocator([rslice(*devices(1), node=None, pool="p", all_nodes=True)], nodes=[node("node-1")]).allocate(
        [claim()]
    )
    assert outcome.allocations is not None and outcome.allocations[0].node_selector is None and outcome.node is None


def test_local_and_network_attached_devices() -> None:
    """Any node-local device pins the allocation to the node by name."""
    sel = selector(("region", "In", ("region-1",)))
    slices = [rslice(device("device-1")), rslice(device("device-2"), node=None, pool="net", node_selector=sel)]
    outcome = allocator(slices, nodes=[node("node-1", region="region-1")]).allocate([claim("c", request(count=2))])
    assert outcome.allocations is not None and outcome.allocations[0].node_selector == name_selector("node-1")


def test_different_resourceslices_in_pool_can_target_different_nodes() -> None:
    """A pool spread over two nodes: each node only uses its own slice."""
    slices = [
        rslice(device("device-1"), name="s1", node="node-1", pool="pool", count=2),
        rslice(device("device-2"), name="s2", node="node-2", pool="pool", count=2),
    ]
    outcome = allocator(slices).allocate([claim()], nodes=["node-2"])
    assert picked(outcome) == [[("req-0", "device-2")]]


def test_several_different_drivers() -> None:
    """Two claims on classes of different drivers."""
    slices = [
        rslice(device("device-1"), driver=DRIVER, pool="a"),
        rslice(device("device-2"), driver=DRIVER_B, pool="b"),
    ]
    outcome = allocator(slices).allocate([claim("c0"), claim("c1", request("req-0", "class-b"))])
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-2")]]


def test_success_commits() -> None:
    """A successful allocation holds its devices for later calls."""
    a = allocator([rslice(*devices(2))])
    assert picked(a.allocate([claim("c0")])) == [[("req-0", "device-1")]]
    assert picked(a.allocate([claim("c1")])) == [[("req-0", "device-2")]]
    assert reasons(a.allocate([claim("c2")])) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)"
    )


def test_nodes_argument_restricts_candidates() -> None:
    """`nodes` limits the search to those nodes; unknown names are ignored."""
    slices = [rslice(device("device-1"), node="node-1"), rslice(device("device-2"), node="node-2")]
    outcome = allocator(slices).allocate([claim()], nodes=["node-2", "node-9"])
    assert outcome.node == "node-2"
    assert reasons(allocator(slices).allocate([claim()], nodes=[])) == (
        "None: none of the candidate nodes is known (no Node object or ResourceSlice names them)\n"
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)"
    )


def test_nodes_from_node_objects() -> None:
    """With Node objects, only those nodes exist; node labels drive selectors."""
    slices = [rslice(device("device-1"), node="node-1"), rslice(device("device-2"), node="node-2")]
    outcome = allocator(slices, nodes=[node("node-2")]).allocate([claim()])
    assert picked(outcome) == [[("req-0", "device-2")]]


def test_policy_enum_values() -> None:
    """The policy names are the CLI's spellings."""
    assert [p.value for p in alloc.Policy] == ["first-fit", "binpack"]
