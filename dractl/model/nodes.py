"""Nodes and pools: which nodes exist, where a slice or device is usable, and which pools are usable.

What it does: the one implementation, shared by the allocator's index, `dractl simulate`
(placement and the per-node report) and the controller, of

- core/v1 `NodeSelector` matching against a node's name and labels (`selector_matches`);
- the node-selection fields of a ResourceSlice and of its devices (`slice_selects`,
  `device_selects`);
- node discovery: the nodes a set of objects knows (`discover`);
- pool gathering as upstream's allocator does it (`Pools`): per (driver, pool), the highest
  generation among the slices a node sees; complete when that generation has
  `resourceSliceCount` slices (counted cluster-wide), obsolete when a newer generation exists,
  else incomplete; invalid when its device names or counter sets are inconsistent.

What it must not do: evaluate CEL, allocate, hold state that changes, or do I/O. Every
function is pure; `Pools` only caches values derived from the slices it was built with.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping, Sequence

from dractl.model import types

NAME_FIELD = "metadata.name"
"""The only node field a `matchFields` requirement may name."""

# strconv.ParseInt(value, 10, 64), as core/v1 uses for Gt and Lt: no spaces, no underscores.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = 1 << 63


# --- node selectors --------------------------------------------------------------------------


def _integer(text: str) -> int | None:
    if _INTEGER.fullmatch(text) is None:
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def _expression_matches(requirement: types.NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One `matchExpressions` requirement against the labels. A requirement the API would
    refuse (wrong number of values, a Gt/Lt value that is not an integer) matches nothing,
    as in core/v1 where it makes the term fail."""
    operator, values = requirement.operator, requirement.values
    value = labels.get(requirement.key)
    if operator == "In":
        return bool(values) and value is not None and value in values
    if operator == "NotIn":
        return bool(values) and (value is None or value not in values)
    if operator == "Exists":
        return not values and value is not None
    if operator == "DoesNotExist":
        return not values and value is None
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or value is None:
            return False
        have, want = _integer(value), _integer(values[0])
        if have is None or want is None:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _field_matches(requirement: types.NodeSelectorRequirement, name: str) -> bool:
    """One `matchFields` requirement: only `metadata.name` with In or NotIn and exactly one
    value is a valid node field selector; anything else makes the term match nothing."""
    if requirement.key != NAME_FIELD or len(requirement.values) != 1:
        return False
    if requirement.operator == "In":
        return name == requirement.values[0]
    if requirement.operator == "NotIn":
        return name != requirement.values[0]
    return False


def term_matches(term: types.NodeSelectorTerm, *, name: str, labels: Mapping[str, str]) -> bool:
    """Whether one term selects the node: its requirements are ANDed, and a term without
    requirements selects nothing (as in core/v1). Pure."""
    if not term.match_expressions and not term.match_fields:
        return False
    return all(_expression_matches(r, labels) for r in term.match_expressions) and all(
        _field_matches(r, name) for r in term.match_fields
    )


def selector_matches(selector: types.NodeSelector, *, name: str, labels: Mapping[str, str]) -> bool:
    """Whether a node with this name and labels is selected: terms are ORed, requirements
    ANDed, exactly as core/v1's node affinity. Pure."""
    return any(term_matches(term, name=name, labels=labels) for term in selector.terms)


def named_nodes(selector: types.NodeSelector) -> tuple[str, ...] | None:
    """The node names a selector can select when each of its terms pins `metadata.name`
    with In; None when some term can select a node by other means. Pure.

    Lets callers skip matching a selector against every node: the allocator writes
    `matchFields metadata.name In [node]` for node-local devices."""
    names: list[str] = []
    for term in selector.terms:
        pinned = [r for r in term.match_fields if r.key == NAME_FIELD and r.operator == "In" and len(r.values) == 1]
        if not pinned:
            if not term.match_expressions and not term.match_fields:
                continue  # an empty term selects nothing
            return None
        if pinned[0].values[0] not in names:
            names.append(pinned[0].values[0])
    return tuple(names)


# --- where slices and devices are usable -----------------------------------------------------


def _choice(
    *,
    node_name: str | None,
    all_nodes: bool,
    node_selector: types.NodeSelector | None,
    name: str | None,
    labels: Mapping[str, str],
) -> bool | None:
    """Whether one node-selection choice (as on a slice or a device) takes the node; None
    when none of `nodeName`, `allNodes` and `nodeSelector` is set. An anonymous node (no
    name) is taken only by `allNodes`."""
    if node_name:
        return node_name == name
    if all_nodes:
        return True
    if node_selector is not None:
        return name is not None and selector_matches(node_selector, name=name, labels=labels)
    return None


def device_selects(device: types.Device, *, name: str | None, labels: Mapping[str, str]) -> bool:
    """Whether a device of a `perDeviceNodeSelection` slice is usable on the node. Pure."""
    return (
        _choice(
            node_name=device.node_name,
            all_nodes=device.all_nodes,
            node_selector=device.node_selector,
            name=name,
            labels=labels,
        )
        is True
    )


