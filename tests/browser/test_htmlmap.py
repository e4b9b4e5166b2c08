"""The HTML allocation map in a real browser: GPU boxes, MIG slices at their offsets, NVLink bands, no errors,
also for a replayed trace with its utilisation chart."""

from __future__ import annotations

import html
import html.parser
import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from dractl import cli, config, model, simulate
from dractl.model import decode
from dractl.simulate import htmlmap, metrics, replay, trace

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

A100 = "dgx-a100-01"
H100 = "dgx-h100-01"


class _Elements(html.parser.HTMLParser):
    """Every element of a document with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.root: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "html":
            self.root = values
        self.found.append((tag, values))


def _parse(dom: str) -> _Elements:
    parser = _Elements()
    parser.feed(dom)
    return parser


def _claim(name: str, pool: str, *devices: str) -> model.ResourceClaim:
    results = tuple(
        model.DeviceRequestAllocationResult(request=f"r{i}", driver="gpu.nvidia.com", pool=pool, device=d)
        for i, d in enumerate(devices)
    )
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace="default"),
        spec=model.ResourceClaimSpec(),
        allocation=model.AllocationResult(results=results),
    )


def _cluster() -> tuple[tuple[model.ResourceSlice, ...], list[model.ResourceClaim]]:
    """The three example nodes: on the A100 a 1g.10gb at 0 and a 3g.40gb at 4 on gpu-0 and gpu-1 whole;
    on the H100 four GPUs of NVLink partition4 1 for one claim."""
    files = [simulate.EXAMPLES / f for f in ("20-dgx-a100-01.yaml", "21-dgx-h100-01.yaml", "22-t4-node-01.yaml")]
    slices = decode.load_paths(files).resource_slices
    claims = [
        _claim("mig-small", A100, "gpu-0-mig-1g10gb-19-0"),
        _claim("mig-large", A100, "gpu-0-mig-3g40gb-9-4"),
        _claim("whole", A100, "gpu-1"),
        _claim("nvlink4", H100, "gpu-0", "gpu-1", "gpu-2", "gpu-3"),
    ]
    return slices, claims


def test_allocation_map_draws_gpus_slices_and_partitions(
    render: Callable[[pathlib.Path], Any], tmp_path: pathlib.Path
) -> None:
    """18 GPU boxes, two MIG slices at their memory-slice offsets, full GPUs filled, a held NVLink band, no errors."""
    slices, claims = _cluster()
    series = metrics.Series()
    for at, used in ((0.0, 0), (60.0, 40), (120.0, 90), (180.0, 30)):
        series.sample(at, used=used, total=100)
    text = htmlmap.render(slices, claims, series=series.result(), title="test map")
    # Self-contained: nothing is fetched, so nothing may name a URL or an external resource.
    assert not re.search(r"https?:|\bsrc=|\bhref=|url\(|@import", text)
    page_file = tmp_path / "map.html"
    page_file.write_text(text, encoding="utf-8")

    page = render(page_file)
    assert page.console == []
    found = _parse(page.dom)
    assert found.root.get("data-ready") == "1" and "data-errors" not in found.root
    assert found.root.get("data-gpu-boxes") == "18"

    boxes = {a["data-gpu"]: a for _, a in found.found if "data-gpu" in a}
    assert len(boxes) == 18
    assert {k: v["data-state"] for k, v in boxes.items() if v["data-state"] != "free"} == {
        f"{A100}/gpu-0": "partitioned",
        f"{A100}/gpu-1": "full",
        **{f"{H100}/gpu-{i}": "full" for i in range(4)},
    }

    drawn = [a for _, a in found.found if "data-slice-start" in a]
    by_claim = {a["data-claim"]: a for a in drawn}
    assert sorted(by_claim) == ["default/mig-large", "default/mig-small"]
    width = htmlmap._BAR_WIDTH / 8
    expected = (("default/mig-large", 4, 4, "3g.40gb"), ("default/mig-small", 0, 1, "1g.10gb"))
    for claim, start, size, profile in expected:
        rect = by_claim[claim]
        assert (int(rect["data-slice-start"]), int(rect["data-slice-size"]), rect["data-profile"]) == (
            start,
            size,
            profile,
        )
        assert float(rect["x"]) == pytest.approx(start * width, abs=0.01)
        assert float(rect["width"]) == pytest.approx(size * width, abs=0.01)

    fills = [a["data-claim"] for t, a in found.found if t == "rect" and a.get("class") == "whole"]
    assert sorted(fills) == ["default/nvlink4"] * 4 + ["default/whole"]
    largest = [a["data-largest"] for _, a in found.found if "data-largest" in a]
    assert largest == ["2g.20gb"]

    bands = [(a["data-partition"], a["class"]) for _, a in found.found if "data-partition" in a]
    assert ("4:1", "partition held") in bands and ("4:2", "partition") in bands
    charts = [a for _, a in found.found if "data-series-points" in a]
    assert [c["data-series-points"] for c in charts] == ["4"]


def test_console_errors_are_seen(render: Callable[[pathlib.Path], Any], tmp_path: pathlib.Path) -> None:
    """The console check can fail: a page that logs an error and throws shows both in the browser's log."""
    page_file = tmp_path / "bad.html"
    page_file.write_text(
        "<!DOCTYPE html><html><body><script>console.error('boom'); missing();</script></body></html>", encoding="utf-8"
    )
    console = render(page_file).console
    assert any('"boom"' in line for line in console)
    assert any("missing is not defined" in line for line in console)


