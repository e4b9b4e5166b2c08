"""The `NvmlBackend` contract, run against every backend: the fake always, real NVML where a GPU is.

Reads run on any backend. Tests that create and destroy MIG instances run on real NVML only
when DRACTL_TEST_NVML_MIG=1 is set (they need a MIG-capable GPU with MIG mode on and no
instances, and root), since they change the machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from dractl.node import backend, fakegpu

_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_BUS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _real() -> backend.NvmlBackend:
    from dractl.node import nvml

    try:
        return nvml.NvmlBackend()
    except backend.NvmlError as error:
        pytest.skip(f"needs an NVIDIA GPU and driver for real NVML ({error.name}); runs where nvidia-smi works")


@pytest.fixture(params=["fake", "nvml"])
def nvml_backend(request: pytest.FixtureRequest) -> Iterator[backend.NvmlBackend]:
    """A backend with at least one GPU; for the fake, GPU 0 of a100-80gb-x8 has MIG mode on."""
    if request.param == "fake":
        fake = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name="contract-node")
        fake.set_mig_mode(0, backend.MigMode.ENABLED)
        b: backend.NvmlBackend = fake
    else:
        b = _real()
    yield b
    b.close()


@pytest.fixture
def mig_gpu(nvml_backend: backend.NvmlBackend, request: pytest.FixtureRequest) -> tuple[backend.NvmlBackend, int]:
    """A backend and the minor of a GPU with MIG on and no instances, safe to partition."""
    if not isinstance(nvml_backend, fakegpu.FakeGpus) and os.environ.get("DRACTL_TEST_NVML_MIG") != "1":
        pytest.skip("changes MIG on a real GPU: set DRACTL_TEST_NVML_MIG=1 on a machine with an idle MIG GPU")
    for gpu in nvml_backend.gpus():
        if gpu.mig_mode is backend.MigMode.ENABLED and not nvml_backend.gpu_instances(gpu.minor):
            return nvml_backend, gpu.minor
    pytest.skip("needs a GPU with MIG mode on and no GPU instances")


def test_gpus_are_sorted_by_minor_with_nvidia_uuids(nvml_backend: backend.NvmlBackend) -> None:
    """Guards the inventory shape: GPUs sorted by minor, unique GPU-... UUIDs, sysfs-style bus ids."""
    gpus = nvml_backend.gpus()
    assert gpus
    assert [g.minor for g in gpus] == sorted(g.minor for g in gpus)
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert len({g.index for g in gpus}) == len(gpus)
    for g in gpus:
        assert _UUID.match(g.uuid), g.uuid
        assert _BUS.match(g.pci_bus_id), g.pci_bus_id
        assert g.memory_bytes > 0 and g.name and g.architecture
        assert g.mig_capable or g.mig_mode is backend.MigMode.DISABLED


def test_reads_are_repeatable(nvml_backend: backend.NvmlBackend) -> None:
    """Guards that reads are pure: two reads without a change in between are equal."""
    assert nvml_backend.gpus() == nvml_backend.gpus()
    assert nvml_backend.driver_info() == nvml_backend.driver_info()


def test_driver_versions_are_dotted_numbers(nvml_backend: backend.NvmlBackend) -> None:
    """Guards the version formats the slices turn into version attributes."""
    info = nvml_backend.driver_info()
    assert re.match(r"^\d+\.\d+(\.\d+)?$", info.driver_version)
    assert re.match(r"^\d+\.\d+$", info.cuda_driver_version)


def test_profiles_have_sorted_placements_inside_the_gpu(nvml_backend: backend.NvmlBackend) -> None:
    """Guards profile shape on MIG GPUs: placements sorted, aligned to their size, within the memory slices."""
    mig = [g for g in nvml_backend.gpus() if g.mig_capable]
    if not mig:
        pytest.skip("needs a MIG-capable GPU (A100, A30, H100 ...)")
    profiles = nvml_backend.gpu_instance_profiles(mig[0].minor)
    assert profiles
    slices = max(p.start + p.size for prof in profiles for p in prof.placements)
    for prof in profiles:
        assert list(prof.placements) == sorted(prof.placements)
        assert all(p.start % p.size == 0 and p.start + p.size <= slices for p in prof.placements)
        assert 0 < prof.memory_bytes <= mig[0].memory_bytes


def test_gpu_without_mig_has_no_profiles(nvml_backend: backend.NvmlBackend) -> None:
    """Guards NVML's NOT_SUPPORTED for MIG questions on a GPU without MIG."""
    if isinstance(nvml_backend, fakegpu.FakeGpus):
        nvml_backend = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="contract-node")
    plain = [g for g in nvml_backend.gpus() if not g.mig_capable]
    if not plain:
        pytest.skip("needs a GPU without MIG")
    with pytest.raises(backend.NvmlError) as caught:
        nvml_backend.gpu_instance_profiles(plain[0].minor)
    assert caught.value.code == backend.Return.NOT_SUPPORTED


