"""Fuzzing `dractl simulate` with hostile documents: exit 0, 1 or 2, never a traceback, every problem names its file."""

from __future__ import annotations

import pathlib
import tempfile

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dractl import cli

# Scalars that broke parsers or decoders before: YAML 1.1 forms, numbers past 64 bits and
# past float range, tags, anchors and aliases, unbalanced brackets and quotes.
NASTY = [
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "~",
    "null",
    ".nan",
    ".inf",
    "-.inf",
    "0x7fffffffffffffff",
    "0x8000000000000000",
    "0o777",
    "0777",
    "08",
    "0b101",
    "1_000",
    "1:30",
    "2024-01-01",
    "2024-01-01T10:00:00Z",
    "1e999999",
    "-1e999999",
    "1e-999999",
    "99999999999999999999999",
    "9" * 5000,
    "9" * 500 + "Ei",
    "0." + "0" * 500 + "1",
    "1.5Gi",
    "-1",
    "!!binary '%%%'",
    "!!binary aGVsbG8=",
    "!!python/object/apply:os.system ['true']",
    "!foo bar",
    "!!int x",
    "!!float y",
    "!!null z",
    "!!timestamp t",
    "!!str 12",
    "&a x",
    "*a",
    "*undefined",
    "[",
    "]",
    "{",
    "}",
    "'",
    '"',
    "'it''s'",
    '"\\u0000"',
    '"\\xff"',
    "|",
    ">",
    "- x",
    "? x",
    ": x",
    "@x",
    "`x",
    "%YAML 1.1",
    "<<: *a",
    "[" * 2000 + "]" * 2000,
    "{a: " * 1500 + "1" + "}" * 1500,
]

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {0}, namespace: {1}}}
spec:
  devices:
    requests:
    - name: {2}
      exactly:
        deviceClassName: {3}
        count: {4}
        allocationMode: {5}
        capacity: {{requests: {{memory: {6}}}}}
"""
SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {0}}}
spec:
  driver: {1}
  pool: {{name: {2}, generation: {3}, resourceSliceCount: {4}}}
  nodeName: {5}
  devices:
  - name: gpu-0
    attributes:
      index: {{int: {6}}}
      productName: {{string: {0}}}
      cudaComputeCapability: {{version: {1}}}
    capacity:
      memory: {{value: {2}}}
"""
DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {0}}}
spec:
  replicas: {1}
  template:
    metadata: {{labels: {{app: {2}}}}}
    spec:
      nodeName: {3}
      containers: [{{name: c, resources: {{claims: [{{name: {4}}}]}}}}]
      resourceClaims: [{{name: {4}, resourceClaimTemplateName: {5}}}]
"""
TEMPLATES = [(CLAIM, 7), (SLICE, 7), (DEPLOYMENT, 6)]
FILLERS = ["gpu", "default", "gpu.nvidia.com", "1", "ExactCount", "16Gi", "node-1", "3"]

nasty = st.sampled_from(NASTY)
scalar = st.one_of(
    nasty,
    nasty,
    nasty,  # weighted: the known-nasty scalars are the point
    st.sampled_from(FILLERS),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30).map(lambda s: s.replace("\n", " ")),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """One to three manifests from the templates, every field a hostile scalar or a valid filler."""
    texts = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        template, holes = draw(st.sampled_from(TEMPLATES))
        values = [draw(scalar) for _ in range(holes)]
        texts.append(template.format(*values))
    text = "---\n".join(texts)
    if draw(st.booleans()):
        # Cut the text anywhere: an unterminated document must be a syntax error, not a crash.
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    return text


@pytest.mark.timeout(240)
# Derandomized, so a failure reproduces on the next run; bounded examples and no deadline (pytest-timeout bounds time).
@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=documents())
def test_hostile_documents_never_crash_the_cli(text: str) -> None:
    """Guards: any mix of hostile scalars exits 0, 1 or 2, without a traceback,
    and every problem line names the file."""
    with tempfile.TemporaryDirectory() as directory:
        file = pathlib.Path(directory) / "fuzz.yaml"
        file.write_text(text, encoding="utf-8", errors="surrogatepass")
        result = CliRunner().invoke(cli.main, ["simulate", "-f", str(file), "--search-limit", "10000"])
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stderr
    if result.exit_code == 1:
        lines = result.stderr.splitlines()
        assert lines and all(str(file) in line for line in lines), lines


def _run(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        file = pathlib.Path(directory) / "sweep.yaml"
        file.write_text(text, encoding="utf-8")
        result = CliRunner().invoke(cli.main, ["simulate", "-f", str(file), "--search-limit", "10000"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2) and "Traceback" not in result.stderr
    if result.exit_code == 1:
        assert all(str(file) in line for line in result.stderr.splitlines()), result.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("token", NASTY, ids=lambda token: repr(token)[:24])
def test_every_nasty_scalar_in_every_field(token: str) -> None:
    """Guards: each known-nasty scalar, put into every field of every template at once, never crashes the CLI."""
    for template, holes in TEMPLATES:
        _run(template.format(*[token] * holes))
