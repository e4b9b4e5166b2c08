"""Hostile input through the real CLI: one clear line naming the file (and object and field), exit 1 or 2, bounded.

The corpus in `corpus/` holds small nasty manifests; big ones (deep nesting, thousands of
digits, an oversized file) are generated at test time rather than committed.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import IO

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
BOOL_HINT = "must be a string, got a boolean: quote it (unquoted y, n, yes, no, on, off, true and false are booleans)"
LARGEST = "is larger than 2^63-1 (9223372036854775807, just under 8Ei), the most a capacity or counter holds"
ABSURD = "is too large: quantities of 10^100 or more are not supported"
INT64 = "must fit in 64 bits (at most 9223372036854775807)"

# file -> the exact stderr lines, after the file name and ": ".
EXPECTED = {
    "billion-laughs.yaml": ["document 1 (line 2): aliases expand to more than 1000000 values (an alias bomb)"],
    "binary-garbage.yaml": ["line 4, column 9: YAML syntax error: !!binary value is not base64 of UTF-8 text"],
    "hex-count.yaml": [
        f"ResourceClaim default/hex: spec.devices.requests[0].exactly.count: {INT64}, got 9223372036854775808"
    ],
    "huge-count.yaml": [f"ResourceClaim default/huge: spec.devices.requests[0].exactly.count: {INT64}, got 1e+23"],
    "int-tag.yaml": ["line 8, column 57: YAML syntax error: cannot decode !!str `twelve` as a !!int"],
    "python-tag.yaml": [
        "DeviceClass (document 1): metadata.name: must be a string, got a list",
        "DeviceClass (document 1): metadata.name: required",
    ],
    "quantity-exponent.yaml": [f"ResourceSlice exp: spec.devices[0].capacity[memory].value: '1e999999' {ABSURD}"],
    "quantity-16ei.yaml": [f"ResourceSlice big: spec.devices[0].capacity[memory].value: '16Ei' {LARGEST}"],
    "recursive-anchor.yaml": ["document 1 (line 2): an alias refers to a value that contains it (a recursive anchor)"],
    "replicas.yaml": [
        "Deployment default/many: spec.replicas: must be at most 100000: dractl expands every replica into a Pod"
    ],
    "sexagesimal-count.yaml": [
        'ResourceClaim default/sixty: spec.devices.requests[0].exactly.count: must be an integer, got the string "1:30"'
    ],
    "timestamp-name.yaml": [
        'ResourceClaim default/when: spec.devices.requests[0].exactly.deviceClassName: "2026-11-23T10:00:00Z" is not a '
        "DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ],
    "yes-no.yaml": [
        f"ResourceSlice yesno: spec.nodeName: {BOOL_HINT}",
        "ResourceSlice yesno: spec: exactly one of nodeName, nodeSelector, allNodes or perDeviceNodeSelection is "
        "required, e.g. nodeName: <node>",
    ],
}

SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {name}}}
spec:
  driver: gpu.nvidia.com
  pool: {{name: node-1, resourceSliceCount: 1}}
  nodeName: node-1
  devices:
  - name: gpu-0
    capacity:
      memory: {{value: {value}}}
"""


def _simulate(
    *args: str, timeout: float = 60, stdout: int | IO[str] = subprocess.PIPE, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`dractl simulate ARGS` in a process of its own; stdout to `stdout` (captured by default), stderr captured,
    `env` added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "dractl", "simulate", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
    )


def _problems(result: subprocess.CompletedProcess[str], file: pathlib.Path) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert all(line.startswith(f"{file}: ") for line in lines), lines
    return [line[len(f"{file}: ") :] for line in lines]


def test_corpus_is_complete() -> None:
    """Guards: every corpus file has its expected message here (and every expectation its file)."""
    assert sorted(p.name for p in CORPUS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.fixture(scope="module")
def corpus_run() -> subprocess.CompletedProcess[str]:
    """The whole corpus in one run of the CLI: every problem of every file is reported, each file on its own."""
    return _simulate(*(arg for name in sorted(EXPECTED) for arg in ("-f", str(CORPUS / name))), timeout=120)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file_gets_its_exact_message(name: str, corpus_run: subprocess.CompletedProcess[str]) -> None:
    """Guards: each nasty manifest of the corpus gets exactly its messages, each naming the file; the run exits 1."""
    assert corpus_run.returncode == 1, corpus_run.stderr
    assert "Traceback" not in corpus_run.stderr
    file = f"{CORPUS / name}: "
    assert [line[len(file) :] for line in corpus_run.stderr.splitlines() if line.startswith(file)] == EXPECTED[name]
    assert corpus_run.stdout == ""


def test_corpus_run_names_a_file_on_every_line(corpus_run: subprocess.CompletedProcess[str]) -> None:
    """Guards: no line of the corpus run's stderr lacks the file it is about."""
    assert all(line.startswith(str(CORPUS) + "/") for line in corpus_run.stderr.splitlines())


def _deep_flow(n: int) -> str:
    return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\ndata: " + "[" * n + "]" * n + "\n"


def _deep_block(n: int) -> str:
    return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\ndata:\n" + "".join(
        " " * i + "a:\n" for i in range(1, n)
    )


