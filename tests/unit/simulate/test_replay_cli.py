"""`dractl simulate --trace/--generate/--compare/--html/--retry`: outputs, exit codes and one-line errors."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner, Result

from dractl import cli
from dractl.simulate import trace

SPEC = "mix=reference,seed=3,claims=60,a100=2,h100=2,t4=1,round=20"


def _invoke(*args: str, stdin: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli.main, ["simulate", *args], input=stdin, catch_exceptions=False)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("trace") / "trace.yaml"
    result = _invoke("--generate", SPEC)
    assert result.exit_code == 0, result.stderr
    path.write_text(result.stdout, encoding="utf-8")
    return path


def test_generate_prints_the_generator_s_trace_as_yaml_or_json() -> None:
    """--generate writes the same trace `trace.generate` makes; -o json writes it as JSON."""
    as_yaml = _invoke("--generate", SPEC)
    as_json = _invoke("--generate", SPEC, "-o", "json")
    assert as_yaml.exit_code == as_json.exit_code == 0
    expected = trace.generate(SPEC).document
    assert trace.parse_text(as_yaml.stdout).document == expected
    assert json.loads(as_json.stdout) == expected


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_generate_streams_the_bytes_dumps_writes(output: str) -> None:
    """Guards: --generate, which writes the trace an event at a time, prints byte for byte what `trace.dumps` writes
    for `trace.generate`'s trace, departures included."""
    spec = "mix=h100-nvlink,seed=5,claims=45,a100=1,h100=2,t4=0,round=7,departures=0.6"
    result = _invoke("--generate", spec, "-o", output)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == trace.dumps(trace.generate(spec), as_json=output == "json")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "mix=reference,claims=100000",
            "claims must be at most 50000, got 100000: a longer trace would be more than the 64 MiB --trace reads",
        ),
        (
            "mix=reference,a100=4000,t4=1001",
            "a100, h100 and t4 must add up to at most 5000 nodes (the most one Kubernetes cluster supports), got 5001",
        ),
    ],
    ids=["claims", "nodes"],
)
def test_a_generator_spec_beyond_its_bounds_is_one_line(spec: str, message: str) -> None:
    """Guards: --generate refuses more claims than a trace --trace can read, and more nodes than a cluster has, with
    one line naming the spec, the key and the bound; exit 1."""
    result = _invoke("--generate", spec)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"dractl simulate: --generate {spec!r}: {message}"]


def test_a_bad_generator_spec_is_one_line_and_exit_1() -> None:
    """An unknown key in --generate names the spec and the key, without a traceback."""
    result = _invoke("--generate", "mix=reference,seeds=3")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "dractl simulate: --generate 'mix=reference,seeds=3': unknown key 'seeds' (known: mix, seed, claims, a100, "
        "h100, t4, round, departures, gangs)"
    ]


def test_trace_table_shows_nodes_and_the_metrics(trace_file: pathlib.Path) -> None:
    """The text report has the per-node GPU table and the cluster metrics with the time series rows."""
    result = _invoke("--trace", str(trace_file), "--policy", "first-fit")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    for expected in ("a100-01", "h100-02", "t4-01", "LARGEST MIG FREE", "admitted before first rejection"):
        assert expected in text
    assert "time-weighted utilisation" in text and "first-fit" in text


def test_compare_puts_both_policies_side_by_side_in_table_and_json(trace_file: pathlib.Path) -> None:
    """--compare first-fit,binpack replays once per policy: two columns, two JSON runs with metrics."""
    table = _invoke("--trace", str(trace_file), "--compare", "first-fit,binpack")
    assert table.exit_code == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "METRIC" in line)
    assert header.index("first-fit") < header.index("binpack")
    as_json = _invoke("--trace", str(trace_file), "--compare", "first-fit,binpack", "-o", "json")
    document = json.loads(as_json.stdout)
    assert [run["policy"] for run in document["runs"]] == ["first-fit", "binpack"]
    for run in document["runs"]:
        assert run["metrics"]["time"]["admitted"] + len([c for c in run["claims"] if not c["allocated"]]) >= 1
        assert run["metrics"]["cluster"]["gpus"]["total"] == 2 * 8 + 2 * 8 + 1 * 2
        assert {c["status"] for c in run["claims"]} <= {"allocated", "not allocated"}


