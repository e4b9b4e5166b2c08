"""The driver's user-space files: glibc's ld.so.cache format, discovery in a driver root, and the CDI edits."""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import subprocess

import click.testing
import pytest
import structlog
from support import cdi_rules, kubelet
from support.state_inputs import Claims, claim, result

from dractl import cli, config
from dractl.node import agent, cdi, driverfiles, fakegpu

VERSION = "580.126.20"
UID = "0c1d2e3f-0000-4000-8000-00000000cd11"
_LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _ldconfig_listing(cache: pathlib.Path) -> list[tuple[str, str]]:
    """(name, path) of every entry as glibc's own `ldconfig -p -C` prints them, in order."""
    out = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    return [(line.split(" (", 1)[0].strip(), line.split("=> ", 1)[1]) for line in out.splitlines() if "=>" in line]


@pytest.fixture
def gpus() -> fakegpu.FakeGpus:
    return fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name="node-a")


@pytest.fixture
def root(tmp_path: pathlib.Path, gpus: fakegpu.FakeGpus) -> pathlib.Path:
    return fakegpu.write_driver_root(tmp_path / "driver", driver=gpus.driver_info(), gpus=gpus.gpus(), machine="x86_64")


# --- ld.so.cache ----------------------------------------------------------------------------------


def test_the_machines_own_cache_parses_to_what_ldconfig_lists() -> None:
    """Guards: the parser reads the cache glibc wrote on this machine exactly as `ldconfig -p` lists it."""
    system = pathlib.Path("/etc/ld.so.cache")
    entries = driverfiles.parse_ld_cache(system.read_bytes())
    assert len(entries) > 10
    assert [(e.name, e.path) for e in entries] == _ldconfig_listing(system)


def test_a_written_cache_is_read_back_by_glibcs_ldconfig(tmp_path: pathlib.Path) -> None:
    """Guards: write_ld_cache produces glibc's real format (ldconfig reads it) and the parser reads it back."""
    entries = (
        driverfiles.LdCacheEntry(name="libcuda.so.1", path=f"{_LIBDIR}/libcuda.so.1"),
        driverfiles.LdCacheEntry(name="libcuda.so.1", path="/usr/lib/i386-linux-gnu/libcuda.so.1", flags=0x0003),
        driverfiles.LdCacheEntry(name="libnvidia-ml.so.1", path=f"{_LIBDIR}/libnvidia-ml.so.1"),
    )
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(driverfiles.write_ld_cache(entries))
    assert _ldconfig_listing(cache) == [(e.name, e.path) for e in entries]
    assert driverfiles.parse_ld_cache(cache.read_bytes()) == entries


@pytest.mark.parametrize("cache_format", ["new", "compat"])
def test_caches_ldconfig_writes_in_either_format_are_parsed(tmp_path: pathlib.Path, cache_format: str) -> None:
    """Guards: a root's cache written by ldconfig itself, in glibc >= 2.32's format and in the compat format of
    older glibc (old table first, as driver containers on older distributions have), parses to ldconfig's listing."""
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    libz = next(pathlib.Path(p) for p in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu") if os.path.isdir(p))
    for library in sorted(libz.glob("libz.so.1.*"))[:1]:
        shutil.copy(library, libdir / library.name)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-c", cache_format, "-r", str(tmp_path)], check=True, capture_output=True)
    cache = tmp_path / "etc/ld.so.cache"
    assert cache.read_bytes().startswith(b"ld.so-1.7.0" if cache_format == "compat" else b"glibc-ld.so.cache1.1")
    parsed = [(e.name, e.path) for e in driverfiles.parse_ld_cache(cache.read_bytes())]
    assert parsed == _ldconfig_listing(cache)
    assert ("libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1") in parsed


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param(b"", "not an ld.so.cache", id="empty"),
        pytest.param(b"\x7fELF garbage", "not an ld.so.cache", id="garbage"),
        pytest.param(b"glibc-ld.so.cache1.1\x05\x00", "truncated header", id="truncated"),
        pytest.param(b"ld.so-1.7.0\x00\x00\x00\x00\x00", "only the libc5 format", id="libc5-only"),
        pytest.param(
            driverfiles.write_ld_cache([driverfiles.LdCacheEntry(name="a", path="/a")])[:-4], "points outside", id="cut"
        ),
        pytest.param(
            driverfiles.write_ld_cache([driverfiles.LdCacheEntry(name="a", path="/a")])[:60], "do not fit", id="short"
        ),
    ],
)
def test_a_malformed_cache_is_one_error_naming_the_file(data: bytes, problem: str) -> None:
    """Guards: an unreadable cache raises DriverFilesError naming the file and the problem, never IndexError."""
    with pytest.raises(driverfiles.DriverFilesError, match=f"^/r/etc/ld.so.cache: .*{problem}"):
        driverfiles.parse_ld_cache(data, source="/r/etc/ld.so.cache")


