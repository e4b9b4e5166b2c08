"""GPU sharing: time-slice settings through the backend, and MPS control daemons behind MpsControl."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import pytest

from dractl.node import backend, fakegpu, sharing


def test_time_slice_is_set_and_not_supported_is_ignored() -> None:
    """Guards: the interval reaches the GPU with compute mode DEFAULT; NOT_SUPPORTED is a no-op."""
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="n")
    gpus.set_compute_mode(0, backend.ComputeMode.EXCLUSIVE_PROCESS)
    sharing.set_time_slice(gpus, minor=0, interval=2)
    assert gpus.time_slice(0) is backend.TimeSlice.MEDIUM
    assert gpus.compute_mode(0) is backend.ComputeMode.DEFAULT
    gpus.fail("set_time_slice", backend.Return.NOT_SUPPORTED)
    sharing.reset_time_slice(gpus, minor=0)
    assert gpus.time_slice(0) is backend.TimeSlice.MEDIUM
    sharing.reset_time_slice(gpus, minor=0)
    assert gpus.time_slice(0) is backend.TimeSlice.DEFAULT


def test_daemon_id_is_the_nvidia_drivers() -> None:
    """Guards: <claimUID>-<5 hex of sha256 of the sorted UUIDs>, independent of UUID order."""
    a = sharing.daemon_id("uid", ["GPU-b", "GPU-a"])
    assert a == sharing.daemon_id("uid", ["GPU-a", "GPU-b"])
    assert a.startswith("uid-") and len(a) == len("uid-") + 5


def test_nvidia_mps_runs_the_control_daemon_with_its_settings(tmp_path: pathlib.Path) -> None:
    """Guards: nvidia-cuda-mps-control runs with per-daemon dirs and settings; stop quits, cleans up."""
    calls: list[tuple[list[str], dict[str, str], str]] = []

    def runner(argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
        calls.append((list(argv), dict(env), stdin))
        if argv[-1] == "-d":
            (tmp_path / "d1" / "pipe" / "control").touch()

    mps = sharing.NvidiaMps(root=tmp_path, runner=runner)
    settings = sharing.MpsSettings(
        daemon_id="d1", uuids=("GPU-a", "GPU-b"), active_thread_percentage=25, pinned_limits_mib={"GPU-b": 2048}
    )
    mps.start(settings)
    mps.start(settings)  # running already: nothing more
    assert mps.daemons() == ("d1",)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "d1/pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "d1/log")}
    assert calls == [
        (["nvidia-cuda-mps-control", "-d"], {**env, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, ""),
        (
            ["nvidia-cuda-mps-control"],
            {**env, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
            "set_default_active_thread_percentage 25\n",
        ),
        (
            ["nvidia-cuda-mps-control"],
            {**env, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
            "set_default_device_pinned_mem_limit GPU-b 2048M\n",
        ),
    ]
    edits = mps.workload_edits("d1")
    assert edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    assert edits.mounts[0]["hostPath"] == str(tmp_path / "d1/pipe")
    mps.stop("d1")
    assert calls[-1] == (["nvidia-cuda-mps-control"], env, "quit\n")
    assert not (tmp_path / "d1").exists()
    mps.stop("d1")
    assert len(calls) == 4 and mps.daemons() == ()


def test_fake_mps_records_calls_and_makes_the_pipe_dir(tmp_path: pathlib.Path) -> None:
    """Guards: the fake records start/stop, keeps running settings, and creates the pipe dir its edits mount."""
    fake = sharing.FakeMps(root=tmp_path)
    fake.start(sharing.MpsSettings(daemon_id="x", uuids=("GPU-a",), multi_user=True))
    assert (tmp_path / "x" / "pipe").is_dir() and fake.running["x"].multi_user
    fake.stop("x")
    assert fake.calls == [("start", "x"), ("stop", "x")] and fake.running == {} and not (tmp_path / "x").exists()


def test_a_failing_mps_control_command_is_an_os_error_the_prepare_path_rolls_back_on(tmp_path: pathlib.Path) -> None:
    """Guards: nvidia-cuda-mps-control exiting non-zero raises OSError (caught by prepare), not CalledProcessError."""
    mps = sharing.NvidiaMps(root=tmp_path, executable="false")
    with pytest.raises(OSError, match="false exited with 1"):
        mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",)))
