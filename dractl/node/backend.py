"""The NVML boundary of the node agent: the `NvmlBackend` Protocol and its plain values.

What it does: names every question the node agent asks the GPUs (inventory, MIG profiles
and placements, existing MIG devices, events) and every change it makes (MIG mode, GPU and
compute instances, compute mode, time-slice), as one Protocol over frozen values. Two
implementations exist: `nvml.NvmlBackend` over `pynvml` (the only module that imports it)
and `fakegpu.FakeGpus`, a deterministic in-memory fake for tests and `dractl discover`.

What it must not do: import `pynvml`, do I/O, or know about Kubernetes. Every failure of a
backend operation is an `NvmlError` carrying NVML's return code, so callers branch on
`err.code == backend.Return.NOT_FOUND` the same way for the fake and the real library.

GPUs are addressed by their NVML *minor number* (`/dev/nvidia<minor>`), the number the
NVIDIA DRA driver puts in device names (`gpu-<minor>`), never by enumeration index.
MIG is addressed NVML's way: GPU-instance profiles by their profile *id* (the value of
`nvmlGpuInstanceProfileInfo_t.id`, e.g. 19 for A100-80GB's `1g.10gb`), GPU instances by
their GI id and compute instances by (GI id, CI id) within their parent GPU.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol

__all__ = [
    "Return",
    "NvmlError",
    "MigMode",
    "ComputeMode",
    "TimeSlice",
    "EventKind",
    "RecoveryAction",
    "Engines",
    "FabricInfo",
    "DriverInfo",
    "GpuInfo",
    "Placement",
    "GpuInstanceProfile",
    "GpuInstance",
    "ComputeInstance",
    "MigDevice",
    "Event",
    "NvmlBackend",
]


class Return(enum.IntEnum):
    """NVML's `nvmlReturn_t` error codes (the values are NVML's, so real codes map 1:1)."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    VGPU_ECC_NOT_SUPPORTED = 22
    INSUFFICIENT_RESOURCES = 23
    FREQ_NOT_SUPPORTED = 24
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    RESET_TYPE_NOT_SUPPORTED = 30
    UNKNOWN = 999


class NvmlError(Exception):
    """A failed NVML call: `code` is NVML's return code, `name` its `NVML_ERROR_*` spelling.

    `str(err)` is one line: `NVML_ERROR_NOT_FOUND: <what was being done>`. Codes NVML adds
    later than `Return` knows keep their number (`name` is then `NVML_ERROR_<code>`).
    """

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)

    @property
    def name(self) -> str:
        try:
            return f"NVML_ERROR_{Return(self.code).name}"
        except ValueError:
            return f"NVML_ERROR_{self.code}"

    def __reduce__(self) -> tuple[type[NvmlError], tuple[int, str]]:
        # Exceptions with a custom __init__ need this to survive pickling (multiprocessing).
        return (type(self), (self.code, self.message))


class MigMode(enum.IntEnum):
    """`NVML_DEVICE_MIG_DISABLE` / `NVML_DEVICE_MIG_ENABLE`."""

    DISABLED = 0
    ENABLED = 1


class ComputeMode(enum.IntEnum):
    """`nvmlComputeMode_t` (EXCLUSIVE_THREAD, 1, is deprecated by NVIDIA and not offered)."""

    DEFAULT = 0
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


class TimeSlice(enum.IntEnum):
    """The time-slice lengths of `nvidia-smi compute-policy --set-timeslice` (0-3)."""

    DEFAULT = 0
    SHORT = 1
    MEDIUM = 2
    LONG = 3


class EventKind(enum.Enum):
    XID = "xid"  # an Xid error (`nvmlEventTypeXidCriticalError`); `Event.xid` holds the code
    GPU_LOST = "gpu-lost"  # NVML answered GPU_IS_LOST, or an event named no known device


