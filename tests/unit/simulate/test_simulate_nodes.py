"""The known nodes a simulation result carries, and the per-node summary that lists them."""

from __future__ import annotations

import io
import json

from support.simulate_manifests import CLUSTER, load

from dractl import alloc, config
from dractl.simulate import engine, report

# A third Node object, with no slice: known, but without devices.
NODE_C = """
apiVersion: v1
kind: Node
metadata: {name: node-c}
"""


def test_the_result_carries_every_known_node_and_the_summary_lists_it() -> None:
    """Guards: `Result.nodes` holds the input's known nodes (a Node without devices too), and the JSON summary
    lists each of them, as `report.write` takes them from the result."""
    objects = load(CLUSTER, NODE_C)
    result = engine.simulate(objects, policy=alloc.Policy.BINPACK, search_limit=1000)
    assert result.nodes == ("node-a", "node-b", "node-c")
    out = io.StringIO()
    settings = config.Simulate(output=config.OutputFormat.JSON)
    report.write(result, slices=objects.resource_slices, settings=settings, out=out, err=io.StringIO())
    summary = json.loads(out.getvalue())["summary"]
    assert [(n["name"], n["devices_total"]) for n in summary["nodes"]] == [("node-a", 2), ("node-b", 2), ("node-c", 0)]
