"""The running part every controller shares: informers feeding a key-only work queue, and workers syncing keys.

What it does: `Loop` starts a controller's informers and waits for their first lists, starts its
worker threads, and stops it all again. A worker takes a key from the queue, syncs it, and then
forgets it (its backoff starts over) or, when the sync raised, hands the failure to the
controller and requeues the key with backoff; the queue never gives one key to two workers.

What it must not do: decide anything about a key (that is the controller's sync), or log or count
a failure itself (the controller's `failed` callback does, in its own words and metrics).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from dractl.kube import informer, workqueue


class Loop:
    """One controller's informers, queue and workers. `start_informers()`, then `start_workers()`; `stop()` ends
    both (once: a stopped loop is not started again).

    Constructor:
    - `name`: the controller as messages name it ("the scheduler"), and `thread_name` the prefix
      of its worker threads' names (`<thread_name>-<index>`).
    - `queue`: the work queue the informers' handlers fill.
    - `informers`: started in this order, stopped in the reverse order.
    - `sync`: syncs one key; raising means "try again later".
    - `failed`: called with the key and the exception, inside the `except` block (so it may log
      the traceback), before the key is requeued with backoff.
    - `workers`: how many worker threads.
    """

    def __init__(
        self,
        *,
        name: str,
        thread_name: str,
        queue: workqueue.WorkQueue,
        informers: Sequence[informer.Informer[Any]],
        sync: Callable[[str], None],
        failed: Callable[[str, Exception], None],
        workers: int,
    ) -> None:
        self.name = name
        self.thread_name = thread_name
        self.queue = queue
        self.informers = tuple(informers)
        self.sync = sync
        self.failed = failed
        self.workers = workers
        self._threads: list[threading.Thread] = []

    def start_informers(self, timeout: float) -> None:
        """Start the informers and wait for their first lists, up to `timeout` seconds.

        Raises TimeoutError when they do not sync in time (the informers are stopped again).
        """
        for source in self.informers:
            source.start()
        if not self.wait_synced(timeout):
            for source in reversed(self.informers):
                source.stop()
            raise TimeoutError(f"{self.name}'s informers did not sync within {timeout:g}s")

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether every informer has its first list, waiting up to `timeout` seconds for each (None: for ever)."""
        return all(source.wait_synced(timeout) for source in self.informers)

    def start_workers(self) -> None:
        """Start the worker threads (daemon threads: they never keep the process alive)."""
        for index in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"{self.thread_name}-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop handing out keys, let the workers finish the key in hand, stop the informers. Idempotent."""
        self.queue.shutdown()
        for source in reversed(self.informers):
            source.stop(timeout)
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self.sync(key)
                self.queue.forget(key)
            except Exception as error:  # noqa: BLE001 (one key's failure must never stop a worker)
                self.failed(key, error)
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)
