"""The work queue keeps client-go's semantics: de-duplication, the processing/dirty rule, delays, backoff, shutdown."""

from __future__ import annotations

import threading

from dractl.kube import workqueue


class FakeClock:
    def __init__(self) -> None:
        self.time = 1000.0

    def now(self) -> float:
        return self.time


def _drain(queue: workqueue.WorkQueue) -> list[str]:
    keys = []
    while (key := queue.get(timeout=0)) is not None:
        keys.append(key)
        queue.done(key)
    return keys


def test_a_key_added_twice_is_handed_out_once() -> None:
    """Guards: de-duplication: a queued key is not queued again."""
    queue = workqueue.WorkQueue()
    for key in ("ns/a", "ns/b", "ns/a", "ns/a"):
        queue.add(key)
    assert len(queue) == 2
    assert _drain(queue) == ["ns/a", "ns/b"]


def test_keys_come_out_in_the_order_they_were_first_added() -> None:
    """Guards: FIFO order among distinct keys."""
    queue = workqueue.WorkQueue()
    for key in ("c", "a", "b"):
        queue.add(key)
    assert _drain(queue) == ["c", "a", "b"]


def test_a_key_added_while_processing_is_requeued_after_done_not_before() -> None:
    """Guards: a key being processed is never handed to a second worker; re-adding it queues it again on done."""
    queue = workqueue.WorkQueue()
    queue.add("ns/a")
    key = queue.get(timeout=0)
    assert key == "ns/a"
    queue.add("ns/a")
    queue.add("ns/a")
    assert queue.get(timeout=0) is None  # not handed out while still processing
    queue.done("ns/a")
    assert queue.get(timeout=0) == "ns/a"
    queue.done("ns/a")
    assert queue.get(timeout=0) is None  # added twice while processing, requeued once


def test_done_without_a_new_add_does_not_requeue() -> None:
    """Guards: done only requeues keys that were added while processing."""
    queue = workqueue.WorkQueue()
    queue.add("a")
    queue.done(queue.get(timeout=0) or "")
    assert queue.get(timeout=0) is None


def test_add_after_waits_for_the_clock_and_the_earliest_delay_wins() -> None:
    """Guards: delayed adds are ready only when their time comes; a later delay does not push an earlier one back."""
    clock = FakeClock()
    queue = workqueue.WorkQueue(clock=clock)
    queue.add_after("a", 10)
    queue.add_after("a", 30)
    queue.add_after("b", 20)
    assert queue.get(timeout=0) is None
    clock.time += 10
    assert _drain(queue) == ["a"]
    clock.time += 10
    assert _drain(queue) == ["b"]
    clock.time += 100
    assert _drain(queue) == []  # a's superseded 30 s delay does not fire again


def test_a_shorter_delay_replaces_a_longer_pending_one() -> None:
    """Guards: add_after with an earlier time than a pending delay moves the key forward."""
    clock = FakeClock()
    queue = workqueue.WorkQueue(clock=clock)
    queue.add_after("a", 60)
    queue.add_after("a", 5)
    clock.time += 5
    assert _drain(queue) == ["a"]
    clock.time += 60
    assert _drain(queue) == []


def test_rate_limited_adds_back_off_exponentially_until_forget() -> None:
    """Guards: per-key exponential backoff (base, 2x, 4x ...) counted by num_requeues and reset by forget."""
    clock = FakeClock()
    queue = workqueue.WorkQueue(clock=clock, backoff=workqueue.ExponentialBackoff(base=1.0, cap=100.0))
    delays = []
    for _ in range(4):
        queue.add_rate_limited("a")
        waited = 0
        while queue.get(timeout=0) is None:
            clock.time += 1
            waited += 1
        queue.done("a")
        delays.append(waited)
    assert delays == [1, 2, 4, 8]
    assert queue.num_requeues("a") == 4
    queue.forget("a")
    assert queue.num_requeues("a") == 0
    queue.add_rate_limited("a")
    clock.time += 1
    assert _drain(queue) == ["a"]


def test_backoff_is_capped_and_per_key() -> None:
    """Guards: the backoff stops growing at its cap and one key's failures do not slow another."""
    backoff = workqueue.ExponentialBackoff(base=0.005, cap=1.0)
    delays = [backoff.when("a") for _ in range(12)]
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert delays[-1] == 1.0
    assert backoff.when("b") == 0.005


def test_shutdown_drains_queued_keys_then_returns_none_and_refuses_new_ones() -> None:
    """Guards: shutdown still hands out queued keys, then get returns None; adds after shutdown are ignored."""
    queue = workqueue.WorkQueue()
    queue.add("a")
    queue.shutdown()
    queue.add("b")
    assert queue.get(timeout=0) == "a"
    assert queue.get() is None
    assert queue.shutting_down


def test_shutdown_wakes_a_blocked_worker() -> None:
    """Guards: a worker blocked in get() without timeout returns None once the queue shuts down."""
    queue = workqueue.WorkQueue()
    results: list[str | None] = []
    worker = threading.Thread(target=lambda: results.append(queue.get()))
    worker.start()
    queue.shutdown()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert results == [None]


def test_a_blocked_worker_gets_a_key_added_from_another_thread() -> None:
    """Guards: get() blocks until a producer adds a key, and returns that key."""
    queue = workqueue.WorkQueue()
    results: list[str | None] = []
    worker = threading.Thread(target=lambda: results.append(queue.get(timeout=30)))
    worker.start()
    queue.add("ns/x")
    worker.join(timeout=30)
    assert results == ["ns/x"]


def test_concurrent_workers_never_hold_the_same_key() -> None:
    """Guards: with several workers and producers hammering few keys, no key is processed by two workers at once."""
    queue = workqueue.WorkQueue()
    holding: set[str] = set()
    violations: list[str] = []
    lock = threading.Lock()
    processed = []

    def work() -> None:
        while (key := queue.get()) is not None:
            with lock:
                if key in holding:
                    violations.append(key)
                holding.add(key)
            with lock:
                holding.discard(key)
                processed.append(key)
            queue.done(key)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    for i in range(2000):
        queue.add(f"k{i % 5}")
    queue.shutdown()
    for worker in workers:
        worker.join(timeout=30)
    assert violations == []
    assert set(processed) == {f"k{i}" for i in range(5)}
