"""MIG at prepare time: device names, creation at an exact placement, idempotent destruction, caps minors."""

from __future__ import annotations

import pathlib

import pytest

from dractl.node import backend, fakegpu, mig


def _gpus(profile: str = "a100-80gb-x8") -> fakegpu.FakeGpus:
    return fakegpu.FakeGpus(fakegpu.load_profile(profile), node_name="node-a")


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        pytest.param("gpu-0-mig-1g10gb-19-0", mig.MigName(0, "1g10gb", 19, 0), id="1g"),
        pytest.param("gpu-12-mig-3g40gb-9-4", mig.MigName(12, "3g40gb", 9, 4), id="two-digit-minor"),
        pytest.param("gpu-1-mig-1g10gb-me-20-6", mig.MigName(1, "1g10gb-me", 20, 6), id="media-extension"),
        pytest.param("gpu-0", None, id="full-gpu"),
        pytest.param("gpu-0-mig-1g10gb-19", None, id="no-start"),
        pytest.param("gpu-vfio-0", None, id="vfio"),
    ],
)
def test_names_are_parsed_as_the_nvidia_driver_writes_them(name: str, parsed: mig.MigName | None) -> None:
    """Guards: gpu-<minor>-mig-<profile>-<GI profile id>-<start> is read back exactly; other names are not MIG."""
    assert mig.parse_name(name) == parsed


def test_placement_comes_from_the_gpu_profiles() -> None:
    """Guards: the placement size comes from the GPU's profile; unknown profile or start is refused."""
    gpus = _gpus()
    assert mig.placement_of(gpus, mig.MigName(0, "3g40gb", 9, 4)) == backend.Placement(4, 4)
    with pytest.raises(ValueError, match="no placement starting at 1"):
        mig.placement_of(gpus, mig.MigName(0, "3g40gb", 9, 1))
    with pytest.raises(ValueError, match="MIG profile id 9 is 3g.40gb, not 2g20gb"):
        mig.placement_of(gpus, mig.MigName(0, "2g20gb", 9, 0))
    with pytest.raises(ValueError, match="no MIG profile with id 77"):
        mig.placement_of(gpus, mig.MigName(0, "x", 77, 0))


def test_create_enables_mig_and_makes_gi_and_ci_at_the_placement() -> None:
    """Guards: create turns MIG on when the mode it is given is off and returns the MIG device at exactly the
    requested placement; given MIG on, it makes the next instance without setting the mode again."""
    gpus = _gpus()
    device = mig.create(
        gpus, minor=3, mig_mode=backend.MigMode.DISABLED, profile_id=14, placement=backend.Placement(2, 2)
    )
    assert gpus.gpus()[3].mig_mode is backend.MigMode.ENABLED
    assert (device.profile_id, device.placement, device.parent_minor) == (14, backend.Placement(2, 2), 3)
    assert gpus.mig_devices(3) == (device,)
    gpus.fail("set_mig_mode", backend.Return.IN_USE, minor=3)
    second = mig.create(
        gpus, minor=3, mig_mode=backend.MigMode.ENABLED, profile_id=19, placement=backend.Placement(0, 1)
    )
    assert gpus.mig_devices(3) == (second, device)


def test_create_cleans_up_the_gpu_instance_when_the_compute_instance_fails() -> None:
    """Guards: a failed compute instance leaves no GPU instance behind."""
    gpus = _gpus()
    gpus.fail("create_compute_instance", backend.Return.INSUFFICIENT_RESOURCES)
    with pytest.raises(backend.NvmlError):
        mig.create(gpus, minor=0, mig_mode=backend.MigMode.DISABLED, profile_id=19, placement=backend.Placement(0, 1))
    assert gpus.gpu_instances(0) == ()


def test_destroy_is_idempotent_and_destroy_at_matches_placement_and_profile() -> None:
    """Guards: destroying twice succeeds; destroy_at removes only the instance at that exact placement and profile."""
    gpus = _gpus()
    a = mig.create(gpus, minor=0, mig_mode=backend.MigMode.DISABLED, profile_id=19, placement=backend.Placement(0, 1))
    b = mig.create(gpus, minor=0, mig_mode=backend.MigMode.DISABLED, profile_id=19, placement=backend.Placement(1, 1))
    mig.destroy(gpus, minor=0, gi_id=a.gi_id)
    mig.destroy(gpus, minor=0, gi_id=a.gi_id)
    assert mig.destroy_at(gpus, minor=0, profile_id=15, placement=backend.Placement(1, 1)) == 0
    assert mig.destroy_at(gpus, minor=0, profile_id=19, placement=b.placement) == 1
    assert gpus.gpu_instances(0) == ()


def test_existing_static_device_is_found_by_profile_and_start() -> None:
    """Guards: static MIG devices are looked up by (profile id, start), and a missing one is None."""
    gpus = _gpus("a100-mig-mixed")
    found = mig.existing_device(gpus, mig.MigName(0, "3g40gb", 9, 0))
    assert found is not None and found.profile_name == "3g.40gb"
    assert mig.existing_device(gpus, mig.MigName(0, "3g40gb", 9, 4)) is None
    assert mig.existing_device(gpus, mig.MigName(0, "3g20gb", 9, 0)) is None  # profile text and id disagree


def test_cap_minors_are_read_from_procfs(tmp_path: pathlib.Path) -> None:
    """Guards: GI then CI nvidia-cap minors come from the access files; missing files give none (fake GPUs)."""
    gi = tmp_path / "driver/nvidia/capabilities/gpu2/mig/gi5"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 48\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 49\n")
    assert mig.cap_minors(tmp_path, parent_minor=2, gi_id=5, ci_id=0) == (48, 49)
    assert mig.cap_minors(tmp_path, parent_minor=2, gi_id=6, ci_id=0) == ()