GENERATED = {
    "deep-flow.yaml": (lambda: _deep_flow(100_000), ["nested too deeply: more than 1000 levels of [ and {"]),
    "deep-flow-maps.yaml": (
        lambda: "a: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n",
        ["nested too deeply: more than 1000 levels of [ and {"],
    ),
    "deep-block.yaml": (lambda: _deep_block(2_100), ["line 2004: nested too deeply: indented more than 2000 columns"]),
    "deep-dashes.yaml": (lambda: "- " * 3_000 + "x\n", ["line 1: nested too deeply: indented more than 2000 columns"]),
    "deep.json": (lambda: "[" * 100_000 + "]" * 100_000, ["nested too deeply: more than 1000 levels of [ and {"]),
    "quantity-digits.yaml": (
        lambda: SLICE.format(name="q", value="9" * 5_000 + "Ei"),
        [f"ResourceSlice q: spec.devices[0].capacity[memory].value: '{'9' * 40}'... (5002 characters) {ABSURD}"],
    ),
    "int-digits.yaml": (
        lambda: SLICE.format(name="i", value="9" * 5_000),
        [f"ResourceSlice i: spec.devices[0].capacity[memory].value: '{'9' * 40}'... (5000 characters) {ABSURD}"],
    ),
    "int-digits.json": (
        lambda: (
            '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": '
            '{"devices": '
            '{"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": ' + "9" * 5_000 + "}}]}}}"
        ),
        [f"ResourceClaim default/c: spec.devices.requests[0].exactly.count: {INT64}, got inf"],
    ),
}


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
    """The generated inputs, written to a temporary directory and run through the CLI together."""
    directory = tmp_path_factory.mktemp("hostile")
    for name, (make, _) in GENERATED.items():
        (directory / name).write_text(make())
    return directory, _simulate(
        *(arg for name in sorted(GENERATED) for arg in ("-f", str(directory / name))), timeout=120
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_hostile_input_gets_one_line(
    name: str, generated_run: tuple[pathlib.Path, subprocess.CompletedProcess[str]]
) -> None:
    """Guards: nesting 100,000 deep (flow, block, JSON) and numbers of thousands of digits end in one line each,
    exit 1."""
    directory, result = generated_run
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    file = f"{directory / name}: "
    assert [line[len(file) :] for line in result.stderr.splitlines() if line.startswith(file)] == GENERATED[name][1]


def test_oversized_file_is_refused_before_reading(tmp_path: pathlib.Path) -> None:
    """Guards: a file past the size bound is refused by its size, without reading it into memory."""
    file = tmp_path / "huge.yaml"
    with file.open("wb") as handle:
        handle.truncate(65 * 1024 * 1024)  # sparse: costs no disk and no time
    result = _simulate("-f", str(file))
    assert result.returncode == 1
    assert _problems(result, file) == [
        f"{65 * 1024 * 1024} bytes is larger than 64 MiB: split the manifests into several files"
    ]


def test_a_trace_past_the_size_bound_is_refused_like_a_file(tmp_path: pathlib.Path) -> None:
    """Guards: --trace reads at most what -f reads (64 MiB): a larger file is refused by its size before reading,
    and an endless input (/dev/zero) after 64 MiB, in bounded time and memory; one line each, exit 1."""
    file = tmp_path / "huge-trace.yaml"
    with file.open("wb") as handle:
        handle.truncate(65 * 1024 * 1024)  # sparse: costs no disk and no time
    result = _simulate("--trace", str(file))
    assert (result.returncode, result.stderr) == (
        1,
        f"{file}: {65 * 1024 * 1024} bytes is larger than 64 MiB: a trace is read whole: replay a shorter one\n",
    )
    endless = _simulate("--trace", "/dev/zero", timeout=30)
    assert (endless.returncode, endless.stderr) == (
        1,
        "/dev/zero: more than 64 MiB: a trace is read whole: replay a shorter one\n",
    )


def test_generate_memory_does_not_grow_with_the_claims() -> None:
    """Guards: `--generate claims=30000` writes its trace in bounded memory (it took about 25 KB per claim, 2.4 GB for
    100,000, holding the whole trace and its YAML at once): the peak stays under 200 MB."""
    code = (
        "import resource, subprocess, sys; "
        "done = subprocess.run([sys.executable, '-m', 'dractl', 'simulate', '--generate', "
        "'mix=reference,seed=1,claims=30000'], stdout=subprocess.DEVNULL); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    measured = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        check=True,
    )
    returncode, peak_kib = map(int, measured.stdout.split())
    assert returncode == 0
    assert peak_kib < 200 * 1024, f"peak {peak_kib} KiB"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--search-limit", "9" * 30], {}, "is not in the range 1<=x<=9223372036854775807"),
        (["--search-limit", "9" * 5_000], {}, "is not a valid integer"),
        ([], {"DRACTL_SEARCH_LIMIT": "0x10"}, "'0x10' is not a valid integer"),
        ([], {"DRACTL_SEARCH_LIMIT": "-1"}, "is not in the range 1<=x<=9223372036854775807"),
    ],
    ids=["flag-beyond-int64", "flag-5000-digits", "env-hex", "env-negative"],
)
def test_search_limit_is_bounded_with_a_usage_error(args: list[str], env: dict[str, str], expected: str) -> None:
    """Guards: search limits beyond int64, in hex or negative are usage errors (exit 2) naming the flag,
    no traceback."""
    result = _simulate(*args, env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--search-limit" in result.stderr and expected in result.stderr


def test_closed_stdout_exits_quietly(tmp_path: pathlib.Path) -> None:
    """Guards: `dractl simulate | head -1` (the reader closes the pipe mid-output) ends quietly with 141,
    no traceback."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import alloc as generator

    # 210 claims print far more YAML than a pipe buffers, so the writer is still writing when the reader leaves.
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": generator.manifests(30)}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "dractl", "simulate", "-o", "yaml", "-f", str(cluster)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline()
    process.stdout.close()  # the reader goes away after one line
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) == 141
    assert stderr == ""


@pytest.mark.parametrize("mode", ["simulate", "trace"])
def test_closed_stdout_exits_quietly_with_tables(mode: str, tmp_path: pathlib.Path) -> None:
    """Guards: a table (rich) written to a pipe whose reader has gone ends quietly with 141, as every other format
    does, not with rich's own exit 1 (the exit code of invalid input)."""
    args: list[str] = []
    if mode == "trace":
        generated = _simulate("--generate", "mix=reference,seed=1,claims=5")
        assert generated.returncode == 0, generated.stderr
        (tmp_path / "trace.yaml").write_text(generated.stdout)
        args += ["--trace", str(tmp_path / "trace.yaml")]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write fails with EPIPE
    try:
        result = _simulate(*args, stdout=write_end, timeout=120)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fill stdout")
def test_full_stdout_prints_one_line_and_exits_1() -> None:
    """Guards: `dractl simulate > /dev/full` prints one line naming the problem and exits 1, without a traceback."""
    with open("/dev/full", "w") as full:
        result = _simulate(stdout=full)
    assert result.returncode == 1
    assert result.stderr == "dractl: cannot write the output: No space left on device\n"


HUGE_COUNTS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: huge, namespace: default}
spec:
  devices:
    requests:
    - {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2147483648}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: huge-first, namespace: default}
