"""ResourceSlices from an inventory: names, attributes, MIG modes, consumable memory, layout and limits, validity."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dractl import config
from dractl.model import decode, encode, types
from dractl.node import backend, fakegpu, inventory, mig, publish, slices

MODES = [config.MigMode.STATIC, config.MigMode.DYNAMIC]


def _inventory(profile: str | fakegpu.Profile, node: str = "node-1") -> inventory.Inventory:
    loaded = fakegpu.load_profile(profile) if isinstance(profile, str) else profile
    return inventory.read(fakegpu.FakeGpus(loaded, node_name=node))


def _build(profile: str | fakegpu.Profile, **options: Any) -> tuple[types.ResourceSlice, ...]:
    options.setdefault("node_name", "node-1")
    return slices.build(_inventory(profile, options["node_name"]), options=slices.Options(**options))


def _devices(result: tuple[types.ResourceSlice, ...]) -> dict[str, types.Device]:
    return {d.name: d for s in result for d in s.devices}


def _attr(device: types.Device, name: str) -> object:
    a = device.attributes[name]
    return a.texts[0] if a.texts else a.scalar


def _validated(result: tuple[types.ResourceSlice, ...]) -> tuple[types.ResourceSlice, ...]:
    """Encode, then decode with the API's validation rules; returns the decoded slices."""
    objects = decode.load_documents([encode.resource_slice(s) for s in result], file="discovered")
    return objects.resource_slices


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("profile", fakegpu.builtin_profiles())
def test_every_profile_and_mode_makes_valid_slices(profile: str, mode: config.MigMode) -> None:
    """Guards validity by the API's rules and exact round trip for every built-in profile and MIG mode."""
    result = _build(profile, mig_mode=mode)
    decoded = _validated(result)
    assert [dataclasses.replace(s, source=types.Source()) for s in decoded] == list(result)
    assert {s.pool.resource_slice_count for s in result} == {len(result)}
    assert len({s.meta.name for s in result}) == len(result)


def test_full_gpu_carries_the_nvidia_driver_attributes() -> None:
    """Guards the attribute and capacity names of a full GPU, as the NVIDIA DRA driver publishes them."""
    device = _devices(_build("h100-80gb-x8"))["gpu-0"]
    assert list(device.attributes) == [
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
        "resource.kubernetes.io/numaNode",
        "gpuModuleID",
        "partition8",
        "partition4",
        "partition2",
        "partition1",
    ]
    assert _attr(device, "type") == "gpu"
    assert _attr(device, "uuid") == fakegpu.gpu_uuid("node-1", 0)
    assert _attr(device, "productName") == "NVIDIA H100 80GB HBM3"
    assert _attr(device, "cudaComputeCapability") == "9.0.0"
    assert _attr(device, "driverVersion") == "580.126.20"
    assert _attr(device, "cudaDriverVersion") == "13.0.0"
    assert _attr(device, "resource.kubernetes.io/pciBusID") == "0000:18:00.0"
    assert _attr(device, "resource.kubernetes.io/pcieRoot") == "pci0000:15"
    assert (_attr(device, "gpuModuleID"), _attr(device, "partition4"), _attr(device, "partition1")) == (1, 1, 7)
    assert list(device.capacity) == ["memory"] and str(device.capacity["memory"].value) == "81559Mi"


def test_gpus_without_fabric_have_no_nvlink_attributes() -> None:
    """Guards that partition attributes appear only where the backend reports a fabric."""
    for device in _devices(_build("l4-x4")).values():
        assert not {"gpuModuleID", "partition4"} & set(device.attributes)


def test_static_mig_publishes_existing_devices_only() -> None:
    """Guards static MIG: existing MIG devices with uuid and memorySlice capacities; MIG GPUs not whole."""
    devices = _devices(_build("a100-mig-mixed", mig_mode=config.MigMode.STATIC))
    assert sorted(n for n in devices if n.startswith("gpu-0")) == [
        "gpu-0-mig-1g10gb-19-6",
        "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-3g40gb-9-0",
    ]
    assert "gpu-0" not in devices and "gpu-3" in devices
    mig = devices["gpu-0-mig-3g40gb-9-0"]
    assert _attr(mig, "type") == "mig" and _attr(mig, "profile") == "3g.40gb"
    assert str(_attr(mig, "uuid")).startswith("MIG-")
    assert _attr(mig, "parentUUID") == fakegpu.gpu_uuid("node-1", 0)
    assert [k for k in mig.capacity if k.startswith("memorySlice")] == [f"memorySlice{i}" for i in range(4)]
    assert str(mig.capacity["memory"].value) == "40192Mi" and str(mig.capacity["multiprocessors"].value) == "42"
    assert not mig.consumes_counters


