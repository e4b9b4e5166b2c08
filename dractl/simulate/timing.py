"""`dractl simulate --timing`: one stderr line per phase, in a fixed, grep-able format.

    timing: phase=<name> seconds=<wall seconds, 6 decimals>[ <key>=<value>]...

Phases, in order: `startup` (process start to the simulation's first step: interpreter,
imports, flag parsing; only where the OS says when the process started, e.g. Linux), `decode`
(reading and decoding the manifests), `validate` (compiling every CEL selector, as the API
server would on create), `index` (planning claims, building the allocator's index, checking
the allocations given in the input), `allocate` (every allocation, CEL evaluation included;
`claims` handed to the allocator and `claims_per_s`), `output` (writing and flushing the
chosen format), and `total` (process start, or else the first phase, to the end of output;
with `cpu_seconds` of the process and `gc_seconds` spent in Python's garbage collector).
Only the `allocate` line carries `claims_per_s=`.

What it must not do: print anything but these lines, or change what it measures.
"""

from __future__ import annotations

import gc
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO


class Clock(Protocol):
    """Seconds from an arbitrary origin, monotonic (`time.perf_counter`)."""

    def __call__(self) -> float: ...


def process_age() -> float | None:
    """Seconds since this process started, from /proc (Linux); None where unknown."""
    try:
        stat = pathlib.Path("/proc/self/stat").read_text()
        uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
        # Field 22 (starttime, in clock ticks since boot); the command name before it may hold spaces.
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def line(phase: str, seconds: float, **fields: object) -> str:
    """One timing line (no newline). Pure."""
    extra = "".join(f" {key}={value}" for key, value in fields.items())
    return f"timing: phase={phase} seconds={seconds:.6f}{extra}"


class Timer:
    """Collects phases as they end and prints them all at once, so that they never interleave
    with other stderr output. Measures garbage collection while it is open."""

    def __init__(self, *, clock: Clock = time.perf_counter, age: Callable[[], float | None] = process_age) -> None:
        self._clock = clock
        self._lines: list[str] = []
        self._gc = 0.0
        self._gc_start = 0.0
        started = age()
        self._origin = clock() - (started or 0.0)
        self._last = clock()
        if started is not None:
            self._lines.append(line("startup", started))
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if stage == "start":
            self._gc_start = self._clock()
        else:
            self._gc += self._clock() - self._gc_start

    def phase(self, name: str, **fields: object) -> float:
        """End the current phase; returns its seconds."""
        now = self._clock()
        seconds, self._last = now - self._last, now
        self._lines.append(line(name, seconds, **fields))
        return seconds

    def record(self, name: str, seconds: float, **fields: object) -> None:
        """A phase measured elsewhere (it ended at the current phase boundary)."""
        self._lines.append(line(name, seconds, **fields))

    def restart(self) -> None:
        """Start the next phase now (after phases recorded with `record`)."""
        self._last = self._clock()

    def close(self, err: TextIO) -> None:
        """Add `total`, stop measuring and print every line. Call once."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        total = self._clock() - self._origin
        cpu = time.process_time()  # the whole process's, since it started
        self._lines.append(line("total", total, cpu_seconds=f"{cpu:.3f}", gc_seconds=f"{self._gc:.3f}"))
        err.write("".join(f"{text}\n" for text in self._lines))
