"""Placement-quality metrics a person reads: GPUs in use, memory, stranded memory, MIG fragmentation.

What it does: turns model values (the ResourceSlices and the claims with their
`status.allocation`) into a per-GPU inventory (`inventory`), per-node and cluster metrics
(`measure`), and renders them as JSON-able dicts (`as_dict`) and rich tables (`node_table`,
and `compare_table` for two or more metric sets side by side, as `--compare first-fit,binpack`
shows them). The time-series metrics the trace replay feeds (admitted before the first
rejection, rejections, time-weighted utilisation) are accumulated by `Series`, the only
mutable object here.

What it must not do: allocate, evaluate CEL, read files or talk to a cluster. Every function
is pure: the same values give equal results.

How a GPU is identified. Only usable pools count (the newest complete generation of each pool,
as `model.nodes.Pools(...).current()` sees them). A GPU is a device whose `type` attribute
(bare, or `<driver>/type`) is `gpu`: its full-GPU device. A device whose `type` is `mig` belongs
to the GPU of the same driver and pool whose `uuid` attribute equals the MIG device's
`parentUUID`; when no GPU has that uuid (or the MIG device has no `parentUUID`), to the GPU
whose full-GPU device consumes the first counter set the MIG device consumes. Under static MIG
the driver publishes no full-GPU device for a GPU in MIG mode: MIG devices that match no GPU are
grouped by `parentUUID` into one GPU, named by their device names' prefix (`gpu-3` for
`gpu-3-mig-...`), whose memory is the sum of theirs. Devices of any other type are ignored.

MIG placements. A MIG device's placement is read from the memory slices it consumes: the
counters named `memory-slice-<n>` of its counter set (as the NVIDIA driver publishes them with
DynamicMIG), or else its `memorySlice<n>` capacities (static MIG). Its start is the lowest `n`,
its size the number of such slices; the GPU has as many memory slices as its counter set has
`memory-slice-<n>` counters (8 on an A100), or under static MIG up to the highest slice used.

Placeable. A device is placeable when it is not allocated and every counter it consumes is
still available: the counter set's value minus what the allocated devices of the same driver
and pool consume (admin-access results consume nothing, as in the allocator).

States. A GPU is `full` when its full-GPU device is allocated, `partitioned` when at least one of
its MIG devices is allocated (and its full-GPU device is not), else `free`. Memory allocated:
a full GPU counts its `memory` capacity, a partitioned GPU the `memory` capacities of its
allocated MIG devices.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dractl import model
from dractl.model import nodes as model_nodes

if TYPE_CHECKING:
    import rich.table

CLUSTER = "(cluster)"
CLUSTER_WIDE = "(cluster-wide)"

_MEMORY_SLICE = re.compile(r"^memory-slice-([0-9]+)$")
_STATIC_SLICE = re.compile(r"^(?:[^/]+/)?memorySlice([0-9]+)$")
_GIB = 2**30


class State(enum.Enum):
    """What a GPU is doing; the value is how outputs spell it."""

    FULL = "full"
    PARTITIONED = "partitioned"
    FREE = "free"


@dataclasses.dataclass(frozen=True, slots=True)
class RequestShape:
    """What a pending request asks for, as far as placement quality goes.

    `kind` is the device type (`gpu` or `mig`), `profile` a MIG profile name (None: any), and
    `min_memory` the least `memory` capacity in bytes (0: any). Spelled in a spec string as
    `kind[:profile][@memory]`: `mig:1g.10gb`, `gpu@40Gi`, `mig@20Gi` (see `parse_shape`).
    """

    kind: str
    profile: str | None = None
    min_memory: int = 0

    def __str__(self) -> str:
        text = self.kind + (f":{self.profile}" if self.profile else "")
        return text + (f"@{model.quantity.format_bytes(self.min_memory)}" if self.min_memory else "")


def parse_shape(text: str) -> RequestShape:
    """`mig:1g.10gb`, `gpu@40Gi` ... -> RequestShape; raises ValueError with one clear message. Pure."""
    spec, _, memory = text.strip().partition("@")
    kind, _, profile = spec.partition(":")
    if kind not in ("gpu", "mig"):
        raise ValueError(f"request shape {text!r}: kind must be gpu or mig (as in mig:1g.10gb or gpu@40Gi)")
    if profile and kind != "mig":
        raise ValueError(f"request shape {text!r}: only a mig shape names a profile")
    floor = 0
    if memory:
        try:
            floor = model.quantity.parse(memory).as_int()
        except model.quantity.QuantityError:
            raise ValueError(f"request shape {text!r}: memory {memory!r} is not a quantity (as in 40Gi)") from None
    return RequestShape(kind=kind, profile=profile or None, min_memory=floor)


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """One MIG device of a GPU: its profile, memory slices `start` .. `start + size - 1`,
    memory in bytes, and the claims (`namespace/name`) holding it (empty: not allocated)."""

    device: str
    profile: str
    start: int
    size: int
    memory: int
    holders: tuple[str, ...] = ()
    placeable: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: its full-GPU device, its MIG devices (every published placement),
    and what the allocations make of it. `slices` is its number of memory slices (0 when its
    MIG devices publish none). `attributes` keeps the NVLink attributes (`gpuModuleID`,
    `partition8/4/2/1`) and `productName` as text, for the map. `stranded` is filled by
    `measure` (it depends on the pending shapes); `largest` is the largest placeable MIG
    device (most memory, then most multiprocessors, then lowest start), None when nothing is."""

    node: str
    driver: str
    pool: str
    device: str
    uuid: str
    product: str
    memory: int
    holders: tuple[str, ...]
    placements: tuple[Placement, ...]
    slices: int
    state: State
    allocated_memory: int
    largest: Placement | None
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stranded: int = 0

    @property
    def key(self) -> str:
        """`node/device`: how the map and the tables name a GPU."""
        return f"{self.node}/{self.device}"

    @property
    def free_memory(self) -> int:
        return max(self.memory - self.allocated_memory, 0)


