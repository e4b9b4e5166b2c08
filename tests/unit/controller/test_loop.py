"""The loop both controllers run: informers started and stopped in order, and workers that survive a failing key."""

from __future__ import annotations

import sys

import pytest

from dractl.controller import loop
from dractl.kube import workqueue


class StillClock:
    """A clock that never moves: a key requeued with backoff stays delayed, so it is not synced twice."""

    def now(self) -> float:
        return 0.0


class FakeInformer:
    """Records start and stop in the shared log; `wait_synced` answers `synced`."""

    def __init__(self, name: str, log: list[str], *, synced: bool = True) -> None:
        self.name = name
        self.log = log
        self.synced = synced

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.synced

    def stop(self, timeout: float = 10.0) -> None:
        self.log.append(f"stop {self.name}")


def _loop(
    queue: workqueue.WorkQueue, informers: list[FakeInformer], synced: list[str], failures: list[tuple[str, bool]]
) -> loop.Loop:
    def sync(key: str) -> None:
        synced.append(key)
        if key.startswith("bad"):
            raise RuntimeError(f"{key} failed")

    def failed(key: str, error: Exception) -> None:
        # Called inside the `except` block: a `log.exception` here logs the sync's traceback.
        failures.append((key, sys.exc_info()[1] is error))

    return loop.Loop(
        name="the test controller",
        thread_name="test",
        queue=queue,
        informers=informers,  # type: ignore[arg-type]
        sync=sync,
        failed=failed,
        workers=1,
    )


def test_a_failing_key_is_reported_and_requeued_with_backoff_and_the_worker_goes_on() -> None:
    """Guards: a sync that raises reaches `failed` inside the except block and is requeued with backoff; the
    worker then syncs the next key, and a key that syncs has its backoff forgotten."""
    backoff = workqueue.ExponentialBackoff()
    backoff.when("good")  # an earlier failure of "good", which its successful sync must forget
    queue = workqueue.WorkQueue(clock=StillClock(), backoff=backoff)
    synced: list[str] = []
    failures: list[tuple[str, bool]] = []
    running = _loop(queue, [], synced, failures)
    queue.add("bad")
    queue.add("good")
    running.start_workers()
    running.stop()  # the queue drains the keys already queued before the worker ends
    assert synced == ["bad", "good"]
    assert failures == [("bad", True)]
    assert (queue.num_requeues("bad"), queue.num_requeues("good")) == (1, 0)


def test_informers_start_in_order_and_stop_in_reverse() -> None:
    """Guards: `start_informers` starts the informers in the given order and waits for them; `stop` stops them in
    the reverse order."""
    log: list[str] = []
    running = _loop(workqueue.WorkQueue(), [FakeInformer("a", log), FakeInformer("b", log)], [], [])
    running.start_informers(1.0)
    assert running.wait_synced(0)
    running.stop()
    assert log == ["start a", "start b", "stop b", "stop a"]


def test_informers_that_do_not_sync_are_stopped_and_named_in_the_timeout() -> None:
    """Guards: informers without their first list in time are stopped again, and the TimeoutError names the
    controller and the timeout."""
    log: list[str] = []
    informers = [FakeInformer("a", log), FakeInformer("b", log, synced=False)]
    running = _loop(workqueue.WorkQueue(), informers, [], [])
    with pytest.raises(TimeoutError, match=r"^the test controller's informers did not sync within 0\.5s$"):
        running.start_informers(0.5)
    assert log == ["start a", "start b", "stop b", "stop a"]
