"""The ResourceSlices a node publishes, computed from its inventory: pure code.

What it does: turns an `inventory.Inventory` into `model.ResourceSlice` values for one
driver (default `gpu.nvidia.com`) the way the NVIDIA DRA driver publishes them, so claims
written for that driver work unchanged: full GPUs `gpu-<minor>`, MIG devices
`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>`, its attribute
and capacity names, and the NVLink attributes `gpuModuleID` / `partition<N>` where the
backend reports a fabric. MIG is published in one of two modes:

* `static`: the MIG devices that exist (with uuid and `memorySlice<N>` capacities); a GPU
  with MIG mode on is not published whole.
* `dynamic`: every MIG-capable GPU whole and as every GPU-instance profile x placement, as
  devices that consume a per-GPU counter set (engines, memory and one `memory-slice-<i>`
  counter per memory slice); the full GPU consumes the whole set, so full-GPU and MIG
  allocations exclude each other and the scheduler picks the layout. Which devices a GPU
  gets depends only on what it is (its model's MIG profiles), never on its current MIG mode:
  prepare sets the mode each allocation needs, so the agent publishes the same devices before
  and after a restart, whatever mode its last prepares left the GPU in.

With `consumable_memory`, devices that consume no counters get `allowMultipleAllocations`
and a memory request policy (default all, 1Mi steps), so a claim can take part of a GPU's
memory (accounting only, as upstream's consumable shares).

Layout: one pool named after the node. Kubernetes 1.35 and later (`Layout.SPLIT`) want counter
sets in slices of their own: counter sets first, in slices of at most 8; then in dynamic mode
one device slice per GPU with counters, and the remaining devices together. Kubernetes 1.34
(`Layout.COMBINED`) wants a counter set in the same slice as the devices that consume it: one
slice per GPU with counters holds its counter set and its devices. Every device slice holds at
most 128 devices, or 64 when a device in it has taints or consumes counters (the API's limits),
and `resourceSliceCount` counts them all. `layout_for` picks the layout from the server's version.

What it must not do: read NVML, talk to the API server or pick slice names at random:
the same inventory and options always give identical slices (names included).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from dractl import config
from dractl.model import quantity, semver, types
from dractl.node import backend, inventory

__all__ = [
    "SliceError",
    "Layout",
    "Options",
    "build",
    "check_names",
    "layout_for",
    "mig_device_name",
    "gpu_device_name",
    "counter_set_name",
]

_MIB = 2**20
_MAX_DEVICES = 128
_MAX_DEVICES_ADVANCED = 64  # with taints or consumesCounters in the slice
_MAX_COUNTER_SETS = 8
_MAX_TAINTS = 16
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_PCI = "resource.kubernetes.io/"
# The generateName alphabet of the API server (no vowels, no confusable characters), in
# ASCII order so that the position characters sort as numbers do.
_SUFFIX_ALPHABET = "".join(sorted("bcdfghjklmnpqrstvwxz2456789"))
# Engine capacities and their DNS-style counter names, in the NVIDIA driver's order.
_ENGINES = (
    ("copyEngines", "copy-engines", "copy_engines"),
    ("decoders", "decoders", "decoders"),
    ("encoders", "encoders", "encoders"),
    ("jpegEngines", "jpeg-engines", "jpeg_engines"),
    ("ofaEngines", "ofa-engines", "ofa_engines"),
)


class SliceError(ValueError):
    """Options that cannot make valid slices; `str()` names the option."""


class Layout(enum.Enum):
    """Where a pool's counter sets go: in slices of their own (Kubernetes 1.35 and later), or in
    the slice of the devices that consume them (Kubernetes 1.34, which refuses them elsewhere)."""

    SPLIT = "split"
    COMBINED = "combined"


def layout_for(major: int, minor: int) -> Layout:
    """The slice layout an API server of version `major.minor` accepts. Pure.

    1.34 validates counters only against the slice they are in; 1.35 changed the
    partitionable-devices API incompatibly and refuses a slice with both counters and devices.
    """
    return Layout.COMBINED if (major, minor) < (1, 35) else Layout.SPLIT


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What to publish. `taints` maps device names to the taints health wants on them (names
    not published are ignored); `node_uid` makes the Node the slices' owner when given;
    `layout` only matters in dynamic MIG mode (nothing else has counters)."""

    node_name: str
    driver_name: str = config.DEFAULT_DRIVER_NAME
    node_uid: str | None = None
    generation: int = 1
    mig_mode: config.MigMode = config.MigMode.STATIC
    consumable_memory: bool = False
    taints: Mapping[str, Sequence[types.DeviceTaint]] = dataclasses.field(default_factory=dict)
    layout: Layout = Layout.SPLIT


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def mig_device_name(parent_minor: int, profile: str, profile_id: int, start: int) -> str:
    """The NVIDIA driver's MIG device name: `gpu-0-mig-1g10gb-19-0` (dots dropped, anything
    else outside RFC 1123 becomes '-'). Pure."""
    short = re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", "")).strip("-")
    return f"gpu-{parent_minor}-mig-{short}-{profile_id}-{start}"


