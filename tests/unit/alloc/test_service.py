"""The allocator as a long-lived service: a ledger by claim id, exact release, holds from the
API, inventory updates that keep selector results, restart independence, thread safety."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from support.alloc_inputs import allocator, claim, picked, reasons, request
from support.devices import counter_set, device, devices, rslice

from dractl import alloc, cel, model

POLICIES = [alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK]


def partitioned() -> list[model.ResourceSlice]:
    """Two GPUs, each a whole device plus two halves drawing on the GPU's counter set."""
    gpus = []
    for g in (0, 1):
        gpus += [
            device(f"gpu-{g}", attributes={"kind": "full"}, consumes={f"set-{g}": {"mem": 2}}),
            device(f"gpu-{g}-a", attributes={"kind": "half"}, consumes={f"set-{g}": {"mem": 1}}),
            device(f"gpu-{g}-b", attributes={"kind": "half"}, consumes={f"set-{g}": {"mem": 1}}),
        ]
    return [rslice(*gpus, counters=[counter_set("set-0", mem=2), counter_set("set-1", mem=2)])]


def shareable() -> list[model.ResourceSlice]:
    return [
        rslice(
            device("gpu-0", multi=True, capacity={"memory": 8}, consumes={"set-0": {"mem": 1}}),
            counters=[counter_set("set-0", mem=1)],
        )
    ]


def half(name: str) -> model.ResourceClaim:
    return claim(name, request("req-0", "class-a", 'device.attributes["driver-a"].kind == "half"'))


@pytest.mark.parametrize("policy", POLICIES)
def test_release_gives_back_exactly_what_was_taken(policy: alloc.Policy) -> None:
    """Allocating, releasing everything and allocating again gives the first allocation back."""
    a = allocator(partitioned(), policy=policy)
    before = a.usage()
    claims = [half("h1"), claim("full"), half("h2")]
    first = [a.allocate([c]) for c in claims]
    assert all(o.ok for o in first)
    assert a.usage() != before
    for c in claims:
        assert a.release(alloc.claim_id(c))
    assert a.usage() == before
    again = [a.allocate([c]) for c in claims]
    assert [picked(o) for o in again] == [picked(o) for o in first]


def test_release_of_a_share_keeps_counters_until_the_last_share_leaves() -> None:
    """Two shares of one device charge its counters once; they come back with the last share."""
    a = allocator(shareable())
    before = a.usage()
    one = a.allocate([claim("s1", request(capacity={"memory": 4}))])
    two = a.allocate([claim("s2", request(capacity={"memory": 4}))])
    assert one.ok and two.ok
    counters_held = a.usage()[2]
    assert counters_held == [0]
    assert a.release("default/s1")
    assert a.usage()[2] == [0], "one share still holds the counter set"
    assert a.usage()[3] == [4], "the released share's memory is back"
    assert a.release("default/s2")
    assert a.usage() == before


def test_a_claim_that_holds_devices_is_refused() -> None:
    """A second allocate of a holding claim, or one claim listed twice, gets nothing new."""
    a = allocator([rslice(*devices(4))])
    c = claim("c")
    assert a.allocate([c]).ok
    assert reasons(a.allocate([c])) == "None: the claim already holds devices; release it first"
    assert reasons(a.allocate([claim("d"), claim("d")])) == "None: the claim is listed twice in one allocation"
    assert a.usage()[0] == b"\x01\x00\x00\x00"
    assert not a.release("default/nobody")


def test_claims_are_named_by_uid_when_they_have_one() -> None:
    """A claim with a UID is held under it; its name alone does not release it."""
    a = allocator([rslice(*devices(2))])
    c = dataclasses.replace(claim("c"), meta=model.ObjectMeta(name="c", namespace="default", uid="u-1"))
    assert alloc.claim_id(c) == "u-1"
    assert a.allocate([c]).ok
    assert a.held("u-1") is not None
    assert not a.release("default/c")
    assert a.release("u-1")
    assert a.held("u-1") is None


