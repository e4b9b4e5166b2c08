"""GPU sharing at prepare time: time-slicing through the backend, MPS through a control daemon.

What it does: sets and resets a GPU's time-slice (full GPUs only; NOT_SUPPORTED is a no-op,
as in the NVIDIA driver), and runs MPS behind the small `MpsControl` Protocol: start a
control daemon with a thread percentage and pinned-memory limits, stop it, and give the
CDI edits a workload needs to reach it (`CUDA_MPS_PIPE_DIRECTORY`, mounts). `NvidiaMps`
runs `nvidia-cuda-mps-control` with a pipe, log and shm directory per daemon under the state
directory; the shm directory is a tmpfs of its own that the daemon sees as /dev/shm (it runs
in a mount namespace of its own) and its clients get at /dev/shm, as the NVIDIA driver does,
so no workload touches the host's /dev/shm and the agent needs no hostIPC. A daemon counts as
running only when its control pipe has a reader: a pipe left behind by a daemon that died
with an earlier agent is replaced. `FakeMps` records calls for tests and fake GPUs. What it
must not do: decide which claim gets which setting (state does, from the opaque config) or
touch checkpoints.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import structlog

from dractl.node import backend, cdi

__all__ = [
    "MPS_PIPE_IN_CONTAINER",
    "MpsSettings",
    "MpsControl",
    "NvidiaMps",
    "FakeMps",
    "daemon_id",
    "set_time_slice",
    "reset_time_slice",
]

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
# The NVIDIA driver sizes each daemon's shm tmpfs at half the node's memory (65536k if unknown).
_SHM_FALLBACK = "65536k"
# How long a started control daemon has to open its control pipe (it forks and returns at once).
_DAEMON_START_S = 10.0

_log = structlog.get_logger(__name__)


def daemon_id(claim_uid: str, uuids: Iterable[str]) -> str:
    """The NVIDIA driver's MPS daemon id: `<claimUID>-<first 5 hex of sha256(sorted UUIDs)>`. Pure."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"


@dataclasses.dataclass(frozen=True, slots=True)
class MpsSettings:
    """One MPS control daemon: the GPUs it serves (UUIDs, in order), the default active
    thread percentage, and pinned device-memory limits in MiB keyed by UUID."""

    daemon_id: str
    uuids: tuple[str, ...]
    active_thread_percentage: int | None = None
    pinned_limits_mib: Mapping[str, int] = dataclasses.field(default_factory=dict)
    multi_user: bool = False


class MpsControl(Protocol):
    """Starts and stops MPS control daemons. `start` of a running id and `stop` of an
    unknown id both succeed (the checkpoint replays them after a crash)."""

    def start(self, settings: MpsSettings) -> None: ...

    def stop(self, daemon_id: str) -> None: ...

    def daemons(self) -> tuple[str, ...]:
        """Ids of the daemons started and not stopped (for the stale-state sweep), sorted."""
        ...

    def workload_edits(self, daemon_id: str) -> cdi.ContainerEdits:
        """The CDI edits a container needs to be a client of this daemon. Pure."""
        ...


def _workload_edits(daemon_dir: pathlib.Path) -> cdi.ContainerEdits:
    # MPS clients find the server through the pipe directory and exchange data through /dev/shm,
    # so both must be the daemon's: its pipe directory and its own tmpfs, shared with its clients
    # only (never the host's /dev/shm).
    return cdi.ContainerEdits(
        env=(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}",),
        mounts=(
            cdi.mount(str(daemon_dir / "pipe"), MPS_PIPE_IN_CONTAINER),
            cdi.mount(str(daemon_dir / "shm"), "/dev/shm"),
        ),
    )


def _answers(control: pathlib.Path) -> bool:
    """Whether a live daemon holds this control pipe: a FIFO with a reader (a write-only open that
    would not block succeeds; older CUDA) or a socket that accepts, stream or seqpacket. Pure apart
    from that probe; never blocks."""
    try:
        mode = os.stat(control).st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode):
        try:
            fd = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no reader: its daemon is gone
                return False
            raise
        os.close(fd)
        return True
    if stat.S_ISSOCK(mode):
        # CUDA 13's daemon listens on a SOCK_SEQPACKET socket (a stream connect gets EPROTOTYPE).
        for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):
            with socket.socket(socket.AF_UNIX, kind) as probe:
                probe.settimeout(1.0)
                try:
                    probe.connect(str(control))
                except OSError as err:
                    if err.errno == errno.EPROTOTYPE:
                        continue
                    return False
            return True
    return False


