"""A de-duplicating, delaying, rate-limited work queue of keys with client-go's semantics.

What it does: hands keys (`"namespace/name"` strings) to workers. A key is queued at most once;
a key being processed is never handed to a second worker, and adding it meanwhile marks it
dirty so it is queued again when the worker calls `done`. `add_after` delays a key (the earliest
of several delays wins); `add_rate_limited` delays it by a per-key exponential backoff that
`forget` resets. `shutdown` wakes every waiting worker; keys already queued are still handed out
(the queue drains), then `get` returns None.

What it must not do: hold objects (workers read the current object from a cache: level
triggered), call the API, or start threads. Time comes from an injectable `Clock`.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic()`."""

    def now(self) -> float:
        return time.monotonic()


class ExponentialBackoff:
    """Per-key exponential backoff, as client-go's ItemExponentialFailureRateLimiter: base * 2**failures, capped.

    Not thread-safe on its own; the queue calls it under its lock.
    """

    def __init__(self, *, base: float = 0.005, cap: float = 1000.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[str, int] = {}

    def when(self, key: str) -> float:
        """The delay for this failure of `key`, and count it. The n-th call waits base * 2**(n-1)."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return float(min(self.base * 2**failures, self.cap))

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)


class WorkQueue:
    """The queue. Thread-safe; any number of producers and workers.

    Invariants: a key is at most once in the queue; a key in `processing` is not in the queue;
    `dirty` holds exactly the keys that are queued or must be queued again on `done`.
    """

    def __init__(self, *, clock: Clock | None = None, backoff: ExponentialBackoff | None = None) -> None:
        self._clock: Clock = clock or MonotonicClock()
        self._backoff = backoff or ExponentialBackoff()
        self._condition = threading.Condition()
        self._queue: list[str] = []
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: list[tuple[float, int, str]] = []  # a heap of (ready at, sequence, key)
        self._ready_at: dict[str, float] = {}  # the earliest pending delay per key
        self._sequence = 0
        self._shutting_down = False

    def __len__(self) -> int:
        """Keys queued now (not counting delayed or in-process ones)."""
        with self._condition:
            self._promote()
            return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        with self._condition:
            return self._shutting_down

    def add(self, key: str) -> None:
        """Queue `key` unless it is queued already; if it is being processed, queue it after `done`."""
        with self._condition:
            self._add(key)

    def _add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._condition.notify()

    def add_after(self, key: str, delay: float) -> None:
        """Queue `key` after `delay` seconds; an earlier pending delay for the same key wins."""
        if delay <= 0:
            self.add(key)
            return
        with self._condition:
            if self._shutting_down:
                return
            ready_at = self._clock.now() + delay
            if key in self._ready_at and self._ready_at[key] <= ready_at:
                return
            self._ready_at[key] = ready_at
            self._sequence += 1
            heapq.heappush(self._waiting, (ready_at, self._sequence, key))
            self._condition.notify()

    def add_rate_limited(self, key: str) -> None:
        """Queue `key` after its next exponential backoff delay (the failure is counted)."""
        with self._condition:
            delay = self._backoff.when(key)
        self.add_after(key, delay)

    def forget(self, key: str) -> None:
        """Reset `key`'s backoff (call after a successful sync). Does not unqueue it."""
        with self._condition:
            self._backoff.forget(key)

    def num_requeues(self, key: str) -> int:
        """How many rate-limited adds `key` had since its last `forget`."""
        with self._condition:
            return self._backoff.failures(key)

    def _promote(self) -> float | None:
        """Move delayed keys whose time has come into the queue; return seconds to the next one (or None)."""
        now = self._clock.now()
        while self._waiting:
            ready_at, _, key = self._waiting[0]
            if self._ready_at.get(key) != ready_at:
                heapq.heappop(self._waiting)  # superseded by an earlier delay of the same key
                continue
            if ready_at > now:
                return ready_at - now
            heapq.heappop(self._waiting)
            del self._ready_at[key]
            self._add(key)
        return None

    def get(self, timeout: float | None = None) -> str | None:
        """The next key, marked as processing; the caller must call `done(key)`.

        Blocks until a key is ready, up to `timeout` seconds (None: forever). Returns None on
        timeout, or once the queue is shut down and drained.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while True:
                next_delay = self._promote()
                if self._queue:
                    key = self._queue.pop(0)
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutting_down:
                    return None
                wait = next_delay
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    wait = remaining if wait is None else min(wait, remaining)
                self._condition.wait(wait)

    def done(self, key: str) -> None:
        """Mark `key` processed; if it was added meanwhile, queue it again now."""
        with self._condition:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._condition.notify()

    def shutdown(self) -> None:
        """Refuse new keys and wake every waiting worker; queued keys are still handed out. Idempotent."""
        with self._condition:
            self._shutting_down = True
            self._waiting.clear()
            self._ready_at.clear()
            self._condition.notify_all()
