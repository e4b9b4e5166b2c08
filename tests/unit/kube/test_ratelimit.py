"""The client-side token bucket, on a clock the tests move (sleeping advances it): no real time passes."""

from __future__ import annotations

import pytest

from dractl.kube import ratelimit


class FakeClock:
    """Monotonic time that moves when the test says so or when a caller sleeps (each sleep recorded)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_full_bucket_lets_the_burst_through_at_once_then_one_per_interval() -> None:
    """Guards: `burst` requests go at once; the next ones wait 1/qps each, in arrival order."""
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(10.0, 3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_tokens_come_back_at_qps_and_never_beyond_the_burst() -> None:
    """Guards: an idle spell refills qps tokens per second, capped at the burst."""
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(2.0, 4, clock=clock)
    for _ in range(4):
        bucket.reserve()
    clock.now += 1.0  # two tokens back
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.5])
    clock.now += 3600.0
    assert [bucket.reserve() for _ in range(5)] == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.5])


def test_wait_sleeps_until_its_token_and_reports_the_wait() -> None:
    """Guards: `wait` sleeps exactly the reserved delay (not at all while tokens are left) and tells `on_wait`."""
    clock = FakeClock()
    heard: list[float] = []
    bucket = ratelimit.TokenBucket(4.0, 1, clock=clock, on_wait=heard.append)
    bucket.wait()
    assert clock.slept == [] and heard == []
    bucket.wait()
    bucket.wait()
    assert clock.slept == pytest.approx([0.25, 0.25]) and heard == pytest.approx([0.25, 0.25])


def test_over_a_long_run_the_rate_is_qps() -> None:
    """Guards: 1,000 requests in a row take (1,000 - burst) / qps seconds: the burst, then exactly qps."""
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(50.0, 100, clock=clock)
    start = clock.now
    for _ in range(1000):
        bucket.wait()
    assert clock.now - start == pytest.approx(900 / 50.0)


def test_a_qps_of_0_sets_no_limit() -> None:
    """Guards: `UNLIMITED` (qps 0) lets every request go at once, however many, and never reports a wait."""
    clock = FakeClock()
    heard: list[float] = []
    bucket = ratelimit.TokenBucket(ratelimit.UNLIMITED, 1, clock=clock, on_wait=heard.append)
    start = clock.now
    for _ in range(10_000):
        bucket.wait()
    assert (clock.now - start, heard) == (0.0, [])


@pytest.mark.parametrize(
    ("qps", "burst", "message"),
    [(-1.0, 10, "0 \\(no limit\\) or more requests per second, got -1"), (5.0, 0, "at least 1 request, got 0")],
    ids=["qps-negative", "burst-zero"],
)
def test_a_bucket_that_could_never_give_a_token_is_refused(qps: float, burst: int, message: str) -> None:
    """Guards: a negative QPS or a burst below 1 raises ValueError naming the value."""
    with pytest.raises(ValueError, match=message):
        ratelimit.TokenBucket(qps, burst, clock=FakeClock())