def test_dynamic_mig_publishes_every_placement_with_counters() -> None:
    """Guards dynamic MIG: counter sets first, one slice per GPU, every profile x placement consuming its slices."""
    result = _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC)
    assert len(result) == 9 and not result[0].devices
    assert [c.name for c in result[0].shared_counters] == [f"gpu-{i}-counter-set" for i in range(8)]
    counters = result[0].shared_counters[0].counters
    assert [str(counters[k]) for k in ("multiprocessors", "copy-engines", "memory")] == ["98", "7", "81152Mi"]
    assert [k for k in counters if k.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]
    gpu1 = result[2].devices
    assert {d.name.split("-mig")[0] for d in gpu1} == {"gpu-1"} and len(gpu1) == 1 + 7 + 4 + 3 + 2 + 1 + 1
    by_name = {d.name: d for d in gpu1}
    full = by_name["gpu-1"]
    assert full.consumes_counters[0].counters == result[0].shared_counters[1].counters
    placed = by_name["gpu-1-mig-2g20gb-14-4"].consumes_counters[0]
    assert placed.counter_set == "gpu-1-counter-set"
    assert [k for k in placed.counters if k.startswith("memory-slice-")] == ["memory-slice-4", "memory-slice-5"]
    assert "uuid" not in by_name["gpu-1-mig-2g20gb-14-4"].attributes


def test_dynamic_mig_publishes_the_same_devices_whatever_the_mig_mode() -> None:
    """Guards the one rule for whole and MIG: a MIG-capable GPU is published whole and as every placement in
    dynamic mode, with MIG mode off, on with instances, or on after its last instance went (an agent restarted
    after its prepares turned MIG on publishes what the first one did)."""
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name="node-1")
    options = slices.Options(node_name="node-1", mig_mode=config.MigMode.DYNAMIC)
    before = slices.build(inventory.read(gpus), options=options)
    gpus.set_mig_mode(0, backend.MigMode.ENABLED)
    placement = backend.Placement(start=0, size=1)
    gi = gpus.create_gpu_instance(0, profile_id=19, placement=placement)
    gpus.create_compute_instance(0, gi_id=gi.gi_id)
    assert slices.build(inventory.read(gpus), options=options) == before
    mig.destroy(gpus, minor=0, gi_id=gi.gi_id)
    assert inventory.read(gpus).gpus[0].info.mig_mode is backend.MigMode.ENABLED
    assert slices.build(inventory.read(gpus), options=options) == before
    devices = _devices(_build("a100-mig-mixed", mig_mode=config.MigMode.DYNAMIC))
    assert {"gpu-0", "gpu-0-mig-7g80gb-0-0", "gpu-3", "gpu-3-mig-1g10gb-19-0"} <= set(devices)


@pytest.mark.parametrize(
    ("version", "layout"),
    [((1, 34), slices.Layout.COMBINED), ((1, 35), slices.Layout.SPLIT), ((1, 36), slices.Layout.SPLIT)],
    ids=["1.34", "1.35", "1.36"],
)
def test_the_layout_follows_the_api_servers_version(version: tuple[int, int], layout: slices.Layout) -> None:
    """Guards the version rule: counters beside their devices for 1.34, in slices of their own from 1.35."""
    assert slices.layout_for(*version) is layout


def test_the_combined_layout_puts_each_gpus_counter_set_beside_its_devices() -> None:
    """Guards the Kubernetes 1.34 layout: one slice per GPU holding its counter set and every device that
    consumes it, no slice of counters alone; the same devices as the split layout, and without counters
    (static MIG) the layout changes nothing."""
    split = _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC)
    combined = _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC, layout=slices.Layout.COMBINED)
    assert len(combined) == 8 and {s.pool.resource_slice_count for s in combined} == {8}
    for minor, piece in enumerate(combined):
        assert [c.name for c in piece.shared_counters] == [f"gpu-{minor}-counter-set"]
        assert {c.counter_set for d in piece.devices for c in d.consumes_counters} == {f"gpu-{minor}-counter-set"}
        assert piece.shared_counters[0] == split[0].shared_counters[minor]
    assert [d for s in combined for d in s.devices] == [d for s in split for d in s.devices]
    assert _build("a100-mig-mixed", layout=slices.Layout.COMBINED) == _build("a100-mig-mixed")


def test_consumable_memory_makes_gpus_shareable() -> None:
    """Guards consumable memory: allowMultipleAllocations and a 1Mi-step memory policy defaulting to all."""
    result = _build("t4-x2", consumable_memory=True)
    device = _devices(result)["gpu-0"]
    assert device.allow_multiple_allocations
    memory = device.capacity["memory"]
    policy = memory.request_policy
    assert policy is not None and policy.valid_range is not None
    assert str(memory.value) == "15Gi" and policy.default == memory.value
    assert str(policy.valid_range.min) == "1Mi" and str(policy.valid_range.step) == "1Mi"
    assert _validated(result)


def test_consumable_memory_leaves_counter_devices_alone() -> None:
    """Guards that devices consuming counters stay single-allocation (a shared full GPU would charge its set twice)."""
    devices = _devices(_build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC, consumable_memory=True))
    assert not any(d.allow_multiple_allocations for d in devices.values())


def test_same_inventory_gives_identical_slices() -> None:
    """Guards determinism: same inventory and options -> equal slices, names included."""
    assert _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC) == _build(
        "a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC
    )
    names = [s.meta.name for s in _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC)]
    assert names == sorted(names) and all(n.startswith("node-1-gpu.nvidia.com-") for n in names)


