"""The allocator's view of one snapshot: nodes, pools, devices, counters and capacity as indices.

Part of the allocation facade (`dractl.alloc` is its only user). Pure: builds plain Python
lists and `array`s from model values once per `Allocator`; no CEL, no search, no I/O.

Pools are gathered per node exactly as upstream does (highest generation among the slices
relevant to the node; complete when the slice count matches, else obsolete when a newer
generation exists anywhere, else complete only when all slices of that generation exist), and
each node gets its visible devices in upstream's first-fit order: pools sorted by (driver,
pool name) with binding-condition pools last, slices by name, devices as listed.
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from dractl import model

NAME_FIELD = "metadata.name"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PARTITION_ATTRIBUTES = ("gpu.nvidia.com/partition2", "gpu.nvidia.com/partition4", "gpu.nvidia.com/partition8")


@dataclasses.dataclass(slots=True)
class DeviceRef:
    """One device of a usable pool generation, with what results and reasons need."""

    index: int
    driver: str
    pool: str
    slice: model.ResourceSlice
    device: model.Device
    node_local: bool  # usable on one node only (nodeName on the slice or the device, or bindsToNode)
    node_selector: model.NodeSelector | None  # where usable, when not node-local (None: everywhere)

    @property
    def path(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class PoolProblem:
    """A pool a node cannot use: `kind` is "invalid" or "incomplete"."""

    driver: str
    pool: str
    kind: str
    detail: str

    def message(self) -> str:
        if self.kind == "invalid":
            return f"resource pool {self.driver}/{self.pool} is invalid: {self.detail}"
        return f"resource pool {self.driver}/{self.pool} is currently being updated: {self.detail}"


@dataclasses.dataclass(slots=True)
class _Group:
    """All slices of one pool at one generation."""

    driver: str
    pool: str
    generation: int
    slices: list[model.ResourceSlice]
    problem: PoolProblem | None = None
    binding: bool = False
    devices: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> device index
    counters: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)  # (set, counter) -> id


def node_selector_matches(selector: model.NodeSelector, name: str, labels: Mapping[str, str]) -> bool:
    """Terms are ORed, requirements ANDed; `metadata.name` is the only field."""
    return any(_term_matches(term, name, labels) for term in selector.terms)


def _term_matches(term: model.NodeSelectorTerm, name: str, labels: Mapping[str, str]) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    for requirement in term.match_expressions:
        if not _requirement_matches(requirement, labels.get(requirement.key)):
            return False
    for requirement in term.match_fields:
        if not _requirement_matches(requirement, name if requirement.key == NAME_FIELD else None):
            return False
    return True


def _requirement_matches(requirement: model.NodeSelectorRequirement, value: str | None) -> bool:
    operator = requirement.operator
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(requirement.values) == 1:
        try:
            have, want = int(value), int(requirement.values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


class Index:
    """Everything about a snapshot that does not change while allocating.

    Invariants: `devices[i].index == i`; device indices ascend in (driver, pool, generation,
    slice name, position) order; counter ids are grouped by counter set, sets ascending.
    """

    def __init__(self, *, slices: Sequence[model.ResourceSlice], nodes: Sequence[model.Node], allocated: Sequence[model.ResourceClaim]) -> None:
        self.devices: list[DeviceRef] = []
        self.node_names: list[str | None] = []
        self.node_labels: list[Mapping[str, str]] = []
        self._init_nodes(slices, nodes)
        self.node_problems: list[list[PoolProblem]] = []
        groups = self._gather(slices)
        self._number(groups)
        self._init_counters(groups)
        self._init_capacity()
        self._init_usage(groups, allocated)
        self._init_groups()

    # --- nodes and pools -------------------------------------------------------------------

    def _init_nodes(self, slices: Sequence[model.ResourceSlice], nodes: Sequence[model.Node]) -> None:
        if nodes:
            for node in sorted(nodes, key=lambda n: n.meta.name):
                self.node_names.append(node.meta.name)
                self.node_labels.append(node.meta.labels)
            return
        names = {s.node_name for s in slices if s.node_name}
        names.update(d.node_name for s in slices for d in s.devices if d.node_name)
        self.node_names.extend(sorted(n for n in names if n))
        self.node_labels.extend({} for _ in self.node_names)
        if not self.node_names:
            # Nothing names a node: one anonymous node sees what is usable everywhere.
            self.node_names.append(None)
            self.node_labels.append({})

    def _selects(self, node: int, *, node_name: str | None, all_nodes: bool, node_selector: model.NodeSelector | None) -> bool | None:
        """Whether one node-selection choice (nodeName, allNodes or nodeSelector, as on a
        slice or a device) takes `node`; None when none of them is set."""
        name = self.node_names[node]
        if node_name:
            return node_name == name
        if all_nodes:
            return True
        if node_selector is not None:
            return name is not None and node_selector_matches(node_selector, name, self.node_labels[node])
        return None

    def _slice_relevant(self, s: model.ResourceSlice, node: int) -> bool:
        selected = self._selects(node, node_name=s.node_name, all_nodes=s.all_nodes, node_selector=s.node_selector)
        if selected is not None:
            return selected
        return s.per_device_node_selection and any(self._device_relevant(d, node) for d in s.devices)

    def _device_relevant(self, d: model.Device, node: int) -> bool:
        return self._selects(node, node_name=d.node_name, all_nodes=d.all_nodes, node_selector=d.node_selector) is True

    def _gather(self, slices: Sequence[model.ResourceSlice]) -> list[tuple[_Group, list[tuple[int, list[model.ResourceSlice]]]]]:
        """Per node, the pools it can use; returns each used group with (node, targeting slices)."""
        by_pool: dict[tuple[str, str], list[model.ResourceSlice]] = {}
        local: dict[str, list[model.ResourceSlice]] = {}
        shared: list[model.ResourceSlice] = []
        for s in slices:
            by_pool.setdefault((s.driver, s.pool.name), []).append(s)
            if s.node_name:
                local.setdefault(s.node_name, []).append(s)
            else:
                shared.append(s)
        groups: dict[tuple[str, str, int], _Group] = {}
        users: dict[tuple[str, str, int], list[tuple[int, list[model.ResourceSlice]]]] = {}
        for node, name in enumerate(self.node_names):
            relevant: dict[tuple[str, str], list[model.ResourceSlice]] = {}
            for s in local.get(name, ()) if name is not None else ():
                relevant.setdefault((s.driver, s.pool.name), []).append(s)
            for s in shared:
                if self._slice_relevant(s, node):
                    relevant.setdefault((s.driver, s.pool.name), []).append(s)
            problems: list[PoolProblem] = []
            for key, found in relevant.items():
                generation = max(s.pool.generation for s in found)
                kept = [s for s in found if s.pool.generation == generation]
                everything = by_pool[key]
                if len(kept) != kept[0].pool.resource_slice_count:
                    if any(s.pool.generation > generation for s in everything):
                        continue  # obsolete: a newer generation exists elsewhere
                    same = [s for s in everything if s.pool.generation == generation]
                    if len(same) != kept[0].pool.resource_slice_count:
                        problems.append(PoolProblem(key[0], key[1], "incomplete", f"{len(same)} of {kept[0].pool.resource_slice_count} slices of generation {generation} are published"))
                        continue
                gkey = (key[0], key[1], generation)
                group = groups.get(gkey)
                if group is None:
                    group = groups[gkey] = _Group(key[0], key[1], generation, sorted((s for s in everything if s.pool.generation == generation), key=lambda s: s.meta.name))
                    group.problem = _validate(group)
                    group.binding = any(d.binding_conditions for s in group.slices for d in s.devices)
                if group.problem is not None:
                    problems.append(group.problem)
                    continue
                users.setdefault(gkey, []).append((node, kept))
            self.node_problems.append(problems)
        return [(groups[k], users[k]) for k in sorted(users)]

    def _number(self, groups: list[tuple[_Group, list[tuple[int, list[model.ResourceSlice]]]]]) -> None:
        """Give every device of a used group an index; build each node's visible list."""
        visible: list[list[tuple[tuple[bool, str, str], int]]] = [[] for _ in self.node_names]
        self._device_group: list[_Group] = []
        for group, users in groups:
            for s in group.slices:
                for d in s.devices:
                    local = bool(s.node_name) or bool(d.node_name) or d.binds_to_node
                    selector = None if local else (d.node_selector if s.per_device_node_selection else s.node_selector)
                    index = len(self.devices)
                    group.devices.setdefault(d.name, index)
                    self.devices.append(DeviceRef(index, group.driver, group.pool, s, d, local, selector))
                    self._device_group.append(group)
            order = (group.binding, group.driver, group.pool)
            for node, kept in users:
                targeting = {id(s) for s in kept}
                for s in group.slices:
                    if id(s) not in targeting or not s.devices:
                        continue
                    for d in s.devices:
                        if s.per_device_node_selection and not self._device_relevant(d, node):
                            continue
                        visible[node].append((order, group.devices[d.name]))
        self.node_off = array.array("i", [0])
        self.node_dev = array.array("i")
        for entries in visible:
            # Stable sort: devices keep slice and listing order inside a pool.
            entries.sort(key=lambda e: e[0])
            self.node_dev.extend(index for _, index in entries)
            self.node_off.append(len(self.node_dev))
        self.node_bad = bytes(1 if problems else 0 for problems in self.node_problems)
        self.all_problems = sorted({p for problems in self.node_problems for p in problems}, key=lambda p: (p.driver, p.pool, p.kind))

    # --- counters, capacity, usage ---------------------------------------------------------

    def _init_counters(self, groups: list[tuple[_Group, list[tuple[int, list[model.ResourceSlice]]]]]) -> None:
        self.counter_names: list[tuple[str, str, str, str]] = []  # (driver, pool, set, counter)
        total: list[int] = []
        cnt_set: list[int] = []
        set_devices: list[list[int]] = []
        set_ids: dict[tuple[int, str], int] = {}
        for gi, (group, _) in enumerate(groups):
            for s in group.slices:
                for counter_set in s.shared_counters:
                    sid = set_ids[(gi, counter_set.name)] = len(set_devices)
                    set_devices.append([])
                    for name, value in counter_set.counters.items():
                        group.counters[(counter_set.name, name)] = len(total)
                        self.counter_names.append((group.driver, group.pool, counter_set.name, name))
                        total.append(value.as_int())
                        cnt_set.append(sid)
        cons_off, cons_id, cons_amt, chk_off, chk_id = [0], [], [], [0], []
        group_of = {id(g): gi for gi, (g, _) in enumerate(groups)}
        for ref in self.devices:
            group = self._device_group[ref.index]
            gi = group_of[id(group)]
            for consumption in ref.device.consumes_counters:
                sid = set_ids[(gi, consumption.counter_set)]
                set_devices[sid].append(ref.index)
                for name, amount in consumption.counters.items():
                    cons_id.append(group.counters[(consumption.counter_set, name)])
                    cons_amt.append(amount.as_int())
                for (set_name, _), cid in group.counters.items():
                    if set_name == consumption.counter_set:
                        chk_id.append(cid)
            cons_off.append(len(cons_id))
            chk_off.append(len(chk_id))
        self.cons_off = array.array("i", cons_off)
        self.cons_id = array.array("i", cons_id)
        self.cons_amt = array.array("q", cons_amt)
        self.chk_off = array.array("i", chk_off)
        self.chk_id = array.array("i", chk_id)
        self.cnt_total = array.array("q", total)
        self.cnt_avail = array.array("q", total)
        self.cnt_set = array.array("i", cnt_set)
        self.set_off = array.array("i", [0])
        self.set_dev = array.array("i")
        for members in set_devices:
            self.set_dev.extend(members)
            self.set_off.append(len(self.set_dev))

    def _init_capacity(self) -> None:
        self.slot_of: dict[tuple[int, str], int] = {}
        self.slot_names: list[tuple[int, str]] = []
        values: list[int] = []
        for ref in self.devices:
            for name, capacity in ref.device.capacity.items():
                self.slot_of[(ref.index, name)] = len(values)
                self.slot_names.append((ref.index, name))
                values.append(capacity.value.as_int())
        self.slot_value = array.array("q", values)
        self.attribute_names = sorted({k for ref in self.devices for k in ref.device.attributes})
        self.capacity_names = sorted({k for ref in self.devices for k in ref.device.capacity})
        self.slot_used = array.array("q", bytes(8 * len(values)))

    def _init_usage(self, groups: list[tuple[_Group, list[tuple[int, list[model.ResourceSlice]]]]], allocated: Sequence[model.ResourceClaim]) -> None:
        """Devices, shares, capacity and counters held by the input's allocated claims.
        Admin-access results hold nothing."""
        n = len(self.devices)
        in_use = bytearray(n)
        self.shares = array.array("i", bytes(4 * n))
        charged = bytearray(n)
        by_name: dict[tuple[str, str, str], list[int]] = {}
        for group, _ in groups:
            for name, index in group.devices.items():
                by_name.setdefault((group.driver, group.pool, name), []).append(index)
        for claim in allocated:
            if claim.allocation is None:
                continue
            for result in claim.allocation.results:
                if result.admin_access:
                    continue
                for index in by_name.get((result.driver, result.pool, result.device), ()):
                    device = self.devices[index].device
                    if result.share_id is not None and device.allow_multiple_allocations:
                        self.shares[index] += 1
                        for name, amount in result.consumed_capacity.items():
                            slot = self.slot_of.get((index, name))
                            if slot is not None:
                                self.slot_used[slot] += amount.as_int()
                    else:
                        in_use[index] = 1
                    if not charged[index]:
                        charged[index] = 1
                        for k in range(self.cons_off[index], self.cons_off[index + 1]):
                            self.cnt_avail[self.cons_id[k]] -= self.cons_amt[k]
        self.in_use = bytes(in_use)
        self.multi = bytes(1 if ref.device.allow_multiple_allocations else 0 for ref in self.devices)

    def _init_groups(self) -> None:
        """Locality groups for the binpack policy: the PCIe root, else the smallest NVLink
        partition attribute, per pool."""
        ids: dict[tuple[str, str, str, str], int] = {}
        groups = []
        for ref in self.devices:
            key = None
            for name in (PCIE_ROOT, *PARTITION_ATTRIBUTES):
                attribute = lookup_attribute(ref, name)
                if attribute is not None and not attribute.is_list:
                    key = (ref.driver, ref.pool, name, str(attribute.scalar))
                    break
            groups.append(-1 if key is None else ids.setdefault(key, len(ids)))
        self.dev_group = array.array("i", groups)
        self.n_groups = len(ids)

    def problems(self, nodes: Iterable[int] | None) -> list[PoolProblem]:
        """The invalid and incomplete pools relevant to these nodes (None: every node),
        each once, sorted."""
        if nodes is None:
            return self.all_problems
        found = {p for node in nodes for p in self.node_problems[node]}
        return sorted(found, key=lambda p: (p.driver, p.pool, p.kind))


