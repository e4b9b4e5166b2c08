"""The allocator's view of one snapshot: nodes, pools, devices, counters and capacity as indices.

Part of the allocator (`dractl.alloc`, its only user). Pure: builds plain Python lists and
`array`s from model values once per build of the device tables; no CEL, no search, no I/O.

Which nodes exist, where slices and devices are usable and which pool generations a node can
use come from `model.nodes` (the one implementation the simulation's placement and report
share). Each node gets its visible devices in upstream's first-fit order: pools sorted by
(driver, pool name) with binding-condition pools last, slices by name, devices as listed.

Allocations given in the input are held as they say (the API's state), or, when the caller
asks (`dractl simulate`), checked as the API server and the scheduler would see them: in
order, a claim's allocation holds its devices, counters and capacity only when every device
exists in a usable pool, is not held by an earlier claim (or, shared, has room left), no
counter set is overdrawn, and some node its node selector matches has every device.
Otherwise the claim holds nothing and `rejected` says why, naming the earlier claim.
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from dractl import model
from dractl.model import nodes as model_nodes

NAME_FIELD = model_nodes.NAME_FIELD
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PARTITION_ATTRIBUTES = ("gpu.nvidia.com/partition2", "gpu.nvidia.com/partition4", "gpu.nvidia.com/partition8")

PoolProblem = model_nodes.PoolProblem

CONFLICT = "conflict"
INVALID = "invalid"


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
class Rejection:
    """Why an allocation given in the input holds nothing: `kind` is `CONFLICT` when an
    earlier claim (`other`) holds the device, its capacity or its counters, else `INVALID`
    (the device does not exist, its pool is unusable, or no node can use the allocation).
    `message` names the claim, the field, the device and the other claim."""

    claim: str
    kind: str
    device: str | None
    other: str | None
    message: str


@dataclasses.dataclass(slots=True)
class _Group:
    """One pool generation some node uses, with the indices the allocator gives it."""

    pool: model_nodes.Pool
    binding: bool = False
    devices: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> device index
    counters: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)  # (set, counter) -> id

    @property
    def driver(self) -> str:
        return self.pool.driver

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def slices(self) -> tuple[model.ResourceSlice, ...]:
        return self.pool.slices


_Users = list[tuple[int, tuple[model.ResourceSlice, ...]]]


class Index:
    """Everything about a snapshot that does not change while allocating.

    Invariants: `devices[i].index == i`; device indices ascend in (driver, pool, generation,
    slice name, position) order; counter ids are grouped by counter set, sets ascending.
    """

    def __init__(
        self,
        *,
        slices: Sequence[model.ResourceSlice],
        nodes: Sequence[model.Node],
        allocated: Sequence[model.ResourceClaim],
        check: bool = False,
    ) -> None:
        self.devices: list[DeviceRef] = []
        self.node_names: list[str | None] = []
        self.node_labels: list[Mapping[str, str]] = []
        self._pools = model_nodes.Pools(slices)
        self._init_nodes(slices, nodes)
        self.node_problems: list[tuple[PoolProblem, ...]] = []
        groups = self._gather(slices)
        self._number(groups)
        self._init_counters(groups)
        self._init_capacity()
        self._init_usage(groups, allocated, check=check)
        self._init_groups()

    # --- nodes and pools -------------------------------------------------------------------

    def _init_nodes(self, slices: Sequence[model.ResourceSlice], nodes: Sequence[model.Node]) -> None:
        cluster = model_nodes.discover(nodes=nodes, slices=slices)
        self.node_names.extend(cluster.names)
        self.node_labels.extend(cluster.labels_of(name) for name in cluster.names)
        if not self.node_names:
            # Nothing names a node: one anonymous node sees what is usable everywhere.
            self.node_names.append(None)
            self.node_labels.append({})

    def _gather(self, slices: Sequence[model.ResourceSlice]) -> list[tuple[_Group, _Users]]:
        """Per node, the pools it can use; returns each used group with (node, targeting slices)."""
        local: dict[str, list[model.ResourceSlice]] = {}
        shared: list[model.ResourceSlice] = []
        for s in slices:
            if s.node_name:
                local.setdefault(s.node_name, []).append(s)
            else:
                shared.append(s)
        groups: dict[int, _Group] = {}
        users: dict[int, _Users] = {}
        for node, name in enumerate(self.node_names):
            labels = self.node_labels[node]
            # A slice naming a node is relevant there only; the others are tested per node.
            relevant = [
                *(local.get(name, ()) if name is not None else ()),
                *(s for s in shared if model_nodes.slice_selects(s, name=name, labels=labels)),
            ]
            view = self._pools.view(relevant)
            for usable in view.usable:
                key = id(usable.pool)
                if key not in groups:
                    groups[key] = _Group(
                        usable.pool, binding=any(d.binding_conditions for s in usable.pool.slices for d in s.devices)
                    )
                users.setdefault(key, []).append((node, usable.targeting))
            self.node_problems.append(view.problems)
        ordered = sorted(groups, key=lambda k: (groups[k].driver, groups[k].name, groups[k].pool.generation))
        return [(groups[k], users[k]) for k in ordered]

    def _number(self, groups: list[tuple[_Group, _Users]]) -> None:
        """Give every device of a used group an index; build each node's visible list."""
        visible: list[list[tuple[tuple[bool, str, str], int]]] = [[] for _ in self.node_names]
        self._device_group: list[_Group] = []
        for group, users in groups:
            for s in group.slices:
                for d in s.devices:
                    local = model_nodes.node_local(s, d)
                    selector = None if local else (d.node_selector if s.per_device_node_selection else s.node_selector)
                    index = len(self.devices)
                    group.devices.setdefault(d.name, index)
                    self.devices.append(DeviceRef(index, group.driver, group.name, s, d, local, selector))
                    self._device_group.append(group)
            order = (group.binding, group.driver, group.name)
            for node, kept in users:
                targeting = {id(s) for s in kept}
                name, labels = self.node_names[node], self.node_labels[node]
                for s in group.slices:
                    if id(s) not in targeting or not s.devices:
                        continue
                    for d in s.devices:
                        if s.per_device_node_selection and not model_nodes.device_selects(d, name=name, labels=labels):
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
        self.all_problems = sorted(
            {p for problems in self.node_problems for p in problems}, key=lambda p: (p.driver, p.pool, p.kind.value)
        )

    # --- counters, capacity, usage ---------------------------------------------------------

    def _init_counters(self, groups: list[tuple[_Group, _Users]]) -> None:
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
                        self.counter_names.append((group.driver, group.name, counter_set.name, name))
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
        self.slot_used = array.array("q", bytes(8 * len(values)))

    def _init_usage(
        self, groups: list[tuple[_Group, _Users]], allocated: Sequence[model.ResourceClaim], *, check: bool
    ) -> None:
        """Devices, shares, capacity and counters held by the input's allocated claims, in
        input order. With `check`, a claim whose allocation fails a check holds nothing and is
        recorded in `rejected` (first come, first served, as the scheduler would have decided);
        without, every allocation holds what it names (the API's state is the truth, and an
        over-committed counter set then blocks its consumers, as upstream).
        Admin-access results hold nothing."""
        n = len(self.devices)
        self._in_use = bytearray(n)
        self.shares = array.array("i", bytes(4 * n))
        self._charged = bytearray(n)
        self._holder: dict[int, str] = {}  # dedicated device -> the claim holding it
        self._sharers: dict[int, list[str]] = {}  # shared device -> the claims holding a share
        self._set_holders: dict[int, tuple[str, str]] = {}  # counter set -> first (claim, device) charging it
        self._device_nodes: list[list[int]] | None = None
        self._current: model_nodes.View | None = None
        self._by_name: dict[tuple[str, str, str], list[int]] = {}
        for group, _ in groups:
            for name, index in group.devices.items():
                self._by_name.setdefault((group.driver, group.name, name), []).append(index)
        self.rejected: dict[str, tuple[Rejection, ...]] = {}
        for claim in allocated:
            if claim.allocation is None:
                continue
            if not check:
                self._trust(claim.allocation)
                continue
            problems = self._hold(claim.key, claim.allocation)
            if problems:
                self.rejected[claim.key] = (*self.rejected.get(claim.key, ()), *problems)
        self.in_use = bytes(self._in_use)
        self.multi = bytes(1 if ref.device.allow_multiple_allocations else 0 for ref in self.devices)

    def _trust(self, allocation: model.AllocationResult) -> None:
        """Hold what one allocation names, unchecked: its devices (dedicated, or one more share
        with its consumed capacity), and each device's counters once however many claims hold it."""
        devices, slots = self.takes(allocation)
        for index, shared in devices:
            if shared:
                self.shares[index] += 1
            else:
                self._in_use[index] = 1
            if not self._charged[index]:
                self._charged[index] = 1
                for k in range(self.cons_off[index], self.cons_off[index + 1]):
                    self.cnt_avail[self.cons_id[k]] -= self.cons_amt[k]
        for _, slot, amount in slots:
            self.slot_used[slot] += amount

    def takes(self, allocation: model.AllocationResult) -> tuple[list[tuple[int, bool]], list[tuple[int, int, int]]]:
        """What an allocation holds when trusted: per non-admin result, every index of the
        named device (one per pool generation in use) as a share (a result with a share id on
        a multi-allocatable device) or dedicated, and per share its consumed capacity as
        (device, slot, amount). A device that does not exist holds nothing."""
        devices: list[tuple[int, bool]] = []
        slots: list[tuple[int, int, int]] = []
        for result in allocation.results:
            if result.admin_access:
                continue
            for index in self._by_name.get((result.driver, result.pool, result.device), ()):
                shared = result.share_id is not None and self.devices[index].device.allow_multiple_allocations
                devices.append((index, shared))
                if shared:
                    for name, amount in result.consumed_capacity.items():
                        slot = self.slot_of.get((index, name))
                        if slot is not None:
                            slots.append((index, slot, amount.as_int()))
        return devices, slots

    def identity(self, index: int) -> tuple[str, str, int, str, str]:
        """What names device `index` across rebuilt indices: driver, pool, generation, slice, device."""
        ref = self.devices[index]
        return ref.driver, ref.pool, ref.slice.pool.generation, ref.slice.meta.name, ref.device.name

    def _hold(self, key: str, allocation: model.AllocationResult) -> list[Rejection]:
        """Check one given allocation against what earlier claims hold; when it passes, make
        it hold its devices, shares, capacity and counters. Returns the problems (then
        nothing is held)."""
        problems: list[Rejection] = []
        dedicated: dict[int, int] = {}  # device -> result position
        shared: set[int] = set()
        consumed: dict[int, int] = {}  # capacity slot -> amount this claim adds
        charge: dict[int, int] = {}  # device whose counters this claim charges -> result position
        used: list[Sequence[int]] = []  # per result, the device's indices (one per generation in use)
        for position, result in enumerate(allocation.results):
            field = f"ResourceClaim {key}: status.allocation.devices.results[{position}]"
            path = f"{result.driver}/{result.pool}/{result.device}"
            indices = self._by_name.get((result.driver, result.pool, result.device))
            if not indices:
                problems.append(
                    Rejection(
                        key, INVALID, path, None, f"{field}: {self._missing(result.driver, result.pool, result.device)}"
                    )
                )
                continue
            used.append(indices)
            if result.admin_access:
                continue
            for index in indices:
                problem = self._take(
                    index,
                    key=key,
                    result=result,
                    field=field,
                    path=path,
                    position=position,
                    dedicated=dedicated,
                    shared=shared,
                    consumed=consumed,
                )
                if problem is not None:
                    problems.append(problem)
                    break
                if not self._charged[index] and index not in charge:
                    charge[index] = position
        if not problems:
            problems.extend(self._check_counters(key, allocation, charge))
        if not problems and used and not self._usable_together(used, allocation.node_selector):
            names = ", ".join(self.devices[indices[0]].path for indices in used)
            problems.append(
                Rejection(
                    key,
                    INVALID,
                    None,
                    None,
                    f"ResourceClaim {key}: status.allocation.nodeSelector: no known node matches it and can use "
                    f"every allocated device ({names})",
                )
            )
        if problems:
            return problems
        for index in dedicated:
            self._in_use[index] = 1
            self._holder[index] = key
        for index in shared:
            self._sharers.setdefault(index, []).append(key)
        for result in allocation.results:
            if result.admin_access or result.share_id is None:
                continue
            for index in self._by_name[(result.driver, result.pool, result.device)]:
                if self.devices[index].device.allow_multiple_allocations:
                    self.shares[index] += 1
        for slot, amount in consumed.items():
            self.slot_used[slot] += amount
        for index in charge:
            self._charged[index] = 1
            for k in range(self.cons_off[index], self.cons_off[index + 1]):
                self.cnt_avail[self.cons_id[k]] -= self.cons_amt[k]
                self._set_holders.setdefault(self.cnt_set[self.cons_id[k]], (key, self.devices[index].path))
        return []

    def _take(
        self,
        index: int,
        *,
        key: str,
        result: model.DeviceRequestAllocationResult,
        field: str,
        path: str,
        position: int,
        dedicated: dict[int, int],
        shared: set[int],
        consumed: dict[int, int],
    ) -> Rejection | None:
        """Whether one result may hold device `index` given earlier claims and this claim's
        earlier results; records the holding in the claim's tentative tables."""
        device = self.devices[index].device
        holder = self._holder.get(index)
        if index in dedicated or (index in shared and result.share_id is None):
            return Rejection(
                key,
                INVALID,
                path,
                None,
                f"{field}: device {path} is already allocated by results[{dedicated.get(index, position)}] "
                "of the same claim",
            )
        if holder is not None:
            return Rejection(
                key,
                CONFLICT,
                path,
                holder,
                f"{field}: device {path} is already allocated to ResourceClaim {holder}, "
                "which comes first in the input",
            )
        sharers = self._sharers.get(index, [])
        if result.share_id is None or not device.allow_multiple_allocations:
            if sharers:
                return Rejection(
                    key,
                    CONFLICT,
                    path,
                    sharers[0],
                    f"{field}: device {path} is already shared by ResourceClaim {sharers[0]}, "
                    "which comes first in the input",
                )
            if index in shared:
                return Rejection(
                    key,
                    INVALID,
                    path,
                    None,
                    f"{field}: device {path} is also shared by another result of the same claim",
                )
            dedicated[index] = position
            return None
        for name, amount in result.consumed_capacity.items():
            slot = self.slot_of.get((index, name))
            if slot is None:
                return Rejection(
                    key,
                    INVALID,
                    path,
                    None,
                    f"{field}: consumedCapacity names {name}, which device {path} does not have",
                )
            before = self.slot_used[slot] + consumed.get(slot, 0)
            total = self.slot_value[slot]
            if before + amount.as_int() > total:
                text = (
                    f"{field}: device {path}: capacity {name} would be overdrawn: {amount} more "
                    f"with {_amount(before)} of {_amount(total)} already consumed"
                )
                if sharers:
                    return Rejection(
                        key, CONFLICT, path, sharers[0], f"{text}, by ResourceClaim {sharers[0]} first in the input"
                    )
                # Overdrawn by the claim's own shares: kept as the API holds it, like a counter
                # set (see `_check_counters`); the device then has no room for later shares.
            consumed[slot] = consumed.get(slot, 0) + amount.as_int()
        shared.add(index)
        return None

    def _check_counters(
        self, key: str, allocation: model.AllocationResult, charge: Mapping[int, int]
    ) -> list[Rejection]:
        """Counter sets the claim's devices would overdraw, each once, naming the earlier
        claim that charges the same set."""
        need: dict[int, int] = {}
        first: dict[int, int] = {}  # counter -> the device that first needs it
        for index in charge:
            for k in range(self.cons_off[index], self.cons_off[index + 1]):
                cid = self.cons_id[k]
                need[cid] = need.get(cid, 0) + self.cons_amt[k]
                first.setdefault(cid, index)
        problems: list[Rejection] = []
        reported: set[int] = set()
        for cid, amount in need.items():
            available = self.cnt_avail[cid]
            sid = self.cnt_set[cid]
            if available >= amount or sid in reported:
                continue
            reported.add(sid)
            ref = self.devices[first[cid]]
            driver, pool, set_name, counter = self.counter_names[cid]
            text = (
                f"ResourceClaim {key}: status.allocation.devices.results[{charge[first[cid]]}]: device {ref.path}: "
                f"counter {counter} of counter set {set_name} in pool {driver}/{pool} would be overdrawn: "
                f"{_amount(amount)} needed, {_amount(available)} of {_amount(self.cnt_total[cid])} left"
            )
            holder = self._set_holders.get(sid)
            if holder is not None:
                problems.append(
                    Rejection(
                        key,
                        CONFLICT,
                        ref.path,
                        holder[0],
                        f"{text}: ResourceClaim {holder[0]}, first in the input, holds device {holder[1]} "
                        "of that counter set",
                    )
                )
            # A set that the claim's own devices overdraw, with no earlier claim in it, is kept
            # as the API holds it (a driver may have shrunk the set after allocation), exactly
            # as upstream keeps it: the set stays over-committed and blocks its later consumers.
        return problems

    def _usable_together(self, devices: Sequence[Sequence[int]], selector: model.NodeSelector | None) -> bool:
        """Whether some known node that `selector` matches (None: every node) can use every
        one of these devices (each given by its indices: a device whose pool two nodes see at
        different generations has one per generation)."""
        if self._device_nodes is None:
            self._device_nodes = [[] for _ in self.devices]
            for node in range(len(self.node_names)):
                for k in range(self.node_off[node], self.node_off[node + 1]):
                    self._device_nodes[self.node_dev[k]].append(node)
        table = self._device_nodes
        common: set[int] | None = None
        for indices in devices:
            nodes = {node for index in indices for node in table[index]}
            common = nodes if common is None else common & nodes
        if not common:
            return False
        if selector is None:
            return bool(common)
        for node in sorted(common):
            name = self.node_names[node]
            if name is not None and model_nodes.selector_matches(selector, name=name, labels=self.node_labels[node]):
                return True
        return False

    def _missing(self, driver: str, pool: str, device: str) -> str:
        """Why no usable device has this name: no such pool, an unusable pool, no such
        device in it, or a device no known node can use."""
        path = f"{driver}/{pool}/{device}"
        if self._current is None:
            self._current = self._pools.current()
        if not self._pools.has((driver, pool)):
            return f"device {path} does not exist: no ResourceSlice publishes resource pool {driver}/{pool}"
        for problem in self._current.problems:
            if (problem.driver, problem.pool) == (driver, pool):
                return f"device {path} cannot be used: {problem.message()}"
        for usable in self._current.usable:
            if usable.pool.key == (driver, pool):
                if usable.pool.device(device) is None:
                    where = f"resource pool {driver}/{pool} generation {usable.pool.generation}"
                    return f"device {path} does not exist: {where} has no such device"
                return f"device {path} is not usable on any known node"
        return f"device {path} does not exist"

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
        return sorted(found, key=lambda p: (p.driver, p.pool, p.kind.value))


def lookup_attribute(ref: DeviceRef, qualified: str) -> model.DeviceAttribute | None:
    """A fully-qualified attribute; a bare id stands for the driver's own domain."""
    attribute = ref.device.attributes.get(qualified)
    if attribute is None:
        domain, _, identifier = qualified.rpartition("/")
        if domain == ref.driver:
            attribute = ref.device.attributes.get(identifier)
    return attribute


_amount = model.quantity.format_bytes
"""An amount in the largest binary unit that divides it ("40Gi"), for messages."""
