"""The shortcuts that keep `dractl simulate` fast end to end: what a run imports, the program's
quick exit, the plain-text table's column arithmetic, and the node modes' help computed on demand."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys

import pytest
from support.simulate_manifests import CLUSTER, claim

from dractl.simulate import report

ROOT = pathlib.Path(__file__).resolve().parents[3]
# Modules a plain `simulate` run to a table must not import: each costs milliseconds at every
# start and belongs to another mode or input or output format (PyYAML for anchors and YAML
# output, msgspec for JSON input and output, the fake GPU backend for the node modes' help
# text, socket for the node modes' default node name).
_NOT_FOR_A_TABLE = {
    "json": ("yaml", "dractl.node.fakegpu", "dractl.node.backend", "socket"),
    "yaml": ("yaml", "msgspec", "dractl.node.fakegpu", "dractl.node.backend", "socket"),
}


def _python(code: str, *, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False
    )


def _manifests_as_json(tmp_path: pathlib.Path) -> pathlib.Path:
    """The test cluster with two claims, as one JSON List."""
    import yaml

    documents = list(yaml.safe_load_all("\n---\n".join((CLUSTER, claim("a"), claim("b")))))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [d for d in documents if d]}))
    return path


@pytest.mark.parametrize("kind", ["json", "yaml"])
def test_a_table_run_imports_nothing_it_does_not_use(tmp_path: pathlib.Path, kind: str) -> None:
    """Guards: simulating plain JSON or YAML input to a table imports neither PyYAML's Python modules, the fake GPU
    backend nor socket, and YAML input not msgspec either."""
    path = _manifests_as_json(tmp_path)
    if kind == "yaml":
        yaml_path = tmp_path / "cluster.yaml"
        yaml_path.write_text("\n---\n".join((CLUSTER, claim("a"), claim("b"))))
        path = yaml_path
    code = (
        "import sys\n"
        "from dractl import cli\n"
        f"try:\n    cli.main(['simulate', '-f', {str(path)!r}], standalone_mode=False)\n"
        "except SystemExit:\n    pass\n"
        f"print('LOADED', sorted(m for m in {_NOT_FOR_A_TABLE[kind]!r} if m in sys.modules))\n"
    )
    completed = _python(code, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "2 of 2 claims allocated." in completed.stdout
    assert completed.stdout.splitlines()[-1] == "LOADED []"


def test_yaml_with_anchors_still_takes_pyyaml_after_the_lazy_import() -> None:
    """Guards: a manifest with an anchor and alias (PyYAML's path, imported on demand) decodes like its plain twin."""
    from dractl.model.decode import loading

    plain = claim("a")
    anchored = plain.replace("metadata: {name: a}", "metadata: {name: &n a, labels: {copy: *n}}")
    assert anchored != plain, "the claim fixture changed: the anchor is not in it"
    twin = loading.load_text(plain).resource_claims[0]
    decoded = loading.load_text(anchored).resource_claims[0]
    assert decoded.meta.labels == {"copy": "a"}
    assert (decoded.meta.name, decoded.spec) == (twin.meta.name, twin.spec)


@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_the_program_ends_with_complete_output_and_its_exit_code(tmp_path: pathlib.Path, output: str) -> None:
    """Guards: `python -m dractl simulate` (which leaves without tearing down the interpreter) writes its whole output
    and stderr, and exits 0; invalid input still exits 1 with its message."""
    path = _manifests_as_json(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "dractl", "simulate", "-f", str(path), "-o", output, "--timing"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    if output == "json":
        assert [c["status"] for c in json.loads(done.stdout)["claims"]] == ["allocated", "allocated"]
    elif output == "yaml":
        assert done.stdout.count("kind: ResourceClaim") == 2 and done.stdout.endswith("\n")
    else:
        assert "2 of 2 claims allocated." in done.stdout
    assert done.stderr.splitlines()[-1].startswith("timing: phase=total ")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    failed = subprocess.run(
        [sys.executable, "-m", "dractl", "simulate", "-f", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert failed.returncode == 1
    assert failed.stderr == f"{bad}: document 1: kind: required (for example DeviceClass, ResourceClaim, Pod)\n"


def test_plain_table_pads_every_line_of_multi_line_cells_in_any_column() -> None:
    """Guards: the plain table pads each column to its widest line (not its widest cell), continues a multi-line cell
    in its own column in any position, and strips trailing spaces."""
    out = io.StringIO()
    rows = [
        ("a", "one\ntwo-long", "x", "first\nsecond"),
        ("longer-name", "n", "status", "r"),
        ("b\nc", "", "", ""),
    ]
    report._plain("Title", ("COL", "NODE", "S", "LAST"), rows, out)
    assert out.getvalue().splitlines() == [
        "Title",
        "COL           NODE       S        LAST",
        "a             one        x        first",
        "              two-long            second",
        "longer-name   n          status   r",
        "b",
        "c",
    ]


def test_plain_table_without_rows_is_its_title_and_header() -> None:
    """Guards: an empty plain table prints the title and the header, padded to the header's own widths."""
    out = io.StringIO()
    report._plain("Nodes", ("NODE", "DEVICES USED", "COUNTERS USED"), [], out)
    assert out.getvalue() == "Nodes\nNODE   DEVICES USED   COUNTERS USED\n"


@pytest.mark.parametrize("mode", ["discover", "node-agent"])
def test_fake_profile_help_still_lists_every_built_in_profile(mode: str) -> None:
    """Guards: `--fake-profile`'s help, computed only when shown, names every built-in profile and the default."""
    from click.testing import CliRunner

    from dractl import cli
    from dractl.node import fakegpu

    result = CliRunner().invoke(cli.main, [mode, "--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    listed = ", ".join(fakegpu.builtin_profiles())
    assert f"--fake-profile TEXT Fake GPUs: a built-in profile ({listed}) or a profile YAML file (default: " in text


@pytest.mark.parametrize("as_program", [True, False], ids=["own-arguments", "arguments-passed"])
def test_only_the_program_leaves_without_tearing_down(tmp_path: pathlib.Path, as_program: bool) -> None:
    """Guards: `cli.main()` with the process's own arguments (the program) ends right after its output, skipping the
    interpreter's teardown (atexit handlers do not run); a caller that passes arguments gets SystemExit as before."""
    path = _manifests_as_json(tmp_path)
    call = "cli.main()" if as_program else f"cli.main(['simulate', '-f', {str(path)!r}])"
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('TORN DOWN', file=sys.stderr))\n"
        f"sys.argv = ['dractl', 'simulate', '-f', {str(path)!r}]\n"
        "from dractl import cli\n"
        f"{call}\n"
    )
    completed = _python(code, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "2 of 2 claims allocated." in completed.stdout
    assert ("TORN DOWN" in completed.stderr) is not as_program
