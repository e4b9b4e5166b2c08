"""Consumable capacity (allowMultipleAllocations, capacity requests, requestPolicy, shareID):
upstream catalog group J."""

from __future__ import annotations

import re

import pytest
from support.alloc_inputs import ONE_DEVICE_TWO_CLAIMS, allocator, claim, held, match, picked, reasons, request
from support.devices import capacity as cap
from support.devices import counter_set, device, device_class, partitioned, rslice

from dractl import model

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def shared(name: str = "device-1", **capacity: model.DeviceCapacity) -> model.Device:
    return device(name, capacity=capacity, multi=True)


def consumed(outcome, index: int = 0) -> list[dict[str, int]]:
    assert outcome.allocations is not None, outcome.reasons
    return [{k: v.as_int() for k, v in r.consumed_capacity.items()} for r in outcome.allocations[index].results]


def test_multi_allocatable_device_with_missing_capacity_request() -> None:
    """A requested capacity the device lacks disqualifies it, and the reason says so."""
    outcome = allocator([rslice(shared(slots=cap(4)))]).allocate([claim("c", request("req-0", capacity={"memory": 1}))])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those lack the "
        "requested capacity; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_multi_allocatable_device_without_capacity_shared_by_two_claims() -> None:
    """A device without capacities is shared by two claims; each result has a share id."""
    outcome = allocator([rslice(shared())]).allocate([claim("c0"), claim("c1")])
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-1")]]
    assert outcome.allocations is not None
    ids = [a.results[0].share_id for a in outcome.allocations]
    assert all(i is not None and UUID.match(i) for i in ids) and ids[0] != ids[1]
    assert outcome.allocations[0].results[0].consumed_capacity == {}


def test_without_policy_without_capacity_request_consumes_everything() -> None:
    """No request and no policy consume the full capacity: the second claim takes another device."""
    outcome = allocator([rslice(shared("device-1", memory=cap(2)), shared("device-2", memory=cap(2)))]).allocate(
        [claim("c0"), claim("c1")]
    )
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-2")]]
    assert reasons(allocator([rslice(shared("device-1", memory=cap(2)))]).allocate([claim("c0"), claim("c1")])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (1 needed); capacity memory of device driver-a/node-1/device-1 ran out"
    )


def test_without_policy_with_capacity_request() -> None:
    """1 + 1 of capacity 2 share one device."""
    outcome = allocator([rslice(shared(memory=cap(2)))]).allocate(
        [claim("c0", request(capacity={"memory": 1})), claim("c1", request(capacity={"memory": 1}))]
    )
    assert consumed(outcome, 0) == [{"memory": 1}] and consumed(outcome, 1) == [{"memory": 1}]


def test_with_policy_without_capacity_request() -> None:
    """The policy default applies to each share."""
    outcome = allocator([rslice(shared(memory=cap(4, default=2, min=1)))]).allocate([claim("c0"), claim("c1")])
    assert consumed(outcome, 0) == [{"memory": 2}] and consumed(outcome, 1) == [{"memory": 2}]


def test_with_zero_request_policy() -> None:
    """A default of 0 lets every claim share with zero consumption."""
    outcome = allocator([rslice(shared(memory=cap(1, default=0, values=(0,))))]).allocate([claim("c0"), claim("c1")])
    assert consumed(outcome, 0) == [{"memory": 0}]


def test_violates_zero_request_policy() -> None:
    """A request of 1 is not among validValues {0}."""
    assert reasons(
        allocator([rslice(shared(memory=cap(1, default=0, values=(0,))))]).allocate(
            [claim("c", request(capacity={"memory": 1}))]
        )
    ) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those lack the "
        "requested capacity; 0 of those are free on the candidate nodes (1 needed)"
    )


@pytest.mark.parametrize(
    ("name", "capacity", "requested", "expected"),
    [
        ("with-range-policy-with-capacity-request", cap(10, default=2, min=2), 1, 2),
        ("with-range-policy-step", cap(10, default=2, min=2, step=2), 3, 4),
        ("with-valid-values-policy", cap(10, default=1, values=(1, 2, 3)), 2, 2),
        ("with-valid-values-policy-round-up", cap(10, default=1, values=(1, 3)), 2, 3),
    ],
)
def test_rounding(name: str, capacity: model.DeviceCapacity, requested: int, expected: int) -> None:
    """Requests are rounded up by the policy and the rounded amount is recorded."""
    outcome = allocator([rslice(shared(memory=capacity))]).allocate(
        [claim("c", request(capacity={"memory": requested}))]
    )
    assert consumed(outcome) == [{"memory": expected}]


