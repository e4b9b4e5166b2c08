"""The scheduler's pending pods: why each is not scheduled yet, and which go back on the queue when the cluster changes.

What it does: `Pending` keeps, per key (`namespace/name`) of a pod of this scheduler that is not
bound, why it is not: unschedulable (queued again when slices, classes or nodes change, when a
claim is freed or deleted, when a bound pod goes away: `requeue_unschedulable`; or when a claim
it uses changes: `requeue_users`), refused until the pod itself changes (not queued again), or
waiting for one claim to change (or its own status, claim ""). It also keeps why the model
refuses a claim, so that a pod using that claim is told. The scheduler's work queue is where
it puts keys back.

What it must not do: decide, read or write the API, or touch the allocator or the node filter:
it only moves keys onto the queue. Its lock guards its own sets alone and is never held while
the queue or the pod cache is called: no other lock is taken under it.
"""

from __future__ import annotations

import threading

from dractl.controller import claims, schedplan
from dractl.kube import informer, workqueue


class Pending:
    """The pending pods' bookkeeping over `queue`. Thread-safe; every method may be called any number of times."""

    def __init__(self, queue: workqueue.WorkQueue) -> None:
        self._queue = queue
        self._lock = threading.Lock()  # guards the sets and maps below
        self._unschedulable: set[str] = set()  # pod keys retried when the cluster changes
        self._refused: set[str] = set()  # pod keys refused until they change
        self._waiting: dict[str, str] = {}  # pod key -> the claim key it waits for ("": its own status)
        self._bad_claims: dict[str, str] = {}  # claim key -> why the model refuses it

    def count(self) -> int:
        """How many pods are unschedulable or refused now."""
        with self._lock:
            return len(self._unschedulable | self._refused)

    def forget(self, key: str) -> None:
        """The pod is bound, gone, or no longer this scheduler's: nothing is kept about it."""
        with self._lock:
            self._unschedulable.discard(key)
            self._refused.discard(key)
            self._waiting.pop(key, None)

    def refuse(self, key: str, *, retry: bool) -> None:
        """The pod was refused: retried when the cluster changes (`retry`), else only when it changes itself."""
        with self._lock:
            self._waiting.pop(key, None)
            if retry:
                self._unschedulable.add(key)
                self._refused.discard(key)
            else:
                self._refused.add(key)
                self._unschedulable.discard(key)

    def wait(self, key: str, *, claim: str) -> None:
        """The pod waits for the claim `claim` (`namespace/name`) to change, or for its own status when ""."""
        with self._lock:
            self._waiting[key] = claim

    def claim_refused(self, claim_key: str, reason: str) -> None:
        """The model refuses the claim `claim_key` for `reason`: a pod using it is told so (`bad_claims`)."""
        with self._lock:
            self._bad_claims[claim_key] = reason

    def claim_readable(self, claim_key: str) -> None:
        """The claim decodes (again), or is gone: no reason is kept for it."""
        with self._lock:
            self._bad_claims.pop(claim_key, None)

    def bad_claims(self, namespace: str) -> dict[str, str]:
        """Why the model refuses claims of `namespace`, by claim name (a fresh dict)."""
        with self._lock:
            return {
                claim_key.partition("/")[2]: reason
                for claim_key, reason in self._bad_claims.items()
                if claim_key.partition("/")[0] == namespace
            }

    def requeue_unschedulable(self) -> None:
        """Queue every unschedulable pod: something they may wait for changed."""
        with self._lock:
            keys = sorted(self._unschedulable)
        for key in keys:
            self._queue.add(key)

    def requeue_users(self, claim_key: str, *, name: str, pods: informer.Store[schedplan.PodInfo]) -> None:
        """Queue the pods that wait for this claim, and the unschedulable pods (read from `pods`) that use it."""
        namespace = claim_key.partition("/")[0]
        with self._lock:
            keys = {key for key, waited in self._waiting.items() if waited == claim_key}
            users = [key for key in self._unschedulable if key.partition("/")[0] == namespace]
        for key in users:
            pod = pods.get(key)
            if pod is not None and name in claims.claim_names(pod.state):
                keys.add(key)
        for key in sorted(keys):
            self._queue.add(key)