class RecoveryAction(enum.IntEnum):
    """`nvmlDeviceGpuRecoveryAction_t`: what the driver says a GPU needs before it is used again."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def resets(self) -> bool:
        """Whether the GPU must be reset (or the node rebooted) before it takes work again."""
        return self in (
            RecoveryAction.GPU_RESET,
            RecoveryAction.NODE_REBOOT,
            RecoveryAction.DRAIN_AND_RESET,
            RecoveryAction.BUS_RESET,
            RecoveryAction.SYSTEM_REBOOT,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Engines:
    """Engine counts of a GPU or a GPU-instance profile (NVML's copyEngineCount etc.)."""

    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class FabricInfo:
    """Where a GPU sits on an NVLink fabric (`nvmlDeviceGetGpuFabricInfo` + Fabric Manager).

    `cluster_uuid` and `clique_id` identify the NVLink domain (multi-node NVLink); `module_id`
    is the HGX module number (1-8) when the platform reports one; `partitions` are the
    Fabric Manager shared-NVLink partitions containing this GPU as (GPU count, partition
    id) pairs, sorted by count descending (e.g. ((8, 0), (4, 1), (2, 3), (1, 7))).
    """

    cluster_uuid: str = ""
    clique_id: int = 0
    module_id: int | None = None
    partitions: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DriverInfo:
    """Host-wide versions: `driver_version` as NVML prints it ("580.126.20"), and the CUDA
    driver API version as "major.minor" ("13.0", from `nvmlSystemGetCudaDriverVersion_v2`)."""

    driver_version: str
    cuda_driver_version: str


@dataclasses.dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts of one physical GPU; `mig_mode` is the *current* mode when read.

    `pci_bus_id` is normalized to the sysfs form `0000:18:00.0` (lower case, 4-digit
    domain); `pcie_root` is the PCIe root complex as sysfs names it (`pci0000:15`) or None
    when not found; `numa_node` is None when the platform reports none. `memory_bytes` is
    the framebuffer size NVML reports (`nvmlMemory_t.total`).
    """

    minor: int
    index: int
    uuid: str
    name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str
    pcie_root: str | None = None
    numa_node: int | None = None
    multiprocessors: int = 0
    engines: Engines = Engines()
    mig_capable: bool = False
    mig_mode: MigMode = MigMode.DISABLED
    fabric: FabricInfo | None = None


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Placement:
    """A GPU-instance placement: `size` memory slices starting at slice `start`."""

    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """A GPU-instance profile the GPU supports, with every placement NVML allows for it.

    `id` is NVML's profile id (`nvmlGpuInstanceProfileInfo_t.id`), used both in the NVIDIA
    driver's device names and in `create_gpu_instance`. `name` is the short form `1g.10gb`
    (NVML's v2 info says `MIG 1g.10gb`). `slice_count` counts compute slices (the `1g`);
    the memory slices a placement covers are `Placement.size`. `placements` are sorted by
    start.
    """

    id: int
    name: str
    slice_count: int
    instance_count: int
    memory_bytes: int
    multiprocessors: int
    engines: Engines
    placements: tuple[Placement, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GpuInstance:
    parent_minor: int
    gi_id: int
    profile_id: int
    placement: Placement


@dataclasses.dataclass(frozen=True, slots=True)
class ComputeInstance:
    parent_minor: int
    gi_id: int
    ci_id: int
    slice_count: int


@dataclasses.dataclass(frozen=True, slots=True)
class MigDevice:
    """A usable MIG device: a compute instance inside a GPU instance, with its MIG UUID."""

    uuid: str
    parent_minor: int
    parent_uuid: str
    profile_id: int
    profile_name: str
    placement: Placement
    gi_id: int
    ci_id: int
    memory_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One health event. `minor` and `gpu_uuid` are None when NVML could not say which GPU
    (then the event is GPU_LOST for every device); `mig_uuid` names the MIG device when
    the event came from one."""

    kind: EventKind
    minor: int | None = None
    gpu_uuid: str | None = None
    mig_uuid: str | None = None
    xid: int = 0


class NvmlBackend(Protocol):
    """The GPUs of one node, as NVML sees them. Every method may raise `NvmlError`.

    Reads are pure with respect to the backend (calling twice returns equal values when
    nothing changed in between). Changes are *not* idempotent, by design, as in NVML:
    creating an instance twice at the same placement fails with INSUFFICIENT_RESOURCES and
    destroying an unknown one fails with NOT_FOUND; the caller (node state) decides what
    a retry means. Implementations are not required to be thread-safe: the node agent
    serializes calls under its state lock (event reading may run on its own thread).
    """

    def driver_info(self) -> DriverInfo:
        """The host's driver and CUDA driver versions."""
        ...

    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every physical GPU, sorted by minor number."""
        ...

    def gpu_instance_profiles(self, minor: int) -> tuple[GpuInstanceProfile, ...]:
        """The GPU-instance profiles of a MIG-capable GPU with their placements, sorted by
        (slice count, memory, id); NOT_SUPPORTED for a GPU without MIG; readable whatever
        the current MIG mode. Profiles NVML reports unsupported are left out."""
        ...

    def gpu_instances(self, minor: int) -> tuple[GpuInstance, ...]:
        """The GPU instances that exist now, sorted by GI id (empty when MIG is off)."""
        ...

    def compute_instances(self, minor: int, *, gi_id: int) -> tuple[ComputeInstance, ...]:
        """The compute instances of one GPU instance, sorted by CI id; NOT_FOUND if no GI."""
        ...

    def mig_devices(self, minor: int) -> tuple[MigDevice, ...]:
        """Every MIG device (GI + CI) of the GPU, sorted by (placement start, GI, CI)."""
        ...

    def set_mig_mode(self, minor: int, mode: MigMode) -> None:
        """Enable or disable MIG. NOT_SUPPORTED on a GPU without MIG; IN_USE when disabling
        with GPU instances left. Setting the current mode again succeeds."""
        ...

    def create_gpu_instance(self, minor: int, *, profile_id: int, placement: Placement) -> GpuInstance:
        """Create a GPU instance at an exact placement (`CreateGpuInstanceWithPlacement`).

        As NVML: NOT_SUPPORTED when MIG mode is off (or the GPU has no MIG);
        INVALID_ARGUMENT for a profile id the GPU lacks or a placement the profile does not
        allow; INSUFFICIENT_RESOURCES when the placement overlaps an existing GPU instance.
        """
        ...

    def create_compute_instance(self, minor: int, *, gi_id: int) -> MigDevice:
        """Create the compute instance spanning the whole GPU instance and return the MIG
        device it makes. NOT_FOUND if no such GI; INSUFFICIENT_RESOURCES if it has one."""
        ...

    def destroy_compute_instance(self, minor: int, *, gi_id: int, ci_id: int) -> None:
        """Destroy one compute instance. NOT_FOUND if the GI or CI does not exist."""
        ...

    def destroy_gpu_instance(self, minor: int, *, gi_id: int) -> None:
        """Destroy one GPU instance. NOT_FOUND if unknown; IN_USE while it has compute
        instances (destroy those first)."""
        ...

    def compute_mode(self, minor: int) -> ComputeMode:
        """The GPU's current compute mode."""
        ...

    def set_compute_mode(self, minor: int, mode: ComputeMode) -> None:
        """Set the compute mode (EXCLUSIVE_PROCESS for MPS, DEFAULT otherwise)."""
        ...

    def recovery_action(self, minor: int) -> RecoveryAction:
        """What the driver says the GPU needs after an error (NVML's GPU recovery action field):
        NONE until an error that needs a reset, then that action until the GPU is reset.
        NOT_SUPPORTED on drivers that cannot tell."""
        ...

    def set_time_slice(self, minor: int, time_slice: TimeSlice) -> None:
        """Set the time-slice length for processes sharing the GPU; NOT_SUPPORTED where the
        GPU or driver cannot (callers treat that as a no-op, as the NVIDIA driver does)."""
        ...

    def wait_events(self, *, timeout_s: float) -> tuple[Event, ...]:
        """Block up to `timeout_s` seconds for health events; return those that arrived
        (empty on timeout). Registers for every GPU on the first call."""
        ...

    def close(self) -> None:
        """Release NVML (idempotent). Other calls after close are undefined."""
        ...
