"""What `dractl simulate` prints: a table for people, JSON for programs, and YAML with the
claims exactly as the API would hold them.

Pure apart from writing to the streams it is given. Every format gives each claim's status:
allocated, not allocated, or (for an allocation given in the input that holds nothing)
conflict or invalid, with the reasons, and its warnings (what the node agent will refuse
when it prepares the claim: `engine.PrepareCheck`). JSON carries what YAML carries (`allocation` and
`reservedFor` exactly as the API holds them). The per-node summary counts GPUs (full,
partitioned, free), their memory and the largest MIG profile still placeable
(`metrics.measure`: a GPU with its MIG placements is one GPU, not one device per placement),
the devices of other types each node offers in usable pools (`model.nodes`, as the allocator
sees them) and holds (a device shared by several claims counts once), and, in JSON, every
device and each node's counters summed by name, adding up indexed counters
(`memory-slice-0` ... `memory-slice-7`) as one (`memory-slice`).

Speed matters at thousands of claims: JSON is encoded and indented by msgspec, YAML written by
`yamlout`, and tables above `RICH_ROWS` claims are plain text.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import fractions
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from dractl import config, model
from dractl.model import encode
from dractl.model import nodes as model_nodes
from dractl.simulate import engine, metrics

if TYPE_CHECKING:
    import rich.console

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
    node), its counters summed by name, its GPUs (`metrics.NodeMetrics`), and how many of its
    devices are neither a GPU nor a MIG device (`other_used` of `other_total`)."""

    node: str
    devices_used: int
    devices_total: int
    counters: tuple[CounterUsage, ...]
    gpus: metrics.NodeMetrics
    other_used: int = 0
    other_total: int = 0


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


def usage(
    slices: Sequence[model.ResourceSlice],
    outcomes: Iterable[engine.ClaimOutcome],
    *,
    nodes: Sequence[str] = (),
    view: model_nodes.View | None = None,
) -> tuple[NodeUsage, ...]:
    """The per-node summary after the simulation: devices, counters, GPUs (`metrics.per_node`)
    and devices of other types, for every node in `nodes` (even without devices) and every
    node a usable pool's device lives on. Only
    usable pools count, as for the allocator (`model.nodes.Pools`): the newest generation of
    each pool, and nothing of an incomplete or invalid pool. `view` is the slices'
    `Pools(...).current()` when the caller has it already. Pure."""
    if view is None:
        view = model_nodes.Pools(slices).current()
    devices: dict[tuple[str, str, str], tuple[str, model.Device]] = {}
    counter_sets: list[tuple[str, str, str, model.CounterSet]] = []
    for usable in view.usable:
        pool = usable.pool
        for s in pool.slices:
            if s.node_name:
                # Every device of a node's slice lives there (`model_nodes.home`): no call per device.
                devices.update(((pool.driver, pool.name, device.name), (s.node_name, device)) for device in s.devices)
            else:
                for device in s.devices:
                    home = model_nodes.home(s, device) or CLUSTER_WIDE
                    devices[(pool.driver, pool.name, device.name)] = (home, device)
            counter_sets.extend((s.node_name or CLUSTER_WIDE, pool.driver, pool.name, c) for c in s.shared_counters)
    allocated = [
        outcome.claim
        for outcome in outcomes
        if outcome.allocated and outcome.claim is not None and outcome.claim.allocation is not None
    ]
    used = {
        (result.driver, result.pool, result.device)
        for claim in allocated
        if claim.allocation is not None
        for result in claim.allocation.results
        if not result.admin_access
    } & devices.keys()
    consumed: dict[tuple[str, str, str, str], fractions.Fraction] = collections.defaultdict(fractions.Fraction)
    for driver, pool_name, name in used:
        for consumption in devices[(driver, pool_name, name)][1].consumes_counters:
            for counter, amount in consumption.counters.items():
                consumed[(driver, pool_name, consumption.counter_set, counter)] += amount.value
    sums: dict[str, dict[str, _Sum]] = collections.defaultdict(dict)
    for node, driver, pool_name, counter_set in counter_sets:
        for counter, total in counter_set.counters.items():
            group = sums[node].setdefault(_INDEXED.sub("", counter), _Sum())
            group.used += consumed.get((driver, pool_name, counter_set.name, counter), fractions.Fraction(0))
            group.total += total.value
            group.binary = group.binary or bool(_BINARY_SUFFIX.search(total.text))
    offered = collections.Counter(node for node, _ in devices.values())
    held = collections.Counter(devices[key][0] for key in used)
    inventory = metrics.inventory(slices, allocated, view=view)
    # Stranded memory needs pending request shapes (`dractl simulate --trace`): not measured here.
    gpus = {n.node: n for n in metrics.per_node(inventory)}
    gpu_devices = {(g.driver, g.pool, d) for g in inventory for d in (g.device, *(p.device for p in g.placements))}
    other = devices.keys() - gpu_devices
    other_offered = collections.Counter(devices[key][0] for key in other)
    other_held = collections.Counter(devices[key][0] for key in used & other)
    names = sorted(offered.keys() | sums.keys() | set(nodes), key=lambda n: (n == CLUSTER_WIDE, n))
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
            gpus=gpus.get(node) or metrics.total(node, ()),
            other_used=other_held[node],
            other_total=other_offered[node],
        )
        for node in names
    )


