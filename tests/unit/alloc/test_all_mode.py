"""allocationMode All: upstream catalog group B."""

from __future__ import annotations

from support.alloc_inputs import DRIVER_B, allocator, claim, held, match, picked, reasons, request
from support.devices import counter_set, device, devices, partitioned, rslice, taint


def test_all_devices_single() -> None:
    """All with one matching device takes it."""
    assert picked(allocator([rslice(*devices(1))]).allocate([claim("c", request(all=True))])) == [
        [("req-0", "device-1")]
    ]


def test_all_devices_with_consumed_counters() -> None:
    """All over a counter-consuming device charges its counters."""
    slices = partitioned(device("device-1", consumes={"set": {"mem": "4Gi"}}), counters=[counter_set("set", mem="8Gi")])
    assert picked(allocator(slices).allocate([claim("c", request(all=True))])) == [[("req-0", "device-1")]]


def test_all_devices_many() -> None:
    """All spans every pool visible on the node."""
    slices = [rslice(device("device-1"), pool="pool-1"), rslice(device("device-2"), pool="pool-2")]
    assert picked(allocator(slices).allocate([claim("c", request(all=True))])) == [
        [("req-0", "device-1"), ("req-0", "device-2")]
    ]


def test_all_devices_of_the_incomplete_pool() -> None:
    """All refuses a node with an incomplete pool, and says which pool."""
    outcome = allocator([rslice(*devices(1), count=2)]).allocate([claim("c", request(all=True))])
    text = reasons(outcome)
    assert "resource pool driver-a/node-1 is currently being updated" in text


def test_all_devices_plus_another() -> None:
    """An All claim plus an ExactCount claim on another driver, in both orders."""
    slices = [rslice(*devices(2), pool="a"), rslice(device("device-9"), driver=DRIVER_B, pool="b")]
    other = claim("c1", request("req-0", "class-b"))
    assert picked(allocator(slices).allocate([claim("c0", request(all=True)), other])) == [
        [("req-0", "device-1"), ("req-0", "device-2")],
        [("req-0", "device-9")],
    ]
    assert picked(allocator(slices).allocate([other, claim("c0", request(all=True))])) == [
        [("req-0", "device-9")],
        [("req-0", "device-1"), ("req-0", "device-2")],
    ]


def test_all_devices_no_solution() -> None:
    """An ExactCount claim first takes the only device, so All fails (and reversed)."""
    slices = [rslice(*devices(1))]
    assert reasons(allocator(slices).allocate([claim("c0"), claim("c1", request(all=True))])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (all of them); allocationMode All needs every matching device, but some "
        "are already allocated or have a taint the request does not tolerate"
    )
    assert reasons(allocator(slices).allocate([claim("c1", request(all=True)), claim("c0")])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (all of them)\n"
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (1 needed)\n"
        "None: every request has devices on its own, but none of the 1 candidate node has devices for all "
        "requests together"
    )


def test_all_devices_slice_without_devices() -> None:
    """All with zero matching devices fails."""
    assert reasons(allocator([rslice()]).allocate([claim("c", request(all=True))])) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (all of them)"
    )


def test_all_devices_some_allocated() -> None:
    """All fails when one matching device is already allocated, and says so."""
    outcome = allocator([rslice(*devices(2))], allocated=[held("x", "device-2")]).allocate(
        [claim("c", request(all=True))]
    )
    assert "needs every matching device" in reasons(outcome)


def test_allocation_mode_all_with_multi_host_resource_pool() -> None:
    """A complete pool spread over two nodes: All takes only this node's devices."""
    slices = [
        rslice(device("device-1"), name="s1", node="node-1", pool="pool", count=2),
        rslice(device("device-2"), name="s2", node="node-2", pool="pool", count=2),
    ]
    assert picked(allocator(slices).allocate([claim("c", request(all=True))], nodes=["node-1"])) == [
        [("req-0", "device-1")]
    ]


def test_with_constraint_not_matching_int_attribute_all_devices() -> None:
    """All mode cannot skip a device that breaks a matchAttribute constraint."""
    slices = [rslice(device("device-1", attributes={"numa": 1}), device("device-2", attributes={"numa": 2}))]
    outcome = allocator(slices).allocate([claim("c", request(all=True), constraints=[match("driver-a/numa")])])
    assert "constraint matchAttribute driver-a/numa could not be met" in reasons(outcome)


def test_tainted_all_devices_single() -> None:
    """An untolerated taint removes the device from the All set: nothing matches."""
    outcome = allocator([rslice(device("device-1", taints=[taint("k")]))]).allocate([claim("c", request(all=True))])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (all of them)"
    )


def test_all_devices_beyond_the_claim_limit() -> None:
    """All over 33 devices exceeds the claim limit of 32 results, and says so."""
    assert "exceeds the claim limit of 32 results" in reasons(
        allocator([rslice(*devices(33))]).allocate([claim("c", request(all=True))])
    )
