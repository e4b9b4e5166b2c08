"""`dractl discover`: flags and their environment variables, YAML and JSON output, one-line errors."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner, Result

from dractl import cli, config
from dractl.model import decode
from dractl.node import backend, discover, fakegpu

ROOT = pathlib.Path(__file__).resolve().parents[3]
FLAGS = {
    "--node-name": "DRACTL_NODE_NAME",
    "--driver-name": "DRACTL_DRIVER_NAME",
    "--device-source": "DRACTL_DEVICE_SOURCE",
    "--fake-profile": "DRACTL_FAKE_PROFILE",
    "--mig-mode": "DRACTL_MIG_MODE",
    "--consumable-memory": "DRACTL_CONSUMABLE_MEMORY",
    "--output": "DRACTL_OUTPUT",
}


def _invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.main, ["discover", *args], env=env, catch_exceptions=False)


def _fake(*args: str, env: dict[str, str] | None = None) -> Result:
    return _invoke("--device-source", "fake", *args, env=env)


def test_prints_valid_slices_as_yaml() -> None:
    """Guards the default output: YAML ResourceSlice documents the API would accept."""
    result = _fake("--fake-profile", "t4-x2", "--node-name", "gpu-node-7")
    assert result.exit_code == 0, result.stderr
    objects = decode.load_text(result.stdout, file="stdout")
    (only,) = objects.resource_slices
    assert only.node_name == "gpu-node-7" and [d.name for d in only.devices] == ["gpu-0", "gpu-1"]


def test_json_output_is_a_list() -> None:
    """Guards -o json: one JSON List of ResourceSlices with the same content as the YAML."""
    as_json = json.loads(_fake("--fake-profile", "l4-x4", "--node-name", "n1", "-o", "json").stdout)
    as_yaml = list(yaml.safe_load_all(_fake("--fake-profile", "l4-x4", "--node-name", "n1").stdout))
    assert as_json["kind"] == "List" and as_json["items"] == as_yaml


def test_flags_state_defaults_and_env_vars() -> None:
    """Guards: every discover flag states its default and names its DRACTL_<FLAG> variable."""
    result = _invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for flag, env in FLAGS.items():
        assert flag in text and env in text, flag
    assert "NODE_NAME" in text
    assert text.count("(default:") == len(FLAGS)


def test_env_vars_mirror_flags() -> None:
    """Guards that DRACTL_* variables (and NODE_NAME) act like their flags."""
    env = {
        "DRACTL_DEVICE_SOURCE": "fake",
        "DRACTL_FAKE_PROFILE": "a100-mig-mixed",
        "NODE_NAME": "from-env",
        "DRACTL_DRIVER_NAME": "gpu.example.com",
        "DRACTL_MIG_MODE": "dynamic",
        "DRACTL_CONSUMABLE_MEMORY": "1",
        "DRACTL_OUTPUT": "json",
    }
    result = _invoke(env=env)
    assert result.exit_code == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    assert {i["spec"]["nodeName"] for i in items} == {"from-env"}
    assert {i["spec"]["driver"] for i in items} == {"gpu.example.com"}
    assert any("sharedCounters" in i["spec"] for i in items)
    devices = {d["name"]: d for i in items for d in i["spec"].get("devices", [])}
    assert devices["gpu-3"].get("allowMultipleAllocations") is None  # it consumes counters: not shared
    assert "gpu-0" in devices and "gpu-0-mig-1g10gb-19-3" in devices  # dynamic MIG: whole and MIG, whatever the mode


def test_node_name_flag_wins_over_environment() -> None:
    """Guards precedence: the flag over DRACTL_NODE_NAME over NODE_NAME."""
    env = {"DRACTL_NODE_NAME": "dractl-env", "NODE_NAME": "downward-api"}
    result = _fake("--fake-profile", "t4-x2", env=env)
    assert decode.load_text(result.stdout).resource_slices[0].node_name == "dractl-env"
    result = _fake("--fake-profile", "t4-x2", "--node-name", "flag", env=env)
    assert decode.load_text(result.stdout).resource_slices[0].node_name == "flag"


def test_bad_profile_file_is_one_line(tmp_path: pathlib.Path) -> None:
    """Guards a bad --fake-profile file: exit 1, one line naming the file and field, no traceback."""
    path = tmp_path / "lab.yaml"
    path.write_text("driverVersion: 580.126.20\ncudaDriverVersion: '13.0'\ngpus: [{model: a100-sxm4-80gb}]\n")
    result = _fake("--fake-profile", str(path), "--node-name", "n1")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f'error: {path}: gpus[0].pciBusID: required (e.g. "0000:07:00.0")\n'


def test_unknown_profile_is_one_line() -> None:
    """Guards an unknown profile name: exit 1 with the list of built-in profiles."""
    result = _fake("--fake-profile", "dgx-b200", "--node-name", "n1")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "a100-80gb-x8" in result.stderr and "dgx-b200" in result.stderr


def test_bad_node_name_is_one_line() -> None:
    """Guards an invalid --node-name: exit 1, one line naming it, no slices printed."""
    result = _fake("--node-name", "GPU_Node", "--fake-profile", "t4-x2")
    assert result.exit_code == 1 and result.stdout == ""
    assert (
        result.stderr == "error: node name 'GPU_Node' is not a DNS subdomain (lowercase letters, digits, '-' and '.'):"
        " set --node-name to the Node's name\n"
    )


def test_bad_choice_is_a_usage_error() -> None:
    """Guards click's validation of --mig-mode and --device-source choices (exit 2, names the flag)."""
    result = _fake("--mig-mode", "mixed")
    assert result.exit_code == 2 and "--mig-mode" in result.stderr


