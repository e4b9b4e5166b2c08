"""The per-node utilisation summary: devices held and offered, counters summed by name."""

from __future__ import annotations

from simulate_manifests import CLASS, CLUSTER, claim, load

from dractl import alloc
from dractl.simulate import engine, report

PARTITIONED = CLASS + """
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-counters}
spec:
  driver: gpu.example.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 2}
  nodeName: node-a
  sharedCounters:
  - name: gpu-0-counter-set
    counters: {memory: {value: 80Gi}, memory-slice-0: {value: "1"}, memory-slice-1: {value: "1"}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-devices}
spec:
  driver: gpu.example.com
  pool: {name: node-a, generation: 1, resourceSliceCount: 2}
  nodeName: node-a
  devices:
  - name: gpu-0-part-0
    consumesCounters:
    - {counterSet: gpu-0-counter-set, counters: {memory: {value: 30Gi}, memory-slice-0: {value: "1"}}}
  - name: gpu-0-part-1
    consumesCounters:
    - {counterSet: gpu-0-counter-set, counters: {memory: {value: 30Gi}, memory-slice-1: {value: "1"}}}
"""


def _usage(*documents: str) -> tuple[report.NodeUsage, ...]:
    objects = load(*documents)
    result = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=100_000)
    return report.usage(objects.resource_slices, result.claims)


def test_devices_used_and_offered_per_node() -> None:
    """Guards: each node's devices are counted, a device held by a claim once, nodes in name order."""
    nodes = _usage(CLUSTER, claim("one"), claim("two", count=2, selector='device.attributes["gpu.example.com"].model == "large"'))
    assert [(n.node, n.devices_used, n.devices_total, n.counters) for n in nodes] == [("node-a", 1, 2, ()), ("node-b", 2, 2, ())]


def test_counters_are_summed_by_name_with_indexed_counters_grouped() -> None:
    """Guards: counter usage adds up consumption per counter, memory-slice-N summed as memory-slice, in the total's unit."""
    (node,) = _usage(PARTITIONED, claim("part"))
    assert node.node == "node-a" and (node.devices_used, node.devices_total) == (1, 2)
    assert node.counters == (
        report.CounterUsage(name="memory", used="30Gi", total="80Gi"),
        report.CounterUsage(name="memory-slice", used="1", total="2"),
    )


def test_counter_usage_in_a_unit_that_divides_the_total() -> None:
    """Guards: used memory is shown in the total's unit, with decimals when needed (30.5Gi / 80Gi)."""
    (node,) = _usage(PARTITIONED.replace("memory: {value: 30Gi}, memory-slice-0", "memory: {value: 31232Mi}, memory-slice-0"), claim("part"))
    assert node.counters[0] == report.CounterUsage(name="memory", used="30.5Gi", total="80Gi")