def test_hold_counts_allocations_made_elsewhere() -> None:
    """A held allocation blocks its device; the same hold again changes nothing; another one
    replaces it; a hold without allocation releases."""
    a = allocator([rslice(*devices(2))])
    made = claim(
        "other",
        allocation=model.AllocationResult(
            results=(model.DeviceRequestAllocationResult("req-0", "driver-a", "node-1", "device-1"),)
        ),
    )
    a.hold(made)
    a.hold(made)
    assert a.usage()[0] == b"\x01\x00"
    moved = dataclasses.replace(
        made,
        allocation=model.AllocationResult(
            results=(model.DeviceRequestAllocationResult("req-0", "driver-a", "node-1", "device-2"),)
        ),
    )
    a.hold(moved)
    assert a.usage()[0] == b"\x00\x01"
    assert picked(a.allocate([claim("mine")])) == [[("req-0", "device-1")]]
    a.hold(dataclasses.replace(moved, allocation=None))
    assert a.held("default/other") is None
    assert a.usage()[0] == b"\x01\x00"


def test_two_holders_of_one_device_free_it_only_when_both_leave() -> None:
    """The API may show two claims on one dedicated device: it stays in use until both go."""
    a = allocator([rslice(*devices(1))])
    result = model.AllocationResult(
        results=(model.DeviceRequestAllocationResult("req-0", "driver-a", "node-1", "device-1"),)
    )
    a.hold(claim("x", allocation=result))
    a.hold(claim("y", allocation=result))
    a.release("default/x")
    assert not a.allocate([claim("z")]).ok
    a.release("default/y")
    assert a.allocate([claim("z")]).ok


def test_unchanged_inventory_keeps_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """An update with equal sets rebuilds nothing and evaluates no selector again."""
    slices = [rslice(*devices(3))]
    a = allocator(slices)
    assert a.allocate([claim("c1")]).ok
    calls: list[object] = []
    real = cel.device_input
    monkeypatch.setattr(cel, "device_input", lambda *args: calls.append(args) or real(*args))
    a.update(resource_slices=[dataclasses.replace(s) for s in slices], nodes=[])
    assert picked(a.allocate([claim("c2")])) == [[("req-0", "device-2")]]
    assert calls == []


def test_a_new_pool_generation_is_used_and_unchanged_pools_keep_their_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the changed pool's devices are evaluated again; held claims survive the rebuild."""
    from support.devices import device_class

    def dev(name: str, i: int) -> model.Device:
        return device(name, attributes={"idx": i})

    # The selector reads a per-device attribute, so no two devices share an evaluation.
    classes = [device_class("class-a", 'device.attributes["driver-a"].idx >= 0')]
    node1 = rslice(dev("a1", 1), dev("a2", 2), node="node-1")
    a = allocator([node1, rslice(dev("b1", 3), node="node-2")], classes)
    assert picked(a.allocate([claim("c1", request(count=2))])) == [[("req-0", "a1"), ("req-0", "a2")]]
    assert picked(a.allocate([claim("c2")])) == [[("req-0", "b1")]]
    seen: list[str] = []
    real = cel.device_input
    monkeypatch.setattr(cel, "device_input", lambda driver, d: seen.append(d.name) or real(driver, d))
    grown = rslice(dev("b1", 3), dev("b2", 4), dev("b3", 5), node="node-2", generation=2)
    a.update(resource_slices=[node1, grown])
    assert picked(a.allocate([claim("c3", request(count=2))])) == [[("req-0", "b2"), ("req-0", "b3")]]
    assert sorted(seen) == ["b1", "b2", "b3"]
    assert a.held("default/c1") is not None
    assert not a.allocate([claim("c4")]).ok, "node-1's devices are still held by c1, node-2's by c2 and c3"


def test_a_held_device_whose_pool_disappears_is_held_again_when_it_returns() -> None:
    """The ledger keeps a claim whose devices left the inventory; they are held on return."""
    pool = rslice(*devices(1))
    a = allocator([pool])
    assert a.allocate([claim("c1")]).ok
    a.update(resource_slices=[])
    assert a.held("default/c1") is not None
    a.update(resource_slices=[pool])
    assert not a.allocate([claim("c2")]).ok


