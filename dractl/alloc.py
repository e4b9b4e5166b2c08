"""The allocation facade: model values in, allocations and reasons out.

What it does: maps model values (classes, slices, nodes, claims) to indices, bitsets and
counters; evaluates CEL selectors once per (selector, device) and slice generation; runs
the Cython core (`dractl._alloc`) for the search and scoring; maps the chosen indices back
into `model.AllocationResult` values in exactly the API's shape; explains every failure.
What it must not do: see an API object (raw dicts), do I/O, or print.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from dractl import model


class Policy(enum.Enum):
    FIRST_FIT = "first-fit"  # upstream's choices exactly
    BINPACK = "binpack"  # scored: pack nodes and GPUs, keep locality, avoid MIG fragmentation


class AllocationError(Exception):
    """The input cannot be allocated at all (not a per-claim failure): e.g. a bad snapshot."""


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


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as the allocator sees it. Claims with `allocation` set hold their devices."""

    device_classes: Sequence[model.DeviceClass]
    resource_slices: Sequence[model.ResourceSlice]
    nodes: Sequence[model.Node] = ()
    allocated_claims: Sequence[model.ResourceClaim] = ()


class Allocator:
    """Allocates claims against one snapshot; every success is committed, so later calls
    see those devices, counters and capacity as used.

    Not thread-safe: one allocator per decision loop.
    """

    def __init__(self, snapshot: Snapshot, *, policy: Policy = Policy.BINPACK, search_limit: int = 1_000_000) -> None:
        raise NotImplementedError

    def allocate(self, claims: Sequence[model.ResourceClaim], *, nodes: Sequence[str] | None = None) -> Outcome:
        """Allocate `claims` jointly (they share one node) on one of `nodes` (None: any node),
        the node the policy picks. Claims must be unallocated. Commits on success."""
        raise NotImplementedError
