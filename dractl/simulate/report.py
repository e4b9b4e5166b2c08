"""What `dractl simulate` prints: a table for people, JSON for programs, and YAML with the
claims exactly as the API would hold them.

Pure apart from writing to the streams it is given. The per-node summary counts the
devices each node offers and holds (a device shared by several claims counts once) and sums
each node's counters by name, adding up indexed counters (`memory-slice-0` ...
`memory-slice-7`) as one (`memory-slice`).
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import rich.console
import rich.table
import rich.text
import yaml

from dractl import config, model
from dractl.model import encode
from dractl.simulate import engine

CLUSTER_WIDE = "(cluster-wide)"

_INDEXED = re.compile(r"-[0-9]+$")
_BINARY_SUFFIX = re.compile(r"[KMGTPE]i$")
_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


@dataclasses.dataclass(frozen=True, slots=True)
class CounterUsage:
    """One counter (or group of indexed counters) of a node: used and total, as text."""

    name: str
    used: str
    total: str


@dataclasses.dataclass(frozen=True, slots=True)
class NodeUsage:
    """Devices held and offered on one node (or `CLUSTER_WIDE` for slices not bound to a
    node), and its counters summed by name."""

    node: str
    devices_used: int
    devices_total: int
    counters: tuple[CounterUsage, ...]


@dataclasses.dataclass(slots=True)
class _Sum:
    """A counter group's running sums; binary when its totals are spelled like "80Gi"."""

    used: fractions.Fraction = fractions.Fraction(0)
    total: fractions.Fraction = fractions.Fraction(0)
    binary: bool = False

    def text(self, value: fractions.Fraction) -> str:
        """`value` in the largest binary unit that divides the total (so used and total read
        alike: "176.75Gi / 634Gi"), or as a plain number."""
        suffix, unit = next(((s, u) for s, u in _BINARY_UNITS if self.binary and self.total % u == 0), ("", 1))
        scaled = value / unit
        number = str(scaled.numerator) if scaled.denominator == 1 else f"{float(scaled):.3f}".rstrip("0")
        return number + suffix


