"""The dractl command line: modes, flags and their environment variables, exit codes and output formats."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner, Result
from support.simulate_manifests import CLASS, resource_slice

import dractl
from dractl import cli, simulate

ROOT = pathlib.Path(__file__).resolve().parents[3]

# One node with one GPU, a claim that fits, a claim that cannot (it wants two GPUs), and two
# pods sharing the first claim.
MANIFESTS = (
    CLASS
    + "---\n"
    + resource_slice("node-1-gpus", node="node-1", spec="devices:\n- {name: gpu-0, capacity: {memory: {value: 16Gi}}}")
    + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: fits}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: too-big}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.example.com, count: 2}}
---
apiVersion: v1
kind: Pod
metadata: {name: one}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: fits}]
  containers: [{name: main, image: busybox, resources: {claims: [{name: gpu}]}}]
---
apiVersion: v1
kind: Pod
metadata: {name: two}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: fits}]
  containers: [{name: main, image: busybox, resources: {claims: [{name: gpu}]}}]
"""
)

BAD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: train}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.example.com, count: -1}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: other}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {count: 1}}
"""

FLAGS = {
    "--file": "DRACTL_FILE",
    "--policy": "DRACTL_POLICY",
    "--output": "DRACTL_OUTPUT",
    "--timing": "DRACTL_TIMING",
    "--search-limit": "DRACTL_SEARCH_LIMIT",
    "--trace": "DRACTL_TRACE",
    "--retry": "DRACTL_RETRY",
    "--generate": "DRACTL_GENERATE",
    "--compare": "DRACTL_COMPARE",
    "--html": "DRACTL_HTML",
    "--topology-levels": "DRACTL_TOPOLOGY_LEVELS",
}
TIMING = re.compile(r"claims_per_s=[0-9]+\.[0-9]+")


def _invoke(*args: str, env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env, input=stdin, catch_exceptions=False)


@pytest.fixture
def manifests(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(MANIFESTS)
    return path


@pytest.fixture
def bad(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "claims.yaml"
    path.write_text(BAD)
    return path


def test_help_lists_every_mode() -> None:
    """Guards: `dractl --help` names every mode of DESIGN.md."""
    result = _invoke("--help")
    assert result.exit_code == 0
    for mode in ("simulate", "node-agent", "controller", "explain", "discover"):
        assert mode in result.stdout


def test_simulate_flags_state_defaults_and_env_vars() -> None:
    """Guards: every simulate flag is kebab-case, states its default, and names its DRACTL_<FLAG> variable."""
    result = _invoke("simulate", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for flag, env in FLAGS.items():
        assert flag in text and f"env var: {env}" in text
    assert text.count("(default:") == len(FLAGS)


def test_version() -> None:
    """Guards: `dractl --version` prints the program name and the package version, and exits 0."""
    result = _invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"dractl {dractl.__version__}\n"


def test_invalid_input_prints_every_problem_and_exits_1(bad: pathlib.Path) -> None:
    """Guards: decode errors exit 1 with every problem, naming file, object and field, and no traceback."""
    result = _invoke("simulate", "-f", str(bad))
    assert result.exit_code == 1
    assert f"{bad}: ResourceClaim default/train: spec.devices.requests[0].exactly.count:" in result.stderr
    assert f"{bad}: ResourceClaim default/other: spec.devices.requests[0].exactly.deviceClassName:" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_missing_file_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    """Guards: -f naming a path that does not exist is refused by the CLI (exit 2) before decoding."""
    result = _invoke("simulate", "-f", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_env_vars_mirror_flags(manifests: pathlib.Path, bad: pathlib.Path) -> None:
    """Guards: DRACTL_FILE, DRACTL_OUTPUT, DRACTL_POLICY, DRACTL_TIMING and DRACTL_SEARCH_LIMIT act like their flags."""
    env = {"DRACTL_FILE": str(manifests), "DRACTL_OUTPUT": "json", "DRACTL_POLICY": "first-fit", "DRACTL_TIMING": "1"}
    result = _invoke("simulate", env=env)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["policy"] == "first-fit"
    assert TIMING.search(result.stderr)
    assert _invoke("simulate", env={"DRACTL_FILE": str(bad)}).exit_code == 1
    both = _invoke("simulate", "-o", "json", env={"DRACTL_FILE": f"{manifests}{os.pathsep}{bad}"})
    assert both.exit_code == 1 and str(bad) in both.stderr
    limited = _invoke("simulate", env={"DRACTL_SEARCH_LIMIT": "0"})
    assert limited.exit_code == 2 and "DRACTL_SEARCH_LIMIT" not in limited.stdout and "--search-limit" in limited.stderr


def test_dash_reads_the_manifests_from_stdin(manifests: pathlib.Path) -> None:
    """Guards: `-f -` (and DRACTL_FILE=-) reads the manifests from standard input, with the same result as the file."""
    from_file = _invoke("simulate", "-f", str(manifests), "-o", "json")
    from_stdin = _invoke("simulate", "-f", "-", "-o", "json", stdin=MANIFESTS)
    from_env = _invoke("simulate", "-o", "json", env={"DRACTL_FILE": "-"}, stdin=MANIFESTS)
    assert from_file.exit_code == from_stdin.exit_code == from_env.exit_code == 0, from_stdin.stderr
    assert json.loads(from_file.stdout)["summary"]["allocated"] == 1
    assert from_stdin.stdout == from_env.stdout == from_file.stdout


def test_dash_goes_with_other_files_and_an_object_in_both_is_refused_naming_both(tmp_path: pathlib.Path) -> None:
    """Guards: `-f -` with other -f files decodes all of them together (the cluster from a file, the claims from stdin),
    and an object given both on stdin and in a file is refused naming `<stdin>` and the file, in the order given."""
    first_claim = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: fits}"
    cluster, claims = MANIFESTS.split("---\n" + first_claim)
    claims = first_claim + claims
    (tmp_path / "cluster.yaml").write_text(cluster)
    (tmp_path / "claims.yaml").write_text(claims)
    together = _invoke("simulate", "-f", str(tmp_path / "cluster.yaml"), "-f", "-", "-o", "json", stdin=claims)
    assert together.exit_code == 0, together.stderr
    assert json.loads(together.stdout)["summary"]["allocated"] == 1
    twice = "given twice, first in {} (document {}); the API holds one object per name: remove one or rename it"
    stdin_first = _invoke("simulate", "-f", "-", "-f", str(tmp_path / "claims.yaml"), stdin=MANIFESTS)
    assert stdin_first.exit_code == 1 and stdin_first.stdout == ""
    assert stdin_first.stderr.splitlines() == [
        f"{tmp_path / 'claims.yaml'}: ResourceClaim default/{name}: metadata.name: {twice.format('<stdin>', document)}"
        for name, document in (("fits", 3), ("too-big", 4))
    ] + [
        f"{tmp_path / 'claims.yaml'}: Pod default/{name}: metadata.name: {twice.format('<stdin>', document)}"
        for name, document in (("one", 5), ("two", 6))
    ]
    file_first = _invoke("simulate", "-f", str(tmp_path / "cluster.yaml"), "-f", "-", stdin=cluster)
    assert file_first.exit_code == 1
    assert file_first.stderr.splitlines()[0] == (
        f"<stdin>: DeviceClass gpu.example.com: metadata.name: {twice.format(tmp_path / 'cluster.yaml', 1)}"
    )


@pytest.mark.parametrize(
    "env",
    [{}, {"DRACTL_FILE": f"-{os.pathsep}-"}],
    ids=["flag-twice", "env-var-twice"],
)
def test_stdin_given_twice_is_a_usage_error_naming_the_flag(env: dict[str, str]) -> None:
    """Guards: a second `-` (in -f or DRACTL_FILE) is exit 2 naming -f and saying stdin can be read once, before any
    input is read, instead of the second read finding standard input empty."""
    args = ("simulate",) if env else ("simulate", "-f", "-", "-f", "-")
    result = _invoke(*args, env=env, stdin=MANIFESTS)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '-f' / '--file' (env var: 'DRACTL_FILE'): '-' is given more than once: "
        "standard input can be read once"
    )


@pytest.mark.parametrize(
    ("stdin", "problem"),
    [
        ("", "no Kubernetes objects: standard input is empty or only comments"),
        ("# nothing yet\n---\n", "no Kubernetes objects: standard input is empty or only comments"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe", "cannot read: not UTF-8 text (a binary file?); manifests are YAML or JSON"),
        ("a: [\n", "line 2, column 1: YAML syntax error: while parsing a flow node did not find expected node content"),
    ],
    ids=["empty", "only-comments", "binary", "syntax-error"],
)
def test_bad_stdin_is_one_line_naming_stdin(stdin: str | bytes, problem: str) -> None:
    """Guards: empty, comment-only, binary or unparsable standard input is exit 1 with the problem an empty, binary or
    unparsable file gets, named `<stdin>`, and no traceback."""
    result = _invoke("simulate", "-f", "-", stdin=stdin)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"<stdin>: {problem}"]


def test_invalid_objects_on_stdin_are_named_as_from_stdin() -> None:
    """Guards: a field problem in a manifest read from `-f -` names `<stdin>`, the object and the field."""
    result = _invoke("simulate", "-f", "-", stdin=BAD)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0].startswith(
        "<stdin>: ResourceClaim default/train: spec.devices.requests[0].exactly.count:"
    )


def _simulate_program(*args: str, stdin: bytes | None) -> tuple[int, str, str]:
    """`dractl simulate` run as a program with `stdin` on its standard input (closed when None), its standard streams in
    Latin-1 as in a non-UTF-8 locale: exit code, stdout and stderr."""
    command = [sys.executable, "-m", "dractl", "simulate", *args]
    if stdin is None:  # subprocess cannot start a child with descriptor 0 closed; the shell's `<&-` does
        command = ["sh", "-c", 'exec "$@" <&-', "sh", *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "latin-1"}
    done = subprocess.run(command, input=stdin, env=env, capture_output=True, timeout=60, check=False, cwd=ROOT)
    return done.returncode, done.stdout.decode("latin-1"), done.stderr.decode("latin-1")


@pytest.mark.parametrize(
    ("stdin", "code"),
    [(MANIFESTS.encode(), 0), (BAD.encode(), 1), (b"a: [\n", 1), (b"\xff\xfe", 1)],
    ids=["manifests", "invalid-objects", "syntax-error", "binary"],
)
def test_dash_reads_stdin_as_dev_stdin_reads_it(stdin: bytes, code: int) -> None:
    """Guards: `-f -` reads standard input the way `-f /dev/stdin` (a pipe) does, as UTF-8 whatever the locale: the
    same output, exit code and problems, only named `<stdin>` instead of `/dev/stdin`."""
    dev = _simulate_program("-f", "/dev/stdin", "-o", "json", stdin=stdin)
    dash = _simulate_program("-f", "-", "-o", "json", stdin=stdin)
    assert dev[0] == code and "Traceback" not in dev[2]
    assert dash == (code, dev[1], dev[2].replace("/dev/stdin: ", "<stdin>: "))
    assert code == 0 or dash[2].startswith("<stdin>: ")


def test_closed_stdin_is_one_line() -> None:
    """Guards: `-f -` with standard input closed (`<&-`) is one line naming `<stdin>`, exit 1, not a traceback."""
    closed = "<stdin>: cannot read: [Errno 9] standard input is closed\n"
    assert _simulate_program("-f", "-", stdin=None) == (1, "", closed)


def test_json_output_has_the_documented_keys(manifests: pathlib.Path) -> None:
    """Guards: -o json is {"claims": [{namespace, name, status, allocated, node, allocation, reservedFor, reasons,
    warnings}], "summary": {...}}."""
    result = _invoke("simulate", "-f", str(manifests), "-o", "json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    claims = {c["name"]: c for c in document["claims"]}
    assert list(claims) == ["too-big", "fits"]
    for claim in claims.values():
        assert set(claim) == {
            "namespace",
            "name",
            "status",
            "allocated",
            "node",
            "allocation",
            "reservedFor",
            "reasons",
            "warnings",
        }
    assert claims["fits"]["allocated"] is True and claims["fits"]["node"] == "node-1"
    assert claims["fits"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}
    ]
    assert (
        claims["too-big"]["allocated"] is False
        and claims["too-big"]["allocation"] is None
        and claims["too-big"]["reasons"]
    )
    summary = document["summary"]
    assert (summary["policy"], summary["claims"], summary["allocated"], summary["unallocated"]) == ("binpack", 2, 1, 1)
    no_gpus = {"gpus": {"total": 0, "full": 0, "partitioned": 0, "free": 0}, "memory": {"total": 0, "allocated": 0}}
    assert summary["nodes"] == [
        {"name": "node-1", "devices_used": 1, "devices_total": 1, "counters": {}, **no_gpus, "largestPlaceable": {}}
    ]
    assert summary["cluster"] == {**no_gpus, "largestPlaceable": {}}


def test_yaml_output_is_resource_claims_as_the_api_holds_them(manifests: pathlib.Path) -> None:
    """Guards: -o yaml prints ResourceClaims with status.allocation and reservedFor; reasons go to stderr."""
    result = _invoke("simulate", "-f", str(manifests), "-o", "yaml")
    assert result.exit_code == 0, result.stderr
    documents = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout)}
    assert all(d["apiVersion"] == "resource.k8s.io/v1" and d["kind"] == "ResourceClaim" for d in documents.values())
    status = documents["fits"]["status"]
    assert status["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}
    ]
    assert [(r["resource"], r["name"]) for r in status["reservedFor"]] == [("pods", "one"), ("pods", "two")]
    assert "allocation" not in documents["too-big"].get("status", {})
    assert result.stderr.startswith("default/too-big: ")


def test_yaml_output_fed_back_in_keeps_the_allocations(manifests: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Guards: claims printed by -o yaml decode again, and are then reported as allocated on the same devices."""
    first = _invoke("simulate", "-f", str(manifests), "-o", "yaml")
    again = tmp_path / "again.yaml"
    cluster = MANIFESTS.split("---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim")[0]
    again.write_text(cluster + first.stdout)
    result = _invoke("simulate", "-f", str(again), "-o", "json")
    assert result.exit_code == 0, result.stderr
    fits = next(c for c in json.loads(result.stdout)["claims"] if c["name"] == "fits")
    assert fits["allocated"] and fits["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


def test_table_shows_claims_reasons_and_nodes_and_exits_0(manifests: pathlib.Path) -> None:
    """Guards: the default table lists every claim, the reasons of the one that failed, a node summary,
    and still exits 0."""
    result = _invoke("simulate", "-f", str(manifests))
    assert result.exit_code == 0, result.stderr
    for text in ("default/fits", "default/too-big", "not allocated", "node-1", "1 of 2 claims allocated", "1 / 1"):
        assert text in result.stdout


def test_timing_prints_claims_per_second_on_stderr(manifests: pathlib.Path) -> None:
    """Guards: --timing prints one stderr line with claims_per_s=<float> and leaves stdout parseable."""
    result = _invoke("simulate", "-f", str(manifests), "-o", "json", "--timing")
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if "claims_per_s=" in line]
    assert len(lines) == 1 and TIMING.search(lines[0])
    json.loads(result.stdout)


