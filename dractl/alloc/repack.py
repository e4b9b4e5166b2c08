"""What a repack would do: which held claims, moved, let a refused claim fit, and where each goes.

Part of the allocator (`dractl.alloc`). `Repack` and `Move` are the plain values the what-if
(`Allocator.repack`) answers with; `candidates` and `subsets` decide which held claims it tries,
in which order, within its bound. Pure: no search, no I/O; the service runs the trials.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence

from dractl import model
from dractl.model import nodes as model_nodes

MAX_MOVES = 2
"""Held claims a repack named in a refusal's reason may move: past this it is no longer a hint a person acts on."""

MAX_CANDIDATES = 8
"""Held claims the what-if considers moving, by default: with `MAX_MOVES` at most 8 + 28 subsets are tried (each
costs a few searches, and every refusal's reasons run it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """One held claim moved: its name ("namespace/name"), id (`claim_id`), and allocation and node before and
    after (node None: the devices are usable on every node)."""

    claim: str
    claim_id: str
    before: model.AllocationResult
    before_node: str | None
    after: model.AllocationResult
    after_node: str | None

    def describe(self) -> str:
        """'ns/a (gpu-3 on dgx-07 -> gpu-1 on dgx-02)'."""
        return f"{self.claim} ({_where(self.before, self.before_node)} -> {_where(self.after, self.after_node)})"


@dataclasses.dataclass(frozen=True, slots=True)
class Repack:
    """A plan that admits refused claims: every move is made at once, together with `allocations` (one per
    refused claim, in their order) on `node`. Nothing of it is held: the allocator is as it was."""

    moves: tuple[Move, ...]
    node: str | None
    allocations: tuple[model.AllocationResult, ...]

    def describe(self) -> str:
        """'move ns/a (gpu-3 on dgx-07 -> gpu-1 on dgx-02), ns/b (...)'."""
        return "move " + ", ".join(move.describe() for move in self.moves)


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A held claim the what-if may move: its id, the devices it holds, and the rank of the best candidate node
    it holds devices on (0: the node closest to taking the refused claim)."""

    claim_id: str
    devices: int
    rank: int


def subsets(candidates: Sequence[Candidate], *, max_moves: int) -> Iterator[tuple[Candidate, ...]]:
    """Sets of candidates to release, fewest claims first, then fewest devices, then the candidates' own order
    (closest node first). Deterministic. At most sum over k <= max_moves of C(len(candidates), k) sets."""
    for size in range(1, max_moves + 1):
        chosen = list(itertools.combinations(range(len(candidates)), size))
        chosen.sort(key=lambda picks: (sum(candidates[i].devices for i in picks), picks))
        for picks in chosen:
            yield tuple(candidates[i] for i in picks)


def node_of(allocation: model.AllocationResult) -> str | None:
    """The one node an allocation's node selector names by `metadata.name`, else None."""
    selector = allocation.node_selector
    if selector is None or len(selector.terms) != 1:
        return None
    term = selector.terms[0]
    names = [r.values for r in term.match_fields if r.key == model_nodes.NAME_FIELD and r.operator == "In"]
    if len(names) == 1 and len(names[0]) == 1 and not term.match_expressions:
        return names[0][0]
    return None


def _where(allocation: model.AllocationResult, node: str | None) -> str:
    devices = ", ".join(result.device for result in allocation.results)
    return devices if node is None else f"{devices} on {node}"
