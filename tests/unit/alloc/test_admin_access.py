"""adminAccess: upstream catalog group C, plus dractl's counter-free admin access."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, held, picked, reasons, request
from support.devices import counter_set, device, devices, partitioned, rslice, taint


def test_admin_access_enabled() -> None:
    """An admin request reuses an allocated device and the result says adminAccess."""
    outcome = allocator([rslice(*devices(1))], allocated=[held("x", "device-1")]).allocate(
        [claim("c", request(admin=True))]
    )
    assert outcome.allocations is not None
    assert outcome.allocations[0].results[0].admin_access is True


def test_non_admin_result_has_no_admin_field() -> None:
    """adminAccess is only recorded when true."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c", request(admin=False))])
    assert outcome.allocations is not None and outcome.allocations[0].results[0].admin_access is None


def test_all_devices_some_allocated_admin_access() -> None:
    """All + admin ignores allocated devices."""
    outcome = allocator([rslice(*devices(2))], allocated=[held("x", "device-1")]).allocate(
        [claim("c", request(all=True, admin=True))]
    )
    assert picked(outcome) == [[("req-0", "device-1"), ("req-0", "device-2")]]


def test_all_devices_some_allocating_admin_access() -> None:
    """An admin claim cannot take the same device twice."""
    c = claim("c", request("req-0", admin=True), request("req-1", all=True, admin=True))
    assert reasons(allocator([rslice(*devices(1))]).allocate([c])) == (
        "req-1: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (all of them); allocationMode All needs every matching device, but some "
        "are already allocated or have a taint the request does not tolerate"
    )


def test_count_devices_some_allocated_admin_access() -> None:
    """Count 2 admin includes the allocated device."""
    outcome = allocator([rslice(*devices(2))], allocated=[held("x", "device-1")]).allocate(
        [claim("c", request(count=2, admin=True))]
    )
    assert picked(outcome) == [[("req-0", "device-1"), ("req-0", "device-2")]]


def test_separate_claims_share_device_admin_access() -> None:
    """Two admin claims share one device."""
    outcome = allocator([rslice(*devices(1))]).allocate(
        [claim("c0", request(admin=True)), claim("c1", request(admin=True))]
    )
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-1")]]


def test_admin_access_claims_device_allocating_for_non_admin_access() -> None:
    """An admin claim reuses a device an earlier normal claim just took."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c0"), claim("c1", request(admin=True))])
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-1")]]


def test_admin_result_does_not_hold_device() -> None:
    """After an admin allocation the device is still free for a normal claim."""
    a = allocator([rslice(*devices(1))])
    assert a.allocate([claim("c0", request(admin=True))]).ok
    assert picked(a.allocate([claim("c1")])) == [[("req-0", "device-1")]]


def test_tainted_admin_access() -> None:
    """Admin access does not bypass a NoSchedule taint."""
    assert reasons(
        allocator([rslice(device("device-1", taints=[taint("k")]))]).allocate([claim("c", request(admin=True))])
    ) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_admin_access_needs_no_counters() -> None:
    """dractl: admin access reaches a partition whose counters are exhausted."""
    slices = partitioned(
        device("full", consumes={"gpu-0": {"mem": 4}}),
        device("part", consumes={"gpu-0": {"mem": 2}}),
        counters=[counter_set("gpu-0", mem=4)],
    )
    a = allocator(slices)
    assert picked(
        a.allocate([claim("c0", request("req-0", "class-a", 'device.attributes["driver-a"].?x.orValue("") == ""'))])
    ) == [[("req-0", "full")]]
    assert reasons(a.allocate([claim("c1")])) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (1 needed); counter mem of counter set gpu-0 in pool driver-a/node-1 "
        "ran out"
    )
    assert picked(a.allocate([claim("c2", request(admin=True))])) == [[("req-0", "full")]]
    outcome = a.allocate([claim("c3", request(count=2, admin=True))])
    assert picked(outcome) == [[("req-0", "full"), ("req-0", "part")]]


def test_admin_share_does_not_spare_a_later_share_its_counters() -> None:
    """An admin share holds nothing, so the next share in the same call charges the counters."""
    slices = partitioned(
        device("shared", multi=True, consumes={"gpu-0": {"mem": 4}}),
        device("other", consumes={"gpu-0": {"mem": 4}}),
        counters=[counter_set("gpu-0", mem=4)],
    )
    a = allocator(slices)
    only_shared = "device.allowMultipleAllocations"
    outcome = a.allocate(
        [
            claim("c0", request("req-0", "class-a", only_shared, admin=True)),
            claim("c1", request("req-0", "class-a", only_shared)),
        ]
    )
    assert picked(outcome) == [[("req-0", "shared")], [("req-0", "shared")]]
    assert reasons(a.allocate([claim("c2", request("req-0", "class-a", "!device.allowMultipleAllocations"))])) == (
        "req-0: device class class-a matches 2 devices; 1 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (1 needed); counter mem of counter set gpu-0 in pool driver-a/node-1 "
        "ran out"
    )