@pytest.mark.parametrize("policy", ["first-fit", "binpack"])
def test_without_files_the_example_cluster_runs(policy: str) -> None:
    """Guards: `dractl simulate` with no -f runs the built-in example and allocates every claim in it."""
    result = _invoke("simulate", "--policy", policy, "-o", "json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["unallocated"] == 0 and summary["claims"] == 5


def test_python_dash_m_dractl_runs_the_cli() -> None:
    """Guards: `python -m dractl` is the same CLI as the console script."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    completed = subprocess.run(
        [sys.executable, "-m", "dractl", "--version"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0
    assert completed.stdout == f"dractl {dractl.__version__}\n"


def test_search_limit_reaches_the_allocator() -> None:
    """Guards: --search-limit is handed to the allocator: a limit of 1 step ends every search of the
    example with that reason."""
    result = _invoke("simulate", "--search-limit", "1", "-o", "json")
    assert result.exit_code == 0, result.stderr
    claims = json.loads(result.stdout)["claims"]
    assert claims and all(not c["allocated"] and "search limit" in c["reasons"][0] for c in claims)


def test_table_prints_reasons_verbatim(tmp_path: pathlib.Path) -> None:
    """Guards: brackets in a reason (CEL map access, "[bold]") are printed as written, not taken for rich markup."""
    odd = (
        MANIFESTS.split("---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim")[0]
        + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: odd}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.example.com
        selectors: [{cel: {expression: 'device.attributes["gpu.example.com"].bold == "[bold]"'}}]
"""
    )
    path = tmp_path / "odd.yaml"
    path.write_text(odd)
    result = _invoke("simulate", "-f", str(path))
    assert result.exit_code == 0, result.stderr
    text = "".join(result.stdout.split())
    assert 'device.attributes["gpu.example.com"].bold=="[bold]"' in text