def build(inv: inventory.Inventory, *, options: Options) -> tuple[types.ResourceSlice, ...]:
    """The pool's slices for this inventory. Pure and deterministic; raises `SliceError`
    for an invalid node or driver name. No GPUs gives no slices."""
    _check_options(options)
    common = _CommonAttributes(inv.driver)
    counter_sets: list[types.CounterSet] = []
    groups: list[list[types.Device]] = []
    loose: list[types.Device] = []
    for gpu in inv.gpus:
        devices, counter_set = _gpu_devices(gpu, common=common, options=options)
        if counter_set is not None:
            counter_sets.append(counter_set)
            groups.append(devices)
        else:
            loose.extend(devices)
    if loose:
        groups.append(loose)
    bodies: list[tuple[tuple[types.CounterSet, ...], tuple[types.Device, ...]]] = []
    combined = options.layout is Layout.COMBINED
    if not combined:
        for i in range(0, len(counter_sets), _MAX_COUNTER_SETS):
            bodies.append((tuple(counter_sets[i : i + _MAX_COUNTER_SETS]), ()))
    for index, group in enumerate(groups):
        tainted = [_with_taints(d, options.taints.get(d.name, ())) for d in sorted(group, key=_natural)]
        limit = _MAX_DEVICES_ADVANCED if any(d.taints or d.consumes_counters for d in tainted) else _MAX_DEVICES
        if combined and index < len(counter_sets):
            # A device may only consume a counter set of its own slice: the GPU's devices stay together.
            if len(tainted) > limit:
                raise SliceError(
                    f"GPU counter set {counter_sets[index].name}: {len(tainted)} devices do not fit one "
                    f"slice (at most {limit}), which Kubernetes 1.34 needs; use Kubernetes 1.35 or later"
                )
            bodies.append(((counter_sets[index],), tuple(tainted)))
            continue
        for i in range(0, len(tainted), limit):
            bodies.append(((), tuple(tainted[i : i + limit])))
    pool = types.ResourcePool(name=options.node_name, generation=options.generation, resource_slice_count=len(bodies))
    return tuple(
        types.ResourceSlice(
            meta=_meta(options, i),
            driver=options.driver_name,
            pool=pool,
            node_name=options.node_name,
            devices=devices,
            shared_counters=counters,
        )
        for i, (counters, devices) in enumerate(bodies)
    )


def check_names(node_name: str, driver_name: str) -> None:
    """Raise `SliceError` naming the flag when the node or driver name cannot name a slice's node or driver."""
    if len(node_name) > 253 or not _DNS_SUBDOMAIN.match(node_name):
        raise SliceError(
            f"node name {node_name!r} is not a DNS subdomain (lowercase letters, digits, '-' and '.'):"
            " set --node-name to the Node's name"
        )
    if len(driver_name) > 63 or not _DNS_SUBDOMAIN.match(driver_name):
        raise SliceError(
            f"driver name {driver_name!r} is not a DNS subdomain of at most 63 characters "
            "such as gpu.nvidia.com: check --driver-name"
        )


def _check_options(options: Options) -> None:
    check_names(options.node_name, options.driver_name)
    if options.generation < 0:
        raise SliceError(f"generation must be >= 0, got {options.generation}")


def _meta(options: Options, index: int) -> types.ObjectMeta:
    # Names look like the API server's generateName (`<node>-<driver>-xxxxx`) but are derived
    # from node, driver and position, so republishing the same inventory changes nothing. The
    # first two characters count the position, so sorting the names keeps the pool's order
    # (counter sets first, then the GPUs by minor) for readers that sort slices by name.
    prefix = f"{options.node_name}-{options.driver_name}"[:57].rstrip(".-")
    digest = hashlib.sha256(f"{options.node_name}/{options.driver_name}/{index}".encode()).digest()
    base = len(_SUFFIX_ALPHABET)
    position = _SUFFIX_ALPHABET[index // base % base] + _SUFFIX_ALPHABET[index % base]
    suffix = position + "".join(_SUFFIX_ALPHABET[b % base] for b in digest[:3])
    owners: tuple[Mapping[str, object], ...] = ()
    if options.node_uid:
        owners = (
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": options.node_name,
                "uid": options.node_uid,
                "controller": True,
            },
        )
    return types.ObjectMeta(name=f"{prefix}-{suffix}", owner_references=owners)