def test_compute_mode_round_trips(nvml_backend: backend.NvmlBackend) -> None:
    """Guards set_compute_mode/compute_mode (MPS sets EXCLUSIVE_PROCESS, unprepare resets DEFAULT)."""
    if not isinstance(nvml_backend, fakegpu.FakeGpus) and os.environ.get("DRACTL_TEST_NVML_MIG") != "1":
        pytest.skip("changes the compute mode of a real GPU: set DRACTL_TEST_NVML_MIG=1 to allow it")
    minor = nvml_backend.gpus()[0].minor
    nvml_backend.set_compute_mode(minor, backend.ComputeMode.EXCLUSIVE_PROCESS)
    assert nvml_backend.compute_mode(minor) is backend.ComputeMode.EXCLUSIVE_PROCESS
    nvml_backend.set_compute_mode(minor, backend.ComputeMode.DEFAULT)
    assert nvml_backend.compute_mode(minor) is backend.ComputeMode.DEFAULT


def test_wait_events_returns_nothing_on_timeout(nvml_backend: backend.NvmlBackend) -> None:
    """Guards that an event wait with nothing to report returns an empty tuple, not an error."""
    assert nvml_backend.wait_events(timeout_s=0.01) == ()


def test_unknown_gpu_is_not_found(nvml_backend: backend.NvmlBackend) -> None:
    """Guards NOT_FOUND for a minor number no GPU has."""
    with pytest.raises(backend.NvmlError) as caught:
        nvml_backend.gpu_instances(4096)
    assert caught.value.code == backend.Return.NOT_FOUND


def test_mig_lifecycle_create_list_destroy(mig_gpu: tuple[backend.NvmlBackend, int]) -> None:
    """Guards the MIG sequence the node state runs: GI at a placement, CI, MIG device listed, then destroyed."""
    b, minor = mig_gpu
    profile = b.gpu_instance_profiles(minor)[0]
    placement = profile.placements[-1]
    gi = b.create_gpu_instance(minor, profile_id=profile.id, placement=placement)
    assert gi.placement == placement and gi.profile_id == profile.id
    assert b.gpu_instances(minor) == (gi,)
    device = b.create_compute_instance(minor, gi_id=gi.gi_id)
    assert device.uuid.startswith("MIG-") and device.gi_id == gi.gi_id
    assert device.profile_name == profile.name and device.placement == placement
    assert b.mig_devices(minor) == (device,)
    assert [ci.ci_id for ci in b.compute_instances(minor, gi_id=gi.gi_id)] == [device.ci_id]
    b.destroy_compute_instance(minor, gi_id=gi.gi_id, ci_id=device.ci_id)
    b.destroy_gpu_instance(minor, gi_id=gi.gi_id)
    assert b.gpu_instances(minor) == () and b.mig_devices(minor) == ()


def test_overlapping_placement_is_insufficient_resources(mig_gpu: tuple[backend.NvmlBackend, int]) -> None:
    """Guards NVML's INSUFFICIENT_RESOURCES when a placement overlaps an existing GPU instance."""
    b, minor = mig_gpu
    profiles = b.gpu_instance_profiles(minor)
    big = max(profiles, key=lambda p: p.placements[0].size)
    small = min(profiles, key=lambda p: p.placements[0].size)
    gi = b.create_gpu_instance(minor, profile_id=big.id, placement=big.placements[0])
    try:
        with pytest.raises(backend.NvmlError) as caught:
            b.create_gpu_instance(minor, profile_id=small.id, placement=small.placements[0])
        assert caught.value.code == backend.Return.INSUFFICIENT_RESOURCES
        with pytest.raises(backend.NvmlError) as again:
            b.create_gpu_instance(minor, profile_id=big.id, placement=big.placements[0])
        assert again.value.code == backend.Return.INSUFFICIENT_RESOURCES
    finally:
        b.destroy_gpu_instance(minor, gi_id=gi.gi_id)