def test_selector_that_does_not_compile_is_rejected_like_the_api_server_would(tmp_path: pathlib.Path) -> None:
    """Guards: `>=` on a quantity (the seed article's class) exits 1 naming file, object and field, with the expression
    to write instead."""
    path = tmp_path / "class.yaml"
    path.write_text(
        """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: high-memory-gpu}
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com" && device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")
"""
    )
    result = _invoke("simulate", "-f", str(path))
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"{path}: DeviceClass high-memory-gpu: spec.selectors[0].cel.expression: CEL expression"
    )
    assert (
        'write instead: device.driver == "gpu.nvidia.com" && '
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0' in result.stderr
    )
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_an_opaque_config_the_node_agent_would_refuse_is_a_warning(tmp_path: pathlib.Path) -> None:
    """Guards: a claim whose GpuConfig the node agent would refuse at prepare time (and the chart's admission policy
    at apply time, where it is on) is allocated as a scheduler would allocate it: exit 0, one stderr warning naming
    file, claim and field with the agent's message, and the claim marked in the output."""
    path = tmp_path / "claim.yaml"
    path.write_text(
        """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: tuned, namespace: default}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Fast}}
"""
    )
    result = _invoke("simulate", "-f", str(simulate.EXAMPLES), "-f", str(path))
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        f"warning: {path}: ResourceClaim default/tuned: spec.devices.config[0].opaque.parameters"
        ".sharing.timeSlicingConfig.interval: must be Default, Short, Medium or Long, got 'Fast' (the node agent will "
        "refuse to prepare a claim with this config)"
    ]
    assert "1 the node agent will refuse to prepare." in result.stdout


def test_the_cli_imports_no_cluster_libraries_until_a_mode_needs_them() -> None:
    """Guards: `dractl simulate` does not pay for importing gRPC, the Kubernetes client or prometheus-client."""
    code = (
        "import sys, dractl.cli; print(sorted(m for m in ('grpc', 'kubernetes', "
        "'prometheus_client') if m in sys.modules))"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert completed.stdout.strip() == "[]"