def test_a_changed_class_is_used() -> None:
    """Updating a DeviceClass changes which devices its requests match."""
    from support.devices import device_class

    a = allocator([rslice(device("a", attributes={"x": 1}), device("b", attributes={"x": 2}))])
    assert picked(a.allocate([claim("c1")])) == [[("req-0", "a")]]
    a.release("default/c1")
    a.update(device_classes=[device_class("class-a", 'device.attributes["driver-a"].x == 2')])
    assert picked(a.allocate([claim("c1")])) == [[("req-0", "b")]]


@pytest.mark.parametrize("policy", POLICIES)
def test_same_inputs_give_the_same_choice_after_a_restart(policy: alloc.Policy) -> None:
    """A fresh allocator given the held claims chooses what the long-lived one chooses."""
    a = allocator(partitioned(), policy=policy)
    for name in ("h1", "h2", "h3"):
        assert a.allocate([half(name)]).ok
    a.release("default/h2")
    held = [dataclasses.replace(half(n), allocation=a.held(f"default/{n}")) for n in ("h1", "h3")]
    fresh = allocator(partitioned(), policy=policy, allocated=held)
    assert fresh.usage() == a.usage()
    assert picked(fresh.allocate([half("next")])) == picked(a.allocate([half("next")]))


def test_concurrent_callers_never_get_one_device_twice() -> None:
    """Threads allocating and releasing at once: every device has at most one holder."""
    a = allocator([rslice(*devices(8))])
    got: list[tuple[str, str]] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(50):
            c = claim(f"t{t}-{i}")
            outcome = a.allocate([c])
            if outcome.allocations is not None:
                with lock:
                    got.append((alloc.claim_id(c), outcome.allocations[0].results[0].device))
                if i % 2:
                    a.release(alloc.claim_id(c))
                    with lock:
                        got.remove((alloc.claim_id(c), outcome.allocations[0].results[0].device))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held_devices = [d for _, d in got]
    assert len(held_devices) == len(set(held_devices)) == 8
    assert a.usage()[0] == b"\x01" * 8


def test_contested_names_the_claim_held_on_the_same_device() -> None:
    """Guards: a device allocated here and then held for another claim (an allocation another scheduler wrote) makes
    both contested, each naming the other; once the other is released, or for a claim that holds nothing, none is."""
    a = allocator([rslice(*devices(2))])
    assert picked(a.allocate([claim("mine")])) == [[("req-0", "device-1")]]
    assert a.contested("default/mine") is None
    result = model.AllocationResult(
        results=(model.DeviceRequestAllocationResult("req-0", "driver-a", "node-1", "device-1"),)
    )
    a.hold(claim("other", allocation=result))
    assert (
        a.contested("default/mine") == "device driver-a/node-1/device-1 is allocated to ResourceClaim default/other too"
    )
    assert (
        a.contested("default/other") == "device driver-a/node-1/device-1 is allocated to ResourceClaim default/mine too"
    )
    assert a.release("default/other")
    assert a.contested("default/mine") is None
    assert a.contested("default/nothing") is None


def test_contested_names_the_claim_whose_device_overdraws_a_shared_counter() -> None:
    """Guards: a half GPU allocated here and the whole GPU held for another claim draw one counter set past its
    capacity: contested names the counter, the device and the other claim; shares of one multi-allocatable device
    are not contested."""
    a = allocator(partitioned(), policy=alloc.Policy.FIRST_FIT)
    assert picked(a.allocate([half("h1")])) == [[("req-0", "gpu-0-a")]]
    whole = model.AllocationResult(
        results=(model.DeviceRequestAllocationResult("req-0", "driver-a", "node-1", "gpu-0"),)
    )
    a.hold(claim("other", allocation=whole))
    problem = a.contested("default/h1")
    assert problem is not None
    assert problem.startswith("counter mem of counter set set-0 in pool driver-a/node-1, which device driver-a/node-1/")
    assert problem.endswith("gpu-0-a draws, is overdrawn with ResourceClaim default/other"), problem

    shared = allocator(shareable())
    assert shared.allocate([claim("s1", request(capacity={"memory": 4}))]).ok
    assert shared.allocate([claim("s2", request(capacity={"memory": 4}))]).ok
    assert shared.contested("default/s1") is None and shared.contested("default/s2") is None
