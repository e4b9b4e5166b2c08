"""firstAvailable subrequests: upstream catalog group F."""

from __future__ import annotations

from support.alloc_inputs import (
    DRIVER_B,
    allocator,
    big_or_small,
    claim,
    first_available,
    held,
    match,
    memory_at_least,
    picked,
    reasons,
    request,
    sub,
    toleration,
)
from support.devices import device, device_class, devices, rslice, taint


def test_prioritized_list_first_unavailable() -> None:
    """The first subrequest's class has no devices: the second is chosen, named req/sub."""
    outcome = allocator([rslice(*devices(1))]).allocate(
        [claim("c", first_available("req-0", sub("subReq-0", "class-b"), sub("subReq-1")))]
    )
    assert picked(outcome) == [[("req-0/subReq-1", "device-1")]]


def test_prioritized_list_non_available() -> None:
    """Both subrequests need two devices; only one exists."""
    outcome = allocator([rslice(*devices(1))]).allocate(
        [claim("c", first_available("req-0", sub("a", count=2), sub("b", count=2)))]
    )
    assert reasons(outcome) == (
        "req-0/a: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (2 needed)\n"
        "req-0/b: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (2 needed)"
    )
    assert {r.request for r in outcome.reasons} == {"req-0/a", "req-0/b"}


def test_prioritized_list_subrequests_with_expressions() -> None:
    """The plain req-0 must backtrack so req-1/subReq-1 gets two 2Gi devices."""
    slices = [rslice(*(device(f"device-{i}", capacity={"memory": m}) for i, m in enumerate(["2Gi", "2Gi", "1Gi"], 1)))]
    c = claim(
        "c",
        request("req-0", "class-a", memory_at_least("1Gi")),
        first_available(
            "req-1",
            sub("subReq-0", "class-a", memory_at_least("4Gi")),
            sub("subReq-1", "class-a", memory_at_least("2Gi"), count=2),
        ),
    )
    assert picked(allocator(slices).allocate([c])) == [
        [("req-0", "device-3"), ("req-1/subReq-1", "device-1"), ("req-1/subReq-1", "device-2")]
    ]


def test_prioritized_list_subrequests_with_constraints_ref_parent_request() -> None:
    """A constraint on the parent request name applies to the chosen subrequest."""
    slices = [
        rslice(
            device("device-1", attributes={"n": 1}),
            device("device-2", attributes={"n": 2}),
            device("device-3", attributes={"n": 1}),
        )
    ]
    c = claim(
        "c",
        request("req-0"),
        first_available("req-1", sub("subReq-0", count=1)),
        constraints=[match("driver-a/n", "req-0", "req-1")],
    )
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-1"), ("req-1/subReq-0", "device-3")]]


def test_prioritized_list_subrequests_with_constraints_ref_sub_request() -> None:
    """A constraint on req-1/subReq-0 does not bind the fallback subrequest."""
    slices = [rslice(device("device-1", attributes={"n": 1}), device("device-2", attributes={"n": 2}))]
    c = claim(
        "c",
        request("req-0"),
        first_available("req-1", sub("subReq-0"), sub("subReq-1")),
        constraints=[match("driver-a/n", "req-0", "req-1/subReq-0")],
    )
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-1"), ("req-1/subReq-1", "device-2")]]


def test_prioritized_list_subrequests_with_allocation_mode_all() -> None:
    """An All subrequest fails on an allocated device; the next subrequest is used."""
    outcome = allocator([rslice(*devices(2))], allocated=[held("x", "device-1")]).allocate(
        [claim("c", first_available("req-0", sub("all", all=True), sub("one")))]
    )
    assert picked(outcome) == [[("req-0/one", "device-2")]]


def test_prioritized_list_allocation_mode_all_multiple_requests() -> None:
    """An All subrequest blocked by an earlier request's device falls back."""
    c = claim("c", request("req-0"), first_available("req-1", sub("all", all=True), sub("one")))
    assert picked(allocator([rslice(*devices(2))]).allocate([c])) == [
        [("req-0", "device-1"), ("req-1/one", "device-2")]
    ]


def test_prioritized_list_multi_request() -> None:
    """The plain request takes the 8Gi device; the subrequest falls back to 4Gi."""
    slices = [rslice(device("device-1", capacity={"memory": "8Gi"}), device("device-2", capacity={"memory": "4Gi"}))]
    c = claim(
        "c",
        request("req-0", "class-a", memory_at_least("8Gi")),
        big_or_small("req-1", "8Gi", "4Gi"),
    )
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-1"), ("req-1/small", "device-2")]]