def _attribute(device: model.Device, driver: str, name: str) -> model.DeviceAttribute | None:
    return device.attributes.get(name) or device.attributes.get(f"{driver}/{name}")


def _text(device: model.Device, driver: str, name: str) -> str:
    return _as_text(_attribute(device, driver, name))


def _as_text(found: model.DeviceAttribute | None) -> str:
    return "" if found is None or found.is_list else str(found.texts[0] if found.texts else found.scalar)


def _device_type(device: model.Device, driver: str) -> str:
    """The device's `type` attribute (bare or `<driver>/type`): `gpu`, `mig`, or another or no type ("")."""
    return _text(device, driver, "type")


def _memory(device: model.Device, driver: str) -> int:
    found = device.capacity.get("memory") or device.capacity.get(f"{driver}/memory")
    return 0 if found is None else found.value.as_int()


_NVLINK = ("gpuModuleID", "partition8", "partition4", "partition2", "partition1")


def holders_by_device(claims: Iterable[model.ResourceClaim]) -> dict[tuple[str, str, str], tuple[str, ...]]:
    """(driver, pool, device) -> the keys (`namespace/name`) of the claims allocated that device,
    in claim order; admin-access results are left out, as they hold nothing. Pure."""
    held: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
    for claim in claims:
        if claim.allocation is None:
            continue
        key = claim.key
        for result in claim.allocation.results:
            if result.admin_access:
                continue
            names = held[(result.driver, result.pool, result.device)]
            if key not in names:
                names.append(key)
    return {device: tuple(names) for device, names in held.items()}


def inventory(
    slices: Sequence[model.ResourceSlice],
    claims: Iterable[model.ResourceClaim],
    *,
    view: model_nodes.View | None = None,
) -> tuple[Gpu, ...]:
    """Every GPU of the usable pools, sorted by node, driver, pool and device order in the pool.
    `view` is the slices' `Pools(...).current()` when the caller has it already.

    Pure. See the module docstring for how GPUs, their MIG devices and placements are found.
    """
    held = holders_by_device(claims)
    amounts = _Amounts()
    gpus: list[Gpu] = []
    for usable in (view or model_nodes.Pools(slices).current()).usable:
        gpus.extend(_pool_gpus(usable.pool, held, amounts))
    return tuple(sorted(gpus, key=lambda g: (g.node, g.driver, g.pool)))