def test_with_exceeded_consumable_capacity_request() -> None:
    """1 then 2 (rounded) exceed capacity 2; the reason names the capacity."""
    a = allocator([rslice(shared(memory=cap(2, default=1, values=(1, 2))))])
    assert a.allocate([claim("c0", request(capacity={"memory": 1}))]).ok
    outcome = a.allocate([claim("c1", request(capacity={"memory": 2}))])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (1 needed); capacity memory of device driver-a/node-1/device-1 ran out"
    )


def test_capacity_ran_out_is_named() -> None:
    """When shares within one call exhaust a capacity, the reason names it."""
    outcome = allocator([rslice(shared(memory=cap(2)))]).allocate(
        [claim("c0", request(capacity={"memory": 2})), claim("c1", request(capacity={"memory": 1}))]
    )
    assert any("capacity memory of device driver-a/node-1/device-1 ran out" in r.message for r in outcome.reasons)


def test_with_request_over_max_sharing_policy() -> None:
    """6 exceeds the policy max 4 although the capacity is 10."""
    assert reasons(
        allocator([rslice(shared(memory=cap(10, default=1, min=1, max=4)))]).allocate(
            [claim("c", request(capacity={"memory": 6}))]
        )
    ) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those lack the "
        "requested capacity; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_with_allocated_capacity_use_remaining() -> None:
    """An existing share of 2 of 4 leaves 2."""
    a = allocator([rslice(shared(memory=cap(4)))], allocated=[held("x", "device-1", share={"memory": 2})])
    assert reasons(a.allocate([claim("c0", request(capacity={"memory": 3}))])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free on the "
        "candidate nodes (1 needed); capacity memory of device driver-a/node-1/device-1 ran out"
    )
    assert a.allocate([claim("c1", request(capacity={"memory": 2}))]).ok


def test_with_allocated_capacity_next_device() -> None:
    """A full device-1 sends the share to device-2."""
    outcome = allocator(
        [rslice(shared("device-1", memory=cap(4)), shared("device-2", memory=cap(4)))],
        allocated=[held("x", "device-1", share={"memory": 4})],
    ).allocate([claim("c", request(capacity={"memory": 1}))])
    assert picked(outcome) == [[("req-0", "device-2")]]


def test_with_multi_allocatable_device_backtrack() -> None:
    """matchAttribute puts both requests on device-1; the other claim gets device-2."""
    devs = [
        device("device-1", attributes={"k": 1}, capacity={"memory": cap(4)}, multi=True),
        device("device-2", attributes={"k": 2}, capacity={"memory": cap(4)}, multi=True),
    ]
    c = claim(
        "c0",
        request("req-0", capacity={"memory": 2}),
        request("req-1", capacity={"memory": 2}),
        constraints=[match("driver-a/k")],
    )
    outcome = allocator([rslice(*devs)]).allocate([c, claim("c1", request(capacity={"memory": 4}))])
    assert picked(outcome) == [[("req-0", "device-1"), ("req-1", "device-1")], [("req-0", "device-2")]]


def test_dedicated_device_with_consumable_capacity_request() -> None:
    """On a dedicated device a capacity request is only a filter: no share fields."""
    slices = [rslice(device("device-1", capacity={"memory": "2Gi"}), device("device-2", capacity={"memory": "8Gi"}))]
    outcome = allocator(slices).allocate([claim("c", request(capacity={"memory": "4Gi"}))])
    assert picked(outcome) == [[("req-0", "device-2")]]
    assert (
        outcome.allocations is not None
        and outcome.allocations[0].results[0].share_id is None
        and not outcome.allocations[0].results[0].consumed_capacity
    )


def test_dedicated_device_is_not_shared() -> None:
    """A dedicated device is not shared by a second claim."""
    assert (
        reasons(
            allocator([rslice(device("device-1", capacity={"memory": 8}))]).allocate(
                [claim("c0", request(capacity={"memory": 1})), claim("c1", request(capacity={"memory": 1}))]
            )
        )
        == ONE_DEVICE_TWO_CLAIMS
    )


