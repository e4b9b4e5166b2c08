"""The allocation map: one self-contained HTML page of nodes, GPUs, MIG slices and who holds what.

What it does: renders the GPU inventory of `metrics` (ResourceSlices plus claims with their
`status.allocation`) as HTML with inline CSS, inline SVG and a small inline script, for
`dractl simulate --html FILE`: one section per node, one box per GPU with its MIG devices drawn
to scale by memory slice (an A100 has 8; a 3g.40gb at start 4 covers slices 4..7), a full GPU
filled, the largest MIG profile still placeable outlined, the NVLink partitions (the driver's
`partition4`/`partition2` attributes) as bands under the GPUs they join, and, when given, the
utilisation over time as a step chart. Claim names are hover titles; hovering a claim lights up
everything it holds.

The page references nothing outside itself (no network, no CDN, no fonts). Elements carry data
attributes for tests and tools: `data-node`, `data-gpu` (`node/device`) and `data-state` on each
GPU box, `data-slice-start`/`data-slice-size`/`data-claim`/`data-profile` on each MIG slice drawn,
`data-claim` on a full GPU's fill, `data-partition` (`<size>:<id>`) on NVLink bands, and
`data-series-points` on the chart. The script sets `data-ready` on `<html>` once it ran and
records script errors in `data-errors`.

With `frames` (moments of a replay, see `Frame`) and at most `OVERVIEW_NODES` nodes, the page
starts with an overview that fits one screen: per moment, a tile per node with one small cell
per GPU, coloured by the kind of claim holding it (`kind_of`: MIG devices, or the number of whole
GPUs the claim holds) and filled to scale for MIG devices, GPUs whose free memory is stranded
(`metrics.stranded_memory`, judged against the request shapes seen by then) outlined in red,
nodes with every GPU free outlined in green; beside it the claim kinds held (claims and GPUs'
worth), the claims waiting and the claims refused since the previous moment, each with its
reasons. A slider (`<input type="range">`) picks the moment; the page opens on the first
rejection when there is one (`#frame=N` in the address opens moment N). Attributes for tests:
`data-frame` (index), `data-at` and `data-first-rejection` on each moment, `hidden` on every
moment but the one shown, `data-overview-node`, `data-whole-free` on node tiles, `data-cell`
(`node/device`), `data-kind` and `data-stranded` (bytes) on GPU cells, `data-waiting` and
`data-refused` (claim keys) on list items; the script sets `data-frames` and `data-shown` on
`<html>`, and the header's summary (`data-summary-at`: the moment's `data-at`) to the moment shown.

Gangs (`gangs`: the PodGroup of each claim of a gang's pod, and `Frame.gangs`): the claims of one gang
share its colour, their hover titles and cells name it (`gang ml/train`) and carry `data-gang`, and a
legend lists each gang held (`data-gang-legend`: its claims, GPUs and nodes), at the end and per moment.

What it must not do: allocate, read or write files (the CLI writes the returned text), or
fetch anything. Pure: equal inputs give the same text.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from dractl import model
from dractl.simulate import metrics

_GIB = 2**30
_BAR_WIDTH = 148
_BAR_HEIGHT = 30
_CHART_WIDTH = 720
_CHART_HEIGHT = 180
_NUMBER = re.compile(r"([0-9]+)")
OVERVIEW_NODES = 64  # past this many nodes the overview would not fit one screen: it is left out
_CELL_HEIGHT = 26
_LISTED = 12  # waiting or refused claims listed per moment; the rest are counted
# Claim kinds of the overview and their colours; a count of whole GPUs not listed gets the last.
_KINDS = {"MIG": "#8e5cc7", "1 GPU": "#3b7dd8", "2 GPUs": "#1f9e89", "4 GPUs": "#e08a1e", "8 GPUs": "#c8413b"}
_OTHER_KIND = "#7a6a58"


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One moment of a replay for the overview: when (`at` seconds, after event `event` of
    `events`), what was held (`claims`, with their allocations), the request shapes seen by then
    (stranded memory is judged against them), the claims waiting then and those refused since the
    previous moment (claim key, reasons), and whether this is the moment of the first rejection."""

    at: float
    event: int
    events: int
    claims: tuple[model.ResourceClaim, ...]
    shapes: tuple[metrics.RequestShape, ...]
    waiting: tuple[tuple[str, tuple[str, ...]], ...] = ()
    refused: tuple[tuple[str, tuple[str, ...]], ...] = ()
    first_rejection: bool = False
    gangs: tuple[tuple[str, str], ...] = ()
    """The held claims of gangs' pods: (claim key, PodGroup "namespace/name")."""