def lookup_attribute(ref: DeviceRef, qualified: str) -> model.DeviceAttribute | None:
    """A fully-qualified attribute; a bare id stands for the driver's own domain."""
    attribute = ref.device.attributes.get(qualified)
    if attribute is None:
        domain, _, identifier = qualified.rpartition("/")
        if domain == ref.driver:
            attribute = ref.device.attributes.get(identifier)
    return attribute


def _validate(group: _Group) -> PoolProblem | None:
    names: set[str] = set()
    sets: dict[str, Mapping[str, model.quantity.Quantity]] = {}
    for s in group.slices:
        for counter_set in s.shared_counters:
            if counter_set.name in sets:
                return PoolProblem(group.driver, group.pool, "invalid", f"counter set {counter_set.name!r} is defined more than once")
            sets[counter_set.name] = counter_set.counters
    for s in group.slices:
        for d in s.devices:
            if d.name in names:
                return PoolProblem(group.driver, group.pool, "invalid", f"device {d.name!r} is listed more than once")
            names.add(d.name)
            for consumption in d.consumes_counters:
                counters = sets.get(consumption.counter_set)
                if counters is None:
                    return PoolProblem(group.driver, group.pool, "invalid", f"device {d.name!r} consumes counters of the unknown counter set {consumption.counter_set!r}")
                for name in consumption.counters:
                    if name not in counters:
                        return PoolProblem(group.driver, group.pool, "invalid", f"device {d.name!r} consumes the unknown counter {name!r} of counter set {consumption.counter_set!r}")
    return None