def test_replayed_trace_map_has_every_gpu_its_slices_and_the_utilisation_chart(
    render: Callable[[pathlib.Path], Any], tmp_path: pathlib.Path
) -> None:
    """`dractl simulate --trace --html` on a generated trace: one box per GPU, every held MIG slice
    at its memory-slice offset, the replay's utilisation chart, and no console errors."""
    spec = "mix=reference,seed=5,claims=80,a100=2,h100=1,t4=1,round=20"
    trace_file = tmp_path / "trace.yaml"
    trace.write(trace.generate(spec), trace_file)
    page_file = tmp_path / "replay.html"
    invoked = CliRunner().invoke(
        cli.main, ["simulate", "--trace", str(trace_file), "--html", str(page_file), "-o", "json"]
    )
    assert invoked.exit_code == 0, invoked.stderr
    expected = replay.replay(trace.load(trace_file))
    assert expected.metrics.time is not None

    page = render(page_file)
    assert page.console == []
    found = _parse(page.dom)
    assert found.root.get("data-ready") == "1" and "data-errors" not in found.root
    gpus = 2 * 8 + 8 + 2
    assert found.root.get("data-gpu-boxes") == str(gpus)
    assert len({a["data-gpu"] for _, a in found.found if "data-gpu" in a}) == gpus

    # Every held MIG device is drawn at its memory-slice offset, with its claim.
    held = {
        (claim, p.device): (p.start, p.size)
        for g in expected.metrics.gpus
        if not g.holders
        for p in g.placements
        for claim in p.holders[:1]
    }
    drawn = {
        (a["data-claim"].split(" ")[0], a["data-profile"], int(a["data-slice-start"]), int(a["data-slice-size"]))
        for _, a in found.found
        if "data-slice-start" in a
    }
    assert held, "the trace should leave MIG slices held at the end"
    assert len(drawn) == len(held)
    profiles = {p.device: p.profile for g in expected.metrics.gpus for p in g.placements if p.holders and not g.holders}
    assert drawn == {(claim, profiles[device], start, size) for (claim, device), (start, size) in held.items()}
    width = htmlmap._BAR_WIDTH / 8
    for _, a in found.found:
        if "data-slice-start" in a:
            assert float(a["x"]) == pytest.approx(int(a["data-slice-start"]) * width, abs=0.01)

    charts = [a for _, a in found.found if "data-series-points" in a]
    assert [int(c["data-series-points"]) for c in charts] == [len(expected.metrics.time.points)]
    assert len(expected.metrics.time.points) > 10


def _frames(found: _Elements) -> list[dict[str, str]]:
    return [a for t, a in found.found if t == "div" and "data-frame" in a]


def test_overview_shows_the_cluster_at_the_first_rejection_and_moves_with_the_slider(
    render: Callable[..., Any], tmp_path: pathlib.Path
) -> None:
    """The overview of a replayed 20-node trace opens at the first rejection: 20 node tiles, GPU cells coloured
    by claim kind, stranded memory marked where the metrics find it, the refused claim with its reason; another
    moment shows alone when the address asks for it."""
    generated = trace.generate("mix=h100-nvlink,seed=3,claims=120,departures=0")
    result = replay.replay(generated, policy=config.Policy.BINPACK, retry=config.Retry.NEVER, frames=6)
    first = [i for i, f in enumerate(result.frames) if f.first_rejection]
    assert len(result.frames) == 7 and len(first) == 1
    moment = result.frames[first[0]]
    text = htmlmap.render(generated.cluster.resource_slices, result.held, frames=result.frames, title="overview")
    page_file = tmp_path / "overview.html"
    page_file.write_text(text, encoding="utf-8")

    page = render(page_file)
    assert page.console == []
    found = _parse(page.dom)
    assert found.root.get("data-ready") == "1" and "data-errors" not in found.root
    assert (found.root.get("data-frames"), found.root.get("data-shown")) == ("7", str(first[0]))
    assert [a["data-frame"] for a in _frames(found) if "hidden" not in a] == [str(first[0])]
    shown = _parse(text.split(f'data-frame="{first[0]}"', 1)[1].split('data-frame="', 1)[0])
    assert len([a for _, a in shown.found if "data-overview-node" in a]) == 20
    measured = metrics.measure(generated.cluster.resource_slices, moment.claims, shapes=moment.shapes)
    stranded = {g.key for g in measured.gpus if g.stranded}
    assert stranded and {a["data-cell"] for _, a in shown.found if "data-stranded" in a} == stranded
    kinds = {a["data-kind"] for _, a in shown.found if "data-cell" in a}
    assert {"MIG", "1 GPU", "4 GPUs", "8 GPUs"} <= kinds
    refused = [a["data-refused"] for _, a in shown.found if "data-refused" in a]
    assert refused == [moment.refused[0][0]] and moment.refused[0][1]
    assert html.escape(moment.refused[0][1][0]) in text

    again = _parse(render(page_file, "frame=0").dom)
    assert again.root.get("data-shown") == "0"
    assert [a["data-frame"] for a in _frames(again) if "hidden" not in a] == ["0"]


