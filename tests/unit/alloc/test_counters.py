"""Partitionable devices (sharedCounters / consumesCounters): upstream catalog group G, the
seed's MIG case, and dractl's per-counter-set and per-(driver, pool) bookkeeping."""

from __future__ import annotations

from support.alloc_inputs import (
    DRIVER_B,
    allocator,
    big_or_small,
    claim,
    held,
    match,
    memory_at_least,
    name_selector,
    node,
    picked,
    reasons,
    request,
    selector,
)
from support.devices import counter_set, device, device_class, partitioned, rslice, taint


def pool(*devs, counters=None, driver: str = "driver-a"):
    """node-1's partitioned pool; counter set set-1 of 8Gi memory unless `counters` are given."""
    sets = counters if counters is not None else [counter_set("set-1", memory="8Gi")]
    return partitioned(*devs, counters=sets, driver=driver)


def part(name: str, mem: str, **kw) -> object:
    return device(name, capacity={"memory": mem}, consumes={"set-1": {"memory": mem}}, **kw)


def test_partitionable_devices_single_device() -> None:
    """One counter-consuming device is allocated."""
    assert picked(allocator(pool(part("device-1", "4Gi"))).allocate([claim()])) == [[("req-0", "device-1")]]


def test_partitionable_devices_prioritized_list() -> None:
    """A 6Gi subrequest exceeds the remaining counters: the 4Gi subrequest is used."""
    slices = pool(part("device-1", "4Gi"), part("device-2", "6Gi"), part("device-3", "4Gi"))
    c = claim(
        "c",
        request("req-0", "class-a", memory_at_least("4Gi")),
        big_or_small("req-1", "6Gi", "4Gi"),
    )
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-1"), ("req-1/small", "device-3")]]


def test_partitionable_devices_multiple_devices() -> None:
    """The second request skips the 6Gi device (8Gi total)."""
    slices = pool(part("device-1", "4Gi"), part("device-2", "6Gi"), part("device-3", "4Gi"))
    assert picked(allocator(slices).allocate([claim("c", request("req-0"), request("req-1"))])) == [
        [("req-0", "device-1"), ("req-1", "device-3")]
    ]


def test_partitionable_devices_multiple_counters() -> None:
    """Multi-counter sets force backtracking to device-2 + device-3."""
    sets = [counter_set("set-1", memory="8Gi", cpu=8)]
    devs = [
        device("device-1", consumes={"set-1": {"memory": "6Gi", "cpu": 2}}),
        device("device-2", consumes={"set-1": {"memory": "4Gi", "cpu": 4}}),
        device("device-3", consumes={"set-1": {"memory": "4Gi", "cpu": 4}}),
    ]
    assert picked(allocator(pool(*devs, counters=sets)).allocate([claim("c", request(count=2))])) == [
        [("req-0", "device-2"), ("req-0", "device-3")]
    ]


def test_partitionable_devices_multiple_pools() -> None:
    """Allocated devices deplete pool-1's counters, so pool-2 is used."""
    slices = [
        rslice(name="p1-c", pool="pool-1", counters=[counter_set("set-1", memory="8Gi")], count=2),
        rslice(part("device-1", "8Gi"), part("device-2", "4Gi"), name="p1-d", pool="pool-1", count=2),
        rslice(name="p2-c", pool="pool-2", counters=[counter_set("set-1", memory="8Gi")], count=2),
        rslice(part("device-3", "4Gi"), name="p2-d", pool="pool-2", count=2),
    ]
    outcome = allocator(slices, allocated=[held("x", "device-1", pool="pool-1")]).allocate([claim()])
    assert picked(outcome) == [[("req-0", "device-3")]]


def test_partitionable_devices_unused_counters_in_counter_set() -> None:
    """An extra counter nobody consumes is harmless."""
    sets = [counter_set("set-1", memory="8Gi", unused=1)]
    assert allocator(pool(part("device-1", "8Gi"), counters=sets)).allocate([claim()]).ok