def problems(slices: Sequence[model.ResourceSlice]) -> tuple[str, ...]:
    """The pools no node can use (incomplete or invalid), one message each, sorted. Pure."""
    return tuple(problem.message() for problem in model_nodes.Pools(slices).current().problems)


def _summary(
    result: engine.Result, nodes: Sequence[NodeUsage], *, pool_problems: Sequence[str], policy: config.Policy
) -> dict[str, Any]:
    counts = collections.Counter(outcome.status for outcome in result.claims)
    return {
        "policy": policy.value,
        "claims": len(result.claims),
        "allocated": counts[engine.Status.ALLOCATED],
        "unallocated": counts[engine.Status.NOT_ALLOCATED],
        "conflict": counts[engine.Status.CONFLICT],
        "invalid": counts[engine.Status.INVALID],
        "nodes": [
            {
                "name": n.node,
                "devices_used": n.devices_used,
                "devices_total": n.devices_total,
                "counters": {c.name: {"used": c.used, "total": c.total} for c in n.counters},
                **_gpu_fields(n.gpus),
            }
            for n in nodes
        ],
        "cluster": _gpu_fields(metrics.total(metrics.CLUSTER, [n.gpus for n in nodes])),
        "pool_problems": list(pool_problems),
    }


def _gpu_fields(n: metrics.NodeMetrics) -> dict[str, Any]:
    """`metrics.node_dict` without the name and without stranded memory (there are no pending
    shapes to judge it by), for the JSON summary."""
    return {key: value for key, value in metrics.node_dict(n, stranded=False).items() if key != "node"}


def _consumer(ref: model.ResourceClaimConsumerReference) -> dict[str, str]:
    """A `status.reservedFor` entry as the API holds it (`model.encode` writes it the same way
    inside a whole claim; it has no public function for one entry)."""
    entry = {"apiGroup": ref.api_group, "resource": ref.resource, "name": ref.name, "uid": ref.uid}
    return {key: value for key, value in entry.items() if value}


def claim_entry(outcome: engine.ClaimOutcome) -> dict[str, Any]:
    """One claim of `-o json`: what `-o yaml` says of it (`allocation` and `reservedFor` as
    the API holds them, `allocation` null when there is none), plus its status, node,
    reasons and warnings. Pure."""
    claim = outcome.claim
    allocation = claim.allocation if claim is not None else None
    return {
        "namespace": outcome.namespace,
        "name": outcome.name,
        "status": outcome.status.value,
        "allocated": outcome.allocated,
        "node": outcome.node,
        "allocation": encode.allocation_result(allocation) if allocation is not None else None,
        "reservedFor": [_consumer(ref) for ref in claim.reserved_for] if claim is not None else [],
        "reasons": list(outcome.reasons),
        "warnings": list(outcome.warnings),
    }


