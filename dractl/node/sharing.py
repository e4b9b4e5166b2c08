"""GPU sharing at prepare time: time-slicing through the backend, MPS through a control daemon.

What it does: sets and resets a GPU's time-slice (full GPUs only; NOT_SUPPORTED is a no-op,
as in the NVIDIA driver), and runs MPS behind the small `MpsControl` Protocol: start a
control daemon with a thread percentage and pinned-memory limits, stop it, and give the
CDI edits a workload needs to reach it (`CUDA_MPS_PIPE_DIRECTORY`, mounts). `NvidiaMps`
runs `nvidia-cuda-mps-control` with a pipe and log directory per daemon under the state
directory; `FakeMps` records calls for tests and fake GPUs. What it must not do: decide
which claim gets which setting (state does, from the opaque config) or touch checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
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


def _workload_edits(pipe_dir: pathlib.Path) -> cdi.ContainerEdits:
    # MPS clients find the server through the pipe directory and exchange data through
    # /dev/shm, so both must be the daemon's: the agent runs with hostIPC for that reason.
    return cdi.ContainerEdits(
        env=(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}",),
        mounts=(cdi.mount(str(pipe_dir), MPS_PIPE_IN_CONTAINER), cdi.mount("/dev/shm", "/dev/shm")),
    )


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
    """MPS through `nvidia-cuda-mps-control`, one daemon per id with `<root>/<id>/{pipe,log}`.

    `root` is a directory on the host (the agent mounts it at the same path) so the CDI
    mount of the pipe directory resolves for the container runtime. `runner` is injectable.
    """

    def __init__(
        self, *, root: pathlib.Path, executable: str = "nvidia-cuda-mps-control", runner: Runner = _run
    ) -> None:
        self._root = root
        self._executable = executable
        self._runner = runner

    def _dirs(self, daemon_id: str) -> tuple[pathlib.Path, pathlib.Path]:
        return self._root / daemon_id / "pipe", self._root / daemon_id / "log"

    def _env(self, daemon_id: str) -> dict[str, str]:
        pipe, log = self._dirs(daemon_id)
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}

    def start(self, settings: MpsSettings) -> None:
        pipe, log = self._dirs(settings.daemon_id)
        if (pipe / "control").exists():
            return  # already running: an earlier prepare of this claim started it
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        env = {**self._env(settings.daemon_id), "CUDA_VISIBLE_DEVICES": ",".join(settings.uuids)}
        self._runner([self._executable, "-d", *(["-M"] if settings.multi_user else [])], env, "")
        commands = []
        if settings.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {settings.active_thread_percentage}")
        for uuid, mib in sorted(settings.pinned_limits_mib.items()):
            commands.append(f"set_default_device_pinned_mem_limit {uuid} {mib}M")
        for command in commands:
            self._runner([self._executable], env, command + "\n")

    def stop(self, daemon_id: str) -> None:
        pipe, _ = self._dirs(daemon_id)
        if (pipe / "control").exists():
            try:
                self._runner([self._executable], self._env(daemon_id), "quit\n")
            except OSError as err:
                _log.warning("stopping MPS control daemon failed", daemon=daemon_id, error=str(err))
        shutil.rmtree(self._root / daemon_id, ignore_errors=True)

    def daemons(self) -> tuple[str, ...]:
        if not self._root.is_dir():
            return ()
        return tuple(sorted(path.name for path in self._root.iterdir() if path.is_dir()))

    def workload_edits(self, daemon_id: str) -> cdi.ContainerEdits:
        return _workload_edits(self._dirs(daemon_id)[0])


class FakeMps:
    """Records MPS calls; `running` holds the settings of each started daemon. It creates the
    pipe directory (so the CDI mount resolves on a kind node) and removes it on stop."""

    def __init__(self, *, root: pathlib.Path) -> None:
        self._root = root
        self.running: dict[str, MpsSettings] = {}
        self.calls: list[tuple[str, str]] = []

    def start(self, settings: MpsSettings) -> None:
        self.calls.append(("start", settings.daemon_id))
        (self._root / settings.daemon_id / "pipe").mkdir(parents=True, exist_ok=True)
        self.running[settings.daemon_id] = settings

    def stop(self, daemon_id: str) -> None:
        self.calls.append(("stop", daemon_id))
        shutil.rmtree(self._root / daemon_id, ignore_errors=True)
        self.running.pop(daemon_id, None)

    def daemons(self) -> tuple[str, ...]:
        return tuple(sorted(self.running))

    def workload_edits(self, daemon_id: str) -> cdi.ContainerEdits:
        return _workload_edits(self._root / daemon_id / "pipe")


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
