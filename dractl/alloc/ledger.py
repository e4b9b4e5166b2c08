"""The ledger: what each claim holds, by claim id, and the core's usage kept in step with it.

Part of the allocator (`dractl.alloc`). A holding records, in one build's tables, the devices a
claim takes (each whole or as a share), the capacity it consumes and, for binpack, the devices
it holds per request shape; giving it back undoes exactly that in the core. No search, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from dractl import _alloc, model
from dractl.alloc import index as allocindex
from dractl.alloc import outcome
from dractl.alloc import plans as allocplans


def claim_id(claim: model.ResourceClaim) -> str:
    """How the allocator names a claim: its UID, or "namespace/name" when it has none (manifests)."""
    return claim.meta.uid or claim.key


@dataclasses.dataclass(frozen=True, slots=True)
class Holding:
    """What one claim holds: the claim (whose own `allocation` may be unset: it was allocated
    here), its allocation, and in the current tables each device it takes (index, as a share),
    each capacity it consumes (device, slot, amount) and the devices it holds per request shape
    (shape id, devices; binpack weighs the shapes by what the cluster holds, first-fit keeps none)."""

    claim: model.ResourceClaim
    allocation: model.AllocationResult | None
    devices: tuple[tuple[int, bool], ...]
    slots: tuple[tuple[int, int, int], ...]
    shapes: tuple[tuple[int, int], ...] = ()


class Ledger:
    """The holdings of one build of the device tables, and the counts of claims holding each
    device whole or as a share. Not thread-safe: the allocator calls it under its lock.

    `enter`, `record` and `hold` add a holding; `pop` removes one and `apply` gives its usage
    back to the core. Holdings added while the tables are stale (`holding(..., stale=True)`)
    take nothing: the next build enters them again from their claims.
    """

    def __init__(
        self, *, core: _alloc.Core, index: allocindex.Index, compiler: allocplans.Compiler, binpack: bool
    ) -> None:
        self._core = core
        self._index = index
        self._compiler = compiler
        self._binpack = binpack
        self._holdings: dict[str, Holding] = {}
        self._dedicated: dict[int, int] = {}  # device -> claims holding it whole
        self._shared: dict[int, int] = {}  # device -> shares held

    def __iter__(self) -> Iterator[Holding]:
        return iter(self._holdings.values())

    def items(self) -> Iterator[tuple[str, Holding]]:
        """(claim id, holding) pairs, in the order the holdings were added."""
        return iter(self._holdings.items())

    def get(self, key: str) -> Holding | None:
        return self._holdings.get(key)

    def refused(self, claims: Sequence[model.ResourceClaim]) -> tuple[outcome.Reason, ...]:
        """Why `claims` cannot be allocated together as they are: one already holds devices, or
        one is listed twice."""
        seen: set[str] = set()
        reasons: list[outcome.Reason] = []
        for claim in claims:
            key = claim_id(claim)
            if key in self._holdings:
                reasons.append(outcome.Reason(claim.key, None, "the claim already holds devices; release it first"))
            elif key in seen:
                reasons.append(outcome.Reason(claim.key, None, "the claim is listed twice in one allocation"))
            seen.add(key)
        return tuple(reasons)

    def enter(self, claim: model.ResourceClaim, allocation: model.AllocationResult) -> None:
        """Enter an allocation the core's tables were built holding (`allocindex.Index`): the core
        already counts its devices, counters and capacity, not yet its demand."""
        devices, slots = self._index.takes(allocation)
        shapes = self._held_shapes(claim, allocation)
        self._holdings[claim_id(claim)] = Holding(claim, allocation, tuple(devices), tuple(slots), shapes)
        for device, shared in devices:
            counts = self._shared if shared else self._dedicated
            counts[device] = counts.get(device, 0) + 1
        for shape, count in shapes:
            self._core.add_held(shape, count)

    def record(self, claim: model.ResourceClaim, allocation: model.AllocationResult, indices: Sequence[int]) -> None:
        """Enter a committed search result: the core already holds its devices, counters and
        capacity (`indices`: the device index of every result)."""
        devices: list[tuple[int, bool]] = []
        slots: list[tuple[int, int, int]] = []
        for index, result in zip(indices, allocation.results, strict=True):
            if result.admin_access:
                continue
            shared = result.share_id is not None
            devices.append((index, shared))
            (self._shared if shared else self._dedicated)[index] = (self._shared if shared else self._dedicated).get(
                index, 0
            ) + 1
            for name, amount in result.consumed_capacity.items():
                slots.append((index, self._index.slot_of[(index, name)], amount.as_int()))
        shapes = self._held_shapes(claim, allocation)
        self._holdings[claim_id(claim)] = Holding(claim, allocation, tuple(devices), tuple(slots), shapes)
        for shape, count in shapes:
            self._core.add_held(shape, count)

    def hold(self, claim: model.ResourceClaim, allocation: model.AllocationResult, *, stale: bool) -> None:
        """Make the claim hold `allocation`, unchecked, taking it in the core; with `stale`
        tables, only remember it for the next build."""
        key = claim_id(claim)
        if stale:
            self._holdings[key] = Holding(claim, allocation, (), ())
            return
        devices, slots = self._index.takes(allocation)
        holding = self._holdings[key] = Holding(
            claim, allocation, tuple(devices), tuple(slots), self._held_shapes(claim, allocation)
        )
        self.apply(holding, 1)

    def pop(self, key: str) -> Holding | None:
        """Remove the claim's holding from the ledger (its usage stays in the core: `apply`)."""
        return self._holdings.pop(key, None)

    def restore(self, holding: Holding) -> None:
        """Put back a holding `pop` removed and `apply(holding, -1)` gave back, taking its usage again: the ledger and
        the core are as before the pop."""
        self._holdings[claim_id(holding.claim)] = holding
        self.apply(holding, 1)

    def apply(self, holding: Holding, sign: int) -> None:
        """Add (1) or give back (-1) what a holding takes, in the device counts and in the core."""
        for shape, count in holding.shapes:
            self._core.add_held(shape, sign * count)
        for index, shared in holding.devices:
            counts = self._shared if shared else self._dedicated
            left = counts.get(index, 0) + sign
            if left > 0:
                counts[index] = left
            else:
                counts.pop(index, None)
        for index, slot, amount in holding.slots:
            self._core.add_slot_used(index, slot, sign * amount)
        for index in sorted({index for index, _ in holding.devices}):
            self._core.set_held(index, self._dedicated.get(index, 0) > 0, self._shared.get(index, 0))

    def _held_shapes(
        self, claim: model.ResourceClaim, allocation: model.AllocationResult
    ) -> tuple[tuple[int, int], ...]:
        """How many devices the allocation holds for each request shape of the claim (results
        with admin access hold nothing), by the (sub)request each result names. Binpack's
        demand only: first-fit keeps none."""
        if not self._binpack:
            return ()
        plan = self._compiler.plan(claim.spec)
        by_name = {alt.name: alt.shape.shape_id for alts in plan.requests for alt in alts}
        counts: dict[int, int] = {}
        for result in allocation.results:
            shape = by_name.get(result.request, -1)
            if shape >= 0 and not result.admin_access:
                counts[shape] = counts.get(shape, 0) + 1
        return tuple(sorted(counts.items()))

    def contested(self, key: str) -> str | None:
        """Why another claim holds what the claim `key` holds, naming that claim, or None (also when
        the claim holds nothing): see `Allocator.contested`."""
        mine = self._holdings.get(key)
        if mine is None:
            return None
        index = self._index
        for device, shared in mine.devices:
            whole = self._dedicated.get(device, 0) - (0 if shared else 1)
            shares = self._shared.get(device, 0) - (1 if shared else 0)
            if whole > 0 or (shares > 0 and not shared):
                other = self._holder(key, device=device)
                return f"device {index.devices[device].path} is allocated to {other} too"
        for device, _ in mine.devices:
            for k in range(index.cons_off[device], index.cons_off[device + 1]):
                counter = index.cons_id[k]
                if self._core.counter_available(counter) < 0:
                    driver, pool, counter_set, name = index.counter_names[counter]
                    return (
                        f"counter {name} of counter set {counter_set} in pool {driver}/{pool}, which device "
                        f"{index.devices[device].path} draws, is overdrawn with "
                        f"{self._holder(key, counter=counter)}"
                    )
        return None

    def _holder(self, key: str, *, device: int = -1, counter: int = -1) -> str:
        """The first claim other than `key` holding `device`, or a device that draws `counter`, as words. Only
        called once an overlap was found (it goes over every holding)."""
        index = self._index
        for other, holding in self._holdings.items():
            if other == key:
                continue
            for used, _ in holding.devices:
                draws = index.cons_id[index.cons_off[used] : index.cons_off[used + 1]]
                if used == device or counter in draws:
                    return f"ResourceClaim {holding.claim.key}"
        return "another claim"