class _Amounts:
    """Counter values as integers, computed once per counter mapping: the slices of nodes made
    from one template share their mappings, so a 1,000-node cluster converts a few hundred. The
    same goes for a MIG device's memory slices and for whether a consumption fits an unused
    counter set."""

    __slots__ = ("_capacity", "_fits", "_indexes", "_seen")

    def __init__(self) -> None:
        # Keyed by identity: the mappings are alive for the whole call that owns this cache.
        self._seen: dict[int, tuple[Mapping[str, model.quantity.Quantity], tuple[tuple[str, int], ...]]] = {}
        self._indexes: dict[int, tuple[object, tuple[int, ...]]] = {}
        self._fits: dict[tuple[int, int], tuple[object, object, bool]] = {}
        self._capacity: dict[tuple[int, str], tuple[object, int]] = {}

    def capacity(self, device: model.Device, driver: str, name: str) -> int:
        """A capacity of the device as an integer (0 when it has none), bare or `<driver>/name`."""
        key = (id(device.capacity), name)
        found = self._capacity.get(key)
        if found is None or found[0] is not device.capacity:
            entry = device.capacity.get(name) or device.capacity.get(f"{driver}/{name}")
            found = (device.capacity, 0 if entry is None else entry.value.as_int())
            self._capacity[key] = found
        return found[1]

    def indexes(self, device: model.Device) -> tuple[int, ...]:
        """The memory slices the MIG device covers, ascending (see `_placement`)."""
        source: object = device.consumes_counters[0].counters if device.consumes_counters else device.capacity
        found = self._indexes.get(id(source))
        if found is None or found[0] is not source:
            found = (source, _slice_indexes(device))
            self._indexes[id(source)] = found
        return found[1]

    def fits(self, need: Mapping[str, model.quantity.Quantity], have: Mapping[str, model.quantity.Quantity]) -> bool:
        """Whether consuming `need` from a counter set of values `have`, with nothing consumed yet, fits."""
        key = (id(need), id(have))
        found = self._fits.get(key)
        if found is None or found[0] is not need or found[1] is not have:
            totals = dict(self.of(have))
            ok = all(name in totals and amount <= totals[name] for name, amount in self.of(need))
            found = (need, have, ok)
            self._fits[key] = found
        return found[2]

    def of(self, counters: Mapping[str, model.quantity.Quantity]) -> tuple[tuple[str, int], ...]:
        found = self._seen.get(id(counters))
        if found is None or found[0] is not counters:
            found = (counters, tuple((name, value.as_int()) for name, value in counters.items()))
            self._seen[id(counters)] = found
        return found[1]