_CSS = """
:root { font-family: system-ui, sans-serif; color: #1d232b; background: #f6f7f9; }
body { margin: 24px; }
h1 { font-size: 20px; margin: 0 0 4px; }
.summary { color: #4a5563; margin: 0 0 18px; }
section.node { background: #fff; border: 1px solid #d5dae1; border-radius: 8px; padding: 12px 14px; width: max-content;
  margin: 0 0 14px; }
section.node h2 { font-size: 15px; margin: 0 0 8px; }
section.node h2 small { font-weight: normal; color: #5b6573; margin-left: 8px; }
.gpus { display: grid; grid-template-columns: repeat(var(--columns), 160px); gap: 6px 8px; }
.gpu { border: 1px solid #c4cad3; border-radius: 6px; padding: 4px 5px; background: #fbfcfd; }
.gpu[data-state=full] { border-color: #6b7686; }
.gpu .label { font-size: 11px; display: flex; justify-content: space-between; margin-bottom: 3px; }
.gpu .label span:last-child { color: #5b6573; }
.partition { font-size: 11px; text-align: center; border-radius: 4px; padding: 1px 0; background: #e7ebf0;
  color: #3c4654; }
.partition.held { background: #cfe3d6; color: #1f4d2f; }
svg rect.slice, svg rect.whole { stroke: #ffffff; stroke-width: 1; }
svg .hl { stroke: #111 !important; stroke-width: 2.5 !important; }
.chart { background: #fff; border: 1px solid #d5dae1; border-radius: 8px; padding: 10px 14px; margin: 0 0 18px;
  display: inline-block; }
.chart h2 { font-size: 15px; margin: 0 0 6px; }
.legend { font-size: 12px; color: #5b6573; margin: 0 0 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; vertical-align: -2px; margin: 0 4px 0 12px;
  border-radius: 2px; }
.overview { background: #fff; border: 1px solid #d5dae1; border-radius: 8px; padding: 10px 14px; margin: 0 0 18px; }
.overview h2 { font-size: 15px; margin: 0 0 6px; }
.overview .slider { font-size: 13px; margin: 0 0 8px; display: flex; gap: 10px; align-items: center; }
.overview .slider input { width: 420px; }
.frame { display: flex; gap: 16px; align-items: flex-start; }
.frame[hidden] { display: none; }
.tiles { display: grid; grid-template-columns: repeat(5, max-content); gap: 6px; }
.tile { border: 1px solid #d5dae1; border-radius: 5px; padding: 3px 4px; font-size: 10px; }
.tile[data-whole-free] { border: 2px solid #2b7a4b; padding: 2px 3px; }
.tile .cells { display: flex; gap: 2px; margin-top: 2px; }
.cell { width: 14px; height: 26px; background: #e9edf2; border-radius: 2px; position: relative; overflow: hidden; }
.cell i { position: absolute; left: 0; width: 14px; }
.cell[data-stranded] { outline: 2px dashed #c62828; outline-offset: -1px; }
.side { font-size: 12px; max-width: 460px; }
.side h3 { font-size: 13px; margin: 4px 0; }
.side ul { margin: 0 0 6px; padding-left: 16px; }
.side li small { color: #5b6573; }
.gangs { background: #fff; border: 1px solid #d5dae1; border-radius: 8px; padding: 10px 14px; margin: 0 0 18px;
  font-size: 13px; }
.gangs h2 { font-size: 15px; margin: 0 0 6px; }
"""

