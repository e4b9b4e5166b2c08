"""What the node agent's /healthz reports besides its sockets: stuck calls and slices the API does not hold.

What it does: `Calls` wraps the claim state the plugin calls (`plugin.Preparer`) and keeps the
prepares and unprepares in flight with their start times; `Calls.stuck(after_s)` names each one
running longer than that, and where it waits when that is an NVML call (read from the calling
thread's stack: the outermost frame in a GPU backend module). `Slices` keeps what the publisher
thread learnt: whether the API holds exactly the slices the agent publishes, since when it does
not and why (the last failure), and whether the Node object exists. `Slices.problems` turns that
into /healthz lines: a missing Node at once (nothing can be published: a wrong --node-name), and
slices that have differed from the API for longer than the grace the repair needs.

What it must not do: take the claim locks or the state's lock (a probe never waits on a stuck
call), call NVML or the API, or decide what the agent does about a problem: it only reports.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator

from dractl.node import plugin, state

# Modules whose functions are NVML calls: the real backend and the fake.
_BACKEND_MODULES = frozenset({"dractl.node.nvml", "dractl.node.fakegpu"})


class Calls:
    """`plugin.Preparer` around `inner`, recording the calls in flight. Thread-safe."""

    def __init__(self, inner: plugin.Preparer, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._running: dict[int, tuple[str, state.ClaimRef, float, int]] = {}

    def prepare(self, claim: state.ClaimRef) -> tuple[state.PreparedDevice, ...]:
        with self._recorded("NodePrepareResources", claim):
            return self._inner.prepare(claim)

    def unprepare(self, claim: state.ClaimRef) -> None:
        with self._recorded("NodeUnprepareResources", claim):
            self._inner.unprepare(claim)

    @contextlib.contextmanager
    def _recorded(self, operation: str, claim: state.ClaimRef) -> Iterator[None]:
        key = next(self._ids)
        with self._lock:
            self._running[key] = (operation, claim, self._clock(), threading.get_ident())
        try:
            yield
        finally:
            with self._lock:
                del self._running[key]

    def stuck(self, *, after_s: float) -> list[str]:
        """One line per call running longer than `after_s` seconds, oldest first. Never blocks on the call."""
        now = self._clock()
        with self._lock:
            running = sorted(self._running.values(), key=lambda call: call[2])
        frames = sys._current_frames()
        lines = []
        for operation, claim, started, thread in running:
            seconds = now - started
            if seconds <= after_s:
                continue
            where = _backend_call(frames.get(thread))
            lines.append(
                f"{operation} of claim {claim.namespace}/{claim.name} (uid {claim.uid}) has run for {seconds:.0f} s"
                + (f", waiting in NVML {where}" if where else "")
            )
        return lines


def _backend_call(frame: types.FrameType | None) -> str | None:
    """The GPU backend function a thread is in (its outermost frame in a backend module), or None."""
    found = None
    while frame is not None:
        if frame.f_globals.get("__name__") in _BACKEND_MODULES:
            found = frame.f_code.co_name
        frame = frame.f_back
    return found


class Slices:
    """What the publisher thread learnt about the slices in the API. Thread-safe; `clock` is monotonic seconds."""

    def __init__(self, *, node_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._node_name = node_name
        self._clock = clock
        self._lock = threading.Lock()
        self._differ_since: float | None = clock()  # Nothing is published yet.
        self._failure = "not published yet"
        self._node_missing = False

    def in_sync(self) -> bool:
        with self._lock:
            return self._differ_since is None

    def differ(self, why: str) -> None:
        """The API may not hold the slices: something changed there, or a publish is due. Keeps the earliest time."""
        with self._lock:
            if self._differ_since is None:
                self._differ_since = self._clock()
                self._failure = why

    def published(self) -> None:
        """A publish left the API holding exactly the agent's slices."""
        with self._lock:
            self._differ_since = None
            self._failure = ""
            self._node_missing = False

    def failed(self, why: str, *, node_missing: bool = False) -> None:
        """A publish failed: the API's slices may differ from the agent's until one succeeds."""
        with self._lock:
            if self._differ_since is None:
                self._differ_since = self._clock()
            self._failure = why
            self._node_missing = node_missing

    def problems(self, *, grace_s: float) -> list[str]:
        """/healthz lines: the Node is missing (at once), or the slices have differed for more than `grace_s`."""
        with self._lock:
            if self._node_missing:
                return [
                    f"node {self._node_name}: there is no Node object of that name, so no ResourceSlice is "
                    "published (is --node-name right?)"
                ]
            if self._differ_since is None:
                return []
            seconds = self._clock() - self._differ_since
            if seconds <= grace_s:
                return []
            return [
                f"the ResourceSlices in the API have differed from this node's for {seconds:.0f} s: {self._failure}"
            ]
