"""Client-side rate limiting of API requests: a token bucket, as client-go's `flowcontrol.NewTokenBucketRateLimiter`.

What it does: `TokenBucket.wait()` takes one token before a request goes out, sleeping until one
is there. The bucket holds at most `burst` tokens and gains `qps` per second, so a client sends
at most `burst` requests at once after a quiet spell and `qps` per second on average. A caller
that finds the bucket empty reserves the next token to come and sleeps until then: callers are
served in the order they arrive, and none waits for a token promised to another. A `qps` of 0
(`UNLIMITED`) sets no limit: the API server's priority and fairness paces the client instead, as
SIG API Machinery recommends for Kubernetes 1.22 and later (controller-runtime made it its default in
kubernetes-sigs/controller-runtime#3119).

What it must not do: send anything, or sleep anywhere but in `wait`. Time comes from an
injectable `Clock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block this thread for `seconds`."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


UNLIMITED = 0.0
"""The `qps` of a bucket that never makes a request wait (client-go writes it as a negative QPS)."""


class TokenBucket:
    """`qps` tokens per second, at most `burst` held; it starts full; `qps` 0 (`UNLIMITED`): no limit. Thread-safe.

    `on_wait(seconds)` hears of every wait longer than zero before it begins (for a metric).
    Raises ValueError for a negative `qps` or a `burst` below 1.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Clock | None = None,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        if not qps >= 0:
            raise ValueError(f"a rate limit needs 0 (no limit) or more requests per second, got {qps:g}")
        if burst < 1:
            raise ValueError(f"a rate limit needs a burst of at least 1 request, got {burst}")
        self.qps = qps
        self.burst = burst
        self._clock: Clock = clock or SystemClock()
        self._on_wait = on_wait
        self._lock = threading.Lock()
        self._tokens = float(burst)  # below 0: tokens reserved by callers that are still waiting for them
        self._updated = self._clock.monotonic()

    def reserve(self) -> float:
        """Take the next token, now or to come; the seconds until it is there (0: at once). Does not sleep."""
        if self.qps == UNLIMITED:
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.qps)
            self._updated = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0.0 else -self._tokens / self.qps

    def wait(self) -> None:
        """Take a token, sleeping until it is there."""
        delay = self.reserve()
        if delay > 0.0:
            if self._on_wait is not None:
                self._on_wait(delay)
            self._clock.sleep(delay)