# Hover highlighting and the readiness flag; errors are recorded on <html> for tests to read.
_SCRIPT = """
(function () {
  var root = document.documentElement;
  var errors = [];
  window.addEventListener('error', function (e) {
    errors.push(String(e.message || e.type));
    root.setAttribute('data-errors', errors.join(' | '));
  }, true);
  var held = document.querySelectorAll('[data-claim]');
  function light(claim, on) {
    for (var i = 0; i < held.length; i++) {
      if (held[i].getAttribute('data-claim').split(' ').indexOf(claim) >= 0) {
        held[i].classList.toggle('hl', on);
      }
    }
  }
  for (var i = 0; i < held.length; i++) {
    held[i].addEventListener('mouseenter', function (e) { light(e.target.getAttribute('data-claim'), true); });
    held[i].addEventListener('mouseleave', function (e) { light(e.target.getAttribute('data-claim'), false); });
  }
  var frames = document.querySelectorAll('[data-frame]');
  var slider = document.getElementById('moment');
  function show(n) {
    for (var i = 0; i < frames.length; i++) { frames[i].hidden = i !== n; }
    root.setAttribute('data-shown', String(n));
    var label = document.getElementById('moment-label');
    if (label && frames[n]) { label.textContent = frames[n].getAttribute('data-label'); }
    var summary = document.getElementById('summary');
    if (summary && frames[n]) {
      summary.textContent = frames[n].getAttribute('data-summary');
      summary.setAttribute('data-summary-at', frames[n].getAttribute('data-at'));
    }
  }
  if (frames.length) {
    var wanted = /^#frame=([0-9]+)$/.exec(window.location.hash);
    var start = wanted ? Math.min(Number(wanted[1]), frames.length - 1) : Number(slider.value);
    slider.value = String(start);
    slider.addEventListener('input', function () { show(Number(slider.value)); });
    show(start);
  }
  root.setAttribute('data-frames', String(frames.length));
  root.setAttribute('data-gpu-boxes', String(document.querySelectorAll('[data-gpu]').length));
  root.setAttribute('data-slices-drawn', String(document.querySelectorAll('[data-slice-start]').length));
  root.setAttribute('data-ready', '1');
})();
"""


def _colours(gpus: Iterable[metrics.Gpu], gangs: Mapping[str, str]) -> dict[str, str]:
    """A colour per claim, in order of first appearance: hues a golden angle apart, so claims
    drawn side by side differ, and the same input always gets the same colours. The claims of one
    gang share the gang's colour."""
    names: dict[str, str] = {}
    by_owner: dict[str, str] = {}
    for gpu in gpus:
        for holders in (gpu.holders, *(p.holders for p in gpu.placements)):
            for name in holders:
                owner = gangs.get(name, name)
                if owner not in by_owner:
                    hue = (len(by_owner) * 137.508 + 200) % 360
                    light = (48, 58, 66)[len(by_owner) % 3]
                    by_owner[owner] = f"hsl({hue:.0f}, 60%, {light}%)"
                names[name] = by_owner[owner]
    return names


def _named(holders: Sequence[str], gangs: Mapping[str, str]) -> str:
    """The holders as a hover title names them, each with its gang."""
    return ", ".join(f"{name} (gang {gangs[name]})" if name in gangs else name for name in holders)


def _gang_attribute(holders: Sequence[str], gangs: Mapping[str, str]) -> str:
    """` data-gang="..."` with the holders' gangs, or nothing when none is in a gang."""
    found = sorted({gangs[name] for name in holders if name in gangs})
    return f' data-gang="{html.escape(" ".join(found))}"' if found else ""


def _summary(measured: metrics.Metrics) -> str:
    c = measured.cluster
    return (
        f"{len(measured.nodes)} nodes, {c.gpus} GPUs: {c.full} full, {c.partitioned} partitioned, {c.free} free; "
        f"GPU memory allocated {_gib(c.memory_allocated)} of {_gib(c.memory)}."
    )


def _gib(value: int) -> str:
    return f"{value / _GIB:.1f}Gi"


def _natural(text: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _NUMBER.split(text))


def _order(gpu: metrics.Gpu) -> tuple[object, ...]:
    module = gpu.attributes.get("gpuModuleID", "")
    return (0, int(module), "") if module.isdigit() else (1, 0, _natural(gpu.device))


