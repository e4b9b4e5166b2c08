"""GPU sharing: time-slice settings through the backend, and MPS control daemons behind MpsControl."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence

import controlplane
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


class ControlDaemon:
    """Stands in for nvidia-cuda-mps-control in a runner: `-d` makes the control FIFO and holds it open for
    reading, as the real daemon does; `die()` drops the reader, as a daemon gone with an earlier agent."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str], str]] = []
        self.readers: list[int] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
        self.calls.append((list(argv), dict(env), stdin))
        if "-d" in argv:
            control = pathlib.Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
            os.mkfifo(control)
            self.readers.append(os.open(control, os.O_RDONLY | os.O_NONBLOCK))

    def die(self) -> None:
        for fd in self.readers:
            os.close(fd)
        self.readers.clear()


def _daemon_start(tmp_path: pathlib.Path, daemon: str, *flags: str) -> list[str]:
    shm = str(tmp_path / daemon / "shm")
    script = 'mount --bind "$1" /dev/shm && shift && exec "$@"'
    prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "mps-daemon", shm]
    return [*prefix, "nvidia-cuda-mps-control", "-d", *flags]


def test_nvidia_mps_runs_the_control_daemon_with_its_own_shm_and_settings(tmp_path: pathlib.Path) -> None:
    """Guards: each daemon gets a tmpfs of its own, bound over /dev/shm in the daemon's own mount namespace, and
    its settings; workloads mount that tmpfs (never the host's /dev/shm) and the pipe; stop quits and cleans up."""
    daemon = ControlDaemon()
    mps = sharing.NvidiaMps(root=tmp_path, runner=daemon)
    settings = sharing.MpsSettings(
        daemon_id="d1", uuids=("GPU-a", "GPU-b"), active_thread_percentage=25, pinned_limits_mib={"GPU-b": 2048}
    )
    mps.start(settings)
    mps.start(settings)  # running already: nothing more
    assert mps.daemons() == ("d1",) and mps.running("d1")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "d1/pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "d1/log")}
    gpus = {**env, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    mount = daemon.calls[0][0]
    assert mount[:4] == ["mount", "-t", "tmpfs", "-o"] and mount[5:] == ["tmpfs", str(tmp_path / "d1/shm")]
    assert mount[4].startswith("size=") and mount[4].endswith("k,mode=1777")
    assert daemon.calls[1:] == [
        (_daemon_start(tmp_path, "d1"), gpus, ""),
        (["nvidia-cuda-mps-control"], gpus, "set_default_active_thread_percentage 25\n"),
        (["nvidia-cuda-mps-control"], gpus, "set_default_device_pinned_mem_limit GPU-b 2048M\n"),
    ]
    edits = mps.workload_edits("d1")
    assert edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    assert [(m["hostPath"], m["containerPath"]) for m in edits.mounts] == [
        (str(tmp_path / "d1/pipe"), "/tmp/nvidia-mps"),
        (str(tmp_path / "d1/shm"), "/dev/shm"),
    ]
    mps.stop("d1")
    assert daemon.calls[-1] == (["nvidia-cuda-mps-control"], env, "quit\n")
    assert not (tmp_path / "d1").exists()
    daemon.die()
    mps.stop("d1")
    assert len(daemon.calls) == 5 and mps.daemons() == ()


def test_a_control_pipe_left_by_a_dead_daemon_does_not_pass_for_a_running_one(tmp_path: pathlib.Path) -> None:
    """Guards: after an agent restart the old daemon's control pipe is still there but has no reader: start()
    replaces the pipe directory and starts the daemon again instead of returning at once; stop() then sends no
    quit to a daemon that is gone. A regular file named control is not a daemon either."""
    daemon = ControlDaemon()
    mps = sharing.NvidiaMps(root=tmp_path, runner=daemon)
    settings = sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",), multi_user=True)
    mps.start(settings)
    daemon.die()
    assert (tmp_path / "d1/pipe/control").exists() and not mps.running("d1")
    mps.start(settings)
    starts = [call for call in daemon.calls if "-d" in call[0]]
    assert [call[0] for call in starts] == [_daemon_start(tmp_path, "d1", "-M")] * 2
    assert mps.running("d1")
    daemon.die()
    mps.stop("d1")
    assert not any(call[2] == "quit\n" for call in daemon.calls)
    (tmp_path / "d2/pipe").mkdir(parents=True)
    (tmp_path / "d2/pipe/control").write_text("")
    assert not mps.running("d2")


def test_start_returns_once_the_forked_daemon_answers(tmp_path: pathlib.Path) -> None:
    """Guards: `nvidia-cuda-mps-control -d` returns before its forked daemon opens the control pipe; start() waits
    for the pipe to answer, so the settings and the workload find a daemon."""
    daemon = ControlDaemon()

    def forks(argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
        if "-d" not in argv:
            daemon(argv, env, stdin)
            return
        ready = threading.Timer(0.2, daemon, (argv, env, stdin))
        ready.start()

    mps = sharing.NvidiaMps(root=tmp_path, runner=forks)
    mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",), active_thread_percentage=50))
    assert mps.running("d1")
    assert [("-d" in call[0], call[2]) for call in daemon.calls[1:]] == [
        (True, ""),
        (False, "set_default_active_thread_percentage 50\n"),
    ]
    daemon.die()


def test_a_daemon_that_never_answers_fails_the_start_with_its_log(tmp_path: pathlib.Path) -> None:
    """Guards: a control daemon that exits at once (its pipe never answers) is an OSError quoting its control.log,
    which the prepare path rolls back on, and nothing of it is left."""

    def dies(argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
        if "-d" in argv:
            log = pathlib.Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
            log.write_text("[2026-11-27 13:21:08.1 Control 4242] Failed to start: no GPU visible\n")

    mps = sharing.NvidiaMps(root=tmp_path, runner=dies, start_timeout=0.2)
    with pytest.raises(OSError, match=r"did not answer within 0.2 s .*control.log: .*Failed to start: no GPU"):
        mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",)))
    assert not (tmp_path / "d1").exists()


@pytest.mark.parametrize("kind", [socket.SOCK_SEQPACKET, socket.SOCK_STREAM], ids=["seqpacket", "stream"])
def test_a_control_socket_answers_while_its_daemon_listens(tmp_path: pathlib.Path, kind: int) -> None:
    """Guards: CUDA 13's control daemon listens on a SOCK_SEQPACKET unix socket at pipe/control (seen on an H200,
    where a stream connect gets EPROTOTYPE): it counts as running while it listens, of either kind, and not once
    its daemon has closed it."""
    mps = sharing.NvidiaMps(root=tmp_path)
    (tmp_path / "d1/pipe").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, kind) as listener:
        listener.bind(str(tmp_path / "d1/pipe/control"))
        listener.listen()
        assert mps.running("d1")
    assert (tmp_path / "d1/pipe/control").exists() and not mps.running("d1")


def test_a_daemon_that_stops_answering_is_ended_by_its_pid_file_and_another_program_is_not(
    tmp_path: pathlib.Path,
) -> None:
    """Guards: a control daemon that still runs but no longer answers on its pipe (a stale probe once left every
    CUDA 13 daemon so) gets SIGTERM from stop(), and from a start() that replaces its pipe, through the pid file it
    keeps in its pipe directory, so removing the directory leaves no daemon running; a pid file naming a process
    of another program is left alone."""
    program = tmp_path / "bin/nvidia-cuda-mps-control"
    program.parent.mkdir()
    shutil.copy("/bin/sleep", program)  # a process whose name is the control daemon's
    processes: list[subprocess.Popen[bytes]] = []
    daemon = ControlDaemon()

    def forks(argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
        daemon(argv, env, stdin)
        if "-d" in argv:
            runs = [str(program) if env["CUDA_MPS_LOG_DIRECTORY"].endswith("d1/log") else "sleep", "60"]
            processes.append(subprocess.Popen(runs))
            # Popen can return before the kernel names the child after its program: a daemon writes its pid file
            # once it runs, so wait for that name, as the real daemon's would be long before anyone reads it.
            comm = pathlib.Path(f"/proc/{processes[-1].pid}/comm")
            named = pathlib.Path(runs[0]).name[:15]
            controlplane.wait_until(lambda: comm.read_text().strip() == named, what=f"the child is named {named}")
            pid_file = pathlib.Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "nvidia-cuda-mps-control.pid"
            pid_file.write_text(f"{processes[-1].pid}\n")

    mps = sharing.NvidiaMps(root=tmp_path / "mps", runner=forks)
    try:
        mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",)))
        mps.start(sharing.MpsSettings(daemon_id="d2", uuids=("GPU-b",)))
        daemon.die()  # both still run; neither answers
        mps.stop("d1")
        mps.stop("d2")
        assert processes[0].wait(timeout=30) == -signal.SIGTERM
        assert processes[1].poll() is None
        assert not any(call[2] == "quit\n" for call in daemon.calls)
        # start() replacing the pipe of a daemon that does not answer ends that daemon first.
        mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",)))
        daemon.die()
        mps.start(sharing.MpsSettings(daemon_id="d1", uuids=("GPU-a",)))
        assert processes[2].wait(timeout=30) == -signal.SIGTERM
        assert processes[3].poll() is None
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_fake_mps_records_calls_and_makes_the_pipe_dir(tmp_path: pathlib.Path) -> None:
    """Guards: the fake records start/stop, keeps running settings, and creates the pipe and shm dirs its edits
    mount."""
    fake = sharing.FakeMps(root=tmp_path)
    fake.start(sharing.MpsSettings(daemon_id="x", uuids=("GPU-a",), multi_user=True))
    assert (tmp_path / "x" / "pipe").is_dir() and (tmp_path / "x" / "shm").is_dir() and fake.running["x"].multi_user
    assert [m["hostPath"] for m in fake.workload_edits("x").mounts] == [
        str(tmp_path / "x/pipe"),
        str(tmp_path / "x/shm"),
    ]
    fake.stop("x")
    assert fake.calls == [("start", "x"), ("stop", "x")] and fake.running == {} and not (tmp_path / "x").exists()


def test_a_failing_mps_command_is_an_os_error_the_prepare_path_rolls_back_on() -> None:
    """Guards: NvidiaMps's command runner turns a non-zero exit (of the control client, mount, unshare) into
    OSError naming the command, which prepare catches, not CalledProcessError."""
    with pytest.raises(OSError, match="false exited with 1"):
        sharing._run(["false"], {}, "")
