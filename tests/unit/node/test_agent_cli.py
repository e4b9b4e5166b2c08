"""`dractl node-agent` on the command line: flags with defaults and env vars, one-line failures."""

from __future__ import annotations

import pathlib
import re

import faultproxy
import pytest
from click.testing import CliRunner

from dractl import cli

FLAGS = {
    "--node-name": "DRACTL_NODE_NAME",
    "--driver-name": "DRACTL_DRIVER_NAME",
    "--device-source": "DRACTL_DEVICE_SOURCE",
    "--fake-profile": "DRACTL_FAKE_PROFILE",
    "--mig-mode": "DRACTL_MIG_MODE",
    "--consumable-memory": "DRACTL_CONSUMABLE_MEMORY",
    "--cdi-root": "DRACTL_CDI_ROOT",
    "--kubelet-registrar-dir": "DRACTL_KUBELET_REGISTRAR_DIR",
    "--kubelet-plugins-dir": "DRACTL_KUBELET_PLUGINS_DIR",
    "--state-dir": "DRACTL_STATE_DIR",
    "--pod-uid": "DRACTL_POD_UID",
    "--kubeconfig": "DRACTL_KUBECONFIG",
    "--kube-api-qps": "DRACTL_KUBE_API_QPS",
    "--kube-api-burst": "DRACTL_KUBE_API_BURST",
    "--health-port": "DRACTL_HEALTH_PORT",
    "--metrics-port": "DRACTL_METRICS_PORT",
    "--log-format": "DRACTL_LOG_FORMAT",
}


@pytest.fixture
def dirs(sock_dir: pathlib.Path) -> list[str]:
    return [
        "--kubelet-registrar-dir",
        str(sock_dir / "reg"),
        "--kubelet-plugins-dir",
        str(sock_dir / "plugins"),
        "--cdi-root",
        str(sock_dir / "cdi"),
        "--health-port",
        "-1",
        "--metrics-port",
        "-1",
    ]


def test_every_flag_states_its_default_and_env_var() -> None:
    """Guards: each node-agent flag is listed with its DRACTL_ variable and a stated default."""
    result = CliRunner().invoke(cli.main, ["node-agent", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for flag, env in FLAGS.items():
        assert flag in text and env in text, flag
    blocks = re.split(r"\s(?=--[a-z])", text.split("Options:", 1)[1])
    described = [b for b in blocks if b.split(" ", 1)[0] in FLAGS]
    assert len(described) == len(FLAGS)
    assert all("(default:" in block for block in described)
    assert "NODE_NAME" in text.replace("DRACTL_NODE_NAME", "")
    assert "POD_UID" in text.replace("DRACTL_POD_UID", "")


def test_nvml_without_a_driver_is_one_line_and_exit_1(dirs: list[str]) -> None:
    """Guards: `--device-source nvml` without an NVIDIA driver prints one error line, exit 1, no traceback."""
    if _driver_present():
        pytest.skip("an NVIDIA driver is present here; this test needs a machine without one")
    result = CliRunner().invoke(cli.main, ["node-agent", "--node-name", "n1", "--device-source", "nvml", *dirs])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dractl node-agent: error: cannot read GPUs through NVML")


def test_missing_kubeconfig_is_one_line_naming_it(dirs: list[str], tmp_path: pathlib.Path) -> None:
    """Guards: a --kubeconfig that does not exist is one error line naming the file, exit 1."""
    missing = tmp_path / "no-such-kubeconfig"
    result = CliRunner().invoke(
        cli.main, ["node-agent", "--node-name", "n1", "--device-source", "fake", "--kubeconfig", str(missing), *dirs]
    )
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(missing) in lines[0]


def test_a_bad_node_name_is_one_line_naming_the_flag_and_writes_no_state(
    dirs: list[str], sock_dir: pathlib.Path
) -> None:
    """Guards: a --node-name that cannot name a Node stops the start before anything is written (fake GPUs keep their
    state for the node they were made for, so a state written under the bad name would refuse the corrected run)."""
    result = CliRunner().invoke(cli.main, ["node-agent", "--node-name", "Bad_Node", "--device-source", "fake", *dirs])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "dractl node-agent: error: node name 'Bad_Node' is not a DNS subdomain (lowercase letters, digits, '-' and "
        "'.'): set --node-name to the Node's name"
    ]
    assert not (sock_dir / "plugins").exists()


def test_a_state_dir_that_cannot_be_made_is_one_line_naming_the_flag(dirs: list[str], tmp_path: pathlib.Path) -> None:
    """Guards: a --state-dir that cannot be created (under a regular file here) is one line naming the directory and
    the flag, exit 1."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = blocker / "state"
    result = CliRunner().invoke(
        cli.main, ["node-agent", "--node-name", "n1", "--device-source", "fake", "--state-dir", str(state), *dirs]
    )
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"cannot create the state directory {state} (--state-dir" in lines[0]


@pytest.mark.parametrize(
    ("case", "failure"),
    [
        ("under-a-regular-file", "cannot create the CDI directory {path} (--cdi-root): Not a directory"),
        ("sysfs", "cannot write to the CDI directory {path} (--cdi-root): "),
    ],
    ids=["under-a-regular-file", "a-directory-nobody-may-write"],
)
def test_a_cdi_root_that_cannot_be_made_or_written_is_one_line_naming_the_flag(
    case: str, failure: str, dirs: list[str], sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: a --cdi-root that cannot be created (a path under a regular file) or written to stops the start with
    one line naming the directory, the flag and the OS error, exit 1, before any socket is made (not an agent whose
    every prepare fails). The unwritable directory is /sys, where sysfs lets nobody create a file, root included
    (root ignores a directory's mode bits)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = blocker / "cdi" if case == "under-a-regular-file" else pathlib.Path("/sys")
    if case == "sysfs" and not path.is_dir():
        pytest.skip("no /sys on this machine, the one directory root cannot write to")
    result = CliRunner().invoke(
        cli.main, ["node-agent", "--node-name", "n1", "--device-source", "fake", *dirs, "--cdi-root", str(path)]
    )
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"dractl node-agent: error: cannot start: {failure.format(path=path)}"), line
    assert line.rsplit(": ", 1)[1] in {"Not a directory", "Permission denied", "Read-only file system"}, line
    assert not (sock_dir / "reg").exists() and not (sock_dir / "plugins" / "gpu.nvidia.com" / "dra.sock").exists()


def test_an_api_server_that_refuses_is_one_line_naming_it_and_its_answer(
    dirs: list[str], fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: an API server that refuses the agent at start (403: a token without RBAC) is one line naming the
    server and its answer, exit 1."""
    fault_proxy.add(faultproxy.respond(403, path="/version", count=None, reason="Forbidden"))
    result = CliRunner().invoke(
        cli.main,
        [
            "node-agent",
            "--node-name",
            "n1",
            "--device-source",
            "fake",
            "--kubeconfig",
            str(fault_proxy.kubeconfig),
            *dirs,
        ],
    )
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"dractl node-agent: error: cannot start: the API server https://127.0.0.1:{fault_proxy.port} answered: 403 "
    ), line