def test_trace_from_stdin_and_yaml_output(trace_file: pathlib.Path) -> None:
    """--trace - reads the trace from stdin; -o yaml prints the claims present at the end as API objects."""
    result = _invoke("--trace", "-", "-o", "yaml", stdin=trace_file.read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n")
    assert "allocation:" in result.stdout


@pytest.mark.parametrize(
    ("stdin", "problem"),
    [
        ("", "a trace is one YAML document (kind: Trace), found 0"),
        (b"\xff\xfe", "cannot read: not UTF-8 text (a binary file?); a trace is YAML or JSON"),
    ],
    ids=["empty", "binary"],
)
def test_a_bad_trace_on_stdin_gets_a_file_s_message_naming_stdin(
    stdin: str | bytes, problem: str, tmp_path: pathlib.Path
) -> None:
    """--trace - reads standard input as --trace FILE reads a file (UTF-8, whatever stdin's own encoding): an empty or
    binary one is the empty or binary file's one line, named `<stdin>`, exit 1, no traceback."""
    file = tmp_path / "trace.yaml"
    file.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
    from_file = _invoke("--trace", str(file))
    from_stdin = _invoke("--trace", "-", stdin=stdin)
    assert from_file.exit_code == from_stdin.exit_code == 1
    assert from_file.stderr.splitlines() == [f"{file}: {problem}"]
    assert from_stdin.stderr.splitlines() == [f"<stdin>: {problem}"] and from_stdin.stdout == ""


def test_html_writes_the_map_with_the_utilisation_chart(trace_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """--html writes one self-contained page with every GPU box and the chart of the replay."""
    page = tmp_path / "map.html"
    result = _invoke("--trace", str(trace_file), "--html", str(page), "-o", "json")
    assert result.exit_code == 0, result.stderr
    text = page.read_text(encoding="utf-8")
    assert text.count('data-gpu="') == 2 * 8 + 2 * 8 + 1 * 2
    assert 'data-series-points="' in text and "http" not in text


def test_html_that_cannot_be_written_is_one_line(trace_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """A --html path in a missing directory is one line naming the flag and the file, exit 1."""
    target = tmp_path / "missing" / "map.html"
    result = _invoke("--trace", str(trace_file), "--html", str(target))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"dractl simulate: --html {target}: cannot write:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bad_trace_file_names_file_event_and_field(tmp_path: pathlib.Path) -> None:
    """A trace with a bad time is one line naming the file, the event and the field, exit 1."""
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: dractl.io/v1alpha1\nkind: Trace\nmetadata: {name: bad}\nspec:\n  events:\n"
        "  - {at: soon, depart: {kind: ResourceClaim, name: x}}\n",
        encoding="utf-8",
    )
    result = _invoke("--trace", str(path))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f'{path}: events[0].at: must be a number of seconds >= 0, got "soon"']
    assert result.stdout == ""


def test_a_trace_whose_selector_does_not_compile_is_refused(tmp_path: pathlib.Path) -> None:
    """An arriving claim with a selector the API server rejects is refused before replaying."""
    generated = trace.generate("mix=reference,seed=1,claims=2,a100=1")
    document = json.loads(json.dumps(generated.document))
    request = document["spec"]["events"][0]["arrive"]["spec"]["devices"]["requests"][0]["exactly"]
    request["selectors"] = [{"cel": {"expression": "device.nope >"}}]
    path = tmp_path / "cel.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    result = _invoke("--trace", str(path))
    assert result.exit_code == 1
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "first-fit,binpack"], "--compare, --html and --retry replay a trace"),
        (["--generate", "mix=reference", "--trace", "TRACE"], "--generate prints a trace"),
        (["--trace", "TRACE", "--compare", "first-fit,binpack", "-o", "yaml"], "-o yaml prints one policy's claims"),
        (["--trace", "-", "-f", "-"], "--trace replays the trace's own cluster"),
    ],
    ids=["compare-without-trace", "generate-with-trace", "compare-with-yaml", "trace-and-file-both-stdin"],
)
def test_flag_combinations_that_make_no_sense_are_one_line(
    args: list[str], message: str, trace_file: pathlib.Path
) -> None:
    """Flags that do not go together exit 1 with one line saying why."""
    result = _invoke(*[str(trace_file) if a == "TRACE" else a for a in args])
    assert result.exit_code == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_trace_path_that_does_not_exist_is_a_usage_error_like_a_missing_file(tmp_path: pathlib.Path) -> None:
    """A --trace path that does not exist exits 2 naming the flag and the path, as a missing -f path does."""
    missing = tmp_path / "nope.yaml"
    result = _invoke("--trace", str(missing))
    assert result.exit_code == 2
    assert "'--trace'" in result.stderr and f"'{missing}' does not exist" in result.stderr


def test_compare_names_only_known_policies() -> None:
    """--compare with an unknown policy is a usage error naming the flag."""
    result = _invoke("--trace", "-", "--compare", "first-fit,best")
    assert result.exit_code == 2
    assert "--compare" in result.stderr and "first-fit, binpack" in result.stderr


def test_retry_never_is_passed_through(trace_file: pathlib.Path) -> None:
    """--retry never reaches the replay: the JSON run says so."""
    result = _invoke("--trace", str(trace_file), "--retry", "never", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["runs"][0]["retry"] == "never"


def test_timing_prints_one_line_per_replayed_policy(trace_file: pathlib.Path) -> None:
    """--timing with --trace prints the load, one replay phase per policy and the output phase on stderr."""
    result = _invoke("--trace", str(trace_file), "--compare", "binpack,first-fit", "--timing", "-o", "json")
    assert result.exit_code == 0, result.stderr
    phases = [line.split()[1] for line in result.stderr.splitlines() if line.startswith("timing: ")]
    assert [p for p in phases if p != "phase=startup"] == [
        "phase=load",
        "phase=replay-binpack",
        "phase=replay-first-fit",
        "phase=output",
        "phase=total",
    ]
