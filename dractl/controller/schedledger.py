"""The scheduler's allocator kept in step with the API: the devices it knows, and the claims that hold them.

What it does: `Inventory` hands the allocator the current slices, classes and nodes when any of
them changed. `Ledger` makes the allocator hold every claim the API shows allocated, by dractl
or by kube-scheduler (`hold`; `release` when it is deallocated or deleted), so nothing is given
twice, once `open` held the claims of the first list; it tells the allocator the request shapes
of pending claims (`consider`); and it keeps the two sets that make a decision's own writes safe
against the claim events they cause: the claims a decision is writing (in flight: their events
do not change the holds, or an event older than the decision's write would drop its hold), and
the claims whose rollback could not confirm the API's state (doubtful: they stay held until a
sync read them, `settle`, so a hold is never dropped while its allocation may exist).

What it must not do: talk to the API (what it learns comes from the caches and from the
scheduler's own reads), decide a placement, or count pods on nodes. The ledger's lock guards
its own sets and is held while the allocator is told about a claim, so that a claim event and a
decision's start or end are ordered; the inventory's is held while the allocator is updated.
Only the allocator's and the caches' own locks (leaves) are taken under either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from dractl import alloc, model
from dractl.controller import schedfit
from dractl.kube import informer

log = logging.getLogger(__name__)


class AllocatorService(Protocol):
    """The long-lived allocator the scheduler uses (`alloc.Allocator`): thread-safe, holds devices per claim id."""

    def allocate(self, claims: Sequence[model.ResourceClaim], *, nodes: Sequence[str] | None = None) -> alloc.Outcome:
        """Allocate `claims` together on one of `nodes`; on success each claim holds its devices."""
        ...

    def release(self, claim_id: str) -> bool:
        """Give back what the claim holds; False when it held nothing."""
        ...

    def hold(self, claim: model.ResourceClaim) -> None:
        """Record an allocation that exists in the API (idempotent)."""
        ...

    def held(self, claim_id: str) -> model.AllocationResult | None:
        """What the claim holds, if anything."""
        ...

    def contested(self, claim_id: str) -> str | None:
        """Why another claim holds what this claim holds (an allocation held unchecked overlaps it), or None."""
        ...

    def consider(self, claims: Sequence[model.ResourceClaim]) -> None:
        """Make the request shapes of pending claims known, without allocating."""
        ...

    def update(
        self,
        *,
        device_classes: Sequence[model.DeviceClass] | None = None,
        resource_slices: Sequence[model.ResourceSlice] | None = None,
        nodes: Sequence[model.Node] | None = None,
    ) -> None:
        """Replace the given sets of the inventory (None leaves one as it is); held claims survive."""
        ...


class Inventory:
    """The allocator's inventory kept in step with the slice, class and node caches. Thread-safe."""

    def __init__(
        self,
        allocator: AllocatorService,
        *,
        classes: informer.Store[model.DeviceClass],
        slices: informer.Store[model.ResourceSlice],
        nodes: informer.Store[schedfit.NodeState],
    ) -> None:
        self._allocator = allocator
        self._classes = classes
        self._slices = slices
        self._nodes = nodes
        self._lock = threading.Lock()  # guards `_dirty`, and makes one update at a time
        self._dirty = True

    def changed(self) -> None:
        """A slice, class or node changed: the next `refresh` hands the allocator the caches."""
        with self._lock:
            self._dirty = True

    def refresh(self) -> None:
        """Hand the allocator the current slices, classes and nodes if any changed since the last time."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            self._allocator.update(
                device_classes=self._classes.values(),
                resource_slices=self._slices.values(),
                nodes=[state.node for state in self._nodes.values()],
            )


class Ledger:
    """The allocator's holds in step with the API's claims. Thread-safe."""

    def __init__(self, allocator: AllocatorService) -> None:
        self._allocator = allocator
        self._lock = threading.Lock()  # guards the fields below, and orders claim events against decisions
        self._open = False  # claim events reach the allocator only once `open` held the API's claims
        self._in_flight: set[str] = set()  # claim ids whose writes a decision is making
        self._doubtful: dict[str, model.ResourceClaim] = {}  # by claim id

    def open(self, claims: Iterable[model.ResourceClaim]) -> None:
        """Hold every allocated claim of `claims` (the claim cache); from now on claim events reach the allocator.
        Idempotent."""
        with self._lock:
            for claim in claims:
                if claim.allocation is not None:
                    self._hold(claim)
            self._open = True

    def claim_changed(self, old: model.ResourceClaim | None, claim: model.ResourceClaim) -> bool:
        """A claim event: hold or release on a transition (unless a decision is writing the claim), and make a
        pending claim's request shapes known. True when the change freed devices (it was deallocated)."""
        claim_id = alloc.claim_id(claim)
        freed = old is not None and old.allocation is not None and claim.allocation is None
        with self._lock:
            if self._open and claim_id not in self._in_flight:
                # Transitions only: an event older than a decision's own write must not drop its hold.
                if claim.allocation is not None:
                    self._hold(claim)
                elif freed:
                    self._allocator.release(claim_id)
            if claim.allocation is None:
                self._consider(claim)
        return freed

    def claim_deleted(self, claim: model.ResourceClaim) -> None:
        """A claim is gone: what it held is free (unless a decision is writing it)."""
        with self._lock:
            if self._open and alloc.claim_id(claim) not in self._in_flight:
                self._allocator.release(alloc.claim_id(claim))

    def busy(self, claims: Iterable[model.ResourceClaim]) -> model.ResourceClaim | None:
        """The first of `claims` that a decision is writing, or that holds devices (written, the cache behind), or
        None."""
        with self._lock:
            for claim in claims:
                claim_id = alloc.claim_id(claim)
                if claim_id in self._in_flight or self._allocator.held(claim_id) is not None:
                    return claim
        return None

    def contested(self, claim: model.ResourceClaim) -> str | None:
        """Why another claim holds what `claim` holds (another scheduler's allocation, held unchecked, overlaps
        it), or None."""
        return self._allocator.contested(alloc.claim_id(claim))

    def begin(self, claims: Iterable[model.ResourceClaim]) -> None:
        """A decision holds these claims' devices and starts writing them: their events leave the holds alone."""
        with self._lock:
            self._in_flight.update(alloc.claim_id(claim) for claim in claims)

    def end(self, claims: Iterable[model.ResourceClaim]) -> None:
        """The decision's writes of these claims are done (or taken back): their events count again."""
        with self._lock:
            self._in_flight.difference_update(alloc.claim_id(claim) for claim in claims)

    def taken_back(self, claims: Iterable[model.ResourceClaim], *, still_allocated: set[str]) -> None:
        """A decision's writes were taken back: give back the devices of the claims whose allocation is gone from
        the API; those in `still_allocated` (claim ids: the API may still show their allocation) stay held and
        doubtful until `settle`."""
        with self._lock:
            for claim in claims:
                claim_id = alloc.claim_id(claim)
                if claim_id in still_allocated:
                    self._doubtful[claim_id] = claim
                else:
                    self._allocator.release(claim_id)

    def doubtful(self, claims: Iterable[model.ResourceClaim]) -> list[model.ResourceClaim]:
        """Those of `claims` whose state in the API is not known since a rollback."""
        with self._lock:
            return [claim for claim in claims if alloc.claim_id(claim) in self._doubtful]

    def settle(self, claim: model.ResourceClaim, *, live: model.ResourceClaim | None, exists: bool) -> None:
        """A doubtful claim was read: hold it as it is (`live`, when it decodes), or release it when it is gone
        (`exists` False) or holds no allocation any more. A claim that exists but does not decode stays held.

        Such a claim is held and not in flight, so no decision can be allocating it meanwhile:
        releasing it here cannot drop a hold a decision relies on.
        """
        claim_id = alloc.claim_id(claim)
        with self._lock:
            if self._doubtful.pop(claim_id, None) is None or claim_id in self._in_flight:
                return
            if exists and live is None:
                return  # It exists but does not decode: keep holding what it may use.
            if live is not None and live.meta.uid == claim.meta.uid and live.allocation is not None:
                self._hold(live)
            else:
                self._allocator.release(claim_id)

    def _hold(self, claim: model.ResourceClaim) -> None:
        """Hold an allocation the API shows. Never raises: a claim the allocator cannot hold is logged."""
        try:
            self._allocator.hold(claim)
        except Exception:  # noqa: BLE001 (one odd claim must not stop the informer's other events)
            log.exception("ResourceClaim %s: the allocator could not record its allocation", claim.key)

    def _consider(self, claim: model.ResourceClaim) -> None:
        """Tell the allocator a pending claim's request shapes, so that binpack's choices depend on the claims
        pending now (the same after a restart, whose first list has them all), not on the order pods came in.
        Never raises."""
        try:
            self._allocator.consider([claim])
        except Exception:  # noqa: BLE001 (one odd claim must not stop the informer's other events)
            log.exception("ResourceClaim %s: the allocator could not read its requests", claim.key)