# --- paths inside a root ------------------------------------------------------------------------------


def test_symlinks_resolve_inside_the_root(tmp_path: pathlib.Path) -> None:
    """Guards: absolute link targets mean the root's own /, `..` stops at the root, loops and misses give None."""
    (tmp_path / "run/x").mkdir(parents=True)
    (tmp_path / "run/x/socket").write_text("")
    (tmp_path / "var").mkdir()
    (tmp_path / "var/run").symlink_to("/run")
    (tmp_path / "up").symlink_to("../../../../run")
    (tmp_path / "loop").symlink_to("loop")
    assert driverfiles.resolve(tmp_path, "/var/run/x/socket") == "/run/x/socket"
    assert driverfiles.resolve(tmp_path, "/up/x/socket") == "/run/x/socket"
    assert driverfiles.resolve(tmp_path, "/loop") is None
    assert driverfiles.resolve(tmp_path, "/var/run/missing") is None


# --- discovery ------------------------------------------------------------------------------------------


def test_discovery_takes_this_drivers_libraries_for_this_machine(root: pathlib.Path) -> None:
    """Guards: from the library directories and the ld cache only compute/utility libraries of the driver's
    version and 64-bit type are taken (not zlib, not the i386 build, not an older driver's NVML), each with every
    name it is loaded by; binaries, firmware and the persistenced socket behind /var/run -> /run are found."""
    files = driverfiles.discover(root, driver_version=VERSION, machine="x86_64")
    by_path = {library.path: library.names for library in files.libraries}
    assert by_path[f"{_LIBDIR}/libcuda.so.{VERSION}"] == ("libcuda.so", "libcuda.so.1", f"libcuda.so.{VERSION}")
    assert by_path[f"{_LIBDIR}/libnvidia-ml.so.{VERSION}"] == ("libnvidia-ml.so.1", f"libnvidia-ml.so.{VERSION}")
    assert by_path[f"{_LIBDIR}/libnvidia-gpucomp.so.{VERSION}"] == (f"libnvidia-gpucomp.so.{VERSION}",)
    assert sorted(p.rsplit("/", 1)[1].split(".so")[0] for p in by_path) == [
        "libcuda",
        "libcudadebugger",
        "libnvidia-allocator",
        "libnvidia-cfg",
        "libnvidia-gpucomp",
        "libnvidia-ml",
        "libnvidia-nvvm",
        "libnvidia-opencl",
        "libnvidia-pkcs11-openssl3",
        "libnvidia-ptxjitcompiler",
    ]
    assert all(path.startswith(_LIBDIR) for path in by_path)
    assert [b.path for b in files.binaries] == [f"/usr/bin/{name}" for name in driverfiles.BINARIES]
    assert [f.path for f in files.firmware] == [
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    ]
    assert files.sockets == (
        driverfiles.File(path="/var/run/nvidia-persistenced/socket", real="/run/nvidia-persistenced/socket"),
    )
    assert files.hook is None