def slice_selects(s: types.ResourceSlice, *, name: str | None, labels: Mapping[str, str]) -> bool:
    """Whether a slice is relevant to the node: its `nodeName`, `allNodes` or `nodeSelector`
    takes the node, or (`perDeviceNodeSelection`) at least one of its devices is usable there.
    A slice with no node selection at all (a future API field) is ignored, as upstream does. Pure."""
    chosen = _choice(
        node_name=s.node_name, all_nodes=s.all_nodes, node_selector=s.node_selector, name=name, labels=labels
    )
    if chosen is not None:
        return chosen
    return s.per_device_node_selection and any(device_selects(d, name=name, labels=labels) for d in s.devices)


def node_local(s: types.ResourceSlice, device: types.Device) -> bool:
    """Whether a device is usable on one node only: the slice or the device names a node,
    or the device binds to the node it is allocated on. Pure."""
    return bool(s.node_name) or bool(device.node_name) or device.binds_to_node


def home(s: types.ResourceSlice, device: types.Device) -> str | None:
    """The node a device lives on when a slice or device `nodeName` says so, else None
    (usable through `allNodes` or a node selector). Pure."""
    return s.node_name or device.node_name or None


# --- node discovery --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """The nodes a set of objects knows, sorted by name, and their labels.

    With Node objects those are the nodes (labels included) and `has_nodes` is True; without,
    the nodes are the names the ResourceSlices give (`discover` says which) and have no labels.
    """

    names: tuple[str, ...]
    labels: Mapping[str, Mapping[str, str]]
    has_nodes: bool

    def labels_of(self, name: str) -> Mapping[str, str]:
        return self.labels.get(name, {})


def _selector_names(selector: types.NodeSelector | None) -> Iterable[str]:
    if selector is None:
        return ()
    return (
        r.values[0]
        for t in selector.terms
        for r in t.match_fields
        if r.key == NAME_FIELD and r.operator == "In" and len(r.values) == 1
    )


def discover(*, nodes: Sequence[types.Node], slices: Sequence[types.ResourceSlice]) -> Cluster:
    """The nodes that exist. Pure and deterministic.

    Node objects, when any are given, are the whole truth (as for the scheduler). Without them
    the nodes are every name a slice gives: `spec.nodeName`, a device's `nodeName`, and the
    `metadata.name In [name]` requirements of slice and device node selectors (a
    network-attached slice restricted to named nodes). Labels are then unknown (empty).
    """
    if nodes:
        return Cluster(
            names=tuple(sorted({node.meta.name for node in nodes})),
            labels={node.meta.name: node.meta.labels for node in nodes},
            has_nodes=True,
        )
    names: set[str] = set()
    for s in slices:
        if s.node_name:
            names.add(s.node_name)
        names.update(_selector_names(s.node_selector))
        if s.per_device_node_selection:
            for d in s.devices:
                if d.node_name:
                    names.add(d.node_name)
                names.update(_selector_names(d.node_selector))
    return Cluster(names=tuple(sorted(names)), labels={}, has_nodes=False)


# --- pools -----------------------------------------------------------------------------------


class ProblemKind(enum.Enum):
    INVALID = "invalid"
    INCOMPLETE = "incomplete"


@dataclasses.dataclass(frozen=True, slots=True)
class PoolProblem:
    """A pool that cannot be used: invalid (inconsistent device names or counter sets) or
    incomplete (some slices of its newest generation are not published)."""

    driver: str
    pool: str
    kind: ProblemKind
    detail: str

    def message(self) -> str:
        if self.kind is ProblemKind.INVALID:
            return f"resource pool {self.driver}/{self.pool} is invalid: {self.detail}"
        return f"resource pool {self.driver}/{self.pool} is currently being updated: {self.detail}"


PoolKey = tuple[str, str]
"""(driver, pool name): pools of different drivers are distinct even when their names agree."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pool:
    """One generation of one pool: all its slices cluster-wide, sorted by name, and its
    problem when it is invalid. Equal for every node that uses this generation."""

    driver: str
    name: str
    generation: int
    slices: tuple[types.ResourceSlice, ...]
    problem: PoolProblem | None

    @property
    def key(self) -> PoolKey:
        return (self.driver, self.name)

    def device(self, name: str) -> tuple[types.ResourceSlice, types.Device] | None:
        """The device with this name and its slice, or None. Linear: for one-off lookups."""
        for s in self.slices:
            for d in s.devices:
                if d.name == name:
                    return s, d
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Usable:
    """A pool a node can use: the pool generation, and the slices of it that target the node
    (the others only contribute counter sets and are kept for counter bookkeeping)."""

    pool: Pool
    targeting: tuple[types.ResourceSlice, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """What one node (or the whole cluster) sees: usable pools sorted by (driver, pool), and
    the pools it cannot use, sorted. Obsolete slices appear in neither."""

    usable: tuple[Usable, ...]
    problems: tuple[PoolProblem, ...]


class Pools:
    """All slices grouped by pool, and the pool generations derived from them.

    Invariant: for a given set of slices every method returns equal values, and `pool()`
    returns the same `Pool` object for the same (driver, pool, generation), so callers may
    key their own tables by identity. Not thread-safe (it caches); cheap to build.
    """

    def __init__(self, slices: Sequence[types.ResourceSlice]) -> None:
        self._by_pool: dict[PoolKey, list[types.ResourceSlice]] = {}
        for s in slices:
            self._by_pool.setdefault((s.driver, s.pool.name), []).append(s)
        self._slices = slices
        self._pools: dict[tuple[str, str, int], Pool] = {}

    def keys(self) -> list[PoolKey]:
        """Every pool some slice names, sorted."""
        return sorted(self._by_pool)

    def has(self, key: PoolKey) -> bool:
        """Whether some slice names this pool, at any generation."""
        return key in self._by_pool

    def pool(self, key: PoolKey, generation: int) -> Pool:
        """The pool at one generation, with every slice of it cluster-wide, validated once."""
        found = self._pools.get((key[0], key[1], generation))
        if found is None:
            same = sorted(
                (s for s in self._by_pool.get(key, ()) if s.pool.generation == generation), key=lambda s: s.meta.name
            )
            found = Pool(
                driver=key[0], name=key[1], generation=generation, slices=tuple(same), problem=_validate(key, same)
            )
            self._pools[(key[0], key[1], generation)] = found
        return found

    def view(self, relevant: Iterable[types.ResourceSlice]) -> View:
        """The pools a node sees through `relevant`, the slices relevant to it (see
        `slice_selects`), exactly as upstream gathers them: per pool the highest generation
        among those slices; complete when the node sees `resourceSliceCount` of them;
        otherwise dropped as obsolete when a newer generation exists anywhere, used when that
        generation is complete cluster-wide, else incomplete. Invalid pools are problems."""
        grouped: dict[PoolKey, list[types.ResourceSlice]] = {}
        for s in relevant:
            grouped.setdefault((s.driver, s.pool.name), []).append(s)
        usable: list[Usable] = []
        problems: list[PoolProblem] = []
        for key, found in grouped.items():
            generation = max(s.pool.generation for s in found)
            kept = [s for s in found if s.pool.generation == generation]
            expected = kept[0].pool.resource_slice_count
            if len(kept) != expected:
                everything = self._by_pool[key]
                if any(s.pool.generation > generation for s in everything):
                    continue  # obsolete: a newer generation is being published
                published = sum(1 for s in everything if s.pool.generation == generation)
                if published != expected:
                    detail = f"{published} of {expected} slices of generation {generation} are published"
                    problems.append(PoolProblem(key[0], key[1], ProblemKind.INCOMPLETE, detail))
                    continue
            pool = self.pool(key, generation)
            if pool.problem is not None:
                problems.append(pool.problem)
                continue
            usable.append(Usable(pool=pool, targeting=tuple(kept)))
        usable.sort(key=lambda u: u.pool.key)
        problems.sort(key=lambda p: (p.driver, p.pool, p.kind.value))
        return View(usable=tuple(usable), problems=tuple(problems))

    def current(self) -> View:
        """The cluster-wide view: every pool at its newest generation, as a node that sees
        every slice would. This is what "the pool exists and is usable" means for checks that
        are not about one node (an allocation given in the input, the report's totals)."""
        return self.view(self._slices)


def _validate(key: PoolKey, slices: Sequence[types.ResourceSlice]) -> PoolProblem | None:
    """The first inconsistency of a pool generation: a device name listed twice, a counter
    set defined twice, or a device consuming an unknown counter set or counter."""
    names: set[str] = set()
    sets: dict[str, Mapping[str, object]] = {}

    def invalid(detail: str) -> PoolProblem:
        return PoolProblem(key[0], key[1], ProblemKind.INVALID, detail)

    for s in slices:
        for counter_set in s.shared_counters:
            if counter_set.name in sets:
                return invalid(f"counter set {counter_set.name!r} is defined more than once")
            sets[counter_set.name] = counter_set.counters
    for s in slices:
        for d in s.devices:
            if d.name in names:
                return invalid(f"device {d.name!r} is listed more than once")
            names.add(d.name)
            for consumption in d.consumes_counters:
                counters = sets.get(consumption.counter_set)
                if counters is None:
                    return invalid(
                        f"device {d.name!r} consumes counters of the unknown counter set {consumption.counter_set!r}"
                    )
                for name in consumption.counters:
                    if name not in counters:
                        unknown = f"the unknown counter {name!r} of counter set {consumption.counter_set!r}"
                        return invalid(f"device {d.name!r} consumes {unknown}")
    return None