def test_invalid_profile_or_placement_is_invalid_argument(mig_gpu: tuple[backend.NvmlBackend, int]) -> None:
    """Guards INVALID_ARGUMENT for a profile id the GPU lacks and a placement the profile does not allow."""
    b, minor = mig_gpu
    profile = b.gpu_instance_profiles(minor)[0]
    with pytest.raises(backend.NvmlError) as unknown:
        b.create_gpu_instance(minor, profile_id=999, placement=profile.placements[0])
    assert unknown.value.code == backend.Return.INVALID_ARGUMENT
    odd = backend.Placement(start=profile.placements[0].start, size=profile.placements[0].size + 1)
    with pytest.raises(backend.NvmlError) as misplaced:
        b.create_gpu_instance(minor, profile_id=profile.id, placement=odd)
    assert misplaced.value.code == backend.Return.INVALID_ARGUMENT
    assert b.gpu_instances(minor) == ()


def test_destroy_order_and_unknown_ids(mig_gpu: tuple[backend.NvmlBackend, int]) -> None:
    """Guards IN_USE for a GI with compute instances and NOT_FOUND for ids that do not exist."""
    b, minor = mig_gpu
    profile = b.gpu_instance_profiles(minor)[0]
    gi = b.create_gpu_instance(minor, profile_id=profile.id, placement=profile.placements[0])
    device = b.create_compute_instance(minor, gi_id=gi.gi_id)
    with pytest.raises(backend.NvmlError) as in_use:
        b.destroy_gpu_instance(minor, gi_id=gi.gi_id)
    assert in_use.value.code == backend.Return.IN_USE
    b.destroy_compute_instance(minor, gi_id=gi.gi_id, ci_id=device.ci_id)
    b.destroy_gpu_instance(minor, gi_id=gi.gi_id)
    for call in (
        lambda: b.destroy_gpu_instance(minor, gi_id=gi.gi_id),
        lambda: b.destroy_compute_instance(minor, gi_id=gi.gi_id, ci_id=device.ci_id),
        lambda: b.create_compute_instance(minor, gi_id=gi.gi_id),
    ):
        with pytest.raises(backend.NvmlError) as missing:
            call()
        assert missing.value.code == backend.Return.NOT_FOUND


def test_mig_mode_guards(mig_gpu: tuple[backend.NvmlBackend, int]) -> None:
    """Guards IN_USE when disabling MIG with instances left, and NOT_SUPPORTED creating with MIG off."""
    b, minor = mig_gpu
    profile = b.gpu_instance_profiles(minor)[0]
    gi = b.create_gpu_instance(minor, profile_id=profile.id, placement=profile.placements[0])
    with pytest.raises(backend.NvmlError) as in_use:
        b.set_mig_mode(minor, backend.MigMode.DISABLED)
    assert in_use.value.code == backend.Return.IN_USE
    b.destroy_gpu_instance(minor, gi_id=gi.gi_id)
    if not isinstance(b, fakegpu.FakeGpus):
        return  # toggling MIG off on real hardware may need a GPU reset; the fake shows the rule
    b.set_mig_mode(minor, backend.MigMode.DISABLED)
    with pytest.raises(backend.NvmlError) as off:
        b.create_gpu_instance(minor, profile_id=profile.id, placement=profile.placements[0])
    assert off.value.code == backend.Return.NOT_SUPPORTED


def test_nvml_error_carries_code_and_name() -> None:
    """Guards NvmlError's code, NVML_ERROR_* name and one-line message, including codes NVML adds later."""
    error = backend.NvmlError(backend.Return.INSUFFICIENT_RESOURCES, "GPU 0: placement 0+4 taken")
    assert error.code == 23 and error.name == "NVML_ERROR_INSUFFICIENT_RESOURCES"
    assert str(error) == "NVML_ERROR_INSUFFICIENT_RESOURCES: GPU 0: placement 0+4 taken"
    assert backend.NvmlError(4242).name == "NVML_ERROR_4242"


def test_a_healthy_gpu_needs_no_recovery(nvml_backend: backend.NvmlBackend) -> None:
    """Guards the recovery-action read health relies on: a GPU in use needs no reset, or the driver says it
    cannot tell (NOT_SUPPORTED), never another error."""
    for gpu in nvml_backend.gpus():
        try:
            action = nvml_backend.recovery_action(gpu.minor)
        except backend.NvmlError as error:
            assert error.code == backend.Return.NOT_SUPPORTED, error
            continue
        assert action is backend.RecoveryAction.NONE