def render(
    slices: Sequence[model.ResourceSlice],
    claims: Iterable[model.ResourceClaim],
    *,
    series: metrics.TimeMetrics | Sequence[tuple[float, float]] | None = None,
    frames: Sequence[Frame] = (),
    title: str = "dractl allocation map",
    gangs: Iterable[tuple[str, str]] = (),
) -> str:
    """The whole page for the claims' allocations over the slices, with the utilisation chart
    when `series` (a `metrics.TimeMetrics` or (seconds, share 0..1) points) has points, the
    overview of `frames` when there are any and at most `OVERVIEW_NODES` nodes, and the gangs of
    `gangs` ((claim key, PodGroup) of the claims held by gangs' pods). Pure."""
    claims = tuple(claims)
    gang_of = dict(gangs)
    measured = metrics.measure(slices, claims, label=title)
    points = series.points if isinstance(series, metrics.TimeMetrics) else tuple(series or ())
    c = measured.cluster
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        f'<body data-gpus-total="{c.gpus}">',
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="summary" id="summary">{html.escape(_summary(measured))}</p>',
        (
            '<p class="legend">Each bar is one GPU\'s memory, divided into its MIG memory slices where it has them.'
            '<i style="background:#9aa5b4"></i>claim (hover for its name)'
            '<i style="border:1.5px dashed #2b7a4b"></i>largest MIG profile still placeable</p>'
        ),
    ]
    if frames and len(measured.nodes) <= OVERVIEW_NODES:
        parts.append(_overview(slices, frames))
    if points:
        parts.append(_chart(points))
    by_node: dict[str, list[metrics.Gpu]] = {}
    for gpu in measured.gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    if gang_of:
        parts.append(
            f'<section class="gangs"><h2>Gangs at the end</h2>{_gang_legend(claims, measured.gpus, gang_of)}</section>'
        )
    colours = _colours(measured.gpus, gang_of)
    for node in measured.nodes:
        parts.append(_node(node, sorted(by_node[node.node], key=_order), colours=colours, gangs=gang_of))
    parts += [f"<script>{_SCRIPT}</script>", "</body>", "</html>", ""]
    return "\n".join(parts)


def _gang_legend(claims: Iterable[model.ResourceClaim], gpus: Iterable[metrics.Gpu], gangs: Mapping[str, str]) -> str:
    """Each gang held: its claims, the GPUs (or MIG devices) they hold and the nodes, as a list; empty without gangs."""
    nodes: dict[str, set[str]] = {}
    for gpu in gpus:
        for name in (*gpu.holders, *(n for p in gpu.placements for n in p.holders)):
            if name in gangs:
                nodes.setdefault(gangs[name], set()).add(gpu.node)
    held: dict[str, list[int]] = {}
    for claim in claims:
        gang = gangs.get(claim.key)
        if gang is not None:
            count = held.setdefault(gang, [0, 0])
            count[0] += 1
            count[1] += len(claim.allocation.results) if claim.allocation is not None else 0
    items = [
        f'<li data-gang-legend="{html.escape(gang)}">gang {html.escape(gang)}: {_count(count[0], "claim")}, '
        f"{_count(count[1], 'device')} on {html.escape(', '.join(sorted(nodes.get(gang, ()), key=_natural)))}</li>"
        for gang, count in sorted(held.items())
    ]
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _node(
    node: metrics.NodeMetrics, gpus: Sequence[metrics.Gpu], *, colours: Mapping[str, str], gangs: Mapping[str, str]
) -> str:
    products = sorted({g.product for g in gpus if g.product})
    detail = (
        f"{', '.join(products)} · {node.gpus} GPUs: {node.full} full, {node.partitioned} partitioned, "
        f"{node.free} free · {_gib(node.memory_allocated)} / {_gib(node.memory)}"
    )
    out = [
        f'<section class="node" data-node="{html.escape(node.node)}">',
        f"<h2>{html.escape(node.node)}<small>{html.escape(detail)}</small></h2>",
        f'<div class="gpus" style="--columns:{max(len(gpus), 1)}">',
    ]
    out.extend(_gpu(gpu, column=i + 1, colours=colours, gangs=gangs) for i, gpu in enumerate(gpus))
    out.extend(_partitions(gpus))
    out += ["</div>", "</section>"]
    return "\n".join(out)