def test_edits_mount_read_only_from_the_host_root_and_set_ld_library_path(root: pathlib.Path) -> None:
    """Guards: every file is a read-only bind mount whose hostPath is under the host's driver root (not where the
    agent reads it) and exists there; libraries land in one directory named by LD_LIBRARY_PATH; a claim spec
    with these common edits follows every CDI rule."""
    files = driverfiles.discover(root, driver_version=VERSION, machine="x86_64")
    host_root = pathlib.Path("/host/driver")
    edits = driverfiles.edits(files, host_root=host_root)
    assert edits.env == ("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",)
    assert edits.hooks == () and edits.device_nodes == ()
    mounts = {m["containerPath"]: m for m in edits.mounts}
    assert mounts["/usr/local/nvidia/lib64/libcuda.so.1"]["hostPath"] == f"/host/driver{_LIBDIR}/libcuda.so.{VERSION}"
    assert mounts["/usr/bin/nvidia-smi"]["hostPath"] == "/host/driver/usr/bin/nvidia-smi"
    assert mounts["/var/run/nvidia-persistenced/socket"]["hostPath"] == "/host/driver/run/nvidia-persistenced/socket"
    for mount in edits.mounts:
        assert mount["options"][0] == "ro"
        assert (root / str(mount["hostPath"]).removeprefix("/host/driver/")).exists(), mount
    spec = cdi.build_spec(
        claim_uid=UID,
        devices=[("gpu-0", cdi.ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=GPU-0",)))],
        common=edits,
    )
    assert cdi_rules.problems(spec) == []


def test_with_nvidia_cdi_hook_in_the_root_the_ld_cache_hook_replaces_ld_library_path(root: pathlib.Path) -> None:
    """Guards: where the root has nvidia-cdi-hook, a createContainer update-ldcache hook (host path) adds the
    library directory to the container's cache and LD_LIBRARY_PATH is left to the image."""
    hook = root / "usr/local/bin/nvidia-cdi-hook"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    edits = driverfiles.edits(driverfiles.discover(root, driver_version=VERSION, machine="x86_64"), host_root=root)
    assert edits.env == ()
    assert edits.hooks == (
        {
            "hookName": "createContainer",
            "path": str(hook),
            "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/local/nvidia/lib64"],
        },
    )


def test_a_root_without_the_driver_is_one_clear_error(tmp_path: pathlib.Path, root: pathlib.Path) -> None:
    """Guards: a root with neither libraries nor an ld cache, or without this version's libcuda/libnvidia-ml,
    raises DriverFilesError naming the root, the version, where it looked and why the cache gave nothing, so the
    agent refuses to start instead of writing specs a GPU cannot use."""
    with pytest.raises(driverfiles.DriverFilesError) as raised:
        driverfiles.discover(tmp_path, driver_version=VERSION, machine="x86_64")
    assert str(raised.value).startswith(
        f"driver root {tmp_path}: no libcuda.so or libnvidia-ml.so of driver version {VERSION} in "
        "/usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib/x86_64-linux-gnu/nvidia/current, /lib/x86_64-linux-gnu,"
    )
    assert "or its /etc/ld.so.cache (cannot read /etc/ld.so.cache (No such file or directory))" in str(raised.value)
    with pytest.raises(
        driverfiles.DriverFilesError,
        match=r"no libcuda.so or libnvidia-ml.so of driver version 575.57.08 in .* or its /etc/ld.so.cache;",
    ):
        driverfiles.discover(root, driver_version="575.57.08", machine="x86_64")
    with pytest.raises(driverfiles.DriverFilesError, match="no NVIDIA driver libraries exist for machine type 'mips'"):
        driverfiles.discover(root, driver_version=VERSION, machine="mips")


def test_a_root_laid_out_like_gkes_is_found_without_an_ld_cache(tmp_path: pathlib.Path) -> None:
    """Guards: a driver installed as GKE and driver containers lay it out (`<root>/lib64`, `<root>/bin`, no
    ld.so.cache) gives the same libraries, names and binaries, as the toolkit's library locator finds them; a
    library of another version beside them is left out."""
    gke = tmp_path / "nvidia"
    (gke / "lib64").mkdir(parents=True)
    (gke / "bin").mkdir()
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        (gke / "lib64" / f"{name}.{VERSION}").write_text("fake\n")
        (gke / "lib64" / f"{name}.1").symlink_to(f"{name}.{VERSION}")
    (gke / "lib64/libnvidia-nvvm.so.4").symlink_to("libnvidia-nvvm.so.470.256.02")
    (gke / "lib64/libnvidia-nvvm.so.470.256.02").write_text("old\n")
    (gke / "bin/nvidia-smi").write_text("#!/bin/sh\n")
    (gke / "bin/nvidia-smi").chmod(0o755)
    files = driverfiles.discover(gke, driver_version=VERSION, machine="x86_64")
    assert {lib.path: lib.names for lib in files.libraries} == {
        f"/lib64/{name}.{VERSION}": (f"{name}.1", f"{name}.{VERSION}")
        for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")
    }
    assert files.binaries == (driverfiles.File(path="/bin/nvidia-smi", real="/bin/nvidia-smi"),)
    mounts = {m["containerPath"]: m["hostPath"] for m in driverfiles.edits(files, host_root=gke).mounts}
    assert mounts["/usr/local/nvidia/lib64/libcuda.so.1"] == f"{gke}/lib64/libcuda.so.{VERSION}"
    assert mounts["/bin/nvidia-smi"] == f"{gke}/bin/nvidia-smi"


def test_libraries_only_the_ld_cache_knows_are_found_and_a_broken_cache_falls_back(root: pathlib.Path) -> None:
    """Guards: a driver in a directory only the ld cache names (/opt/nvidia/lib) is found through the cache; a
    malformed cache beside libraries in the standard directories is a warning, not a refusal."""
    moved = root / "opt/nvidia/lib"
    moved.mkdir(parents=True)
    for library in (root / _LIBDIR.lstrip("/")).glob("libnvidia-ml.so*"):
        library.rename(moved / library.name)
    arch = driverfiles.ld_cache_arch("x86_64")
    cache = root / "etc/ld.so.cache"
    entries = driverfiles.parse_ld_cache(cache.read_bytes())
    entries += (
        driverfiles.LdCacheEntry(name="libnvidia-ml.so.1", path="/opt/nvidia/lib/libnvidia-ml.so.1", flags=arch),
    )
    cache.write_bytes(driverfiles.write_ld_cache(entries))
    files = driverfiles.discover(root, driver_version=VERSION, machine="x86_64")
    assert {lib.path: lib.names for lib in files.libraries}[f"/opt/nvidia/lib/libnvidia-ml.so.{VERSION}"] == (
        "libnvidia-ml.so.1",
        f"libnvidia-ml.so.{VERSION}",
    )
    for library in moved.iterdir():
        library.rename(root / _LIBDIR.lstrip("/") / library.name)
    cache.write_bytes(b"not a cache")
    files = driverfiles.discover(root, driver_version=VERSION, machine="x86_64")
    assert f"{_LIBDIR}/libnvidia-ml.so.{VERSION}" in {lib.path for lib in files.libraries}


def test_binaries_that_are_scripts_are_named(tmp_path: pathlib.Path) -> None:
    """Guards: a driver binary that is a `#!` script (a wrapper that execs the real program elsewhere, as on a
    GKE-style host's /usr/bin/nvidia-smi) is named by `scripts`; an ELF program is not."""
    for name, content in (
        ("nvidia-smi", b"#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi\n"),
        ("nvidia-debugdump", b"\x7fELF"),
    ):
        program = tmp_path / "usr/bin" / name
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_bytes(content)
        program.chmod(0o755)
    files = driverfiles.DriverFiles(
        version=VERSION,
        libraries=(),
        binaries=tuple(
            driverfiles.File(path=f"/usr/bin/{n}", real=f"/usr/bin/{n}") for n in ("nvidia-smi", "nvidia-debugdump")
        ),
    )
    assert driverfiles.scripts(tmp_path, files) == ("/usr/bin/nvidia-smi",)


def test_the_fake_nvidia_smi_lists_the_gpus_a_container_was_given(root: pathlib.Path, gpus: fakegpu.FakeGpus) -> None:
    """Guards: the fake root's nvidia-smi -L prints the GPUs of NVIDIA_VISIBLE_DEVICES, as the real one would
    inside a container given those GPUs, and all of them without the variable."""
    smi = root / "usr/bin/nvidia-smi"
    info = gpus.gpus()
    visible = {"NVIDIA_VISIBLE_DEVICES": f"{info[2].uuid},{info[5].uuid}"}
    given = subprocess.run([str(smi), "-L"], env=visible, capture_output=True, text=True, check=True).stdout
    assert given.splitlines() == [
        f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})" for gpu in sorted((info[2], info[5]), key=lambda g: g.index)
    ]
    everything = subprocess.run([str(smi), "-L"], env={}, capture_output=True, text=True, check=True).stdout
    assert len(everything.splitlines()) == 8