def _newest_slices(slices: Sequence[model.ResourceSlice]) -> list[model.ResourceSlice]:
    """Only the slices of each pool's newest generation count, as for the allocator."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool.name)
        newest[key] = max(newest.get(key, s.pool.generation), s.pool.generation)
    return [s for s in slices if s.pool.generation == newest[(s.driver, s.pool.name)]]


def usage(slices: Sequence[model.ResourceSlice], outcomes: Iterable[engine.ClaimOutcome]) -> tuple[NodeUsage, ...]:
    """The per-node summary of devices and counters after the simulation. Pure."""
    devices: dict[tuple[str, str, str], tuple[str, model.Device]] = {}
    counter_sets: list[tuple[str, str, str, model.CounterSet]] = []
    for s in _newest_slices(slices):
        for device in s.devices:
            devices[(s.driver, s.pool.name, device.name)] = (s.node_name or device.node_name or CLUSTER_WIDE, device)
        counter_sets.extend((s.node_name or CLUSTER_WIDE, s.driver, s.pool.name, c) for c in s.shared_counters)
    used = {
        (result.driver, result.pool, result.device)
        for outcome in outcomes
        if outcome.claim is not None and outcome.claim.allocation is not None
        for result in outcome.claim.allocation.results
        if not result.admin_access
    } & devices.keys()
    consumed: dict[tuple[str, str, str, str], fractions.Fraction] = collections.defaultdict(fractions.Fraction)
    for driver, pool, name in used:
        for consumption in devices[(driver, pool, name)][1].consumes_counters:
            for counter, amount in consumption.counters.items():
                consumed[(driver, pool, consumption.counter_set, counter)] += amount.value
    sums: dict[str, dict[str, _Sum]] = collections.defaultdict(dict)
    for node, driver, pool, counter_set in counter_sets:
        for counter, total in counter_set.counters.items():
            group = sums[node].setdefault(_INDEXED.sub("", counter), _Sum())
            group.used += consumed.get((driver, pool, counter_set.name, counter), fractions.Fraction(0))
            group.total += total.value
            group.binary = group.binary or bool(_BINARY_SUFFIX.search(total.text))
    offered = collections.Counter(node for node, _ in devices.values())
    held = collections.Counter(devices[key][0] for key in used)
    nodes = sorted(offered.keys() | sums.keys(), key=lambda n: (n == CLUSTER_WIDE, n))
    return tuple(
        NodeUsage(
            node=node,
            devices_used=held[node],
            devices_total=offered[node],
            counters=tuple(
                CounterUsage(name=name, used=group.text(group.used), total=group.text(group.total))
                for name, group in sorted(sums[node].items())
                if group.total
            ),
        )
        for node in nodes
    )


def _summary(result: engine.Result, nodes: Sequence[NodeUsage], *, policy: config.Policy) -> dict[str, Any]:
    allocated = sum(1 for outcome in result.claims if outcome.allocated)
    return {
        "policy": policy.value,
        "claims": len(result.claims),
        "allocated": allocated,
        "unallocated": len(result.claims) - allocated,
        "nodes": [
            {
                "name": n.node,
                "devices_used": n.devices_used,
                "devices_total": n.devices_total,
                "counters": {c.name: {"used": c.used, "total": c.total} for c in n.counters},
            }
            for n in nodes
        ],
    }


def _results(outcome: engine.ClaimOutcome) -> list[Any]:
    if outcome.claim is None or outcome.claim.allocation is None:
        return []
    results: list[Any] = encode.allocation_result(outcome.claim.allocation)["devices"].get("results", [])
    return results


def write_json(result: engine.Result, nodes: Sequence[NodeUsage], *, policy: config.Policy, out: TextIO) -> None:
    """`{"claims": [...], "summary": {...}}`, one object per claim in processing order."""
    document = {
        "claims": [
            {
                "namespace": o.namespace,
                "name": o.name,
                "allocated": o.allocated,
                "node": o.node,
                "results": _results(o),
                "reasons": list(o.reasons),
            }
            for o in result.claims
        ],
        "summary": _summary(result, nodes, policy=policy),
    }
    json.dump(document, out, indent=2)
    out.write("\n")


def write_yaml(result: engine.Result, *, out: TextIO, err: TextIO) -> None:
    """Every claim that exists as a full ResourceClaim, `status.allocation` and `reservedFor`
    included, one YAML document each; the reasons of unallocated claims go to `err` so that
    `out` holds only API objects."""
    documents = [encode.resource_claim(o.claim) for o in result.claims if o.claim is not None]
    # A wide line keeps long CEL expressions on one line, as kubectl prints them.
    yaml.dump_all(documents, out, Dumper=yaml.CSafeDumper, sort_keys=False, explicit_start=True, width=1 << 16)
    for o in result.claims:
        for reason in o.reasons if not o.allocated else ():
            print(f"{o.namespace}/{o.name}: {reason}", file=err)


def _devices(outcome: engine.ClaimOutcome) -> str:
    """One line per request: its devices, with the pool when it is not named after the node."""
    if outcome.claim is None or outcome.claim.allocation is None:
        return ""
    by_request: dict[str, list[str]] = {}
    for r in outcome.claim.allocation.results:
        by_request.setdefault(r.request, []).append(r.device if r.pool == outcome.node else f"{r.pool}/{r.device}")
    return "\n".join(f"{request}: {', '.join(devices)}" for request, devices in by_request.items())


def write_table(result: engine.Result, nodes: Sequence[NodeUsage], *, policy: config.Policy, out: TextIO) -> None:
    """The claims with their node and devices, the reasons under each claim that was not
    allocated, and the per-node utilisation. Every cell is a `Text`, so names and reasons
    print verbatim: the `[...]` of a CEL expression is not taken for rich markup."""
    console = rich.console.Console(file=out, width=None if out.isatty() else 160, highlight=False)
    claims = rich.table.Table(title=f"Claims (policy {policy.value})", title_justify="left")
    for column in ("CLAIM", "NODE", "STATUS", "DEVICES / REASONS"):
        claims.add_column(column, overflow="fold")
    for o in result.claims:
        if o.allocated:
            claims.add_row(rich.text.Text(f"{o.namespace}/{o.name}"), rich.text.Text(o.node or "(any)"), rich.text.Text("allocated", style="green"), rich.text.Text(_devices(o)))
        else:
            reasons = rich.text.Text("\n".join(f"- {reason}" for reason in o.reasons), style="yellow")
            claims.add_row(rich.text.Text(f"{o.namespace}/{o.name}"), rich.text.Text("-"), rich.text.Text("not allocated", style="red"), reasons)
    console.print(claims)
    allocated = sum(1 for o in result.claims if o.allocated)
    console.print(rich.text.Text(f"{allocated} of {len(result.claims)} claims allocated."))
    usage_table = rich.table.Table(title="Nodes", title_justify="left")
    for column in ("NODE", "DEVICES USED", "COUNTERS USED"):
        usage_table.add_column(column)
    for n in nodes:
        counters = "\n".join(f"{c.name}: {c.used} / {c.total}" for c in n.counters)
        usage_table.add_row(rich.text.Text(n.node), rich.text.Text(f"{n.devices_used} / {n.devices_total}"), rich.text.Text(counters or "-"))
    console.print(usage_table)


def write(result: engine.Result, *, slices: Sequence[model.ResourceSlice], settings: config.Simulate, out: TextIO, err: TextIO) -> None:
    """Print `result` in the format `settings.output` names."""
    match settings.output:
        case config.OutputFormat.YAML:
            write_yaml(result, out=out, err=err)
        case config.OutputFormat.JSON:
            write_json(result, usage(slices, result.claims), policy=settings.policy, out=out)
        case config.OutputFormat.TABLE:
            write_table(result, usage(slices, result.claims), policy=settings.policy, out=out)