def test_partitionable_devices_no_capacity_available() -> None:
    """An allocated device leaves too little: nothing fits, and the counter is named."""
    outcome = allocator(
        pool(part("device-1", "4Gi"), part("device-2", "6Gi")), allocated=[held("x", "device-1")]
    ).allocate([claim("c", request("req-0", "class-a", memory_at_least("6Gi")))])
    assert "counter memory of counter set set-1 in pool driver-a/node-1 ran out" in reasons(outcome)


def test_partitionable_devices_overallocated_capacity_pool() -> None:
    """Negative availability (over-committed set) blocks every consumer of that set."""
    slices = pool(
        part("device-1", "8Gi"), part("device-2", "8Gi"), device("device-3", consumes={"set-1": {"memory": 0}})
    )
    outcome = allocator(slices, allocated=[held("x", "device-1", "device-2")]).allocate([claim()])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 3 devices; 3 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (1 needed); counter memory of counter set set-1 in pool "
        "driver-a/node-1 ran out\n"
        "None: a repack would admit it: move default/x (device-1, device-2 on node-1 -> device-3 on node-1)"
    )


def test_counters_checked_per_counter_set() -> None:
    """dractl: an over-committed GPU does not block another GPU's partitions in the pool."""
    sets = [counter_set("gpu-0", memory="8Gi"), counter_set("gpu-1", memory="8Gi")]
    devs = [
        device("g0-a", consumes={"gpu-0": {"memory": "8Gi"}}),
        device("g0-b", consumes={"gpu-0": {"memory": "8Gi"}}),
        device("g1-a", consumes={"gpu-1": {"memory": "4Gi"}}),
    ]
    outcome = allocator(pool(*devs, counters=sets), allocated=[held("x", "g0-a", "g0-b")]).allocate([claim()])
    assert picked(outcome) == [[("req-0", "g1-a")]]


def test_counters_kept_per_driver_and_pool() -> None:
    """dractl: two drivers' pools named after the same node keep separate counters."""
    classes = [device_class(), device_class("class-b", driver=DRIVER_B)]
    slices = pool(part("device-1", "8Gi")) + pool(part("device-2", "8Gi"), driver=DRIVER_B)
    outcome = allocator(slices, classes, allocated=[held("x", "device-1")]).allocate(
        [claim("c", request("req-0", "class-b"))]
    )
    assert picked(outcome) == [[("req-0", "device-2")]]


def test_refused_device_releases_its_counters() -> None:
    """dractl: a device refused by a constraint after its counters were charged releases them."""
    sets = [counter_set("set-1", memory="8Gi")]
    devs = [
        device("device-1", attributes={"k": 1}, consumes={"set-1": {"memory": "4Gi"}}),
        device("device-2", attributes={"k": 2}, consumes={"set-1": {"memory": "4Gi"}}),
        device("device-3", attributes={"k": 1}, consumes={"set-1": {"memory": "4Gi"}}),
    ]
    c = claim("c", request("req-0"), request("req-1"), constraints=[match("driver-a/k")])
    assert picked(allocator(pool(*devs, counters=sets)).allocate([c])) == [
        [("req-0", "device-1"), ("req-1", "device-3")]
    ]