def test_an_api_server_whose_version_names_no_version_is_one_line_naming_it(
    dirs: list[str], fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: a /version answer the agent cannot read (200 without major and minor) is one line naming the server
    and what is missing, exit 1, not a traceback (a crash loop)."""
    fault_proxy.add(faultproxy.respond(200, path="/version", count=None))
    result = CliRunner().invoke(
        cli.main,
        ["node-agent", "--node-name", "n1", "--device-source", "fake", "--kubeconfig", str(fault_proxy.kubeconfig)]
        + dirs,
    )
    assert result.exit_code == 1, result.output
    [line] = result.stderr.splitlines()
    assert line == (
        f"dractl node-agent: error: cannot start: the API server https://127.0.0.1:{fault_proxy.port} answered what "
        "dractl cannot read: the API server's /version names no version: major None, minor None"
    ), line


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["--kube-api-qps", "-1"], "--kube-api-qps"), (["--health-port", "port"], "--health-port")],
    ids=["negative-qps", "port-not-a-number"],
)
def test_a_flag_value_of_the_wrong_type_or_range_is_one_line_and_exit_2(args: list[str], flag: str) -> None:
    """Guards: a value the flag's type refuses is one line naming the flag, exit 2, as for the controller (no usage
    block of three lines)."""
    result = CliRunner().invoke(cli.main, ["node-agent", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dractl node-agent: error: ") and f"'{flag}'" in lines[0]


def test_env_vars_set_the_flags(dirs: list[str]) -> None:
    """Guards: DRACTL_FAKE_PROFILE reaches the agent (a bad value from the environment is reported like the flag)."""
    result = CliRunner().invoke(
        cli.main,
        ["node-agent", "--node-name", "n1", "--device-source", "fake", *dirs],
        env={"DRACTL_FAKE_PROFILE": "no-such-profile"},
    )
    assert result.exit_code == 1
    assert "no-such-profile" in result.stderr and len(result.stderr.splitlines()) == 1


def _driver_present() -> bool:
    """Whether real NVML initializes here (then the no-driver tests cannot run)."""
    from dractl.node import backend, nvml

    try:
        nvml.NvmlBackend().close()
    except backend.NvmlError:
        return False
    return True