spec:
  devices:
    requests:
    - name: gpus
      firstAvailable:
      - {name: many, deviceClassName: gpu.nvidia.com, count: 9223372036854775807}
      - {name: one, deviceClassName: gpu.nvidia.com}
"""


@pytest.mark.parametrize("policy", ["binpack", "first-fit"])
def test_a_count_beyond_32_bits_is_the_claim_limit_not_a_traceback(policy: str, tmp_path: pathlib.Path) -> None:
    """Guards: a request count of 2^31 or more (the API takes any int64) is not allocated, with the claim limit of
    32 devices as its reason, and a firstAvailable subrequest that large is passed over for the next one, as
    upstream's allocator does; exit 0, no traceback, under either policy."""
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE_COUNTS)
    result = _simulate("-f", str(ROOT / "dractl" / "examples"), "-f", str(path), "--policy", policy, "-o", "json")
    assert result.returncode == 0, result.stderr
    claims = {c["name"]: c for c in json.loads(result.stdout)["claims"]}
    assert claims["huge"]["status"] == "not allocated"
    assert claims["huge"]["reasons"] == [
        "the claim asks for at least 2147483648 devices, which exceeds the claim limit of 32 results; split it into "
        "several claims"
    ]
    assert [r["request"] for r in claims["huge-first"]["allocation"]["devices"]["results"]] == ["gpus/one"]


NON_ASCII = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: accent, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"]["modèle"] == "x"'}
"""


@pytest.mark.parametrize("encoding", ["ascii", "ascii:strict"])
@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_an_ascii_only_terminal_gets_escapes_not_a_traceback(
    encoding: str, output: str, tmp_path: pathlib.Path
) -> None:
    """Guards: with PYTHONIOENCODING=ascii (strict on stderr too), a non-ASCII reason (a CEL error naming `modèle`) and
    the table's `7g.80gb×5` are written as backslash escapes, and JSON stays JSON (`\u00e8`); exit 0, no traceback,
    in every format."""
    path = tmp_path / "accent.yaml"
    path.write_text(NON_ASCII, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "dractl", "simulate", "-f", str(ROOT / "dractl" / "examples"), "-f", str(path)]
        + ["-o", output],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": encoding},
        cwd=ROOT,
    )
    stdout, stderr = result.stdout.decode("ascii"), result.stderr.decode("ascii")
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr
    if output == "json":
        [accent] = [c for c in json.loads(stdout)["claims"] if c["name"] == "accent"]
        assert "no such key: modèle" in accent["reasons"][0]
    elif output == "table":
        # The ASCII table wraps cells across lines: compare without borders and white space.
        assert "nosuchkey:mod\\xe8le" in re.sub(r"[\s|]", "", stdout)
        assert "7g.80gb\\xd75" in stdout
    else:  # -o yaml keeps stdout for API objects: the reasons go to stderr
        assert "no such key: mod\\xe8le" in stderr