def _gpu(gpu: metrics.Gpu, *, column: int, colours: Mapping[str, str], gangs: Mapping[str, str]) -> str:
    label = (
        f'<div class="label"><span>{html.escape(gpu.device)}</span>'
        f"<span>{_gib(gpu.allocated_memory)} / {_gib(gpu.memory)}</span></div>"
    )
    bar = [
        f'<svg width="{_BAR_WIDTH}" height="{_BAR_HEIGHT}" viewBox="0 0 {_BAR_WIDTH} {_BAR_HEIGHT}" role="img">',
        f'<rect x="0" y="0" width="{_BAR_WIDTH}" height="{_BAR_HEIGHT}" rx="3" fill="#e9edf2"/>',
    ]
    if gpu.slices:
        step = _BAR_WIDTH / gpu.slices
        bar.extend(
            f'<line x1="{i * step:.2f}" y1="0" x2="{i * step:.2f}" y2="{_BAR_HEIGHT}" stroke="#c9d0d9"/>'
            for i in range(1, gpu.slices)
        )
    if gpu.holders:
        names = " ".join(gpu.holders)
        tip = f"{_named(gpu.holders, gangs)} · full GPU · {_gib(gpu.memory)}"
        bar.append(
            f'<rect class="whole" x="0" y="0" width="{_BAR_WIDTH}" height="{_BAR_HEIGHT}" rx="3" '
            f'fill="{colours[gpu.holders[0]]}" data-claim="{html.escape(names)}"{_gang_attribute(gpu.holders, gangs)}>'
            f"<title>{html.escape(tip)}</title></rect>"
        )
    elif gpu.slices:
        step = _BAR_WIDTH / gpu.slices
        for p in gpu.placements:
            if not p.holders:
                continue
            last = p.start + p.size - 1
            tip = f"{_named(p.holders, gangs)} · {p.profile} · slices {p.start}-{last} · {_gib(p.memory)} · {p.device}"
            bar.append(
                f'<rect class="slice" x="{p.start * step:.2f}" y="0" width="{p.size * step:.2f}" '
                f'height="{_BAR_HEIGHT}" rx="2" fill="{colours[p.holders[0]]}" '
                f'data-slice-start="{p.start}" data-slice-size="{p.size}" data-profile="{html.escape(p.profile)}" '
                f'data-claim="{html.escape(" ".join(p.holders))}"{_gang_attribute(p.holders, gangs)}>'
                f"<title>{html.escape(tip)}</title></rect>"
            )
        if gpu.largest is not None and gpu.state is metrics.State.PARTITIONED:
            p = gpu.largest
            tip = f"largest MIG profile still placeable: {p.profile} at slice {p.start}"
            bar.append(
                f'<rect class="largest" x="{p.start * step + 1.5:.2f}" y="1.5" width="{p.size * step - 3:.2f}" '
                f'height="{_BAR_HEIGHT - 3}" fill="none" stroke="#2b7a4b" stroke-width="1.5" stroke-dasharray="4 3" '
                f'data-largest="{html.escape(p.profile)}"><title>{html.escape(tip)}</title></rect>'
            )
    bar.append("</svg>")
    title = f"{gpu.key} · {gpu.product} · {gpu.state.value}" + (f" · {gpu.uuid}" if gpu.uuid else "")
    return (
        f'<div class="gpu" style="grid-column:{column};grid-row:1" data-gpu="{html.escape(gpu.key)}" '
        f'data-state="{gpu.state.value}" title="{html.escape(title)}">{label}{"".join(bar)}</div>'
    )


def _partitions(gpus: Sequence[metrics.Gpu]) -> list[str]:
    """NVLink partition bands of 4 and 2 GPUs, each spanning its GPUs when they sit side by side."""
    out: list[str] = []
    for row, size in enumerate(("4", "2"), start=2):
        groups: dict[str, list[int]] = {}
        for column, gpu in enumerate(gpus, start=1):
            pid = gpu.attributes.get(f"partition{size}")
            if pid:
                groups.setdefault(pid, []).append(column)
        for pid, columns in sorted(groups.items(), key=lambda item: item[1][0]):
            if columns != list(range(columns[0], columns[-1] + 1)):
                continue  # Not side by side in module order: a band would claim GPUs it does not join.
            members = [gpus[c - 1] for c in columns]
            owners = {g.holders for g in members}
            held = len(owners) == 1 and members[0].holders != ()
            tip = f"NVLink partition{size} {pid}: " + ", ".join(g.device for g in members)
            if held:
                tip += f" · held whole by {', '.join(members[0].holders)}"
            out.append(
                f'<div class="partition{" held" if held else ""}" data-partition="{size}:{html.escape(pid)}" '
                f'style="grid-column:{columns[0]} / {columns[-1] + 1};grid-row:{row}" title="{html.escape(tip)}">'
                f"NVLink {size}-GPU partition {html.escape(pid)}</div>"
            )
    return out


