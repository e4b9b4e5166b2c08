"""The output formats: -o json carries what -o yaml carries, the fast YAML writer equals PyYAML's,
big tables are plain text, and --timing prints one documented line per phase."""

from __future__ import annotations

import io
import json
import pathlib
import re

import hypothesis
import hypothesis.strategies as st
import pytest
import yaml
from support.simulate_manifests import CLASS, CLUSTER, claim, load, pod, template

from dractl import alloc, config, simulate
from dractl.model import encode
from dractl.simulate import EXAMPLES, engine, report, timing, yamlout

CONFIGURED_CLASS = (
    CLASS
    + """  config:
  - opaque: {driver: gpu.example.com, parameters: {sharing: {strategy: TimeSlicing}, ratio: 0.5, "on": "yes"}}
"""
)


def _run(paths: tuple[pathlib.Path, ...], output: config.OutputFormat, *, timing_on: bool = False) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = simulate.run(config.Simulate(paths=paths, output=output, timing=timing_on), out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def _write(tmp_path: pathlib.Path, *documents: str) -> tuple[pathlib.Path, ...]:
    path = tmp_path / "input.yaml"
    path.write_text("\n---\n".join(documents))
    return (path,)


@pytest.mark.parametrize("source", ["example", "configured"])
def test_json_carries_what_yaml_carries(tmp_path: pathlib.Path, source: str) -> None:
    """Guards: each claim's -o json `allocation` and `reservedFor` equal the -o yaml claim's status.allocation and
    status.reservedFor (results, config, nodeSelector)."""
    if source == "example":
        paths: tuple[pathlib.Path, ...] = (EXAMPLES,)
    else:
        cluster = CLUSTER.split("---", 1)[1]  # nodes and slices, without the plain class
        paths = _write(
            tmp_path,
            CONFIGURED_CLASS,
            cluster,
            claim("shared"),
            template("tmpl"),
            pod("one", claims={"s": "shared"}, templates={"own": "tmpl"}),
            pod("two", claims={"s": "shared"}),
        )
    out_json, _ = _run(paths, config.OutputFormat.JSON)
    out_yaml, _ = _run(paths, config.OutputFormat.YAML)
    claims = json.loads(out_json)["claims"]
    documents = list(yaml.safe_load_all(out_yaml))
    assert [(c["namespace"], c["name"]) for c in claims] == [
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in documents
    ]
    for entry, document in zip(claims, documents, strict=True):
        assert entry["allocation"] == document["status"].get("allocation")
        assert entry["reservedFor"] == document["status"].get("reservedFor", [])
    assert (
        any(entry["allocation"] and entry["allocation"]["devices"].get("config") for entry in claims)
        or source == "example"
    )
    assert all(entry["allocation"]["nodeSelector"] for entry in claims if entry["allocated"]) or source == "configured"


def test_json_claim_entry_keys() -> None:
    """Guards: every -o json claim has exactly the documented keys."""
    result = engine.simulate(
        load(CLUSTER, claim("a"), claim("b", count=9)), policy=alloc.Policy.FIRST_FIT, search_limit=1000
    )
    entries = [report.claim_entry(o) for o in result.claims]
    assert [set(e) for e in entries] == [
        {"namespace", "name", "status", "allocated", "node", "allocation", "reservedFor", "reasons", "warnings"}
    ] * 2
    assert (entries[1]["status"], entries[1]["allocation"], entries[1]["reservedFor"]) == ("not allocated", None, [])


def _pyyaml(documents: list[object]) -> str:
    return yaml.dump_all(documents, Dumper=yaml.CSafeDumper, sort_keys=False, explicit_start=True, width=1 << 16)


def _fast(documents: list[object]) -> str:
    out = io.StringIO()
    yamlout.Writer(out).documents(documents)
    return out.getvalue()


def test_fast_yaml_equals_pyyaml_on_the_example_cluster() -> None:
    """Guards: the YAML writer prints the example cluster's claims byte for byte as PyYAML does."""
    from dractl.model import decode

    result = engine.simulate(decode.load_paths([EXAMPLES]), policy=alloc.Policy.BINPACK, search_limit=1_000_000)
    documents: list[object] = [encode.resource_claim(o.claim) for o in result.claims if o.claim is not None]
    assert _fast(documents) == _pyyaml(documents)


ODD = [
    "",
    " lead",
    "trail ",
    "yes",
    "No",
    "on",
    "null",
    "~",
    "true",
    "1",
    "0x1f",
    "1e3",
    "1.5",
    ".inf",
    "1_000",
    "12:30",
    "2024-01-01",
    "a: b",
    "a #b",
    "#x",
    "- x",
    "[x]",
    "{x}",
    "*x",
    "&x",
    "!x",
    "%x",
    "@x",
    "`x",
    "'q'",
    '"q"',
    "x\ny",
    "x\n",
    "é",
    "\u2028",
    "\t",
    'device.driver == "gpu"',
    "8.0.0",
    "81920Mi",
    "gpu.nvidia.com/productName",
    "=",
    "<<",
    "?x",
    ":x",
    "x:",
    "a,b",
    "-1",
    "+1",
]


def test_fast_yaml_equals_pyyaml_on_odd_strings() -> None:
    """Guards: strings that need quoting (or read back as other types) are spelled as PyYAML spells them, as values,
    list items and keys."""
    documents: list[object] = [{"v": text, "l": [text, {"k": text}], text or "empty": 1} for text in ODD]
    fast = _fast(documents)
    assert fast == _pyyaml(documents)
    assert list(yaml.safe_load_all(fast)) == documents


def test_fast_yaml_handles_floats_nesting_and_empty_containers() -> None:
    """Guards: floats, nested lists, empty maps and lists and None are written as PyYAML writes them."""
    documents: list[object] = [
        {"a": 0.5, "b": [[1, [2, {}]], []], "c": {"d": None, "e": {}, "f": False}},
        {"x": [{"y": [{"z": 1}]}]},
    ]
    assert _fast(documents) == _pyyaml(documents)


@hypothesis.given(
    st.lists(
        st.recursive(
            st.text(max_size=8) | st.integers() | st.booleans() | st.none(),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
            max_leaves=12,
        ),
        min_size=1,
        max_size=3,
    )
)
@hypothesis.settings(max_examples=150, deadline=None)
def test_fast_yaml_reads_back_as_written(values: list[object]) -> None:
    """Guards: whatever plain data the writer gets, PyYAML reads the same data back."""
    documents: list[object] = [{"value": v} for v in values]
    assert list(yaml.safe_load_all(_fast(documents))) == documents


def test_yaml_writer_comments_precede_their_document() -> None:
    """Guards: a document's comment lines come before its `---`, one `# ` line per line."""
    out = io.StringIO()
    yamlout.Writer(out).documents([{"a": 1}, {"b": 2}], comments=[None, "two\nlines"])
    assert out.getvalue() == "---\na: 1\n# two\n# lines\n---\nb: 2\n"


def test_big_tables_are_plain_text_with_the_same_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: above RICH_ROWS claims the table is plain text with the same columns, every reason on one line, and the
    footer and node summary."""
    objects = load(CLUSTER, claim("fits"), claim("too-big", count=9))
    result = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=1000)
    nodes = report.usage(objects.resource_slices, result.claims, nodes=("node-a", "node-b"))
    monkeypatch.setattr(report, "RICH_ROWS", 1)
    out = io.StringIO()
    report.write_table(result, nodes, policy=config.Policy.FIRST_FIT, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Claims (policy first-fit)"
    assert re.fullmatch(r"CLAIM +NODE +STATUS +DEVICES / REASONS", lines[1])
    assert re.fullmatch(r"default/fits +node-a +allocated +gpu: gpu-0", lines[2])
    assert re.fullmatch(
        r"default/too-big +- +not allocated +- gpu: device class gpu.example.com matches 4 devices; .*\(9 needed\)",
        lines[3],
    )
    assert lines[4] == "1 of 2 claims allocated."
    # The example devices have no `type` attribute: no GPU, so the summary counts devices.
    assert lines[5:] == [
        "Nodes",
        "NODE        DEVICES USED",
        "node-a      1 / 2",
        "node-b      0 / 2",
        "(cluster)   1 / 4",
    ]


LINE = re.compile(r"timing: phase=([a-z]+) seconds=[0-9]+\.[0-9]{6}((?: [a-z_]+=\S+)*)")


@pytest.mark.parametrize("output", list(config.OutputFormat), ids=[f.value for f in config.OutputFormat])
def test_timing_prints_one_line_per_phase(tmp_path: pathlib.Path, output: config.OutputFormat) -> None:
    """Guards: --timing ends stderr with one line per phase in the documented format and order;
    only allocate has claims_per_s."""
    _, err = _run(_write(tmp_path, CLUSTER, claim("a"), claim("b")), output, timing_on=True)
    lines = [line for line in err.splitlines() if line.startswith("timing:")]
    matches = [LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    phases = [m.group(1) for m in matches if m]
    assert phases in (
        ["startup", "decode", "validate", "index", "allocate", "output", "total"],
        ["decode", "validate", "index", "allocate", "output", "total"],  # where the process start time is unknown
    )
    fields = {m.group(1): dict(f.split("=") for f in m.group(2).split()) for m in matches if m}
    assert fields["allocate"]["claims"] == "2" and float(fields["allocate"]["claims_per_s"]) > 0
    assert fields["decode"] == {"objects": "7"} and fields["index"] == {"nodes": "2", "slices": "2"}
    assert fields["output"] == {"format": output.value} and set(fields["total"]) == {"cpu_seconds", "gc_seconds"}
    assert sum("claims_per_s=" in line for line in err.splitlines()) == 1


def test_timer_measures_phases_with_the_injected_clock() -> None:
    """Guards: each phase is the clock's difference since the previous one; total runs from process start."""
    ticks = iter([10.0, 10.0, 11.5, 14.0, 14.25])
    timer = timing.Timer(clock=lambda: next(ticks), age=lambda: 2.0)
    assert timer.phase("decode", objects=3) == 1.5
    timer.record("allocate", 0.5, claims=1)
    timer.restart()
    out = io.StringIO()
    timer.close(out)
    lines = out.getvalue().splitlines()
    assert lines[:3] == [
        "timing: phase=startup seconds=2.000000",
        "timing: phase=decode seconds=1.500000 objects=3",
        "timing: phase=allocate seconds=0.500000 claims=1",
    ]
    assert lines[3].startswith("timing: phase=total seconds=6.250000 cpu_seconds=")


def test_process_age_is_plausible() -> None:
    """Guards: the process start time read from /proc is a non-negative age (or unknown off Linux)."""
    age = timing.process_age()
    if not pathlib.Path("/proc/self/stat").exists():
        assert age is None
    else:
        assert age is not None and age >= 0.0
