"""The node's GPUs read once from a backend: one plain value that slices are built from.

What it does: asks an `backend.NvmlBackend` for the driver versions, every GPU, the
GPU-instance profiles of MIG-capable GPUs and the MIG devices that exist, and returns them
as one frozen `Inventory`. What it must not do: change anything on the GPUs, decide what to
publish (that is `slices`), or know about Kubernetes.
"""

from __future__ import annotations

import dataclasses

from dractl.node import backend

__all__ = ["Gpu", "Inventory", "read"]


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU. `profiles` is empty for a GPU without MIG; `mig_devices` lists the
    MIG devices that exist now (empty when MIG mode is off). `lost` is set when NVML said
    GPU_IS_LOST while reading it: the GPU is still listed (so health can taint it) but its
    MIG details are unknown."""

    info: backend.GpuInfo
    profiles: tuple[backend.GpuInstanceProfile, ...] = ()
    mig_devices: tuple[backend.MigDevice, ...] = ()
    lost: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    """What the node has, sorted by GPU minor number. Equal hardware gives equal values."""

    driver: backend.DriverInfo
    gpus: tuple[Gpu, ...]


def read(nvml: backend.NvmlBackend) -> Inventory:
    """Read the inventory. Only reads; raises `backend.NvmlError` when NVML itself fails
    (a single lost GPU does not fail the read: it is returned with `lost=True`)."""
    driver = nvml.driver_info()
    gpus = []
    for info in sorted(nvml.gpus(), key=lambda g: g.minor):
        try:
            profiles = nvml.gpu_instance_profiles(info.minor) if info.mig_capable else ()
            devices = nvml.mig_devices(info.minor) if info.mig_mode is backend.MigMode.ENABLED else ()
        except backend.NvmlError as error:
            if error.code != backend.Return.GPU_IS_LOST:
                raise
            gpus.append(Gpu(info=info, lost=True))
            continue
        gpus.append(Gpu(info=info, profiles=profiles, mig_devices=devices))
    return Inventory(driver=driver, gpus=tuple(gpus))