def test_pool_owner_generation_and_driver() -> None:
    """Guards pool = node name, the caller's generation, the Node owner reference and the driver flag."""
    result = _build("t4-x2", node_uid="1234-abcd", generation=7, driver_name="gpu.example.com")
    (only,) = result
    assert (only.pool.name, only.pool.generation, only.node_name, only.driver) == (
        "node-1",
        7,
        "node-1",
        "gpu.example.com",
    )
    assert only.meta.owner_references == (
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "1234-abcd", "controller": True},
    )
    assert _build("t4-x2")[0].meta.owner_references == ()


def _many(count: int, *, mig: bool) -> fakegpu.Profile:
    raw = {
        "driverVersion": "580.126.20",
        "cudaDriverVersion": "13.0",
        "gpus": [
            {"model": "a100-sxm4-80gb" if mig else "tesla-t4", "pciBusID": f"0000:{i // 32:02x}:{i % 32:02x}.0"}
            for i in range(count)
        ],
    }
    return fakegpu.parse_profile(raw, name=f"many-{count}")


def test_more_than_128_devices_split_across_slices() -> None:
    """Guards the 128-devices-per-slice limit and resourceSliceCount when a pool is split."""
    result = _build(_many(130, mig=False))
    assert [len(s.devices) for s in result] == [128, 2]
    assert {s.pool.resource_slice_count for s in result} == {2}
    assert _validated(result)


def test_taints_lower_the_limit_to_64() -> None:
    """Guards the 64-device limit for slices with taints, and that taints land on the named device only."""
    taint = types.DeviceTaint(key="gpu.nvidia.com/xid", value="79", effect="NoSchedule")
    result = _build(_many(70, mig=False), taints={"gpu-5": [taint], "gpu-999": [taint]})
    assert [len(s.devices) for s in result] == [64, 6]
    devices = _devices(result)
    assert devices["gpu-5"].taints == (taint,) and not devices["gpu-4"].taints
    assert _validated(result)


def test_more_than_16_taints_keep_a_stable_16() -> None:
    """Guards the API's 16-taints-per-device limit: a stable choice of 16, still valid."""
    many = [types.DeviceTaint(key=f"example.com/t{i:02d}", effect="None") for i in range(20)]
    result = _build("t4-x2", taints={"gpu-0": list(reversed(many))})
    assert _devices(result)["gpu-0"].taints == tuple(many[:16])
    assert _validated(result)


def test_more_than_8_counter_sets_use_several_counter_slices() -> None:
    """Guards the 8-counter-sets-per-slice limit with dynamic MIG on a large node."""
    result = _build(_many(10, mig=True), mig_mode=config.MigMode.DYNAMIC)
    assert [len(s.shared_counters) for s in result[:2]] == [8, 2]
    assert len(result) == 2 + 10
    assert _validated(result)


def test_devices_sort_numerically() -> None:
    """Guards device order within a slice: gpu-2 before gpu-10 (the scheduler takes the first match)."""
    names = [d.name for d in _build(_many(12, mig=False))[0].devices]
    assert names == [f"gpu-{i}" for i in range(12)]


def test_no_gpus_gives_no_slices() -> None:
    """Guards an empty inventory: nothing to publish, not an empty invalid slice."""
    empty = inventory.Inventory(driver=_inventory("t4-x2").driver, gpus=())
    assert slices.build(empty, options=slices.Options(node_name="node-1")) == ()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        pytest.param({"node_name": "Node_1"}, "node name 'Node_1' is not a DNS subdomain", id="node"),
        pytest.param({"driver_name": "GPU!"}, "driver name 'GPU!' is not a DNS subdomain", id="driver"),
        pytest.param({"generation": -1}, "generation must be >= 0", id="generation"),
    ],
)
def test_invalid_options_are_one_clear_error(options: dict[str, Any], problem: str) -> None:
    """Guards SliceError naming the bad option instead of publishing slices the API would refuse."""
    options = {"node_name": "node-1", **options}
    with pytest.raises(slices.SliceError, match=problem):
        slices.build(_inventory("t4-x2"), options=slices.Options(**options))


def test_mig_device_names_follow_the_nvidia_driver() -> None:
    """Guards MIG device naming: dots dropped, other characters outside RFC 1123 turned into '-'."""
    assert slices.mig_device_name(1, "2g.20gb", 14, 4) == "gpu-1-mig-2g20gb-14-4"
    assert slices.mig_device_name(0, "1g.10gb+me", 20, 0) == "gpu-0-mig-1g10gb-me-20-0"


@pytest.mark.parametrize("layout", list(slices.Layout), ids=lambda layout: layout.value)
def test_the_publisher_reads_back_either_layout_as_it_wrote_it(layout: slices.Layout) -> None:
    """Guards the publisher's comparison on a 1.34 server too: a stored slice that holds counters and devices
    together normalizes to exactly what was encoded, so an unchanged pool is never rewritten."""
    for built in _build("a100-80gb-x8", mig_mode=config.MigMode.DYNAMIC, layout=layout):
        body = encode.resource_slice(built)
        assert publish.normalized(body) == body