def kind_of(claim: model.ResourceClaim, placements: Mapping[tuple[str, str], metrics.Placement]) -> str:
    """The overview's kind of an allocated claim: `MIG` when it holds a MIG device, else how many
    whole GPUs it holds (`1 GPU`, `2 GPUs` ...)."""
    results = claim.allocation.results if claim.allocation is not None else ()
    if any((r.pool, r.device) in placements for r in results):
        return "MIG"
    return f"{len(results)} GPU" + ("" if len(results) == 1 else "s")


def _overview(slices: Sequence[model.ResourceSlice], frames: Sequence[Frame]) -> str:
    """The overview: a slider over the moments and one block per moment (see the module docstring)."""
    shown = next((i for i, f in enumerate(frames) if f.first_rejection), len(frames) - 1)
    first = "the first rejection" if frames[shown].first_rejection else "the end"
    out = [
        '<section class="overview">',
        f"<h2>Cluster over the trace ({len(frames)} moments; opens at {first})</h2>",
        '<div class="slider"><label for="moment">moment</label>'
        f'<input id="moment" type="range" min="0" max="{len(frames) - 1}" step="1" value="{shown}">'
        '<span id="moment-label"></span></div>',
        '<p class="legend">Cells are GPUs, coloured by the kind of claim holding them (MIG devices to scale):'
        + "".join(f'<i style="background:{c}"></i>{html.escape(k)}' for k, c in _KINDS.items())
        + f'<i style="background:{_OTHER_KIND}"></i>other'
        + '<i style="outline:2px dashed #c62828"></i>stranded memory'
        + '<i style="border:2px solid #2b7a4b"></i>node with every GPU free</p>',
    ]
    out.extend(_frame(slices, i, f, hidden=i != shown) for i, f in enumerate(frames))
    out.append("</section>")
    return "\n".join(out)


def _frame(slices: Sequence[model.ResourceSlice], index: int, frame: Frame, *, hidden: bool) -> str:
    measured = metrics.measure(slices, frame.claims, shapes=frame.shapes)
    placements = {(g.pool, p.device): p for g in measured.gpus for p in g.placements}
    kinds = {c.key: kind_of(c, placements) for c in frame.claims}
    by_node: dict[str, list[metrics.Gpu]] = {}
    for gpu in measured.gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    label = f"t={frame.at:g}s, after event {frame.event} of {frame.events}" + (
        " (first rejection)" if frame.first_rejection else ""
    )
    summary = f"At {label}: {_summary(measured)} The nodes below show the end of the trace."
    gangs = dict(frame.gangs)
    out = [
        f'<div class="frame" data-frame="{index}" data-at="{frame.at:g}" data-label="{html.escape(label)}"'
        f' data-summary="{html.escape(summary)}"'
        + (' data-first-rejection="1"' if frame.first_rejection else "")
        + (" hidden" if hidden else "")
        + '><div class="tiles">'
    ]
    for node in measured.nodes:
        gpus = sorted(by_node[node.node], key=_order)
        whole = " data-whole-free" if all(g.state is metrics.State.FREE for g in gpus) else ""
        cells = "".join(_cell(g, kinds, gangs) for g in gpus)
        out.append(
            f'<div class="tile" data-overview-node="{html.escape(node.node)}"{whole}>'
            f"{html.escape(node.node)} · {node.free}/{node.gpus} free"
            f'<div class="cells">{cells}</div></div>'
        )
    out.append("</div>")
    out.append(_side(frame, kinds, _gang_legend(frame.claims, measured.gpus, gangs)))
    out.append("</div>")
    return "".join(out)


def _cell(gpu: metrics.Gpu, kinds: Mapping[str, str], gangs: Mapping[str, str]) -> str:
    """One GPU of the overview: filled by its whole-GPU holder, or by its MIG devices to scale."""
    tip = [f"{gpu.key} · {gpu.product} · {gpu.state.value}"]
    fill = ""
    kind = ""
    if gpu.holders:
        kind = kinds.get(gpu.holders[0], "")
        fill = f' style="background:{_KINDS.get(kind, _OTHER_KIND)}"'
        tip.append(f"{_named(gpu.holders, gangs)} ({kind})")
    parts = []
    if gpu.slices and not gpu.holders:
        for p in gpu.placements:
            if p.holders:
                top, height = p.start * _CELL_HEIGHT / gpu.slices, p.size * _CELL_HEIGHT / gpu.slices
                parts.append(f'<i style="top:{top:.1f}px;height:{height:.1f}px;background:{_KINDS["MIG"]}"></i>')
                tip.append(f"{_named(p.holders, gangs)}: {p.profile} at slice {p.start}")
        kind = "MIG" if parts else ""
    stranded = ""
    if gpu.stranded:
        stranded = f' data-stranded="{gpu.stranded}"'
        tip.append(f"stranded {_gib(gpu.stranded)}: no request shape seen can use it")
    holders = (*gpu.holders, *(n for p in gpu.placements for n in p.holders))
    return (
        f'<div class="cell" data-cell="{html.escape(gpu.key)}" data-kind="{html.escape(kind)}"{stranded}{fill}'
        f"{_gang_attribute(holders, gangs)} "
        f'title="{html.escape(" · ".join(tip))}">{"".join(parts)}</div>'
    )