# --- through the agent ----------------------------------------------------------------------------------


def _prepare(a: agent.Agent, claims: Claims) -> dict[str, object]:
    ref = claims.put(claim("train", UID, [result("gpu-3")]))
    assert kubelet.prepare(a.sockets.dra, ref)[UID].error == ""
    return cdi_rules.check_file(a.settings.cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.yaml")  # type: ignore[no-any-return]


def test_a_fake_node_mounts_its_fake_driver_root_and_names_no_device_node(
    tmp_path: pathlib.Path, sock_dir: pathlib.Path, gpus: fakegpu.FakeGpus
) -> None:
    """Guards: with fake GPUs the agent lays out a fake driver root in its state directory and the claim's spec
    mounts its files (every hostPath exists on the host, as containerd requires) and names no device node; its
    binaries, scripts of its own, draw no warning."""
    claims = Claims()
    a = agent.Agent(kubelet.agent_settings(tmp_path, sock_dir), gpus=gpus, claims=claims, publisher=kubelet.Slices())
    with structlog.testing.capture_logs() as logs:
        a.start()
    try:
        spec = _prepare(a, claims)
    finally:
        a.stop()
    assert not [log for log in logs if "scripts" in log["event"]]  # the fake root's scripts are its own
    common = spec["containerEdits"]
    assert "deviceNodes" not in common and all("deviceNodes" not in d["containerEdits"] for d in spec["devices"])
    host_paths = [m["hostPath"] for m in common["mounts"]]
    assert f"{tmp_path}/state/fake-driver-root{_LIBDIR}/libcuda.so.{VERSION}" in host_paths
    assert all(os.path.exists(path) for path in host_paths)
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64" in common["env"]


def test_a_gpu_node_names_host_paths_of_the_driver_root_it_reads_elsewhere(
    tmp_path: pathlib.Path, sock_dir: pathlib.Path, gpus: fakegpu.FakeGpus, root: pathlib.Path
) -> None:
    """Guards: --driver-root is what specs name and --container-driver-root where the agent reads the files: a
    driver container's root mounted into the agent at another path still gives host paths. Binaries there that
    are scripts are named in a warning that points at --driver-root."""
    claims = Claims()
    settings = kubelet.agent_settings(
        tmp_path,
        sock_dir,
        device_source=config.DeviceSource.NVML,
        driver_root=pathlib.Path("/run/nvidia/driver"),
        container_driver_root=root,
    )
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=kubelet.Slices())
    with structlog.testing.capture_logs() as logs:
        a.start()
    try:
        spec = _prepare(a, claims)
    finally:
        a.stop()
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    nvml = f"/run/nvidia/driver{_LIBDIR}/libnvidia-ml.so.{VERSION}"
    # The fake root's binaries are scripts: on a GPU node that is worth a warning naming them and the flag.
    (warning,) = [log for log in logs if log["event"].startswith("driver binaries in the driver root are scripts")]
    assert warning["driver_root"] == "/run/nvidia/driver" and "/usr/bin/nvidia-smi" in warning["scripts"]
    assert "--driver-root" in warning["event"]
    assert mounts["/usr/local/nvidia/lib64/libnvidia-ml.so.1"] == nvml
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia3"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"driver_root": pathlib.Path("/nonexistent-driver")},
            "dractl node-agent: error: driver root /nonexistent-driver: no libcuda.so or libnvidia-ml.so of driver",
            id="no-driver",
        ),
        pytest.param(
            {"cdi_generator": config.CdiGenerator.NVIDIA_CTK, "driver_root": pathlib.Path("/")},
            "dractl node-agent: error: --cdi-generator nvidia-ctk: nvidia-ctk is not on PATH",
            id="no-nvidia-ctk",
        ),
    ],
)
def test_a_driver_root_that_cannot_give_specs_stops_the_start_with_one_line(
    tmp_path: pathlib.Path,
    sock_dir: pathlib.Path,
    gpus: fakegpu.FakeGpus,
    changes: dict[str, object],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards: a wrong --driver-root or a missing nvidia-ctk is one line and exit 1 before the sockets go up."""
    monkeypatch.setenv("PATH", str(tmp_path))
    settings = kubelet.agent_settings(tmp_path, sock_dir, device_source=config.DeviceSource.NVML, **changes)
    a = agent.Agent(settings, gpus=gpus, claims=Claims(), publisher=kubelet.Slices())
    err = io.StringIO()
    assert agent.run(settings, err=err, agent=a) == agent.EXIT_FAILED
    assert err.getvalue().splitlines()[-1].startswith(message)
    assert not a.sockets.dra.exists()


def test_node_agent_flags_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: --driver-root, --container-driver-root (here from its DRACTL_ variable) and --cdi-generator parse
    into the node agent's settings."""
    seen: list[config.NodeAgent] = []

    def run(settings: config.NodeAgent, *, err: object) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(agent, "run", run)
    outcome = click.testing.CliRunner().invoke(
        cli.main,
        ["node-agent", "--node-name", "n", "--driver-root", "/run/nvidia/driver", "--cdi-generator", "nvidia-ctk"],
        env={"DRACTL_CONTAINER_DRIVER_ROOT": "/driver-root"},
    )
    assert outcome.exit_code == 0, outcome.output
    assert seen[0].driver_root == pathlib.Path("/run/nvidia/driver")
    assert seen[0].container_driver_root == pathlib.Path("/driver-root")
    assert seen[0].agent_driver_root == pathlib.Path("/driver-root")
    assert seen[0].cdi_generator is config.CdiGenerator.NVIDIA_CTK
