"""What the allocator answers: reasons a person can act on, and the outcome of one allocation.

Plain values (frozen, slotted); `dractl.alloc` names them for its callers.
"""

from __future__ import annotations

import dataclasses

from dractl import model


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """One thing a person can act on. `request` is "req" or "req/sub", or None for the claim."""

    claim: str  # "namespace/name"
    request: str | None
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for one `Allocator.allocate` call.

    On success `allocations` holds one result per claim (same order) and `node` the chosen
    node (None when the devices are usable on every node). On failure `allocations` is None
    and `reasons` says why, per claim and request.
    """

    node: str | None
    allocations: tuple[model.AllocationResult, ...] | None
    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        return self.allocations is not None