def test_prioritized_list_with_backtracking() -> None:
    """A later plain request forces an earlier request onto its second subrequest."""
    slices = [rslice(device("device-1", capacity={"memory": "8Gi"}), device("device-2", capacity={"memory": "4Gi"}))]
    c = claim(
        "c",
        big_or_small("req-0", "8Gi", "4Gi"),
        request("req-1", "class-a", memory_at_least("8Gi")),
    )
    assert picked(allocator(slices).allocate([c])) == [[("req-0/small", "device-2"), ("req-1", "device-1")]]


def test_prioritized_list_too_many_in_first_subrequest() -> None:
    """A subrequest of 500 devices is skipped by the claim limit; the next one is used."""
    outcome = allocator([rslice(*devices(1))]).allocate(
        [claim("c", first_available("req-0", sub("huge", count=500), sub("one")))]
    )
    assert picked(outcome) == [[("req-0/one", "device-1")]]


def test_prioritized_list_max_allocation_allocation_mode_all() -> None:
    """All of 31 plus 2 more would exceed 32: the count-2 subrequest is chosen."""
    c = claim("c", request("req-0", count=2), first_available("req-1", sub("all", all=True), sub("two", count=2)))
    outcome = allocator([rslice(*devices(35))]).allocate([c])
    assert [r for r, _ in picked(outcome)[0]] == ["req-0", "req-0", "req-1/two", "req-1/two"]


def test_prioritized_list_allocation_mode_all_with_selectors_multiple_pools() -> None:
    """An All subrequest spans two pools."""
    slices = [rslice(device("device-1"), pool="p1"), rslice(device("device-2"), pool="p2")]
    assert picked(allocator(slices).allocate([claim("c", first_available("req-0", sub("all", all=True)))])) == [
        [("req-0/all", "device-1"), ("req-0/all", "device-2")]
    ]


def test_prioritized_list_allocation_mode_all_with_selectors_deviceclass_subset() -> None:
    """The class selector restricts the All set."""
    classes = [device_class(), device_class("class-odd", 'device.attributes["driver-a"].odd')]
    slices = [rslice(device("device-1", attributes={"odd": True}), device("device-2", attributes={"odd": False}))]
    assert picked(
        allocator(slices, classes).allocate([claim("c", first_available("req-0", sub("all", "class-odd", all=True)))])
    ) == [[("req-0/all", "device-1")]]


def test_all_devices_no_slices_prioritized_list() -> None:
    """An All subrequest without devices moves to the next subrequest."""
    slices = [rslice(device("device-9"), driver=DRIVER_B, pool="b")]
    assert picked(
        allocator(slices).allocate([claim("c", first_available("req-0", sub("all", all=True), sub("b", "class-b")))])
    ) == [[("req-0/b", "device-9")]]


def test_tainted_two_devices_prioritized_list_tolerated() -> None:
    """Only the second subrequest tolerates the taint: it is chosen."""
    slices = [rslice(device("device-1", taints=[taint("k", effect="NoExecute")]))]
    c = claim(
        "c",
        first_available("req-0", sub("subReq-0"), sub("subReq-1", tolerations=[toleration("k", operator="Exists")])),
    )
    outcome = allocator(slices).allocate([c])
    assert picked(outcome) == [[("req-0/subReq-1", "device-1")]]
    assert outcome.allocations is not None and outcome.allocations[0].results[0].tolerations == (
        toleration("k", operator="Exists"),
    )


def test_tainted_prioritized_list() -> None:
    """No subrequest tolerates the taint: nothing is allocated."""
    slices = [rslice(device("device-1", taints=[taint("k")]))]
    assert reasons(allocator(slices).allocate([claim("c", first_available("req-0", sub("a"), sub("b")))])) == (
        "req-0/a: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (1 needed)\n"
        "req-0/b: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_prioritized_list_max_allocation_limit_request() -> None:
    """Two requests each fall back to 16 devices so the claim stays within 32 results."""
    c = claim(
        "c",
        first_available("req-0", sub("a", count=32), sub("b", count=16)),
        first_available("req-1", sub("a", count=32), sub("b", count=16)),
    )
    outcome = allocator([rslice(*devices(40))]).allocate([c])
    names = [r for r, _ in picked(outcome)[0]]
    assert names == ["req-0/b"] * 16 + ["req-1/b"] * 16