def _shm_size(meminfo: pathlib.Path = pathlib.Path("/proc/meminfo")) -> str:
    """Half of MemTotal in kB, as the NVIDIA driver sizes each daemon's shm."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) // 2}k"
    except (OSError, ValueError, IndexError):
        pass
    return _SHM_FALLBACK


Runner = Callable[[Sequence[str], Mapping[str, str], str], None]


def _run(argv: Sequence[str], env: Mapping[str, str], stdin: str) -> None:
    """Run one MPS control command. Every failure is an OSError naming the command, the
    error type the prepare path rolls back on (a CalledProcessError would escape it)."""
    try:
        subprocess.run(
            list(argv), input=stdin, env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=True
        )
    except subprocess.CalledProcessError as err:
        raise OSError(f"{argv[0]} exited with {err.returncode}: {(err.stderr or '').strip()[:200]}") from err
    except subprocess.TimeoutExpired as err:
        raise OSError(f"{argv[0]} did not answer within {err.timeout:g} s") from err


class NvidiaMps:
    """MPS through `nvidia-cuda-mps-control`, one daemon per id with `<root>/<id>/{pipe,log,shm}`.

    `root` is a directory on the host (the agent mounts it at the same path, with bidirectional
    mount propagation so the shm tmpfs it mounts there reaches the container runtime), so the CDI
    mounts resolve for the runtime. The control daemon starts under `unshare --mount` with its
    shm directory bound over /dev/shm; its server processes inherit that namespace. `runner`
    runs every command (mount, unshare, the control client, umount) and is injectable. `start()`
    returns once the daemon answers on its control pipe (within `start_timeout` seconds), so a
    workload started after the prepare never finds no daemon and runs without MPS and its limits.
    """

    def __init__(
        self,
        *,
        root: pathlib.Path,
        executable: str = "nvidia-cuda-mps-control",
        runner: Runner = _run,
        start_timeout: float = _DAEMON_START_S,
    ) -> None:
        self._root = root
        self._executable = executable
        self._runner = runner
        self._start_timeout = start_timeout

    def _dirs(self, daemon_id: str) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
        base = self._root / daemon_id
        return base / "pipe", base / "log", base / "shm"

    def _env(self, daemon_id: str) -> dict[str, str]:
        pipe, log, _ = self._dirs(daemon_id)
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}

    def running(self, daemon_id: str) -> bool:
        """Whether the daemon answers on its control pipe (a leftover pipe does not count)."""
        return _answers(self._dirs(daemon_id)[0] / "control")

    def start(self, settings: MpsSettings) -> None:
        pipe, log, shm = self._dirs(settings.daemon_id)
        if self.running(settings.daemon_id):
            return  # already running: an earlier prepare of this claim started it
        if pipe.exists():
            # A daemon that died with an earlier agent (its pod's processes end with it) left its
            # pipe behind; a new daemon needs a clean one.
            _log.info("replacing the pipe directory of an MPS daemon that is gone", daemon=settings.daemon_id)
            self._end_silent(settings.daemon_id)
            shutil.rmtree(pipe)
        for directory in (pipe, log, shm):
            directory.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(shm):
            self._runner(["mount", "-t", "tmpfs", "-o", f"size={_shm_size()},mode=1777", "tmpfs", str(shm)], {}, "")
        env = {**self._env(settings.daemon_id), "CUDA_VISIBLE_DEVICES": ",".join(settings.uuids)}
        daemon = [self._executable, "-d", *(["-M"] if settings.multi_user else [])]
        try:
            self._runner(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    'mount --bind "$1" /dev/shm && shift && exec "$@"',
                    "mps-daemon",
                    str(shm),
                    *daemon,
                ],
                env,
                "",
            )
            self._wait_answering(settings.daemon_id)
        except OSError:
            # No daemon uses the tmpfs: leave no mount behind for a caller that never calls stop().
            self.stop(settings.daemon_id)
            raise
        commands = []
        if settings.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {settings.active_thread_percentage}")
        for uuid, mib in sorted(settings.pinned_limits_mib.items()):
            commands.append(f"set_default_device_pinned_mem_limit {uuid} {mib}M")
        for command in commands:
            self._runner([self._executable], env, command + "\n")

    def _wait_answering(self, daemon_id: str) -> None:
        """Until the daemon answers on its control pipe; OSError with the end of its log after `start_timeout`."""
        deadline = time.monotonic() + self._start_timeout
        while not self.running(daemon_id):
            if time.monotonic() >= deadline:
                _, log, _ = self._dirs(daemon_id)
                try:
                    said = " ".join((log / "control.log").read_text(errors="replace").split()[-40:])
                except OSError:
                    said = "it wrote no control.log"
                raise OSError(
                    f"{self._executable} -d started but its control pipe did not answer within"
                    f" {self._start_timeout:g} s ({log}/control.log: {said})"
                )
            time.sleep(0.01)

    def stop(self, daemon_id: str) -> None:
        _, _, shm = self._dirs(daemon_id)
        if self.running(daemon_id):
            try:
                self._runner([self._executable], self._env(daemon_id), "quit\n")
            except OSError as err:
                _log.warning("stopping MPS control daemon failed", daemon=daemon_id, error=str(err))
        else:
            self._end_silent(daemon_id)
        if os.path.ismount(shm):
            self._runner(["umount", str(shm)], {}, "")
        shutil.rmtree(self._root / daemon_id, ignore_errors=True)

    def _end_silent(self, daemon_id: str) -> None:
        """SIGTERM a control daemon that still runs but does not answer on its pipe (hung, or its socket
        removed), found by the pid file it keeps in its pipe directory, so removing that directory leaves no
        daemon behind. A pid that now belongs to another program (its name is not the control daemon's) is
        left alone."""
        pipe, _, _ = self._dirs(daemon_id)
        name = pathlib.Path(self._executable).name
        try:
            pid = int((pipe / f"{name}.pid").read_text().strip())
            comm = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            return  # no pid file, or no such process: nothing runs
        if comm != name[:15]:  # the kernel keeps 15 characters of a program's name
            return
        _log.warning("ending an MPS control daemon that does not answer on its pipe", daemon=daemon_id, pid=pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def daemons(self) -> tuple[str, ...]:
        if not self._root.is_dir():
            return ()
        return tuple(sorted(path.name for path in self._root.iterdir() if path.is_dir()))

    def workload_edits(self, daemon_id: str) -> cdi.ContainerEdits:
        return _workload_edits(self._root / daemon_id)


class FakeMps:
    """Records MPS calls; `running` holds the settings of each started daemon. It creates the
    pipe and shm directories (so the CDI mounts resolve on a kind node) and removes them on stop."""

    def __init__(self, *, root: pathlib.Path) -> None:
        self._root = root
        self.running: dict[str, MpsSettings] = {}
        self.calls: list[tuple[str, str]] = []

    def start(self, settings: MpsSettings) -> None:
        self.calls.append(("start", settings.daemon_id))
        for directory in ("pipe", "shm"):
            (self._root / settings.daemon_id / directory).mkdir(parents=True, exist_ok=True)
        self.running[settings.daemon_id] = settings

    def stop(self, daemon_id: str) -> None:
        self.calls.append(("stop", daemon_id))
        shutil.rmtree(self._root / daemon_id, ignore_errors=True)
        self.running.pop(daemon_id, None)

    def daemons(self) -> tuple[str, ...]:
        return tuple(sorted(self.running))

    def workload_edits(self, daemon_id: str) -> cdi.ContainerEdits:
        return _workload_edits(self._root / daemon_id)


def set_time_slice(gpus: backend.NvmlBackend, *, minor: int, interval: int) -> None:
    """Time-slice a full GPU: compute mode DEFAULT, then the interval (0-3). NOT_SUPPORTED
    from the time-slice call is ignored, as the NVIDIA driver does. Idempotent."""
    gpus.set_compute_mode(minor, backend.ComputeMode.DEFAULT)
    try:
        gpus.set_time_slice(minor, backend.TimeSlice(interval))
    except backend.NvmlError as err:
        if err.code != backend.Return.NOT_SUPPORTED:
            raise


def reset_time_slice(gpus: backend.NvmlBackend, *, minor: int) -> None:
    """Back to the default time-slice. Idempotent; NOT_SUPPORTED ignored."""
    set_time_slice(gpus, minor=minor, interval=int(backend.TimeSlice.DEFAULT))