def test_exclude_multi_allocatable_device_by_class_selector() -> None:
    """A class selecting allowMultipleAllocations == false excludes shared devices."""
    classes = [device_class("class-a", "device.allowMultipleAllocations == false")]
    assert reasons(allocator([rslice(shared())], classes).allocate([claim()])) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)"
    )


def test_not_allocate_multi_allocatable_device_which_already_dedicated() -> None:
    """A dedicated allocation of a multi-allocatable device blocks sharing; the what-if sees that the holder,
    allocated anew by its spec, would share the device too."""
    assert reasons(allocator([rslice(shared())], allocated=[held("x", "device-1")]).allocate([claim()])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (1 needed)\n"
        "None: a repack would admit it: move default/x (device-1 on node-1 -> device-1 on node-1)"
    )


def test_allow_multiple_allocations_with_partitionable_device() -> None:
    """Shares of a counter-consuming device charge its counters once."""
    slices = partitioned(
        device("device-1", multi=True, capacity={"memory": cap(4)}, consumes={"set": {"mem": 4}}),
        counters=[counter_set("set", mem=4)],
    )
    outcome = allocator(slices).allocate(
        [claim("c0", request(capacity={"memory": 2})), claim("c1", request(capacity={"memory": 2}))]
    )
    assert picked(outcome) == [[("req-0", "device-1")], [("req-0", "device-1")]]


def test_share_ids_are_deterministic() -> None:
    """The same input gives the same share ids."""
    ids = []
    for _ in range(2):
        outcome = allocator([rslice(shared())]).allocate([claim("c0")])
        assert outcome.allocations is not None
        ids.append(outcome.allocations[0].results[0].share_id)
    assert ids[0] == ids[1]


def all_slices() -> list:
    return [rslice(shared("device-1", memory=cap(4)), shared("device-2", memory=cap(4)))]


def test_all_filter_out_no_capacity() -> None:
    """All skips a shared device lacking the requested capacity."""
    slices = [rslice(shared("device-1", memory=cap(4)), shared("device-2", slots=cap(4)))]
    assert picked(allocator(slices).allocate([claim("c", request(all=True, capacity={"memory": 1}))])) == [
        [("req-0", "device-1")]
    ]


def test_all_filter_out_insufficient_capacity() -> None:
    """All skips a shared device with too little capacity."""
    slices = [rslice(shared("device-1", memory=cap(4)), shared("device-2", memory=cap(1)))]
    assert picked(allocator(slices).allocate([claim("c", request(all=True, capacity={"memory": 2}))])) == [
        [("req-0", "device-1")]
    ]


def test_all_allocating_sufficient() -> None:
    """An earlier request's share leaves room for the All request."""
    c = claim("c", request("req-0", capacity={"memory": 2}), request("req-1", all=True, capacity={"memory": 2}))
    assert picked(allocator(all_slices()).allocate([c])) == [
        [("req-0", "device-1"), ("req-1", "device-1"), ("req-1", "device-2")]
    ]


def test_all_allocating_insufficient() -> None:
    """An earlier share in the same call that exhausts a device of the All set fails the claim."""
    c = claim("c", request("req-0", capacity={"memory": 4}), request("req-1", all=True, capacity={"memory": 2}))
    assert reasons(allocator(all_slices()).allocate([c])) == (
        "req-1: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are "
        "free on the candidate nodes (all of them); capacity memory of device driver-a/node-1/device-2 ran "
        "out; allocationMode All needs every matching device, but some are already allocated or have a "
        "taint the request does not tolerate"
    )


def test_all_in_use_insufficient() -> None:
    """A device exhausted by earlier allocations is not part of the All set."""
    a = allocator(all_slices())
    assert a.allocate([claim("c0", request(capacity={"memory": 4}))]).ok
    assert picked(a.allocate([claim("c1", request(all=True, capacity={"memory": 2}))])) == [[("req-0", "device-2")]]


def test_all_in_use_sufficient() -> None:
    """Earlier allocations that leave room keep the device in the All set."""
    a = allocator(all_slices())
    assert a.allocate([claim("c0", request(capacity={"memory": 2}))]).ok
    assert picked(a.allocate([claim("c1", request(all=True, capacity={"memory": 2}))])) == [
        [("req-0", "device-1"), ("req-0", "device-2")]
    ]