def _pool_gpus(
    pool: model_nodes.Pool, held: Mapping[tuple[str, str, str], tuple[str, ...]], amounts: _Amounts
) -> list[Gpu]:
    driver = pool.driver
    totals: dict[tuple[str, str], int] = {}
    sets: dict[str, Mapping[str, model.quantity.Quantity]] = {}
    for s in pool.slices:
        for counter_set in s.shared_counters:
            sets[counter_set.name] = counter_set.counters
            for counter, value in amounts.of(counter_set.counters):
                totals[(counter_set.name, counter)] = value
    devices = [(s, d, _device_type(d, driver)) for s in pool.slices for d in s.devices]

    def is_held(device: model.Device) -> bool:
        return bool(held.get((driver, pool.name, device.name)))

    consumed: dict[tuple[str, str], int] = collections.defaultdict(int)
    for _, device, _ in devices:
        if is_held(device):
            for use in device.consumes_counters:
                for counter, amount in amounts.of(use.counters):
                    consumed[(use.counter_set, counter)] += amount

    used_sets = {name for name, _ in consumed}

    def placeable(device: model.Device) -> bool:
        if is_held(device):
            return False
        for use in device.consumes_counters:
            if use.counter_set not in used_sets:
                # Nothing consumes this set yet: the answer depends on the two mappings only.
                have = sets.get(use.counter_set)
                if have is None or not amounts.fits(use.counters, have):
                    return False
                continue
            for counter, amount in amounts.of(use.counters):
                total = totals.get((use.counter_set, counter))
                if total is None or consumed[(use.counter_set, counter)] + amount > total:
                    return False
        return True

    full = [(s, d, _text(d, driver, "uuid")) for s, d, kind in devices if kind == "gpu"]
    by_uuid = {uuid: d.name for _, d, uuid in full if uuid}
    by_set = {d.consumes_counters[0].counter_set: d.name for _, d, _ in full if d.consumes_counters}
    migs: dict[str, list[model.Device]] = collections.defaultdict(list)
    # Static MIG publishes no full-GPU device for a GPU in MIG mode: its MIG devices are grouped
    # by parentUUID into a GPU named like its devices' prefix (gpu-3 for gpu-3-mig-...).
    orphans: dict[str, tuple[model.ResourceSlice, list[model.Device]]] = {}
    for s, device, kind in devices:
        if kind != "mig":
            continue
        parent_uuid = _text(device, driver, "parentUUID")
        parent = by_uuid.get(parent_uuid)
        if parent is None and device.consumes_counters:
            parent = by_set.get(device.consumes_counters[0].counter_set)
        if parent is not None:
            migs[parent].append(device)
        elif parent_uuid:
            orphans.setdefault(parent_uuid, (s, []))[1].append(device)
    out: list[Gpu] = []
    for s, device, uuid in full:
        slice_count = 0
        if device.consumes_counters:
            own = device.consumes_counters[0].counter_set
            slice_count = sum(1 for name, counter in totals if name == own and _MEMORY_SLICE.match(counter))
        out.append(
            _gpu(
                s,
                device,
                pool=pool,
                uuid=uuid,
                full=device,
                migs=migs.get(device.name, []),
                slices=slice_count,
                held=held,
                placeable=placeable,
                amounts=amounts,
            )
        )
    for parent_uuid, (s, group) in orphans.items():
        placements = [_placement(m, driver=driver, holders=(), placeable=False, amounts=amounts) for m in group]
        slice_count = max((p.start + p.size for p in placements), default=0)
        out.append(
            _gpu(
                s,
                group[0],
                pool=pool,
                uuid=parent_uuid,
                full=None,
                migs=group,
                slices=slice_count,
                held=held,
                placeable=placeable,
                amounts=amounts,
            )
        )
    return out


def _gpu(
    s: model.ResourceSlice,
    device: model.Device,
    *,
    pool: model_nodes.Pool,
    uuid: str,
    full: model.Device | None,
    migs: Sequence[model.Device],
    slices: int,
    held: Mapping[tuple[str, str, str], tuple[str, ...]],
    placeable: Callable[[model.Device], bool],
    amounts: _Amounts,
) -> Gpu:
    """One GPU from its full-GPU device (None under static MIG, where `device` is its first MIG
    device, `uuid` its parentUUID and the GPU's memory is that of its MIG devices)."""
    driver = pool.driver
    placements = tuple(
        _placement(
            m,
            driver=driver,
            holders=held.get((driver, pool.name, m.name), ()),
            placeable=placeable(m),
            amounts=amounts,
        )
        for m in migs
    )
    holders = () if full is None else held.get((driver, pool.name, full.name), ())
    memory = _memory(full, driver) if full is not None else sum(p.memory for p in placements)
    if holders:
        state, allocated = State.FULL, memory
    elif any(p.holders for p in placements):
        state, allocated = State.PARTITIONED, sum(p.memory for p in placements if p.holders)
    else:
        state, allocated = State.FREE, 0
    candidates = [(p, amounts.capacity(m, driver, "multiprocessors")) for p, m in zip(placements, migs, strict=True)]
    best = max((c for c in candidates if c[0].placeable), key=lambda c: (c[0].memory, c[1], -c[0].start), default=None)
    name = full.name if full is not None else device.name.partition("-mig-")[0]
    return Gpu(
        node=model_nodes.home(s, device) or CLUSTER_WIDE,
        driver=driver,
        pool=pool.name,
        device=name,
        uuid=uuid,
        product=_text(device, driver, "productName"),
        memory=memory,
        holders=holders,
        placements=placements,
        slices=slices,
        state=state,
        allocated_memory=allocated,
        largest=None if best is None else best[0],
        attributes=_nvlink(device, driver),
    )