def test_nvml_without_driver_is_one_line_without_traceback() -> None:
    """Guards `--device-source nvml` on a machine without the NVIDIA driver: exit 1, one clear line."""
    from dractl.node import nvml

    try:
        nvml.NvmlBackend().close()
    except backend.NvmlError:
        pass
    else:
        pytest.skip("this machine has a working NVIDIA driver; the no-driver path cannot be shown here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DRACTL_DEVICE_SOURCE", None)
    completed = subprocess.run(
        [sys.executable, "-m", "dractl", "discover", "--node-name", "n1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 1 and completed.stdout == ""
    assert completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr
    assert completed.stderr.startswith("error: cannot read GPUs through NVML (NVML_ERROR_")
    assert "--device-source fake" in completed.stderr


def test_nvml_failure_while_reading_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards an NVML error after start-up (e.g. a GPU fell off the bus mid-read): exit 1, one line."""
    settings = config.Discover(node_name="n1", device_source=config.DeviceSource.FAKE, fake_profile="t4-x2")
    failing = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="n1")
    failing.fail("driver_info", backend.Return.UNKNOWN)
    monkeypatch.setattr(discover, "open_backend", lambda settings, state_file=None: failing)
    out, err = io.StringIO(), io.StringIO()
    assert discover.run(settings, out=out, err=err) == 1
    assert out.getvalue() == ""
    assert (
        err.getvalue() == "error: reading GPUs through NVML failed: NVML_ERROR_UNKNOWN: injected fault in driver_info\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fill stdout")
def test_full_stdout_is_one_line() -> None:
    """Guards `dractl discover > /dev/full`: one line naming the problem, exit 1, no traceback."""
    with open("/dev/full", "w") as full:
        completed = subprocess.run(
            [sys.executable, "-m", "dractl", "discover", "--device-source", "fake", "--node-name", "n1"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert completed.returncode == 1
    assert completed.stderr == "dractl: cannot write the output: No space left on device\n"


def test_closed_stdout_exits_quietly() -> None:
    """Guards `dractl discover | head -1`: the reader goes away early and discover ends without a traceback."""
    args = [
        sys.executable,
        "-m",
        "dractl",
        "discover",
        "--device-source",
        "fake",
        "--node-name",
        "n1",
        "--mig-mode",
        "dynamic",
    ]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) in (0, 141)
    assert stderr == ""