def _without_departures_of_gangs(spec: str) -> trace.Trace:
    """The generated trace of `spec` with its gangs staying to the end (their departs-after annotations dropped)."""
    document = trace.generate(spec).document
    for event in document["spec"]["events"]:
        arriving = event.get("arrive", {})
        if arriving.get("kind") in ("Pod", "PodGroup"):
            arriving["metadata"]["annotations"].pop(trace.DEPARTS_AFTER)
    return trace.parse(document, file="gangs.yaml")


def test_map_names_each_gang_and_its_header_follows_the_moment_shown(
    render: Callable[..., Any], tmp_path: pathlib.Path
) -> None:
    """Guards: with gangs, every drawn claim of a gang's pod names its gang (hover title, `data-gang`) in its gang's
    one colour, a legend lists each gang held at the end and per moment, and the header's summary is that of the
    moment shown (the one the page opens on, and another one the address asks for)."""
    generated = _without_departures_of_gangs("mix=reference,seed=1,claims=60,a100=4,h100=4,t4=0,gangs=4")
    result = replay.replay(generated, frames=6)
    gang_of = dict(result.gangs)
    assert set(gang_of.values()) == {"default/g-1", "default/g-2", "default/g-3", "default/g-4"}
    text = htmlmap.render(
        generated.cluster.resource_slices, result.held, frames=result.frames, gangs=result.gangs, title="gangs"
    )
    page_file = tmp_path / "gangs.html"
    page_file.write_text(text, encoding="utf-8")

    page = render(page_file)
    assert page.console == []
    found = _parse(page.dom)
    assert found.root.get("data-ready") == "1" and "data-errors" not in found.root
    legend = [a["data-gang-legend"] for _, a in found.found if "data-gang-legend" in a]
    end = text.split('<section class="gangs">', 1)[1].split("</section>", 1)[0]
    assert [a["data-gang-legend"] for _, a in _parse(end).found if "data-gang-legend" in a] == sorted(
        set(gang_of.values())
    )
    assert set(legend) == set(gang_of.values())
    rects = [a for t, a in found.found if t == "rect" and "data-claim" in a]
    ganged = [a for a in rects if any(claim in gang_of for claim in a["data-claim"].split(" "))]
    assert ganged and all(a.get("data-gang") == gang_of[a["data-claim"].split(" ")[0]] for a in ganged)
    assert all("data-gang" not in a for a in rects if a not in ganged)
    fills: dict[str, set[str]] = {}
    for a in ganged:
        fills.setdefault(a["data-gang"], set()).add(a["fill"])
    assert all(len(colours) == 1 for colours in fills.values()), fills
    claim, gang = next(iter(gang_of.items()))
    assert f"{html.escape(claim)} (gang {html.escape(gang)})" in text
    cells = {a["data-gang"] for _, a in found.found if "data-cell" in a and "data-gang" in a}
    assert cells <= set(gang_of.values()) and cells

    frames = _frames(found)
    shown = int(found.root["data-shown"])

    def summary(dom: str) -> tuple[str, str]:
        match = re.search(r'<p [^>]*id="summary"[^>]*data-summary-at="([^"]*)"[^>]*>([^<]*)</p>', dom)
        assert match is not None, "no summary for the moment shown"
        return match.group(1), html.unescape(match.group(2))

    assert summary(page.dom) == (frames[shown]["data-at"], frames[shown]["data-summary"])
    assert frames[shown]["data-summary"].startswith(f"At {frames[shown]['data-label']}: ")
    again = render(page_file, "frame=0")
    first = _frames(_parse(again.dom))[0]
    assert summary(again.dom) == (first["data-at"], first["data-summary"])
    assert first["data-summary"] != frames[shown]["data-summary"]