def _nvlink(device: model.Device, driver: str) -> dict[str, str]:
    """The device's NVLink attributes (`_NVLINK`) that it has, as text."""
    attributes = device.attributes
    out = {}
    for name, qualified in _qualified(driver, _NVLINK):
        found = attributes.get(name) or attributes.get(qualified)
        if found is not None:
            out[name] = _as_text(found)
    return out


@functools.cache
def _qualified(driver: str, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(name, `<driver>/name`) per name: the spellings `_attribute` looks up, made once per driver."""
    return tuple((name, f"{driver}/{name}") for name in names)


def _slice_indexes(device: model.Device) -> tuple[int, ...]:
    """Dynamic MIG names the memory slices as consumed counters, static MIG as `memorySlice<N>` capacities."""
    return tuple(
        sorted(
            int(match.group(1))
            for use in device.consumes_counters[:1]
            for counter in use.counters
            if (match := _MEMORY_SLICE.match(counter))
        )
        or sorted(int(match.group(1)) for key in device.capacity if (match := _STATIC_SLICE.match(key)))
    )


def _placement(
    device: model.Device, *, driver: str, holders: tuple[str, ...], placeable: bool, amounts: _Amounts
) -> Placement:
    """One MIG device's placement: its memory slices (`_slice_indexes`, cached per mapping)."""
    indexes = amounts.indexes(device)
    return Placement(
        device=device.name,
        profile=_text(device, driver, "profile"),
        start=indexes[0] if indexes else 0,
        size=len(indexes),
        memory=amounts.capacity(device, driver, "memory"),
        holders=holders,
        placeable=placeable,
    )


def device_memory(slices: Sequence[model.ResourceSlice]) -> dict[tuple[str, str, str], int]:
    """(driver, pool, device) -> the bytes of GPU memory allocating that device takes: a
    full GPU's `memory` capacity, a MIG device's own; other devices are absent. Pure.

    For the replay's utilisation samples: summing this over each allocation's results as
    claims come and go keeps "memory allocated" current without measuring the whole cluster
    per event (`measure` gives the same sum, `Metrics.cluster.memory` the total).
    """
    out: dict[tuple[str, str, str], int] = {}
    for usable in model_nodes.Pools(slices).current().usable:
        pool = usable.pool
        for s in pool.slices:
            for device in s.devices:
                if _text(device, pool.driver, "type") in ("gpu", "mig"):
                    out[(pool.driver, pool.name, device.name)] = _memory(device, pool.driver)
    return out


def stranded_memory(gpu: Gpu, shapes: Iterable[RequestShape]) -> int:
    """Free memory of a partitioned GPU that no pending request shape can use, in bytes. Pure.

    "Can use", precisely: a free memory slice of the GPU (one no allocated MIG device covers)
    is usable when some placeable MIG device of this GPU covers it and matches some shape
    (`kind` mig, the shape's profile if it names one, `memory` at least its `min_memory`). A
    full-GPU shape never uses a partitioned GPU (its device consumes the whole GPU). The
    stranded memory is the GPU's free memory times the share of its free memory slices that
    are not usable. A GPU without memory slices is all or nothing: its free memory is stranded
    unless some placeable MIG device of it matches a shape. Free and full GPUs strand nothing.
    """
    if gpu.state is not State.PARTITIONED:
        return 0
    wanted = [s for s in shapes if s.kind == "mig"]

    def matches(p: Placement) -> bool:
        return p.placeable and any(
            (s.profile is None or s.profile == p.profile) and p.memory >= s.min_memory for s in wanted
        )

    usable_devices = [p for p in gpu.placements if matches(p)]
    if gpu.slices == 0:
        return 0 if usable_devices else gpu.free_memory
    taken = {i for p in gpu.placements if p.holders for i in range(p.start, p.start + p.size)}
    free = [i for i in range(gpu.slices) if i not in taken]
    if not free:
        return 0
    usable = {i for p in usable_devices for i in range(p.start, p.start + p.size)}
    unusable = sum(1 for i in free if i not in usable)
    return gpu.free_memory * unusable // len(free)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeMetrics:
    """One node's (or the cluster's, `node == CLUSTER`) GPUs and memory, in bytes.

    `largest` counts GPUs with MIG devices by their largest placeable profile (`none` when no
    MIG device is placeable any more), sorted by profile name."""

    node: str
    gpus: int
    full: int
    partitioned: int
    free: int
    memory: int
    memory_allocated: int
    memory_stranded: int
    largest: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class GangCounts:
    """Gangs (PodGroups placed all or nothing) admitted, and refused (each time a gang that had gathered its
    minimum was first refused: a gang refused and admitted on a later retry counts in both)."""

    admitted: int = 0
    refused: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TimeMetrics:
    """What the replay's `Series` accumulated: claims admitted before the first rejection (all
    admitted claims when none was rejected), admitted and rejected in all, and utilisation (the
    allocated share of GPU memory) weighted by time between the first and the last sample; and
    the gangs admitted and refused, None for a trace without PodGroups."""

    admitted_before_first_rejection: int
    admitted: int
    rejections: int
    utilisation: float
    points: tuple[tuple[float, float], ...] = ()
    gangs: GangCounts | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Metrics:
    """One metric set: a label (the policy, say), per-node metrics, the cluster's, every GPU,
    the pending shapes it was measured against, and the time series when there is one."""

    label: str
    nodes: tuple[NodeMetrics, ...]
    cluster: NodeMetrics
    gpus: tuple[Gpu, ...]
    shapes: tuple[RequestShape, ...] = ()
    time: TimeMetrics | None = None


def measure(
    slices: Sequence[model.ResourceSlice],
    claims: Iterable[model.ResourceClaim],
    *,
    shapes: Iterable[RequestShape] = (),
    label: str = "",
    time: TimeMetrics | None = None,
) -> Metrics:
    """The metric set of one cluster state: `claims` with their allocations over `slices`,
    stranded memory judged against the pending request `shapes`. Pure."""
    wanted = tuple(shapes)
    gpus = tuple(_with_stranded(g, wanted) for g in inventory(slices, claims))
    nodes = per_node(gpus)
    return Metrics(label=label, nodes=nodes, cluster=total(CLUSTER, nodes), gpus=gpus, shapes=wanted, time=time)


def _with_stranded(gpu: Gpu, shapes: Sequence[RequestShape]) -> Gpu:
    stranded = stranded_memory(gpu, shapes)
    return dataclasses.replace(gpu, stranded=stranded) if stranded else gpu


def per_node(gpus: Iterable[Gpu]) -> tuple[NodeMetrics, ...]:
    """The GPUs' metrics per node, by node name (`CLUSTER_WIDE` last). Pure."""
    by_node: dict[str, list[Gpu]] = collections.defaultdict(list)
    for gpu in gpus:
        by_node[gpu.node].append(gpu)
    return tuple(_sum(node, by_node[node]) for node in sorted(by_node, key=lambda n: (n == CLUSTER_WIDE, n)))


def total(node: str, parts: Iterable[NodeMetrics]) -> NodeMetrics:
    """The sum of node metrics under the name `node` (the largest placeable profiles counted
    together); all zero for no parts. Pure."""
    parts = tuple(parts)
    largest: collections.Counter[str] = collections.Counter()
    for part in parts:
        largest.update(dict(part.largest))
    return NodeMetrics(
        node=node,
        gpus=sum(p.gpus for p in parts),
        full=sum(p.full for p in parts),
        partitioned=sum(p.partitioned for p in parts),
        free=sum(p.free for p in parts),
        memory=sum(p.memory for p in parts),
        memory_allocated=sum(p.memory_allocated for p in parts),
        memory_stranded=sum(p.memory_stranded for p in parts),
        largest=tuple(sorted(largest.items())),
    )


def _sum(node: str, gpus: Sequence[Gpu]) -> NodeMetrics:
    states = collections.Counter(g.state for g in gpus)
    largest = collections.Counter(
        (g.largest.profile if g.largest is not None else "none") for g in gpus if g.placements
    )
    return NodeMetrics(
        node=node,
        gpus=len(gpus),
        full=states[State.FULL],
        partitioned=states[State.PARTITIONED],
        free=states[State.FREE],
        memory=sum(g.memory for g in gpus),
        memory_allocated=sum(g.allocated_memory for g in gpus),
        memory_stranded=sum(g.stranded for g in gpus),
        largest=tuple(sorted(largest.items())),
    )


class Series:
    """The time-series accumulator the trace replay calls per event, in time order.

    Not a value: it is mutated by `admitted`, `rejected` and `sample`, each with the event's
    time in seconds. Utilisation is a step function: a sample holds from its time until the
    next. Times must not go backwards (ValueError naming both times). `result()` may be
    called at any point and any number of times.
    """

    __slots__ = ("_admitted", "_area", "_before_first", "_gangs", "_last", "_points", "_rejected")

    def __init__(self, *, gangs: bool = False) -> None:
        self._gangs = GangCounts() if gangs else None
        self._admitted = 0
        self._before_first: int | None = None
        self._rejected = 0
        self._points: list[tuple[float, float]] = []
        self._area = 0.0
        self._last: float | None = None

    def _at(self, at: float) -> None:
        if self._last is not None and at < self._last:
            raise ValueError(f"time series: event at {at}s comes after one at {self._last}s")
        self._last = at

    def admitted(self, at: float, *, count: int = 1) -> None:
        """`count` claims were allocated at `at`."""
        self._at(at)
        self._admitted += count

    def rejected(self, at: float, *, count: int = 1) -> None:
        """`count` claims could not be allocated at `at`; the first one fixes "admitted before
        the first rejection"."""
        self._at(at)
        if self._before_first is None:
            self._before_first = self._admitted
        self._rejected += count

    def gang(self, at: float, *, admitted: bool) -> None:
        """A gang was admitted (or refused) at `at`; counted only by a series made with `gangs`."""
        self._at(at)
        if self._gangs is not None:
            counts = self._gangs
            self._gangs = GangCounts(admitted=counts.admitted + admitted, refused=counts.refused + (not admitted))

    def sample(self, at: float, *, used: int, total: int) -> None:
        """From `at` on, `used` of `total` (bytes of GPU memory, say) are allocated."""
        self._at(at)
        level = used / total if total > 0 else 0.0
        if self._points:
            then, previous = self._points[-1]
            self._area += previous * (at - then)
            if at == then:
                self._points[-1] = (at, level)
                return
        self._points.append((at, level))

    def result(self) -> TimeMetrics:
        if len(self._points) >= 2 and self._points[-1][0] > self._points[0][0]:
            utilisation = self._area / (self._points[-1][0] - self._points[0][0])
        else:
            utilisation = self._points[-1][1] if self._points else 0.0
        return TimeMetrics(
            admitted_before_first_rejection=self._admitted if self._before_first is None else self._before_first,
            admitted=self._admitted,
            rejections=self._rejected,
            utilisation=utilisation,
            points=tuple(self._points),
            gangs=self._gangs,
        )


# --- rendering ---------------------------------------------------------------------------------


def _gib(value: int) -> str:
    return f"{value / _GIB:.1f}Gi"


def _largest_text(largest: Sequence[tuple[str, int]]) -> str:
    return " ".join(f"{profile}×{count}" for profile, count in largest) or "-"


def as_dict(metrics: Metrics) -> dict[str, Any]:
    """A JSON-able dict (memory in bytes, utilisation a fraction). Pure."""
    out: dict[str, Any] = {
        "label": metrics.label,
        "shapes": [str(s) for s in metrics.shapes],
        "cluster": node_dict(metrics.cluster),
        "nodes": [node_dict(n) for n in metrics.nodes],
        "gpus": [
            {
                "gpu": g.key,
                "state": g.state.value,
                "memory": g.memory,
                "allocated": g.allocated_memory,
                "stranded": g.stranded,
                "holders": list(g.holders) + [h for p in g.placements for h in p.holders],
                "largestPlaceable": None
                if g.largest is None
                else {"profile": g.largest.profile, "start": g.largest.start},
            }
            for g in metrics.gpus
        ],
    }
    if metrics.time is not None:
        t = metrics.time
        out["time"] = {
            "admittedBeforeFirstRejection": t.admitted_before_first_rejection,
            "admitted": t.admitted,
            "rejections": t.rejections,
            "utilisation": t.utilisation,
        }
        if t.gangs is not None:
            out["time"]["gangs"] = {"admitted": t.gangs.admitted, "refused": t.gangs.refused}
    return out


def node_dict(n: NodeMetrics, *, stranded: bool = True) -> dict[str, Any]:
    """One node's (or the cluster's) metrics as a JSON-able dict, memory in bytes; without
    `memory.stranded` when `stranded` is false (as `node_columns`). Pure."""
    memory = {"total": n.memory, "allocated": n.memory_allocated}
    if stranded:
        memory["stranded"] = n.memory_stranded
    return {
        "node": n.node,
        "gpus": {"total": n.gpus, "full": n.full, "partitioned": n.partitioned, "free": n.free},
        "memory": memory,
        "largestPlaceable": dict(n.largest),
    }


def node_columns(*, stranded: bool = True) -> tuple[str, ...]:
    """The headers of `node_cells`, NODE first; without STRANDED when `stranded` is false
    (where there are no pending shapes to judge it by)."""
    return ("NODE", "GPUS", "FULL", "PARTITIONED", "FREE", "MEMORY ALLOCATED") + (
        ("STRANDED", "LARGEST MIG FREE") if stranded else ("LARGEST MIG FREE",)
    )


def node_cells(n: NodeMetrics, *, stranded: bool = True) -> tuple[str, ...]:
    """One node's (or the cluster's) row under `node_columns`, as text. Pure."""
    memory = f"{_gib(n.memory_allocated)} / {_gib(n.memory)}"
    cells = (n.node, str(n.gpus), str(n.full), str(n.partitioned), str(n.free), memory)
    return cells + ((_gib(n.memory_stranded),) if stranded else ()) + (_largest_text(n.largest),)


def node_table(metrics: Metrics) -> rich.table.Table:
    """Per node and for the cluster: GPUs full/partitioned/free, memory, MIG fragmentation. Pure."""
    import rich.table  # imported here: `dractl simulate -o json` uses this module without rich

    table = rich.table.Table(title=f"GPUs {metrics.label}".strip(), title_justify="left")
    for header in node_columns():
        table.add_column(header, justify="left" if header in ("NODE", "LARGEST MIG FREE") else "right")
    for n in (*metrics.nodes, metrics.cluster):
        table.add_row(*node_cells(n), end_section=n.node != CLUSTER and n is metrics.nodes[-1])
    return table


def compare_rows(metrics: Metrics) -> list[tuple[str, str]]:
    """The cluster-level (name, value) rows of one metric set, in the order `compare_table` shows. Pure."""
    c = metrics.cluster
    share = f" ({c.memory_stranded / c.memory:.1%})" if c.memory else ""
    rows = [
        ("GPUs full", str(c.full)),
        ("GPUs partitioned", str(c.partitioned)),
        ("GPUs free", f"{c.free} / {c.gpus}"),
        ("memory allocated", f"{_gib(c.memory_allocated)} / {_gib(c.memory)}"),
        ("memory stranded", _gib(c.memory_stranded) + share),
        ("largest MIG profile free", _largest_text(c.largest)),
    ]
    if metrics.time is not None:
        t = metrics.time
        rows += [
            ("admitted before first rejection", str(t.admitted_before_first_rejection)),
            ("admitted", str(t.admitted)),
            ("rejections", str(t.rejections)),
            ("time-weighted utilisation", f"{t.utilisation:.1%}"),
        ]
        if t.gangs is not None:
            rows += [("gangs admitted", str(t.gangs.admitted)), ("gangs refused", str(t.gangs.refused))]
    return rows


def compare_table(sets: Sequence[Metrics]) -> rich.table.Table:
    """Two or more metric sets side by side, one column per set (its label), one row per
    cluster metric; a metric one set lacks (no time series) shows `-`. Pure."""
    if not sets:
        raise ValueError("compare_table needs at least one metric set")
    import rich.table

    table = rich.table.Table(title="placement quality", title_justify="left")
    table.add_column("METRIC")
    for index, metrics in enumerate(sets):
        table.add_column(metrics.label or f"set {index + 1}", justify="right")
    columns = [dict(compare_rows(m)) for m in sets]
    names: list[str] = []
    for metrics in sets:
        names.extend(name for name, _ in compare_rows(metrics) if name not in names)
    for name in names:
        table.add_row(name, *(column.get(name, "-") for column in columns))
    return table