def _natural(device: types.Device) -> tuple[object, ...]:
    """Sort key: names in order with numbers compared as numbers (gpu-2 before gpu-10)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", device.name))


def _with_taints(device: types.Device, taints: Sequence[types.DeviceTaint]) -> types.Device:
    if not taints:
        return device
    # The API allows 16 taints per device; keep a stable choice when health reports more.
    chosen = tuple(sorted(taints, key=lambda t: (t.key, t.value, t.effect))[:_MAX_TAINTS])
    return dataclasses.replace(device, taints=chosen)


# --- Attributes ---------------------------------------------------------------------------------


def _string(value: str) -> types.DeviceAttribute:
    return types.DeviceAttribute(kind=types.AttributeKind.STRING, values=(value,))


def _int(value: int) -> types.DeviceAttribute:
    return types.DeviceAttribute(kind=types.AttributeKind.INT, values=(value,))


def _version(text: str) -> types.DeviceAttribute:
    # NVML versions ("580.126.20", "13.0", "8.0") become strict semver ("13.0.0"), as the
    # NVIDIA driver publishes them; a version NVML spells oddly is normalized, not dropped.
    version = semver.parse(text, normalize=True)
    return types.DeviceAttribute(kind=types.AttributeKind.VERSION, values=(version,), texts=(str(version),))


class _CommonAttributes:
    """Host-wide attributes, built once per inventory."""

    def __init__(self, driver: backend.DriverInfo) -> None:
        self.driver_version = _version(driver.driver_version)
        self.cuda_driver_version = _version(driver.cuda_driver_version)


def _gpu_attributes(info: backend.GpuInfo, common: _CommonAttributes) -> dict[str, types.DeviceAttribute]:
    """productName through numaNode: shared by a GPU and its MIG devices, in the driver's order."""
    major, minor = info.cuda_compute_capability
    attributes = {
        "productName": _string(info.name),
        "brand": _string(info.brand),
        "architecture": _string(info.architecture),
        "cudaComputeCapability": _version(f"{major}.{minor}.0"),
        "driverVersion": common.driver_version,
        "cudaDriverVersion": common.cuda_driver_version,
        f"{_PCI}pciBusID": _string(info.pci_bus_id),
    }
    if info.pcie_root:
        attributes[f"{_PCI}pcieRoot"] = _string(info.pcie_root)
    if info.numa_node is not None:
        attributes[f"{_PCI}numaNode"] = _int(info.numa_node)
    return attributes


def _fabric_attributes(info: backend.GpuInfo) -> dict[str, types.DeviceAttribute]:
    """gpuModuleID and partition<N> (FabricManagerPartitioning), on full GPUs only."""
    if info.fabric is None:
        return {}
    attributes = {}
    if info.fabric.module_id is not None:
        attributes["gpuModuleID"] = _int(info.fabric.module_id)
    for count, partition in info.fabric.partitions:
        attributes[f"partition{count}"] = _int(partition)
    return attributes


# --- Capacity and counters -----------------------------------------------------------------------


def _bytes(value: int) -> quantity.Quantity:
    return quantity.parse(quantity.format_bytes(value))


def _count(value: int) -> quantity.Quantity:
    return quantity.from_int(value)


def _engine_capacity(multiprocessors: int, *, engines: backend.Engines, memory: int) -> dict[str, types.DeviceCapacity]:
    capacity = {"multiprocessors": types.DeviceCapacity(value=_count(multiprocessors))}
    for name, _, field in _ENGINES:
        capacity[name] = types.DeviceCapacity(value=_count(getattr(engines, field)))
    capacity["memory"] = types.DeviceCapacity(value=_bytes(memory))
    return capacity


def _engine_counters(
    multiprocessors: int, *, engines: backend.Engines, memory: int, slices: Iterable[int]
) -> dict[str, quantity.Quantity]:
    counters = {"multiprocessors": _count(multiprocessors)}
    for _, counter, field in _ENGINES:
        counters[counter] = _count(getattr(engines, field))
    counters["memory"] = _bytes(memory)
    for s in slices:
        counters[f"memory-slice-{s}"] = _count(1)
    return counters


