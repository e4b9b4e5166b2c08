"""The real `backend.NvmlBackend`, over NVIDIA's NVML through `nvidia-ml-py` (`import pynvml`).

What it does: answers the backend's questions with NVML calls and carries out its changes
(MIG mode, GPU and compute instances, compute mode), turning every `pynvml.NVMLError` into
`backend.NvmlError` with the same return code. PCIe root and NUMA node come from sysfs,
as NVML does not report the root complex. Time-slice has no NVML call: it runs
`nvidia-smi compute-policy`, as the NVIDIA DRA driver does.

What it must not do: be imported by anything but `discover`/the node agent when the real
device source is chosen (it is the only module that imports `pynvml`), or leak pynvml's
types or exceptions to callers. Importing it never touches the driver: `NvmlBackend()` does.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from dractl.node import backend

__all__ = ["NvmlBackend"]

_T = TypeVar("_T")
_MIB = 2**20
_SYS_PCI = pathlib.Path("/sys/bus/pci/devices")

# GPU-instance profile indices (NVML_GPU_INSTANCE_PROFILE_*) to skip: the single-slice
# media-extension revision, which upstream's driver leaves out as well.
_SKIPPED_GI_PROFILES = frozenset({getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 7)})
_GI_PROFILE_COUNT = int(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 18))
_CI_PROFILE_COUNT = int(getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))
_CI_SKIPPED = frozenset({getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1", 7)})
# The field holding the GPU's recovery action (NVML 555+); older nvidia-ml-py lacks the name.
_FI_GPU_RECOVERY_ACTION = int(getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230))


def _nvml(what: str, fn: Callable[..., _T], *args: Any) -> _T:
    """Call NVML; an NVMLError becomes backend.NvmlError(code, what)."""
    try:
        return fn(*args)
    except pynvml.NVMLError as error:
        raise backend.NvmlError(int(getattr(error, "value", backend.Return.UNKNOWN)), what) from None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _enum_names(prefix: str) -> dict[int, str]:
    return {
        int(getattr(pynvml, n)): n[len(prefix) :] for n in dir(pynvml) if n.startswith(prefix) and n != f"{prefix}COUNT"
    }


_BRANDS = _enum_names("NVML_BRAND_")
_ARCHITECTURES = _enum_names("NVML_DEVICE_ARCH_")
_ARCHITECTURE_NAMES = {"ADA": "Ada Lovelace"}


def _brand(code: int) -> str:
    # NVML_BRAND_NVIDIA -> "Nvidia", NVML_BRAND_QUADRO_RTX -> "QuadroRtx": the NVIDIA DRA
    # driver's spelling for the common brands.
    return "".join(part.capitalize() for part in _BRANDS.get(code, "UNKNOWN").split("_"))


def _architecture(code: int) -> str:
    name = _ARCHITECTURES.get(code, "UNKNOWN")
    return _ARCHITECTURE_NAMES.get(name, name.capitalize())


def _bus_id(raw: object) -> str:
    """NVML's "00000000:07:00.0" as sysfs spells it: "0000:07:00.0"."""
    domain, rest = _text(raw).lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _pcie_root(bus_id: str) -> str | None:
    try:
        path = os.path.realpath(_SYS_PCI / bus_id)
    except OSError:
        return None
    for part in pathlib.Path(path).parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def _numa_node(bus_id: str) -> int | None:
    try:
        node = int((_SYS_PCI / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class NvmlBackend:
    """`backend.NvmlBackend` over the driver's NVML. Construction calls `nvmlInit` and raises
    `backend.NvmlError` (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, ...) when it cannot."""

    def __init__(self) -> None:
        _nvml("nvmlInit", pynvml.nvmlInit)
        self._closed = False
        self._event_set: Any = None
        self._handles: dict[int, Any] = {}
        self._indices: dict[int, int] = {}
        for index in range(int(_nvml("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))):
            handle = _nvml(f"nvmlDeviceGetHandleByIndex({index})", pynvml.nvmlDeviceGetHandleByIndex, index)
            minor = int(_nvml(f"nvmlDeviceGetMinorNumber(index {index})", pynvml.nvmlDeviceGetMinorNumber, handle))
            self._handles[minor] = handle
            self._indices[minor] = index

    def _handle(self, minor: int) -> Any:
        handle = self._handles.get(minor)
        if handle is None:
            raise backend.NvmlError(backend.Return.NOT_FOUND, f"no GPU with minor number {minor}")
        return handle

    # --- Reads ---

    def driver_info(self) -> backend.DriverInfo:
        driver = _text(_nvml("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
        cuda = int(_nvml("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2))
        return backend.DriverInfo(driver_version=driver, cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}")

    def gpus(self) -> tuple[backend.GpuInfo, ...]:
        return tuple(self._gpu(minor) for minor in sorted(self._handles))

    def _gpu(self, minor: int) -> backend.GpuInfo:
        h = self._handle(minor)
        what = f"GPU {minor}"
        bus = _bus_id(_nvml(f"{what}: nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, h).busId)
        major, cc_minor = _nvml(
            f"{what}: nvmlDeviceGetCudaComputeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, h
        )
        try:
            mig_mode = backend.MigMode(int(_nvml(f"{what}: nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)[0]))
            mig_capable = True
        except backend.NvmlError as error:
            if error.code != backend.Return.NOT_SUPPORTED:
                raise
            mig_mode, mig_capable = backend.MigMode.DISABLED, False
        return backend.GpuInfo(
            minor=minor,
            index=self._indices[minor],
            uuid=_text(_nvml(f"{what}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h)),
            name=_text(_nvml(f"{what}: nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h)),
            brand=_brand(int(_nvml(f"{what}: nvmlDeviceGetBrand", pynvml.nvmlDeviceGetBrand, h))),
            architecture=_architecture(
                int(_nvml(f"{what}: nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, h))
            ),
            cuda_compute_capability=(int(major), int(cc_minor)),
            memory_bytes=int(_nvml(f"{what}: nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h).total),
            pci_bus_id=bus,
            pcie_root=_pcie_root(bus),
            numa_node=_numa_node(bus),
            mig_capable=mig_capable,
            mig_mode=mig_mode,
            fabric=self._fabric(h),
        )

    def _fabric(self, h: Any) -> backend.FabricInfo | None:
        # A GPU with an active NVLink reports its HGX module id; the Fabric Manager's shared
        # partitions are not NVML's to tell, so they stay empty here. PCIe-only GPUs (no
        # NVLink, NOT_SUPPORTED) and drivers without the call report no fabric at all.
        try:
            if int(pynvml.nvmlDeviceGetNvLinkState(h, 0)) != 1:
                return None
            module = int(pynvml.nvmlDeviceGetModuleId(h))
        except (pynvml.NVMLError, AttributeError):
            return None
        return backend.FabricInfo(module_id=module) if module > 0 else None

    def gpu_instance_profiles(self, minor: int) -> tuple[backend.GpuInstanceProfile, ...]:
        h = self._handle(minor)
        profiles = []
        for index in range(_GI_PROFILE_COUNT):
            if index in _SKIPPED_GI_PROFILES:
                continue
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except pynvml.NVMLError as error:
                code = int(getattr(error, "value", backend.Return.UNKNOWN))
                if code in (backend.Return.NOT_SUPPORTED, backend.Return.INVALID_ARGUMENT):
                    continue  # a profile this GPU does not have
                raise backend.NvmlError(code, f"GPU {minor}: nvmlDeviceGetGpuInstanceProfileInfo({index})") from None
            profiles.append(
                backend.GpuInstanceProfile(
                    id=int(info.id),
                    name=_text(info.name).removeprefix("MIG ").strip(),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    memory_bytes=int(info.memorySizeMB) * _MIB,
                    multiprocessors=int(info.multiprocessorCount),
                    engines=backend.Engines(
                        copy_engines=int(info.copyEngineCount),
                        decoders=int(info.decoderCount),
                        encoders=int(info.encoderCount),
                        jpeg_engines=int(info.jpegCount),
                        ofa_engines=int(info.ofaCount),
                    ),
                    placements=self._placements(h, minor, int(info.id)),
                )
            )
        if not profiles:
            raise backend.NvmlError(backend.Return.NOT_SUPPORTED, f"GPU {minor}: no MIG profiles (no MIG support)")
        return tuple(sorted(profiles, key=lambda p: (p.slice_count, p.memory_bytes, p.id)))

    def _placements(self, h: Any, minor: int, profile_id: int) -> tuple[backend.Placement, ...]:
        what = f"GPU {minor}: nvmlDeviceGetGpuInstancePossiblePlacements({profile_id})"
        count = ctypes.c_uint(0)
        _nvml(what, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, None, ctypes.byref(count))
        array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        _nvml(what, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, array, ctypes.byref(count))
        return tuple(sorted(backend.Placement(start=int(p.start), size=int(p.size)) for p in array[: count.value]))

    def _gi_handles(self, minor: int) -> list[tuple[Any, Any]]:
        """(GI handle, GI info) for every GPU instance; empty when MIG is off."""
        h = self._handle(minor)
        result = []
        for profile in self._profiles_or_empty(minor):
            count = ctypes.c_uint(0)
            array = (pynvml.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
            try:
                pynvml.nvmlDeviceGetGpuInstances(h, profile.id, array, ctypes.byref(count))
            except pynvml.NVMLError as error:
                code = int(getattr(error, "value", backend.Return.UNKNOWN))
                if code in (backend.Return.NOT_SUPPORTED, backend.Return.INVALID_STATE):
                    return []  # MIG mode is off: no instances
                raise backend.NvmlError(code, f"GPU {minor}: nvmlDeviceGetGpuInstances({profile.id})") from None
            for gi in array[: count.value]:
                result.append((gi, _nvml(f"GPU {minor}: nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)))
        return result

    def _profiles_or_empty(self, minor: int) -> tuple[backend.GpuInstanceProfile, ...]:
        try:
            return self.gpu_instance_profiles(minor)
        except backend.NvmlError as error:
            if error.code == backend.Return.NOT_SUPPORTED:
                return ()
            raise

    def gpu_instances(self, minor: int) -> tuple[backend.GpuInstance, ...]:
        return tuple(
            sorted(
                (
                    backend.GpuInstance(
                        parent_minor=minor,
                        gi_id=int(info.id),
                        profile_id=int(info.profileId),
                        placement=backend.Placement(start=int(info.placement.start), size=int(info.placement.size)),
                    )
                    for _, info in self._gi_handles(minor)
                ),
                key=lambda gi: gi.gi_id,
            )
        )

    def _gi(self, minor: int, gi_id: int) -> Any:
        return _nvml(
            f"GPU {minor}: GPU instance {gi_id}", pynvml.nvmlDeviceGetGpuInstanceById, self._handle(minor), gi_id
        )

    def _ci_profiles(self, gi: Any, minor: int) -> list[Any]:
        infos = []
        engines = getattr(pynvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        for index in range(_CI_PROFILE_COUNT):
            if index in _CI_SKIPPED:
                continue
            try:
                infos.append(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, engines))
            except pynvml.NVMLError as error:
                code = int(getattr(error, "value", backend.Return.UNKNOWN))
                if code not in (backend.Return.NOT_SUPPORTED, backend.Return.INVALID_ARGUMENT):
                    raise backend.NvmlError(
                        code, f"GPU {minor}: nvmlGpuInstanceGetComputeInstanceProfileInfo"
                    ) from None
        return infos

    def compute_instances(self, minor: int, *, gi_id: int) -> tuple[backend.ComputeInstance, ...]:
        gi = self._gi(minor, gi_id)
        result = []
        for profile in self._ci_profiles(gi, minor):
            count = ctypes.c_uint(0)
            array = (pynvml.c_nvmlComputeInstance_t * max(int(profile.instanceCount), 1))()
            _nvml(
                f"GPU {minor}: nvmlGpuInstanceGetComputeInstances",
                pynvml.nvmlGpuInstanceGetComputeInstances,
                gi,
                int(profile.id),
                array,
                ctypes.byref(count),
            )
            for ci in array[: count.value]:
                info = _nvml(f"GPU {minor}: nvmlComputeInstanceGetInfo", pynvml.nvmlComputeInstanceGetInfo, ci)
                result.append(
                    backend.ComputeInstance(
                        parent_minor=minor, gi_id=gi_id, ci_id=int(info.id), slice_count=int(profile.sliceCount)
                    )
                )
        return tuple(sorted(result, key=lambda ci: ci.ci_id))

    def mig_devices(self, minor: int) -> tuple[backend.MigDevice, ...]:
        h = self._handle(minor)
        gis = {int(info.id): info for _, info in self._gi_handles(minor)}
        if not gis:
            return ()
        profiles = {p.id: p for p in self.gpu_instance_profiles(minor)}
        parent_uuid = _text(_nvml(f"GPU {minor}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h))
        devices = []
        for index in range(
            int(_nvml(f"GPU {minor}: nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h))
        ):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
            except pynvml.NVMLError as error:
                if int(getattr(error, "value", 0)) == backend.Return.NOT_FOUND:
                    continue  # an unused MIG device index
                raise backend.NvmlError(
                    int(getattr(error, "value", backend.Return.UNKNOWN)),
                    f"GPU {minor}: nvmlDeviceGetMigDeviceHandleByIndex({index})",
                ) from None
            gi_id = int(_nvml(f"GPU {minor}: nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(
                _nvml(f"GPU {minor}: nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig)
            )
            info = gis.get(gi_id)
            if info is None:
                continue  # destroyed between the two reads
            profile = profiles.get(int(info.profileId))
            devices.append(
                backend.MigDevice(
                    uuid=_text(_nvml(f"GPU {minor}: MIG nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig)),
                    parent_minor=minor,
                    parent_uuid=parent_uuid,
                    profile_id=int(info.profileId),
                    profile_name=profile.name if profile is not None else f"profile-{int(info.profileId)}",
                    placement=backend.Placement(start=int(info.placement.start), size=int(info.placement.size)),
                    gi_id=gi_id,
                    ci_id=ci_id,
                    memory_bytes=int(
                        _nvml(f"GPU {minor}: MIG nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, mig).total
                    ),
                )
            )
        return tuple(sorted(devices, key=lambda d: (d.placement.start, d.gi_id, d.ci_id)))

    def compute_mode(self, minor: int) -> backend.ComputeMode:
        mode = int(
            _nvml(f"GPU {minor}: nvmlDeviceGetComputeMode", pynvml.nvmlDeviceGetComputeMode, self._handle(minor))
        )
        return backend.ComputeMode(mode)

    def recovery_action(self, minor: int) -> backend.RecoveryAction:
        what = f"GPU {minor}: nvmlDeviceGetFieldValues(GPU recovery action)"
        (value,) = _nvml(what, pynvml.nvmlDeviceGetFieldValues, self._handle(minor), [_FI_GPU_RECOVERY_ACTION])
        if int(value.nvmlReturn) != backend.Return.SUCCESS:
            raise backend.NvmlError(int(value.nvmlReturn), what)
        try:
            return backend.RecoveryAction(int(value.value.uiVal))
        except ValueError:
            raise backend.NvmlError(
                backend.Return.NOT_SUPPORTED, f"{what}: unknown action {value.value.uiVal}"
            ) from None

    # --- Changes ---

    def set_mig_mode(self, minor: int, mode: backend.MigMode) -> None:
        h = self._handle(minor)
        current = int(_nvml(f"GPU {minor}: nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)[0])
        status = int(
            _nvml(f"GPU {minor}: nvmlDeviceSetMigMode({int(mode)})", pynvml.nvmlDeviceSetMigMode, h, int(mode))
        )
        if status != backend.Return.SUCCESS:
            # The change is pending until a GPU reset (Ampere), which would switch the GPU under
            # whatever runs on it then: withdraw it, so nothing changes behind the agent's back.
            try:
                pynvml.nvmlDeviceSetMigMode(h, current)
            except pynvml.NVMLError:
                pass
            raise backend.NvmlError(
                status,
                f"GPU {minor}: MIG mode {mode.name} takes effect only after a GPU reset on this GPU, "
                "so the change was withdrawn",
            )

    def create_gpu_instance(self, minor: int, *, profile_id: int, placement: backend.Placement) -> backend.GpuInstance:
        c_placement = pynvml.c_nvmlGpuInstancePlacement_t()
        c_placement.start = placement.start
        c_placement.size = placement.size
        gi = _nvml(
            f"GPU {minor}: create GPU instance profile {profile_id} at {placement.start}+{placement.size}",
            pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            self._handle(minor),
            profile_id,
            ctypes.byref(c_placement),
        )
        info = _nvml(f"GPU {minor}: nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
        return backend.GpuInstance(
            parent_minor=minor,
            gi_id=int(info.id),
            profile_id=int(info.profileId),
            placement=backend.Placement(start=int(info.placement.start), size=int(info.placement.size)),
        )

    def create_compute_instance(self, minor: int, *, gi_id: int) -> backend.MigDevice:
        gi = self._gi(minor, gi_id)
        gi_info = _nvml(f"GPU {minor}: nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
        gi_profile = next((p for p in self.gpu_instance_profiles(minor) if p.id == int(gi_info.profileId)), None)
        slices = gi_profile.slice_count if gi_profile is not None else 0
        # The compute instance that spans the whole GPU instance: the CI profile with the most
        # slices that fits (equal to the GI's slice count).
        candidates = [p for p in self._ci_profiles(gi, minor) if not slices or int(p.sliceCount) <= slices]
        if not candidates:
            raise backend.NvmlError(
                backend.Return.NOT_SUPPORTED, f"GPU {minor}: GPU instance {gi_id} has no compute profile"
            )
        profile = max(candidates, key=lambda p: int(p.sliceCount))
        ci = _nvml(
            f"GPU {minor}: create compute instance in GPU instance {gi_id}",
            pynvml.nvmlGpuInstanceCreateComputeInstance,
            gi,
            int(profile.id),
        )
        ci_id = int(_nvml(f"GPU {minor}: nvmlComputeInstanceGetInfo", pynvml.nvmlComputeInstanceGetInfo, ci).id)
        for device in self.mig_devices(minor):
            if device.gi_id == gi_id and device.ci_id == ci_id:
                return device
        raise backend.NvmlError(backend.Return.NOT_FOUND, f"GPU {minor}: MIG device of GI {gi_id} CI {ci_id} not found")

    def destroy_compute_instance(self, minor: int, *, gi_id: int, ci_id: int) -> None:
        gi = self._gi(minor, gi_id)
        ci = _nvml(
            f"GPU {minor}: GI {gi_id} compute instance {ci_id}",
            pynvml.nvmlGpuInstanceGetComputeInstanceById,
            gi,
            ci_id,
        )
        _nvml(f"GPU {minor}: destroy GI {gi_id} CI {ci_id}", pynvml.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, minor: int, *, gi_id: int) -> None:
        _nvml(f"GPU {minor}: destroy GPU instance {gi_id}", pynvml.nvmlGpuInstanceDestroy, self._gi(minor, gi_id))

    def set_compute_mode(self, minor: int, mode: backend.ComputeMode) -> None:
        _nvml(
            f"GPU {minor}: nvmlDeviceSetComputeMode({mode.name})",
            pynvml.nvmlDeviceSetComputeMode,
            self._handle(minor),
            int(mode),
        )

    def set_time_slice(self, minor: int, time_slice: backend.TimeSlice) -> None:
        uuid = _text(_nvml(f"GPU {minor}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, self._handle(minor)))
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise backend.NvmlError(backend.Return.NOT_SUPPORTED, "nvidia-smi not found: cannot set the time-slice")
        done = subprocess.run(
            [smi, "compute-policy", "-i", uuid, f"--set-timeslice={int(time_slice)}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            message = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
            code = backend.Return.NOT_SUPPORTED if "not supported" in message.lower() else backend.Return.UNKNOWN
            raise backend.NvmlError(code, f"GPU {minor}: nvidia-smi compute-policy: {message}")

    # --- Events ---

    def wait_events(self, *, timeout_s: float) -> tuple[backend.Event, ...]:
        if self._event_set is None:
            self._event_set = _nvml("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
            for registered, h in self._handles.items():
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
                except pynvml.NVMLError as error:
                    code = int(getattr(error, "value", backend.Return.UNKNOWN))
                    if code == backend.Return.GPU_IS_LOST:
                        return (backend.Event(kind=backend.EventKind.GPU_LOST, minor=registered),)
                    if code != backend.Return.NOT_SUPPORTED:
                        raise backend.NvmlError(code, f"GPU {registered}: nvmlDeviceRegisterEvents") from None
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, int(max(timeout_s, 0.0) * 1000))
        except pynvml.NVMLError as error:
            code = int(getattr(error, "value", backend.Return.UNKNOWN))
            if code == backend.Return.TIMEOUT:
                return ()
            if code == backend.Return.GPU_IS_LOST:
                return (backend.Event(kind=backend.EventKind.GPU_LOST),)
            raise backend.NvmlError(code, "nvmlEventSetWait") from None
        minor = next(
            (
                m
                for m, h in self._handles.items()
                if ctypes.cast(h, ctypes.c_void_p).value == ctypes.cast(data.device, ctypes.c_void_p).value
            ),
            None,
        )
        if minor is None:
            return (backend.Event(kind=backend.EventKind.GPU_LOST),)
        gpu_uuid = _text(_nvml(f"GPU {minor}: nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, self._handles[minor]))
        mig_uuid = None
        gi_id, ci_id = int(data.gpuInstanceId), int(data.computeInstanceId)
        if gi_id != 0xFFFFFFFF:
            mig_uuid = next((d.uuid for d in self.mig_devices(minor) if d.gi_id == gi_id and d.ci_id == ci_id), None)
        return (
            backend.Event(
                kind=backend.EventKind.XID, minor=minor, gpu_uuid=gpu_uuid, mig_uuid=mig_uuid, xid=int(data.eventData)
            ),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # Shutting down a broken NVML has nothing left to release.
