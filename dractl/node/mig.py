"""MIG devices at prepare time: parse MIG device names, create and destroy dynamic instances.

What it does: reads the NVIDIA driver's MIG device name (`gpu-<minor>-mig-<profile>-<GI
profile id>-<placement start>`), creates a GPU instance at exactly the allocated placement
and its compute instance through the backend, destroys instances (compute instances first,
NOT_FOUND tolerated so a retry after a crash converges), finds instances (and the usable
MIG device, for a rebuilt state) at a recorded placement, and reads the `/dev/nvidia-caps`
minors a MIG device needs from procfs. What it must not do: decide which instance to create
(the allocation did) or keep state (the checkpoint records what was created).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

from dractl.node import backend, slices

__all__ = [
    "MigName",
    "parse_name",
    "placement_of",
    "create",
    "destroy",
    "destroy_at",
    "find",
    "existing_at",
    "cap_minors",
]

_NAME = re.compile(r"^gpu-(?P<minor>[0-9]+)-mig-(?P<profile>[a-z0-9-]+?)-(?P<pid>[0-9]+)-(?P<start>[0-9]+)\Z")


@dataclasses.dataclass(frozen=True, slots=True)
class MigName:
    """What a MIG device name says: parent GPU minor, profile (without dots), GI profile id
    and placement start."""

    parent_minor: int
    profile: str
    profile_id: int
    start: int

    def names(self, profile: backend.GpuInstanceProfile) -> bool:
        """Whether this name is the one `slices` publishes for `profile` at this start, so a
        name whose profile text disagrees with its profile id (stale hardware) is caught."""
        return str(self) == slices.mig_device_name(self.parent_minor, profile.name, profile.id, self.start)

    def __str__(self) -> str:
        return f"gpu-{self.parent_minor}-mig-{self.profile}-{self.profile_id}-{self.start}"


def parse_name(device: str) -> MigName | None:
    """The parts of a MIG device name, or None when `device` is not a MIG device name. Pure."""
    match = _NAME.match(device)
    if match is None:
        return None
    return MigName(
        parent_minor=int(match["minor"]),
        profile=match["profile"],
        profile_id=int(match["pid"]),
        start=int(match["start"]),
    )


def placement_of(gpus: backend.NvmlBackend, name: MigName) -> backend.Placement:
    """The full placement (start and size) of a named MIG device, from the GPU's profiles.

    Raises ValueError when the GPU has no such profile or the profile no such placement
    (a stale allocation against different hardware).
    """
    for profile in gpus.gpu_instance_profiles(name.parent_minor):
        if profile.id == name.profile_id:
            if not name.names(profile):
                raise ValueError(
                    f"GPU {name.parent_minor} MIG profile id {profile.id} is {profile.name}, not {name.profile}"
                )
            for placement in profile.placements:
                if placement.start == name.start:
                    return placement
            raise ValueError(
                f"GPU {name.parent_minor} profile {profile.name} (id {profile.id})"
                f" has no placement starting at {name.start}"
            )
    raise ValueError(f"GPU {name.parent_minor} has no MIG profile with id {name.profile_id}")


def find(
    gpus: backend.NvmlBackend, *, minor: int, profile_id: int, placement: backend.Placement
) -> tuple[backend.GpuInstance, ...]:
    """GPU instances that sit exactly at `placement` with `profile_id` (at most one on real hardware)."""
    return tuple(gi for gi in gpus.gpu_instances(minor) if gi.profile_id == profile_id and gi.placement == placement)


def existing_at(
    gpus: backend.NvmlBackend, *, minor: int, profile_id: int, placement: backend.Placement
) -> backend.MigDevice | None:
    """The usable MIG device (GPU instance with its compute instance) at exactly `placement` with
    `profile_id`, or None: none there, or a GPU instance whose compute instance was never made."""
    for device in gpus.mig_devices(minor):
        if device.profile_id == profile_id and device.placement == placement:
            return device
    return None


def existing_device(gpus: backend.NvmlBackend, name: MigName) -> backend.MigDevice | None:
    """The MIG device (GI + CI) that exists now under a static-MIG device name, if any: same
    parent, profile id, start, and the profile text `slices` would publish for it."""
    for device in gpus.mig_devices(name.parent_minor):
        if device.profile_id == name.profile_id and device.placement.start == name.start:
            published = slices.mig_device_name(
                name.parent_minor, device.profile_name, device.profile_id, device.placement.start
            )
            if published == str(name):
                return device
    return None


def create(
    gpus: backend.NvmlBackend,
    *,
    minor: int,
    mig_mode: backend.MigMode,
    profile_id: int,
    placement: backend.Placement,
) -> backend.MigDevice:
    """Create the GPU instance at `placement` and its compute instance; enable MIG mode first
    when `mig_mode` (the GPU's mode as the caller last read it; nothing is read again here)
    is off. Not idempotent (the caller rolls back through the checkpoint): if the compute
    instance cannot be made, the new GPU instance is destroyed before re-raising.
    """
    if mig_mode is backend.MigMode.DISABLED:
        gpus.set_mig_mode(minor, backend.MigMode.ENABLED)
    gi = gpus.create_gpu_instance(minor, profile_id=profile_id, placement=placement)
    try:
        return gpus.create_compute_instance(minor, gi_id=gi.gi_id)
    except backend.NvmlError:
        destroy(gpus, minor=minor, gi_id=gi.gi_id)
        raise


def destroy(gpus: backend.NvmlBackend, *, minor: int, gi_id: int) -> None:
    """Destroy a GPU instance and its compute instances. Idempotent: NOT_FOUND is success."""
    try:
        cis = gpus.compute_instances(minor, gi_id=gi_id)
    except backend.NvmlError as err:
        if err.code == backend.Return.NOT_FOUND:
            return
        raise
    for ci in cis:
        try:
            gpus.destroy_compute_instance(minor, gi_id=gi_id, ci_id=ci.ci_id)
        except backend.NvmlError as err:
            if err.code != backend.Return.NOT_FOUND:
                raise
    try:
        gpus.destroy_gpu_instance(minor, gi_id=gi_id)
    except backend.NvmlError as err:
        if err.code != backend.Return.NOT_FOUND:
            raise


def destroy_at(gpus: backend.NvmlBackend, *, minor: int, profile_id: int, placement: backend.Placement) -> int:
    """Destroy whatever GPU instance sits exactly at `placement` with `profile_id`; return how
    many were destroyed. Idempotent. Used to roll back a prepare whose ids were never recorded."""
    found = find(gpus, minor=minor, profile_id=profile_id, placement=placement)
    for gi in found:
        destroy(gpus, minor=minor, gi_id=gi.gi_id)
    return len(found)


def _access_minor(path: pathlib.Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def cap_minors(proc_root: pathlib.Path, *, parent_minor: int, gi_id: int, ci_id: int) -> tuple[int, ...]:
    """The `/dev/nvidia-caps/nvidia-cap<N>` numbers of a MIG device (its GI's, then its CI's),
    read from `<proc>/driver/nvidia/capabilities/gpu<m>/mig/gi<g>[/ci<c>]/access`. Missing
    files (no NVIDIA driver, fake GPUs) give fewer or no numbers."""
    gi_dir = proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{parent_minor}" / "mig" / f"gi{gi_id}"
    minors = (_access_minor(gi_dir / "access"), _access_minor(gi_dir / f"ci{ci_id}" / "access"))
    return tuple(m for m in minors if m is not None)
