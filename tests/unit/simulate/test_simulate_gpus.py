"""`dractl simulate`'s per-node summary counts GPUs, not published devices: a GPU with its MIG
placements is one GPU (full, partitioned or free), with its memory and largest placeable MIG
profile, in the table and in the JSON summary; devices of other types are counted apart."""

from __future__ import annotations

import io
import json

from dractl import config
from dractl import simulate as simulate_mode
from dractl.simulate import metrics, report

# The built-in example after binpack (see README "The built-in example"): the A100 node serves
# the training GPU whole and two MIG pairs (3g.40gb + 1g.10gb) on two other GPUs; the H100
# node serves the NVLink-4 claim; the T4 node the shared inference GPU.
_A100 = ("dgx-a100-01", "8", "1", "2", "5")
_H100 = ("dgx-h100-01", "8", "4", "0", "4")
_T4 = ("t4-node-01", "2", "1", "0", "1")
_CLUSTER = ("(cluster)", "18", "6", "2", "10")


def _run(output: config.OutputFormat) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = simulate_mode.run(config.Simulate(output=output), out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_table_counts_gpus_with_their_mig_devices_as_one() -> None:
    """Guards: the Nodes table gives GPUs full/partitioned/free per node and for the cluster
    (the A100 node publishes 152 devices, 8 of them GPUs); no device count mixes MIG placements
    with GPUs, and a cluster of GPUs only has no OTHER DEVICES column."""
    text = _run(config.OutputFormat.TABLE)
    nodes = text[text.index("Nodes") :]
    header = [line for line in nodes.splitlines() if "NODE" in line][0]
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "NODE",
        "GPUS",
        "FULL",
        "PARTITIONED",
        "FREE",
        "MEMORY ALLOCATED",
        "LARGEST MIG FREE",
    ]
    assert "152" not in nodes
    rows = {}
    for line in nodes.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] in ("dgx-a100-01", "dgx-h100-01", "t4-node-01", "(cluster)"):
            rows[cells[0]] = tuple(cells[:5])
    assert rows == {r[0]: r for r in (_A100, _H100, _T4, _CLUSTER)}


def test_json_summary_carries_gpus_per_node_and_for_the_cluster() -> None:
    """Guards: -o json's summary gives each node's GPUs, memory (bytes) and largest placeable MIG
    profiles beside its devices and counters, and the cluster's sums."""
    summary = json.loads(_run(config.OutputFormat.JSON))["summary"]
    by_name = {n["name"]: n for n in summary["nodes"]}
    a100 = by_name["dgx-a100-01"]
    assert a100["devices_total"] == 152
    assert a100["gpus"] == {"total": 8, "full": 1, "partitioned": 2, "free": 5}
    assert a100["memory"]["allocated"] > 0 and a100["memory"]["total"] >= a100["memory"]["allocated"]
    assert a100["largestPlaceable"]["7g.80gb"] == 5
    assert by_name["t4-node-01"]["gpus"] == {"total": 2, "full": 1, "partitioned": 0, "free": 1}
    cluster = summary["cluster"]
    assert cluster["gpus"] == {"total": 18, "full": 6, "partitioned": 2, "free": 10}
    assert cluster["memory"]["total"] == sum(n["memory"]["total"] for n in summary["nodes"])


def _usage(node: str, *, gpus: int, other_used: int, other_total: int) -> report.NodeUsage:
    gpu = metrics.NodeMetrics(node, gpus, 0, 0, gpus, memory=gpus * 2**30, memory_allocated=0, memory_stranded=0)
    return report.NodeUsage(
        node=node,
        devices_used=other_used,
        devices_total=gpus + other_total,
        counters=(),
        gpus=gpu if gpus else metrics.total(node, ()),
        other_used=other_used,
        other_total=other_total,
    )


def test_other_devices_are_counted_apart_and_alone_without_gpus() -> None:
    """Guards: devices that are neither GPUs nor MIG devices get an OTHER DEVICES USED column
    (used / total, `-` on a node without any), and a cluster without GPUs shows only them."""
    header, rows = report._node_table(
        [_usage("a", gpus=2, other_used=0, other_total=0), _usage("b", gpus=0, other_used=1, other_total=3)]
    )
    assert header == (*metrics.node_columns(stranded=False), "OTHER DEVICES USED")
    assert [(r[0], r[1], r[-1]) for r in rows] == [("a", "2", "-"), ("b", "0", "1 / 3"), ("(cluster)", "2", "1 / 3")]
    header, rows = report._node_table([_usage("b", gpus=0, other_used=1, other_total=3)])
    assert (header, rows) == (("NODE", "DEVICES USED"), [("b", "1 / 3"), ("(cluster)", "1 / 3")])
