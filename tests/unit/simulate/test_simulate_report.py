"""The per-node utilisation summary: devices held and offered, counters summed by name."""

from __future__ import annotations

from support.simulate_manifests import CLUSTER, claim, load, partitioned, resource_slice

from dractl import alloc
from dractl.simulate import engine, report

PARTITIONED = partitioned(
    counters="""
    - name: gpu-0-counter-set
      counters: {memory: {value: 80Gi}, memory-slice-0: {value: "1"}, memory-slice-1: {value: "1"}}
    """,
    devices="""
    - name: gpu-0-part-0
      consumesCounters:
      - {counterSet: gpu-0-counter-set, counters: {memory: {value: 30Gi}, memory-slice-0: {value: "1"}}}
    - name: gpu-0-part-1
      consumesCounters:
      - {counterSet: gpu-0-counter-set, counters: {memory: {value: 30Gi}, memory-slice-1: {value: "1"}}}
    """,
)


def _usage(*documents: str) -> tuple[report.NodeUsage, ...]:
    objects = load(*documents)
    result = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=100_000)
    return report.usage(objects.resource_slices, result.claims)


def test_devices_used_and_offered_per_node() -> None:
    """Guards: each node's devices are counted, a device held by a claim once, nodes in name order."""
    nodes = _usage(
        CLUSTER, claim("one"), claim("two", count=2, selector='device.attributes["gpu.example.com"].model == "large"')
    )
    assert [(n.node, n.devices_used, n.devices_total, n.counters) for n in nodes] == [
        ("node-a", 1, 2, ()),
        ("node-b", 2, 2, ()),
    ]


def test_counters_are_summed_by_name_with_indexed_counters_grouped() -> None:
    """Guards: counter usage adds up consumption per counter, memory-slice-N summed as memory-slice,
    in the total's unit."""
    (node,) = _usage(PARTITIONED, claim("part"))
    assert node.node == "node-a" and (node.devices_used, node.devices_total) == (1, 2)
    assert node.counters == (
        report.CounterUsage(name="memory", used="30Gi", total="80Gi"),
        report.CounterUsage(name="memory-slice", used="1", total="2"),
    )


def test_counter_usage_in_a_unit_that_divides_the_total() -> None:
    """Guards: used memory is shown in the total's unit, with decimals when needed (30.5Gi / 80Gi)."""
    (node,) = _usage(
        PARTITIONED.replace("memory: {value: 30Gi}, memory-slice-0", "memory: {value: 31232Mi}, memory-slice-0"),
        claim("part"),
    )
    assert node.counters[0] == report.CounterUsage(name="memory", used="30.5Gi", total="80Gi")


def test_incomplete_pool_offers_no_devices_like_the_allocator_sees_it() -> None:
    """Guards: the report and the allocator agree on an incomplete pool: its devices are not offered (the report used to
    count them), and the pool is listed as a problem."""
    incomplete = CLUSTER.replace(
        "pool: {name: node-a, generation: 1, resourceSliceCount: 1}",
        "pool: {name: node-a, generation: 1, resourceSliceCount: 2}",
    )
    objects = load(incomplete, claim("one", selector='device.attributes["gpu.example.com"].model == "small"'))
    result = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=100_000)
    assert not result.claims[0].allocated
    assert (
        "resource pool gpu.example.com/node-a is currently being updated: 1 of 2 slices of generation 1 are published"
        in result.claims[0].reasons
    )
    nodes = report.usage(objects.resource_slices, result.claims, nodes=("node-a", "node-b"))
    assert [(n.node, n.devices_used, n.devices_total) for n in nodes] == [("node-a", 0, 0), ("node-b", 0, 2)]
    assert report.problems(objects.resource_slices) == (
        "resource pool gpu.example.com/node-a is currently being updated: 1 of 2 slices of generation 1 are published",
    )


def test_newest_generation_incomplete_means_no_fallback_to_the_older_one() -> None:
    """Guards: with generation 2 incomplete the report does not offer generation 1's (or 2's) devices, as the allocator
    does not use them."""
    older = CLUSTER.replace("metadata: {name: node-a-gpus}", "metadata: {name: node-a-old}")
    slice_v2 = resource_slice("node-a-new", node="node-a", slices=2, generation=2, spec="devices: [{name: gpu-9}]")
    objects = load(older, slice_v2)
    nodes = report.usage(objects.resource_slices, (), nodes=("node-a", "node-b"))
    assert [(n.node, n.devices_total) for n in nodes] == [("node-a", 0), ("node-b", 2)]


def test_nodes_without_devices_are_listed_when_known() -> None:
    """Guards: every known node appears in the summary, also one without devices."""
    nodes = report.usage(load(CLUSTER).resource_slices, (), nodes=("node-a", "node-b", "node-c"))
    assert [(n.node, n.devices_total) for n in nodes] == [("node-a", 2), ("node-b", 2), ("node-c", 0)]