def test_seed_two_mig_slices_on_one_parent_when_first_gpu_is_partly_used() -> None:
    """The seed's MIG pattern (3g.40gb + 1g.10gb, matchAttribute parentUUID) finds GPU 1
    when GPU 0 is partly used; upstream's allocator misses it."""
    sets = [counter_set(f"gpu-{g}", **{f"memory-slice-{i}": 1 for i in range(8)}) for g in (0, 1)]

    def mig(g: int, profile: str, start: int, size: int) -> object:
        return device(
            f"gpu-{g}-mig-{profile.replace('.', '')}-{start}",
            attributes={"profile": profile, "parentUUID": f"GPU-{g}", "type": "mig"},
            consumes={f"gpu-{g}": {f"memory-slice-{i}": 1 for i in range(start, start + size)}},
        )

    devs = [
        mig(g, p, s, n)
        for g in (0, 1)
        for p, s, n in (
            ("3g.40gb", 0, 4),
            ("3g.40gb", 4, 4),
            ("1g.10gb", 0, 1),
            ("1g.10gb", 1, 1),
            ("1g.10gb", 4, 1),
            ("1g.10gb", 5, 1),
            ("1g.10gb", 6, 1),
        )
    ]
    classes = [device_class("mig.nvidia.com", 'device.attributes["driver-a"].type == "mig"')]
    allocated = [held("x", "gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-4")]
    c = claim(
        "mig",
        request("large-slice", "mig.nvidia.com", 'device.attributes["driver-a"].profile == "3g.40gb"'),
        request("small-slice", "mig.nvidia.com", 'device.attributes["driver-a"].profile == "1g.10gb"'),
        constraints=[match("driver-a/parentUUID", "large-slice", "small-slice")],
    )
    outcome = allocator(pool(*devs, counters=sets), classes, allocated=allocated).allocate([c])
    assert picked(outcome) == [[("large-slice", "gpu-1-mig-3g40gb-0"), ("small-slice", "gpu-1-mig-1g10gb-4")]]


def spread_pool(device_1_memory: str) -> list:
    """Pool "pool" across nodes: counter set set-1 (8Gi memory) in an all-nodes slice, and per-device node
    selection for device-1 (`device_1_memory`, node-2) and device-2 (4Gi, node-1)."""
    return [
        rslice(
            name="c", node=None, pool="pool", counters=[counter_set("set-1", memory="8Gi")], count=2, all_nodes=True
        ),
        rslice(
            part("device-1", device_1_memory, node_name="node-2"),
            part("device-2", "4Gi", node_name="node-1"),
            name="d",
            node=None,
            pool="pool",
            count=2,
            per_device_node_selection=True,
        ),
    ]


def test_partitionable_devices_per_device_node_selection_nodename() -> None:
    """A device on another node is excluded; the result pins the node by name."""
    outcome = allocator(spread_pool("4Gi"), nodes=[node("node-1"), node("node-2")]).allocate(
        [claim()], nodes=["node-1"]
    )
    assert picked(outcome) == [[("req-0", "device-2")]]
    assert outcome.allocations is not None and outcome.allocations[0].node_selector == name_selector("node-1")


def test_partitionable_devices_per_device_node_selection_node_selector() -> None:
    """A device-level node selector is copied to the result."""
    sel = selector(("rack", "In", ("r1",)))
    slices = [
        rslice(device("device-1", node_selector=sel), name="d", node=None, pool="pool", per_device_node_selection=True)
    ]
    outcome = allocator(slices, nodes=[node("node-1", rack="r1")]).allocate([claim()])
    assert outcome.allocations is not None and outcome.allocations[0].node_selector == sel


def test_partitionable_devices_devices_on_different_nodes_consume_same_counter_set() -> None:
    """Another node's allocated device consumes the shared counters."""
    outcome = allocator(
        spread_pool("8Gi"), nodes=[node("node-1"), node("node-2")], allocated=[held("x", "device-1", pool="pool")]
    ).allocate([claim()])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 1 of those are "
        "free on the candidate nodes (1 needed); counter memory of counter set set-1 in pool driver-a/pool "
        "ran out"
    )


def test_partitionable_devices_with_attribute_selector() -> None:
    """Backtracking sends the `special` device to req-1."""
    devs = [
        part("device-1", "4Gi", attributes={"special": True}),
        part("device-2", "4Gi", attributes={"special": False}),
    ]
    c = claim("c", request("req-0"), request("req-1", "class-a", 'device.attributes["driver-a"].special'))
    assert picked(allocator(pool(*devs)).allocate([c])) == [[("req-0", "device-2"), ("req-1", "device-1")]]


def test_partitionable_devices_with_taint_releases_counters() -> None:
    """A tainted partition is never charged, so its sibling still fits."""
    devs = [part("device-1", "8Gi", taints=[taint("k")]), part("device-2", "8Gi")]
    assert picked(allocator(pool(*devs)).allocate([claim()])) == [[("req-0", "device-2")]]
