"""The real NVML backend's translation layer, over a scripted stand-in for the pynvml functions.

No GPU is needed: each test replaces the pynvml functions `nvml.py` calls with a small
scripted A100 (MIG on, one 3g.40gb instance), using pynvml's own ctypes structures and
NVMLError, so the argument passing, the value mapping and the error mapping are exercised.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from dractl.node import backend, nvml

_PROFILES = {  # NVML profile index -> (id, name, slices, instances, memory MiB, SMs, placements, size)
    0: (19, "MIG 1g.10gb", 1, 7, 9728, 14, list(range(7)), 1),
    2: (9, "MIG 3g.40gb", 3, 2, 40192, 42, [0, 4], 4),
    4: (0, "MIG 7g.80gb", 7, 1, 81152, 98, [0], 8),
}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _ptr(kind: Any, key: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(key), kind)


def _key(handle: Any) -> int:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    assert value is not None
    return value


class ScriptedLib:
    """One A100-SXM4-80GB at minor 3 with a 3g.40gb GPU instance (GI 1, CI 0) at placement 4."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gis: dict[int, tuple[int, int, int]] = {1: (9, 4, 4)}  # gi id -> (profile id, start, size)

    def nvmlInit(self) -> None:
        self.calls.append(("init", None))

    def nvmlShutdown(self) -> None:
        self.calls.append(("shutdown", None))

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return _ptr(pynvml.c_nvmlDevice_t, 0x1000 + index)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return 3

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.126.20"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = type("Pci", (), {})()
        info.busId = b"00000000:07:00.0"
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return (8, 0)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if _key(handle) >= 0x2000:
            return f"MIG-{_key(handle):08x}-0000-0000-0000-000000000000"
        return "GPU-b7d9f256-1625-58a5-9d3c-f967d747f557"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        return int(pynvml.NVML_BRAND_NVIDIA)

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return int(pynvml.NVML_DEVICE_ARCH_AMPERE)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        memory = type("Memory", (), {})()
        memory.total = 40192 * 2**20 if _key(handle) >= 0x2000 else 81920 * 2**20
        return memory

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return 1

    def nvmlDeviceGetModuleId(self, handle: Any) -> int:
        return 5

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: int) -> Any:
        if index not in _PROFILES:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, name, slices, instances, memory, sms, _, _ = _PROFILES[index]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.name, info.sliceCount, info.instanceCount = pid, name.encode(), slices, instances
        info.memorySizeMB, info.multiprocessorCount, info.copyEngineCount = memory, sms, slices
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int, array: Any, count: Any) -> int:
        (_, _, _, _, _, _, starts, size) = next(p for p in _PROFILES.values() if p[0] == profile_id)
        count._obj.value = len(starts)
        if array is not None:
            for i, start in enumerate(starts):
                array[i].start, array[i].size = start, size
        return 0

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, array: Any, count: Any) -> int:
        mine = [gi for gi, (pid, _, _) in self.gis.items() if pid == profile_id]
        for i, gi in enumerate(mine):
            array[i] = _ptr(pynvml.c_nvmlGpuInstance_t, 0x3000 + gi)
        count._obj.value = len(mine)
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> Any:
        gi_id = _key(gi) - 0x3000
        pid, start, size = self.gis[gi_id]
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi_id, pid
        info.placement.start, info.placement.size = start, size
        return info

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> Any:
        start, size = placement._obj.start, placement._obj.size
        self.calls.append(("create_gi", (profile_id, start, size)))
        if any(set(range(s, s + z)) & set(range(start, start + size)) for _, s, z in self.gis.values()):
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = max(self.gis) + 1
        self.gis[gi_id] = (profile_id, start, size)
        return _ptr(pynvml.c_nvmlGpuInstance_t, 0x3000 + gi_id)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        if index != 0:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _ptr(pynvml.c_nvmlDevice_t, 0x2000)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return 1

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return 0

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        self.calls.append(("set_mig_mode", mode))
        return int(pynvml.NVML_ERROR_IN_USE) if mode == 0 else 0

    recovery = (int(pynvml.NVML_SUCCESS), 0)  # (field return code, recovery action)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field in zip(values, field_ids, strict=True):
            value.fieldId = field
            value.nvmlReturn, value.value.uiVal = self.recovery
        return values

    def nvmlEventSetCreate(self) -> Any:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Any, kinds: int, event_set: Any) -> None:
        self.calls.append(("register", kinds))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        raise _error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.calls.append(("free", event_set))


@pytest.fixture
def lib(monkeypatch: pytest.MonkeyPatch) -> ScriptedLib:
    scripted = ScriptedLib()
    for name in dir(scripted):
        if name.startswith("nvml"):
            monkeypatch.setattr(nvml.pynvml, name, getattr(scripted, name))
    monkeypatch.setattr(nvml, "_pcie_root", lambda bus: "pci0000:00" if bus == "0000:07:00.0" else None)
    monkeypatch.setattr(nvml, "_numa_node", lambda bus: 3)
    return scripted


def test_init_failure_maps_to_nvml_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards that a missing library or driver at nvmlInit is an NvmlError with NVML's code."""

    def no_library() -> None:
        raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(nvml.pynvml, "nvmlInit", no_library)
    with pytest.raises(backend.NvmlError) as caught:
        nvml.NvmlBackend()
    assert caught.value.code == backend.Return.LIBRARY_NOT_FOUND
    assert str(caught.value) == "NVML_ERROR_LIBRARY_NOT_FOUND: nvmlInit"