def write_json(
    result: engine.Result,
    nodes: Sequence[NodeUsage],
    *,
    pool_problems: Sequence[str] = (),
    policy: config.Policy,
    out: TextIO,
) -> None:
    """`{"claims": [...], "summary": {...}}`, one object per claim in processing order (see
    `claim_entry`), indented by two spaces."""
    document = {
        "claims": [claim_entry(o) for o in result.claims],
        "summary": _summary(result, nodes, pool_problems=pool_problems, policy=policy),
    }
    write_json_document(document, out=out)


def write_json_document(document: Any, *, out: TextIO) -> None:
    """`document` as JSON indented by two spaces, and a newline. Where `out`'s encoding cannot hold a character
    (`PYTHONIOENCODING=ascii`, the C locale), every non-ASCII character is written as a JSON escape (`\\u00e8`),
    so the output stays JSON rather than failing or holding a Python escape."""
    # msgspec's encoder and formatter are C: the stdlib's indenting encoder is pure Python.
    # Imported here, like yamlout and rich: each output format imports only what it needs.
    import msgspec

    text = msgspec.json.format(msgspec.json.encode(document), indent=2).decode()
    if not text.isascii() and not _encodes(text, getattr(out, "encoding", None)):
        # Non-ASCII characters appear only inside JSON strings, where an escape means the same.
        text = _NON_ASCII.sub(_json_escape, text)
    out.write(text + "\n")


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _encodes(text: str, encoding: str | None) -> bool:
    try:
        text.encode(encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _note(outcome: engine.ClaimOutcome) -> str | None:
    lines = [f"dractl: warning: {warning}" for warning in outcome.warnings]
    if outcome.status in (engine.Status.CONFLICT, engine.Status.INVALID):
        lines.insert(0, f"dractl: {outcome.status.value}: " + "; ".join(outcome.reasons))
    return "\n".join(lines) or None


def write_yaml(result: engine.Result, *, out: TextIO, err: TextIO) -> None:
    """Every claim that exists as a full ResourceClaim, `status.allocation` and `reservedFor`
    included, one YAML document each. A claim whose input allocation holds nothing (status
    conflict or invalid) keeps that allocation, as the API holds it, under a `# dractl:
    conflict: ...` comment, and each warning of a claim is a `# dractl: warning: ...` comment
    above it; the reasons of unallocated claims go to `err` so that `out` holds only API
    objects."""
    from dractl.simulate import yamlout  # imported here: it imports PyYAML, which other formats do not need

    shown = [o for o in result.claims if o.claim is not None]
    writer = yamlout.Writer(out)
    writer.documents(
        (encode.resource_claim(o.claim) for o in shown if o.claim is not None), comments=(_note(o) for o in shown)
    )
    for o in result.claims:
        for reason in o.reasons if o.status is engine.Status.NOT_ALLOCATED else ():
            print(f"{o.namespace}/{o.name}: {reason}", file=err)


def _devices(outcome: engine.ClaimOutcome) -> str:
    """One line per request: its devices, with the pool when it is not named after the node."""
    if outcome.claim is None or outcome.claim.allocation is None:
        return ""
    results = outcome.claim.allocation.results
    if len(results) == 1:
        # The common claim, one device: the same line without grouping.
        r = results[0]
        return f"{r.request}: {r.device}" if r.pool == outcome.node else f"{r.request}: {r.pool}/{r.device}"
    by_request: dict[str, list[str]] = {}
    for r in results:
        by_request.setdefault(r.request, []).append(r.device if r.pool == outcome.node else f"{r.pool}/{r.device}")
    return "\n".join(f"{request}: {', '.join(devices)}" for request, devices in by_request.items())


_STYLES = {
    engine.Status.ALLOCATED: "green",
    engine.Status.NOT_ALLOCATED: "red",
    engine.Status.CONFLICT: "red",
    engine.Status.INVALID: "red",
}

RICH_ROWS = 500
"""Tables with more claims than this are written as plain text: rich measures and wraps
every cell, about a millisecond per claim."""


def _rows(result: engine.Result) -> list[tuple[str, str, engine.Status, str]]:
    """(claim, node, status, devices or reasons, then the warnings) per claim."""
    rows = []
    for o in result.claims:
        if o.allocated:
            node, text = o.node or "(any)", _devices(o)
        else:
            node, text = "-", "\n".join(f"- {reason}" for reason in o.reasons)
        if o.warnings:
            text = "\n".join([*([text] if text else []), *(f"warning: {warning}" for warning in o.warnings)])
        rows.append((f"{o.namespace}/{o.name}", node, o.status, text))
    return rows


def _footer(result: engine.Result) -> str:
    counts = collections.Counter(o.status for o in result.claims)
    text = f"{counts[engine.Status.ALLOCATED]} of {len(result.claims)} claims allocated."
    trouble = [f"{counts[s]} {s.value}" for s in (engine.Status.CONFLICT, engine.Status.INVALID) if counts[s]]
    warned = sum(1 for o in result.claims if o.warnings)
    if warned:
        trouble.append(f"{warned} the node agent will refuse to prepare")
    return f"{text} {', '.join(trouble)}." if trouble else text


def _node_table(nodes: Sequence[NodeUsage]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The header and the rows, per node and then for the cluster: its GPUs (`metrics.node_cells`)
    when the cluster has any, and, when some node has devices that are neither GPUs nor MIG
    devices, how many of those are used (`DEVICES USED` when there is no GPU at all)."""
    cluster = metrics.total(metrics.CLUSTER, [n.gpus for n in nodes])
    other = sum(n.other_total for n in nodes)
    used = [f"{n.other_used} / {n.other_total}" if n.other_total else "-" for n in nodes]
    used.append(f"{sum(n.other_used for n in nodes)} / {other}")
    if not cluster.gpus:
        names = [*(n.node for n in nodes), cluster.node]
        return ("NODE", "DEVICES USED"), [(name, cell) for name, cell in zip(names, used, strict=True)]
    header = metrics.node_columns(stranded=False)
    rows = [metrics.node_cells(n.gpus, stranded=False) for n in nodes] + [metrics.node_cells(cluster, stranded=False)]
    if not other:
        return header, rows
    return (*header, "OTHER DEVICES USED"), [(*row, cell) for row, cell in zip(rows, used, strict=True)]


def _plain(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """A kubectl-style table: columns padded to their widest line, three spaces apart; a
    cell with several lines continues on the next lines in its own column. No wrapping, so
    every reason stays on one line (grep-able)."""
    last = len(header) - 1
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    # Columns are measured whole, and split into lines only where some cell has several:
    # the claim, node and status columns never do, and thousands of rows pass through here.
    multiline = [i for i, column in enumerate(columns) if "\n" in "".join(column)]
    widths = [
        max(
            len(header[i]),
            max((len(line) for cell in columns[i] for line in cell.split("\n")), default=0)
            if i in multiline
            else max(map(len, columns[i]), default=0),
        )
        for i in range(last)
    ]
    # One format call per line: each cell but the last left-justified to its column's width
    # plus three spaces (as str.ljust pads), the last as it is.
    line = "".join(f"{{:<{width + 3}}}" for width in widths) + "{}"
    lines = [title, line.format(*header)]
    for row in rows:
        if multiline and any("\n" in row[i] for i in multiline):
            split = [cell.split("\n") for cell in row]
            for k in range(max(map(len, split))):
                lines.append(line.format(*(cell[k] if k < len(cell) else "" for cell in split)).rstrip())
        else:
            lines.append(line.format(*row).rstrip())
    out.write("\n".join(lines) + "\n")


def write_table(
    result: engine.Result,
    nodes: Sequence[NodeUsage],
    *,
    pool_problems: Sequence[str] = (),
    policy: config.Policy,
    out: TextIO,
) -> None:
    """The claims with their node and devices, the reasons under each claim that was not
    allocated (or whose input allocation is in conflict or invalid), the per-node
    utilisation, and the pools no node can use. Up to `RICH_ROWS` claims it is a rich table
    (every cell a `Text`, so names and reasons print verbatim: the `[...]` of a CEL expression
    is not taken for markup); above, the same columns as plain text."""
    rows = _rows(result)
    header = ("CLAIM", "NODE", "STATUS", "DEVICES / REASONS")
    if len(rows) > RICH_ROWS:
        _plain(f"Claims (policy {policy.value})", header, [(c, n, s.value, d) for c, n, s, d in rows], out)
        out.write(_footer(result) + "\n")
        _plain("Nodes", *_node_table(nodes), out)
        out.write("".join(f"warning: {problem}\n" for problem in pool_problems))
        return
    # Imported here: rich takes about 50 ms to import, which json, yaml and large
    # tables never use.
    import rich.table
    import rich.text

    console = new_console(out)
    claims = rich.table.Table(title=f"Claims (policy {policy.value})", title_justify="left")
    for column in header:
        claims.add_column(column, overflow="fold")
    for claim, node, status, text in rows:
        style = "yellow" if status is not engine.Status.ALLOCATED or "\nwarning: " in f"\n{text}" else ""
        claims.add_row(
            rich.text.Text(claim),
            rich.text.Text(node),
            rich.text.Text(status.value, style=_STYLES[status]),
            rich.text.Text(text, style=style),
        )
    console.print(claims)
    console.print(rich.text.Text(_footer(result)))
    usage_table = rich.table.Table(title="Nodes", title_justify="left")
    node_header, node_rows = _node_table(nodes)
    for column in node_header:
        usage_table.add_column(column, justify="left" if column in ("NODE", "LARGEST MIG FREE") else "right")
    for index, node_row in enumerate(node_rows):
        usage_table.add_row(*(rich.text.Text(cell) for cell in node_row), end_section=index == len(node_rows) - 2)
    console.print(usage_table)
    for problem in pool_problems:
        console.print(rich.text.Text(f"warning: {problem}", style="yellow"))


def new_console(out: TextIO) -> rich.console.Console:
    """A rich console on `out` (160 columns unless `out` is a terminal) that lets a closed pipe
    raise `BrokenPipeError`: rich's own handler exits 1, where the CLI ends a closed pipe
    (`dractl simulate | head -1`) quietly with 141 as for every other format."""
    import rich.console  # imported here: rich takes about 50 ms to import

    class Console(rich.console.Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return Console(file=out, width=None if out.isatty() else 160, highlight=False)


def write(
    result: engine.Result,
    *,
    slices: Sequence[model.ResourceSlice],
    settings: config.Simulate,
    out: TextIO,
    err: TextIO,
) -> None:
    """Print `result` in the format `settings.output` names; the per-node summary lists the
    result's known nodes even when they have no devices."""
    if settings.output is config.OutputFormat.YAML:
        write_yaml(result, out=out, err=err)
        return
    view = model_nodes.Pools(slices).current()
    summary = usage(slices, result.claims, nodes=result.nodes, view=view)
    pool_problems = [problem.message() for problem in view.problems]
    if settings.output is config.OutputFormat.JSON:
        write_json(result, summary, pool_problems=pool_problems, policy=settings.policy, out=out)
    else:
        write_table(result, summary, pool_problems=pool_problems, policy=settings.policy, out=out)
