"""Binding conditions: upstream catalog group I and the lexicographical cases (group O)."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, name_selector, node, picked, request, selector, toleration
from support.devices import counter_set, device, partitioned, rslice, taint


def test_device_binding_conditions() -> None:
    """Binding conditions and failure conditions are copied into the result."""
    slices = [rslice(device("device-1", binding_conditions=("ready",), binding_failure_conditions=("failed",)))]
    outcome = allocator(slices).allocate([claim()])
    assert outcome.allocations is not None
    result = outcome.allocations[0].results[0]
    assert result.binding_conditions == ("ready",) and result.binding_failure_conditions == ("failed",)


def test_binding_conditions_with_and_without() -> None:
    """A device without conditions has empty lists."""
    slices = [rslice(device("device-1", binding_conditions=("ready",)), device("device-2"))]
    outcome = allocator(slices).allocate([claim("c", request(count=2))])
    assert outcome.allocations is not None
    assert [r.binding_conditions for r in outcome.allocations[0].results] == [("ready",), ()]


def test_node_restriction() -> None:
    """bindsToNode on a selector slice forces a metadata.name node selector."""
    sel = selector(("region", "In", ("r1",)))
    slices = [
        rslice(
            device("device-1", binds_to_node=True, binding_conditions=("ready",)),
            node=None,
            pool="p",
            node_selector=sel,
        )
    ]
    outcome = allocator(slices, nodes=[node("node-1", region="r1")]).allocate([claim()])
    assert outcome.allocations is not None and outcome.allocations[0].node_selector == name_selector("node-1")


def test_lexicographical_sorting_pools() -> None:
    """Pools are tried in (driver, pool) order whatever the listing order."""
    slices = [
        rslice(device("device-3"), pool="pool-3"),
        rslice(device("device-2"), pool="pool-2"),
        rslice(device("device-1"), pool="pool-1"),
    ]
    assert picked(allocator(slices).allocate([claim("c", request(count=2))])) == [
        [("req-0", "device-1"), ("req-0", "device-2")]
    ]


def test_lexicographical_sorting_pools_with_binding_conditions() -> None:
    """A pool with binding conditions is tried after every other pool."""
    slices = [
        rslice(device("device-1", binding_conditions=("ready",)), pool="pool-1"),
        rslice(device("device-3"), pool="pool-3"),
        rslice(device("device-2"), pool="pool-2"),
    ]
    outcome = allocator(slices).allocate([claim("c", request(count=2))])
    assert outcome.allocations is not None
    assert [r.pool for r in outcome.allocations[0].results] == ["pool-2", "pool-3"]


def test_lexicographical_sorting_slices() -> None:
    """Slices within a pool are tried by name."""
    slices = [
        rslice(device("device-3"), name="slice-3", count=3),
        rslice(device("device-2"), name="slice-2", count=3),
        rslice(device("device-1"), name="slice-1", count=3),
    ]
    assert picked(allocator(slices).allocate([claim("c", request(count=2))])) == [
        [("req-0", "device-1"), ("req-0", "device-2")]
    ]


def test_lexicographical_sorting_slices_with_binding_conditions() -> None:
    """Inside one pool, slice-name order still wins over binding conditions."""
    slices = [
        rslice(device("device-2"), name="slice-2", count=2),
        rslice(device("device-1", binding_conditions=("ready",)), name="slice-1", count=2),
    ]
    assert picked(allocator(slices).allocate([claim()])) == [[("req-0", "device-1")]]


def test_partitionable_devices_with_binding_conditions_and_taints_tolerated() -> None:
    """Counters, binding conditions and a tolerated taint together; the toleration is copied."""
    tol = toleration("k", operator="Exists")
    slices = partitioned(
        *(
            device(f"device-{i}", consumes={"set": {"mem": 1}}, binding_conditions=("ready",), taints=[taint("k")])
            for i in (1, 2)
        ),
        counters=[counter_set("set", mem=2)],
    )
    outcome = allocator(slices).allocate([claim("c", request("req-0", count=2, tolerations=[tol]))])
    assert outcome.allocations is not None
    assert [(r.device, r.tolerations, r.binding_conditions) for r in outcome.allocations[0].results] == [
        ("device-1", (tol,), ("ready",)),
        ("device-2", (tol,), ("ready",)),
    ]