def test_gpu_facts_are_mapped(lib: ScriptedLib) -> None:
    """Guards the mapping of NVML's answers: bus id form, brand and architecture names, versions, fabric."""
    b = nvml.NvmlBackend()
    (gpu,) = b.gpus()
    assert (gpu.minor, gpu.index, gpu.name, gpu.brand, gpu.architecture) == (
        3,
        0,
        "NVIDIA A100-SXM4-80GB",
        "Nvidia",
        "Ampere",
    )
    assert (gpu.pci_bus_id, gpu.pcie_root, gpu.numa_node) == ("0000:07:00.0", "pci0000:00", 3)
    assert gpu.cuda_compute_capability == (8, 0) and gpu.memory_bytes == 80 * 2**30
    assert gpu.mig_capable and gpu.mig_mode is backend.MigMode.ENABLED
    assert gpu.fabric == backend.FabricInfo(module_id=5)
    assert b.driver_info() == backend.DriverInfo(driver_version="580.126.20", cuda_driver_version="13.0")


def test_profiles_and_placements_are_read(lib: ScriptedLib) -> None:
    """Guards profile reading: names without the MIG prefix, unsupported indices skipped, placements filled."""
    profiles = nvml.NvmlBackend().gpu_instance_profiles(3)
    assert [(p.id, p.name, [pl.start for pl in p.placements]) for p in profiles] == [
        (19, "1g.10gb", list(range(7))),
        (9, "3g.40gb", [0, 4]),
        (0, "7g.80gb", [0]),
    ]
    assert profiles[1].memory_bytes == 40192 * 2**20 and profiles[1].placements[1] == backend.Placement(4, 4)


def test_existing_mig_devices_are_listed(lib: ScriptedLib) -> None:
    """Guards MIG device discovery: GI info joined with the MIG handle's UUID, GI and CI ids."""
    b = nvml.NvmlBackend()
    assert b.gpu_instances(3) == (
        backend.GpuInstance(parent_minor=3, gi_id=1, profile_id=9, placement=backend.Placement(4, 4)),
    )
    (device,) = b.mig_devices(3)
    assert device.uuid.startswith("MIG-") and device.parent_uuid.startswith("GPU-")
    assert (device.profile_name, device.gi_id, device.ci_id, device.memory_bytes) == ("3g.40gb", 1, 0, 40192 * 2**20)


def test_create_passes_the_placement_and_maps_refusals(lib: ScriptedLib) -> None:
    """Guards GI creation: the placement struct reaches NVML; NVML's refusal keeps its code."""
    b = nvml.NvmlBackend()
    gi = b.create_gpu_instance(3, profile_id=9, placement=backend.Placement(0, 4))
    assert ("create_gi", (9, 0, 4)) in lib.calls and gi.gi_id == 2 and gi.placement == backend.Placement(0, 4)
    with pytest.raises(backend.NvmlError) as caught:
        b.create_gpu_instance(3, profile_id=19, placement=backend.Placement(5, 1))
    assert caught.value.code == backend.Return.INSUFFICIENT_RESOURCES


def test_mig_mode_activation_status_is_an_error_and_the_pending_change_is_withdrawn(lib: ScriptedLib) -> None:
    """Guards that a non-success activation status from nvmlDeviceSetMigMode (a change that needs a GPU reset) is
    raised with its code and a reason, after the current mode is set again so no change stays pending for the
    next reset to apply under running work."""
    with pytest.raises(backend.NvmlError, match="takes effect only after a GPU reset") as caught:
        nvml.NvmlBackend().set_mig_mode(3, backend.MigMode.DISABLED)
    assert caught.value.code == backend.Return.IN_USE
    assert [call for call in lib.calls if call[0] == "set_mig_mode"] == [("set_mig_mode", 0), ("set_mig_mode", 1)]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        pytest.param((int(pynvml.NVML_SUCCESS), 0), backend.RecoveryAction.NONE, id="none"),
        pytest.param((int(pynvml.NVML_SUCCESS), 1), backend.RecoveryAction.GPU_RESET, id="reset"),
        pytest.param((int(pynvml.NVML_SUCCESS), 4), backend.RecoveryAction.DRAIN_AND_RESET, id="drain-reset"),
        pytest.param((int(pynvml.NVML_ERROR_NOT_SUPPORTED), 0), backend.Return.NOT_SUPPORTED, id="old-driver"),
        pytest.param((int(pynvml.NVML_SUCCESS), 99), backend.Return.NOT_SUPPORTED, id="unknown-action"),
    ],
)
def test_recovery_action_reads_nvmls_field(
    lib: ScriptedLib, field: tuple[int, int], expected: backend.RecoveryAction | backend.Return
) -> None:
    """Guards the recovery-action read: the field's value maps to RecoveryAction; a per-field error (older drivers)
    or an action this code does not know is NvmlError with NOT_SUPPORTED, never a wrong answer."""
    lib.recovery = field
    b = nvml.NvmlBackend()
    if isinstance(expected, backend.RecoveryAction):
        assert b.recovery_action(3) is expected
    else:
        with pytest.raises(backend.NvmlError) as caught:
            b.recovery_action(3)
        assert caught.value.code == expected


def test_unknown_minor_is_not_found(lib: ScriptedLib) -> None:
    """Guards NOT_FOUND for a minor number NVML did not enumerate."""
    with pytest.raises(backend.NvmlError) as caught:
        nvml.NvmlBackend().compute_mode(0)
    assert caught.value.code == backend.Return.NOT_FOUND


def test_event_wait_timeout_and_close(lib: ScriptedLib) -> None:
    """Guards event registration, a timeout answered with no events, and an idempotent close."""
    b = nvml.NvmlBackend()
    assert b.wait_events(timeout_s=0.01) == ()
    assert ("register", pynvml.nvmlEventTypeXidCriticalError) in lib.calls
    b.close()
    b.close()
    assert [c for c in lib.calls if c[0] in ("free", "shutdown")] == [("free", "event-set"), ("shutdown", None)]