def _consumable(capacity: Mapping[str, types.DeviceCapacity]) -> dict[str, types.DeviceCapacity]:
    """Memory rounded down to whole MiB, shareable in 1Mi steps (default: all of it)."""
    out = dict(capacity)
    memory = out.get("memory")
    if memory is not None:
        total = _bytes(int(memory.value.value) // _MIB * _MIB)
        step = quantity.parse("1Mi")
        out["memory"] = types.DeviceCapacity(
            value=total,
            request_policy=types.CapacityRequestPolicy(
                default=total, valid_range=types.CapacityRequestPolicyRange(min=step, max=total, step=step)
            ),
        )
    return out


# --- Devices of one GPU ------------------------------------------------------------------------------


def _gpu_devices(
    gpu: inventory.Gpu, *, common: _CommonAttributes, options: Options
) -> tuple[list[types.Device], types.CounterSet | None]:
    info = gpu.info
    shared = _gpu_attributes(info, common)
    dynamic = options.mig_mode is config.MigMode.DYNAMIC and bool(gpu.profiles) and not gpu.lost
    mig_on = info.mig_mode is backend.MigMode.ENABLED
    devices: list[types.Device] = []
    if not dynamic:
        if mig_on and not gpu.lost:
            devices.extend(_static_mig(gpu, shared, options=options))
        else:
            devices.append(
                _full_gpu(
                    info,
                    shared,
                    capacity={"memory": types.DeviceCapacity(value=_bytes(info.memory_bytes))},
                    options=options,
                )
            )
        return devices, None
    # Dynamic MIG: the counter set holds the per-profile maxima, as the NVIDIA driver does.
    profiles = gpu.profiles
    top_sm = max(p.multiprocessors for p in profiles)
    top = backend.Engines(**{field: max(getattr(p.engines, field) for p in profiles) for _, _, field in _ENGINES})
    top_memory = max(p.memory_bytes for p in profiles)
    memory_slices = range(max(pl.start + pl.size for p in profiles for pl in p.placements))
    set_name = counter_set_name(info.minor)
    counter_set = types.CounterSet(
        name=set_name, counters=_engine_counters(top_sm, engines=top, memory=top_memory, slices=memory_slices)
    )
    devices.append(
        types.Device(
            name=gpu_device_name(info.minor),
            attributes={"type": _string("gpu"), "uuid": _string(info.uuid), **shared, **_fabric_attributes(info)},
            capacity=_engine_capacity(top_sm, engines=top, memory=top_memory),
            consumes_counters=(types.DeviceCounterConsumption(counter_set=set_name, counters=counter_set.counters),),
        )
    )
    for profile in profiles:
        for placement in profile.placements:
            devices.append(
                types.Device(
                    name=mig_device_name(info.minor, profile.name, profile.id, placement.start),
                    attributes={
                        "type": _string("mig"),
                        "profile": _string(profile.name),
                        "parentUUID": _string(info.uuid),
                        **shared,
                    },
                    capacity=_engine_capacity(
                        profile.multiprocessors, engines=profile.engines, memory=profile.memory_bytes
                    ),
                    consumes_counters=(
                        types.DeviceCounterConsumption(
                            counter_set=set_name,
                            counters=_engine_counters(
                                profile.multiprocessors,
                                engines=profile.engines,
                                memory=profile.memory_bytes,
                                slices=placement.slices,
                            ),
                        ),
                    ),
                )
            )
    return devices, counter_set


def _full_gpu(
    info: backend.GpuInfo,
    shared: Mapping[str, types.DeviceAttribute],
    *,
    capacity: Mapping[str, types.DeviceCapacity],
    options: Options,
) -> types.Device:
    return types.Device(
        name=gpu_device_name(info.minor),
        attributes={"type": _string("gpu"), "uuid": _string(info.uuid), **shared, **_fabric_attributes(info)},
        capacity=_consumable(capacity) if options.consumable_memory else dict(capacity),
        allow_multiple_allocations=options.consumable_memory,
    )


def _static_mig(
    gpu: inventory.Gpu, shared: Mapping[str, types.DeviceAttribute], *, options: Options
) -> list[types.Device]:
    by_id = {p.id: p for p in gpu.profiles}
    devices = []
    for mig in gpu.mig_devices:
        profile = by_id.get(mig.profile_id)
        if profile is not None:
            capacity = _engine_capacity(profile.multiprocessors, engines=profile.engines, memory=profile.memory_bytes)
        else:
            # A profile NVML no longer lists (e.g. made out of band): publish what the device says.
            capacity = {"memory": types.DeviceCapacity(value=_bytes(mig.memory_bytes))}
        for s in mig.placement.slices:
            capacity[f"memorySlice{s}"] = types.DeviceCapacity(value=_count(1))
        devices.append(
            types.Device(
                name=mig_device_name(mig.parent_minor, mig.profile_name, mig.profile_id, mig.placement.start),
                attributes={
                    "type": _string("mig"),
                    "uuid": _string(mig.uuid),
                    "profile": _string(mig.profile_name),
                    "parentUUID": _string(mig.parent_uuid),
                    **shared,
                },
                capacity=_consumable(capacity) if options.consumable_memory else capacity,
                allow_multiple_allocations=options.consumable_memory,
            )
        )
    return devices
