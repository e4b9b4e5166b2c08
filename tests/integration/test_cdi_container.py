"""A claim's CDI spec applied to a root filesystem that has no NVIDIA driver, as a container runtime applies it.

The root is Debian's busybox-static and libc6 (built by tools/gpu_check_prepare.sh --rootfs-only, cached under
~/.cache/dractl); tools/cdi_run.py applies the spec's edits in a private mount namespace and runs a command there
chrooted. With the fake driver root this proves, without a GPU, what tools/gpu_check.sh proves on one: the
spec alone brings the driver's binaries and libraries into an image that has none. Needs root, unshare, chroot and
apt-get download; skipped with one line otherwise.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from dractl.node import cdi, driverfiles, fakegpu

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PREPARE = ROOT / "tools" / "gpu_check_prepare.sh"
UID = "9d8c7b6a-0000-4000-8000-00000000cd22"


@pytest.fixture(scope="session")
def driverless_rootfs() -> pathlib.Path:
    """busybox-static + libc6 + cuda-query, built once per version of the script and kept in the cache."""
    missing = [tool for tool in ("unshare", "chroot", "apt-get", "dpkg-deb", "gcc") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"needs root and {', '.join(missing) or 'the tools'} to build and enter a root filesystem")
    key = hashlib.sha256(PREPARE.read_bytes() + (ROOT / "tools/cuda_query.c").read_bytes()).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "dractl"
    done = cache / f"driverless-rootfs-{key}"
    if not (done / "bin" / "busybox").exists():
        cache.mkdir(parents=True, exist_ok=True)
        building = pathlib.Path(tempfile.mkdtemp(prefix="driverless-rootfs-", dir=cache))
        made = subprocess.run(
            [str(PREPARE), "--rootfs-only", str(building)], capture_output=True, text=True, timeout=600, check=False
        )
        if made.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            pytest.fail(f"building the root filesystem failed:\n{made.stderr[-2000:]}")
        try:
            building.rename(done)
        except OSError:
            shutil.rmtree(building, ignore_errors=True)  # another run made it first
    return done


def test_a_claims_spec_brings_the_driver_into_an_image_that_has_none(
    driverless_rootfs: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: with only the claim's CDI spec applied, a driverless image runs the driver's nvidia-smi, which lists
    exactly the claim's GPU, and the loader finds libcuda.so.1 through the spec's LD_LIBRARY_PATH and read-only
    mounts (the fake library is a placeholder, so loading it fails only once found); nothing stays mounted."""
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="node-a")
    root = fakegpu.write_driver_root(tmp_path / "driver", driver=gpus.driver_info(), gpus=gpus.gpus())
    common = driverfiles.NativeEdits(root=root, host_root=root, driver_version=gpus.driver_info().driver_version)
    uuid = gpus.gpus()[1].uuid
    device = cdi.ContainerEdits(env=(f"NVIDIA_VISIBLE_DEVICES={uuid}", f"CUDA_VISIBLE_DEVICES={uuid}"))
    spec = cdi.build_spec(claim_uid=UID, devices=[("gpu-1", device)], common=common.common_edits())
    spec_file = cdi.write_spec(tmp_path / "cdi", UID, spec)
    image = tmp_path / "image"
    shutil.copytree(driverless_rootfs, image, symlinks=True)
    script = "nvidia-smi -L; cat /usr/local/nvidia/lib64/libcuda.so.1; touch /usr/bin/nvidia-smi; cuda-query"
    ran = subprocess.run(
        [sys.executable, str(ROOT / "tools/cdi_run.py"), str(spec_file), f"{UID}-gpu-1", str(image), "--"]
        + ["/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = ran.stdout.splitlines()
    assert f"GPU 1: Tesla T4 (UUID: {uuid})" in lines, ran.stdout + ran.stderr
    assert not any(line.startswith("GPU 0:") for line in lines)
    assert f"fake libcuda.so.{gpus.driver_info().driver_version}" in lines
    assert "Read-only file system" in ran.stderr  # the driver's files are mounted read-only
    assert "cuda-query: cannot load libcuda.so.1: /usr/local/nvidia/lib64/libcuda.so.1" in ran.stderr
    assert ran.returncode == 2  # cuda-query: libcuda found but not a real library
    assert (image / "usr/local/nvidia/lib64/libcuda.so.1").stat().st_size == 0  # the mount ended with the command
