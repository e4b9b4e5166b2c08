"""Pool generations, resourceSliceCount, invalid and obsolete pools: upstream catalog group M
and the pool cases of groups A and G."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, picked, reasons
from support.devices import counter_set, device, devices, rslice


def test_obsolete_slice() -> None:
    """A newer generation with a missing slice makes the pool incomplete: nothing allocated."""
    slices = [
        rslice(*devices(1), name="old", generation=1),
        rslice(device("device-2"), name="new", generation=2, count=2),
    ]
    assert reasons(allocator(slices).allocate([claim()])) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)\n"
        "None: resource pool driver-a/node-1 is currently being updated: 1 of 2 slices of generation 2 are "
        "published"
    )


def test_duplicate_slice() -> None:
    """Two identical slices: duplicate device names make the pool invalid, and the reason says so."""
    slices = [rslice(*devices(1), name="s1", count=2), rslice(*devices(1), name="s2", count=2)]
    text = reasons(allocator(slices).allocate([claim()]))
    assert "resource pool driver-a/node-1 is invalid: device 'device-1' is listed more than once" in text


def two_hosts(node_1: tuple[int, int], node_2: tuple[int, int]) -> list:
    """Pool "pool" with a slice from node-1 (device-1) and one from node-2 (device-2), each given as
    (generation, resourceSliceCount)."""
    return [
        rslice(device(f"device-{i}"), name=f"s{i}", node=f"node-{i}", pool="pool", generation=generation, count=count)
        for i, (generation, count) in enumerate((node_1, node_2), 1)
    ]


def test_multi_host_resource_pool_with_stale_slice_for_current_node() -> None:
    """A newer generation elsewhere makes this node's slice obsolete."""
    slices = two_hosts((1, 2), (2, 2))
    assert reasons(allocator(slices).allocate([claim()], nodes=["node-1"])) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)"
    )


def test_multi_host_resource_pool_complete_update_from_node_1_to_node_2() -> None:
    """The old complete generation on node-1 is still used."""
    slices = two_hosts((1, 1), (2, 1))
    assert picked(allocator(slices).allocate([claim()], nodes=["node-1"])) == [[("req-0", "device-1")]]


def test_multi_host_resource_pool_incomplete_update_from_node_2_to_node_1() -> None:
    """A new generation that is incomplete is not used."""
    slices = two_hosts((2, 2), (1, 1))
    assert reasons(allocator(slices).allocate([claim()], nodes=["node-1"])) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 0 of those are free "
        "on the candidate nodes (1 needed)\n"
        "None: resource pool driver-a/pool is currently being updated: 1 of 2 slices of generation 2 are "
        "published"
    )


def test_invalid_pool_is_ok_if_devices_can_be_allocated_from_other() -> None:
    """An invalid pool is skipped when another pool satisfies the claim."""
    slices = [
        rslice(*devices(1), name="s1", pool="bad", count=2),
        rslice(*devices(1), name="s2", pool="bad", count=2),
        rslice(device("device-9"), pool="good"),
    ]
    assert picked(allocator(slices).allocate([claim()])) == [[("req-0", "device-9")]]


def test_invalid_pool_is_error_if_no_other_device_can_be_allocated() -> None:
    """No solution plus an invalid pool: the pool is reported."""
    slices = [rslice(*devices(1), name="s1", pool="bad", count=2), rslice(*devices(1), name="s2", pool="bad", count=2)]
    assert "resource pool driver-a/bad is invalid" in reasons(allocator(slices).allocate([claim()]))


def test_no_allocation_from_incomplete_pools() -> None:
    """An incomplete pool is never used, and it is reported."""
    text = reasons(allocator([rslice(*devices(1), count=2)]).allocate([claim()]))
    assert "is currently being updated: 1 of 2 slices of generation 1 are published" in text


def test_same_counter_set_name_in_different_resource_slices() -> None:
    """A counter set defined twice makes the pool invalid."""
    slices = [
        rslice(name="a", counters=[counter_set("set", mem=1)], count=3),
        rslice(name="b", counters=[counter_set("set", mem=1)], count=3),
        rslice(device("device-1", consumes={"set": {"mem": 1}}), name="c", count=3),
    ]
    assert "counter set 'set' is defined more than once" in reasons(allocator(slices).allocate([claim()]))


def test_device_counter_consumption_references_unknown_counter_set() -> None:
    """A reference to a missing counter set makes the pool invalid."""
    slices = [rslice(device("device-1", consumes={"nope": {"mem": 1}}))]
    assert "unknown counter set 'nope'" in reasons(allocator(slices).allocate([claim()]))


def test_device_counter_consumption_references_unknown_counter_in_counter_set() -> None:
    """A reference to a missing counter makes the pool invalid."""
    slices = [
        rslice(name="a", counters=[counter_set("set", mem=1)], count=2),
        rslice(device("device-1", consumes={"set": {"cpu": 1}}), name="b", count=2),
    ]
    assert "unknown counter 'cpu'" in reasons(allocator(slices).allocate([claim()]))


def test_validation_error_on_non_targeting_slice() -> None:
    """A bad reference on another node's slice invalidates the whole pool."""
    slices = [
        rslice(name="a", node=None, pool="pool", counters=[counter_set("set", mem=2)], count=3, all_nodes=True),
        rslice(device("device-1", consumes={"set": {"mem": 1}}), name="b", node="node-1", pool="pool", count=3),
        rslice(device("device-2", consumes={"set": {"cpu": 1}}), name="c", node="node-2", pool="pool", count=3),
    ]
    assert reasons(allocator(slices).allocate([claim()], nodes=["node-1"])) == (
        "req-0: device class class-a matches 0 devices; 0 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (1 needed)\n"
        "None: resource pool driver-a/pool is invalid: device 'device-2' consumes the unknown counter "
        "'cpu' of counter set 'set'"
    )


def test_devices_consume_counter_set_in_different_nodes() -> None:
    """A counter slice published for another node is still part of the pool."""
    slices = [
        rslice(name="a", node="node-2", pool="pool", counters=[counter_set("set", mem=2)], count=2),
        rslice(device("device-1", consumes={"set": {"mem": 1}}), name="b", node="node-1", pool="pool", count=2),
    ]
    assert picked(allocator(slices).allocate([claim()], nodes=["node-1"])) == [[("req-0", "device-1")]]