def _side(frame: Frame, kinds: Mapping[str, str], gangs: str) -> str:
    """The claim kinds held, the gangs held (`gangs`, a `_gang_legend`), the claims waiting and the claims refused
    since the previous moment."""
    held: dict[str, list[int]] = {}
    for claim in frame.claims:
        count = held.setdefault(kinds[claim.key], [0, 0])
        count[0] += 1
        count[1] += len(claim.allocation.results) if claim.allocation is not None else 0
    order = [*_KINDS, *sorted(set(held) - _KINDS.keys())]
    rows = [
        f'<li data-held-kind="{html.escape(k)}">{html.escape(k)}: {_count(held[k][0], "claim")}, '
        f"{_count(held[k][1], 'device')}</li>"
        for k in order
        if k in held
    ]
    out = ['<div class="side">', f"<h3>Held: {_count(len(frame.claims), 'claim')}</h3><ul>{''.join(rows)}</ul>"]
    if gangs:
        out.append(f"<h3>Gangs</h3>{gangs}")
    for title, entries, attribute in (
        ("Waiting", frame.waiting, "data-waiting"),
        ("Refused since the previous moment", frame.refused, "data-refused"),
    ):
        items = [
            f'<li {attribute}="{html.escape(key)}">{html.escape(key)}<br><small>{html.escape("; ".join(reasons))}'
            "</small></li>"
            for key, reasons in entries[:_LISTED]
        ]
        more = f"<li>and {len(entries) - _LISTED} more</li>" if len(entries) > _LISTED else ""
        out.append(f"<h3>{title}: {len(entries)}</h3><ul>{''.join(items)}{more}</ul>")
    out.append("</div>")
    return "".join(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _chart(points: Sequence[tuple[float, float]]) -> str:
    """Utilisation over time as an inline SVG step chart, 0-100% on the y axis."""
    left, bottom, top, right = 44, 24, 10, 12
    width, height = _CHART_WIDTH - left - right, _CHART_HEIGHT - top - bottom
    start, end = points[0][0], points[-1][0]
    span = end - start if end > start else 1.0

    def x(t: float) -> float:
        return left + (t - start) / span * width

    def y(share: float) -> float:
        return top + (1 - min(max(share, 0.0), 1.0)) * height

    path = [f"M{x(points[0][0]):.1f},{y(points[0][1]):.1f}"]
    for (_, previous), (t, share) in itertools.pairwise(points):
        path.append(f"L{x(t):.1f},{y(previous):.1f}L{x(t):.1f},{y(share):.1f}")
    axes = [
        f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" stroke="#8a94a3"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#8a94a3"/>',
    ]
    for share in (0.0, 0.5, 1.0):
        axes.append(
            f'<text x="{left - 6}" y="{y(share) + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="#4a5563">{share:.0%}</text>'
        )
    for t in (start, end):
        axes.append(
            f'<text x="{x(t):.1f}" y="{_CHART_HEIGHT - 6}" font-size="11" text-anchor="middle" '
            f'fill="#4a5563">{t:g}s</text>'
        )
    return (
        f'<div class="chart"><h2>GPU memory allocated over time</h2>'
        f'<svg width="{_CHART_WIDTH}" height="{_CHART_HEIGHT}" viewBox="0 0 {_CHART_WIDTH} {_CHART_HEIGHT}" '
        f'data-series-points="{len(points)}" role="img"><title>utilisation over time</title>{"".join(axes)}'
        f'<path d="{"".join(path)}" fill="none" stroke="#2f6fb3" stroke-width="2"/></svg></div>'
    )
