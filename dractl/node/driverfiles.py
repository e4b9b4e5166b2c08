"""The NVIDIA driver's user-space files under a driver root, found as the NVIDIA container toolkit finds them.

What it does: finds the driver's compute and utility libraries (the toolkit's list: `libcuda`,
`libnvidia-ml`, `libnvidia-ptxjitcompiler`, `libnvidia-nvvm`, `libnvidia-gpucomp`, ...) where the
toolkit's library locator looks: the root's standard library directories, then its dynamic-linker
cache (`<root>/etc/ld.so.cache`, glibc's binary format, parsed here), keeping only files of this
driver version for this machine's architecture; finds the driver's binaries (`nvidia-smi`,
`nvidia-debugdump`, `nvidia-persistenced`, the MPS control and server), its GSP firmware and the
persistenced and fabric-manager sockets; and turns them into the CDI edits every claim spec shares: read-only
bind mounts, plus a way for an ordinary image to load the libraries (the toolkit's
`update-ldcache` hook where `nvidia-cdi-hook` exists in the root, else `LD_LIBRARY_PATH`).
Paths are resolved inside the root (an absolute symlink such as `/var/run -> /run` stays in it),
and the specs name them where the host has them (`host_root`), which differs from where the
agent reads them when the driver root is mounted into the agent's container elsewhere.

What it must not do: touch GPUs or device nodes (the claim's spec adds those), or run anything
from the driver root.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import stat
import struct
from collections.abc import Mapping, Sequence

import structlog

from dractl.node import cdi

__all__ = [
    "UTILITY_LIBRARIES",
    "COMPUTE_LIBRARIES",
    "BINARIES",
    "LIBRARY_DIR",
    "LD_LIBRARY_PATH",
    "HOOK",
    "library_dirs",
    "scripts",
    "DriverFilesError",
    "LdCacheEntry",
    "Library",
    "File",
    "DriverFiles",
    "parse_ld_cache",
    "write_ld_cache",
    "ld_cache_arch",
    "resolve",
    "discover",
    "edits",
    "NativeEdits",
]

# The NVIDIA container toolkit's driver libraries for the `utility` and `compute` capabilities
# (libnvidia-container's `utility_libs` and `compute_libs`), matched as name prefixes.
UTILITY_LIBRARIES = ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so")
COMPUTE_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-allocator.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nvvm.so",
    "libnvidia-tileiras.so",
)
# Without these two no CUDA or NVML program can start, so a root lacking them is refused.
_REQUIRED = ("libcuda.so", "libnvidia-ml.so")
# The toolkit's utility and compute binaries (nv-fabricmanager is a host service, not mounted).
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
_BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# GNU triplets of the machines the driver ships libraries for (see _ARCH_FLAGS).
_TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu"}
_SOCKETS = ("/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket")
_FIRMWARE_DIR = "/lib/firmware/nvidia"
LD_CACHE = "/etc/ld.so.cache"
# Libraries go to a directory of their own in the container: LD_LIBRARY_PATH (or the ld cache)
# then adds exactly the driver's libraries, never the rest of the host's library directory.
# It is where NVIDIA's CUDA images already look (their LD_LIBRARY_PATH is this very value).
LIBRARY_DIR = "/usr/local/nvidia/lib64"
LD_LIBRARY_PATH = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
HOOK = "nvidia-cdi-hook"
_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")

# glibc's cache formats (elf/dl-cache.h): the old libc5 table, optionally followed by the new one.
_OLD_MAGIC = b"ld.so-1.7.0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sII B3x I 12x")  # magic+version, nlibs, strings length, flags, extensions
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_OLD_ENTRY = struct.Struct("<iII")
_FLAG_ELF_LIBC6 = 0x0003
_FLAG_TYPE_MASK = 0x00FF
_FLAG_ARCH_MASK = 0xFF00
_ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00, "ppc64le": 0x0500}
_MAX_SYMLINKS = 40

_log = structlog.get_logger(__name__)


class DriverFilesError(Exception):
    """The driver root cannot give usable specs; str() names the root and what is wrong."""


@dataclasses.dataclass(frozen=True, slots=True)
class LdCacheEntry:
    """One entry of an ld.so.cache: `name` as the loader looks it up, `path` where it is."""

    name: str
    path: str
    flags: int = _FLAG_ELF_LIBC6 | _ARCH_FLAGS["x86_64"]
    hwcap: int = 0


def ld_cache_arch(machine: str | None = None) -> int:
    """The cache flags of 64-bit ELF libraries for `machine` (default: this one). Raises
    DriverFilesError for a machine the NVIDIA driver does not ship libraries for."""
    machine = machine or platform.machine()
    try:
        return _FLAG_ELF_LIBC6 | _ARCH_FLAGS[machine]
    except KeyError:
        raise DriverFilesError(f"no NVIDIA driver libraries exist for machine type {machine!r}") from None


def parse_ld_cache(data: bytes, *, source: str = LD_CACHE) -> tuple[LdCacheEntry, ...]:
    """The entries of an ld.so.cache in file order. Pure.

    Reads the new format (glibc >= 2.32 writes only this) and the compat format of older glibc
    (the old table, then the new one, which holds the same libraries). Raises DriverFilesError
    naming `source` for anything else or a truncated or inconsistent file.
    """
    offset = 0
    if data.startswith(_OLD_MAGIC):
        if len(data) < 16:
            raise DriverFilesError(f"{source}: truncated header")
        (count,) = struct.unpack_from("<I", data, 12)
        offset = 16 + count * _OLD_ENTRY.size
        offset += -offset % 8  # the new table starts 8-byte aligned
        if not data.startswith(_NEW_MAGIC, offset):
            raise DriverFilesError(
                f"{source}: only the libc5 format, which holds no glibc libraries (run ldconfig in the driver root)"
            )
    elif not data.startswith(_NEW_MAGIC):
        raise DriverFilesError(f"{source}: not an ld.so.cache (no glibc-ld.so.cache1.1 header)")
    if len(data) < offset + _NEW_HEADER.size:
        raise DriverFilesError(f"{source}: truncated header")
    _, count, strings, _, _ = _NEW_HEADER.unpack_from(data, offset)
    table = offset + _NEW_HEADER.size
    if table + count * _NEW_ENTRY.size > len(data):
        raise DriverFilesError(f"{source}: {count} entries do not fit in {len(data)} bytes")
    entries = []
    for n in range(count):
        flags, key, value, _, hwcap = _NEW_ENTRY.unpack_from(data, table + n * _NEW_ENTRY.size)
        entries.append(
            LdCacheEntry(
                name=_string(data, offset + key, source=source, entry=n),
                path=_string(data, offset + value, source=source, entry=n),
                flags=flags,
                hwcap=hwcap,
            )
        )
    return tuple(entries)


def _string(data: bytes, at: int, *, source: str, entry: int) -> str:
    end = data.find(b"\0", at)
    if at >= len(data) or end < 0:
        raise DriverFilesError(f"{source}: entry {entry} points outside the file")
    return data[at:end].decode("utf-8", errors="surrogateescape")


def write_ld_cache(entries: Sequence[LdCacheEntry]) -> bytes:
    """An ld.so.cache in glibc's new format (as `ldconfig` >= 2.32 writes it) holding `entries`
    in the given order. Pure. The fake driver root uses it, so the parser reads a real format."""
    strings = bytearray()
    offsets: dict[str, int] = {}
    base = _NEW_HEADER.size + len(entries) * _NEW_ENTRY.size
    for text in (t for e in entries for t in (e.name, e.path)):
        if text not in offsets:
            offsets[text] = base + len(strings)
            strings += text.encode() + b"\0"
    out = bytearray(_NEW_HEADER.pack(_NEW_MAGIC, len(entries), len(strings), 0, 0))
    for e in entries:
        out += _NEW_ENTRY.pack(e.flags, offsets[e.name], offsets[e.path], 0, e.hwcap)
    return bytes(out + strings)


def resolve(root: pathlib.Path, path: str) -> str | None:
    """`path` with every symlink followed inside `root`, as an absolute path relative to the root
    ("/usr/lib/libcuda.so.580.65.06"), or None when it does not exist. An absolute link target
    means the root's own `/`, and `..` never leaves the root."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        try:
            mode = os.lstat(here).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            hops += 1
            if hops > _MAX_SYMLINKS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(part)
    return "/" + "/".join(done)


@dataclasses.dataclass(frozen=True, slots=True)
class Library:
    """One driver library: the file (`path`, in the root) and the names programs load it by
    (its ld-cache names and its own file name), sorted."""

    path: str
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class File:
    """A file of the driver: `path` where programs expect it ("/usr/bin/nvidia-smi", the path a
    container gets it at) and `real` where it is in the root once symlinks are followed."""

    path: str
    real: str


@dataclasses.dataclass(frozen=True, slots=True)
class DriverFiles:
    """What a driver root holds, as paths inside the root. `hook` is the root's
    nvidia-cdi-hook, or None."""

    version: str
    libraries: tuple[Library, ...]
    binaries: tuple[File, ...] = ()
    firmware: tuple[File, ...] = ()
    sockets: tuple[File, ...] = ()
    hook: File | None = None


def discover(root: pathlib.Path, *, driver_version: str, machine: str | None = None) -> DriverFiles:
    """Find the driver's files under `root` (as the agent sees it). Reads only.

    Libraries, as the toolkit's library locator finds them: the root's standard library
    directories for this machine (`/usr/lib/<triplet>`, `/usr/lib64`, Debian's
    `nvidia/current`, ...; a layout such as GKE's `<root>/lib64` is one of them), and the
    root's ld cache for anywhere else. A file counts when its name starts with a utility or
    compute library name, it is of this machine's 64-bit ELF type (ld cache) or in this
    machine's directories, and once symlinks are followed in the root it ends in
    `.so.<driver_version>`, so another driver's leftovers are never mounted. Raises
    DriverFilesError naming the root when neither gives `libcuda.so` and `libnvidia-ml.so` of
    this version. Binaries, firmware and sockets are optional.
    """
    arch = ld_cache_arch(machine)
    prefixes = UTILITY_LIBRARIES + COMPUTE_LIBRARIES
    by_file: dict[str, set[str]] = {}

    def take(name: str, path: str) -> None:
        real = resolve(root, path)
        if real is not None and real.endswith(f".so.{driver_version}") and (root / real.lstrip("/")).is_file():
            by_file.setdefault(real, {real.rsplit("/", 1)[-1]}).add(name)

    for directory in library_dirs(machine or platform.machine()):
        real_dir = resolve(root, directory)
        if real_dir is None or not (root / real_dir.lstrip("/")).is_dir():
            continue
        for file_name in sorted(os.listdir(root / real_dir.lstrip("/"))):
            if file_name.startswith(prefixes):
                take(file_name, f"{real_dir}/{file_name}")
    cache_path = root / LD_CACHE.lstrip("/")
    cache_problem = ""
    try:
        cache = parse_ld_cache(cache_path.read_bytes(), source=f"{cache_path}")
    except OSError as err:
        cache, cache_problem = (), f"cannot read {LD_CACHE} ({err.strerror or err})"
    except DriverFilesError as err:
        cache, cache_problem = (), str(err)
        _log.warning("driver root's ld cache is unreadable; using its library directories only", problem=str(err))
    for entry in cache:
        same_arch = entry.flags & _FLAG_ARCH_MASK == arch & _FLAG_ARCH_MASK
        if entry.flags & _FLAG_TYPE_MASK == _FLAG_ELF_LIBC6 and same_arch and entry.name.startswith(prefixes):
            take(entry.name, entry.path)
    libraries = tuple(Library(path=p, names=tuple(sorted(n))) for p, n in sorted(by_file.items()))
    missing = [lib for lib in _REQUIRED if not any(n.startswith(lib) for x in libraries for n in x.names)]
    if missing:
        searched = ", ".join(library_dirs(machine or platform.machine()))
        raise DriverFilesError(
            f"driver root {root}: no {' or '.join(missing)} of driver version {driver_version} in {searched}"
            f" or its {LD_CACHE}{f' ({cache_problem})' if cache_problem else ''}; is this the root of the driver"
            " NVML reports (--driver-root, --container-driver-root)?"
        )
    binaries = [found for name in BINARIES if (found := _executable(root, name)) is not None]
    firmware_dir = f"{_FIRMWARE_DIR}/{driver_version}"
    firmware: list[File] = []
    resolved_dir = resolve(root, firmware_dir)
    if resolved_dir is not None and (root / resolved_dir.lstrip("/")).is_dir():
        firmware = [
            File(path=f"{firmware_dir}/{p.name}", real=f"{resolved_dir}/{p.name}")
            for p in sorted((root / resolved_dir.lstrip("/")).glob("gsp*.bin"))
            if p.is_file()
        ]
    sockets = []
    for socket in _SOCKETS:
        real = resolve(root, socket)
        if real is not None and stat.S_ISSOCK(os.stat(root / real.lstrip("/")).st_mode):
            sockets.append(File(path=socket, real=real))
    hook = _executable(root, HOOK)
    files = DriverFiles(
        version=driver_version,
        libraries=libraries,
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        sockets=tuple(sockets),
        hook=hook,
    )
    _log.info(
        "driver files found",
        root=str(root),
        version=driver_version,
        libraries=len(libraries),
        binaries=[b.path for b in binaries],
        firmware=len(firmware),
        sockets=[s.path for s in sockets],
        hook=hook.path if hook is not None else None,
    )
    return files


def library_dirs(machine: str) -> tuple[str, ...]:
    """The toolkit's library search directories (besides the ld cache) that hold `machine`'s 64-bit libraries."""
    triplet = _TRIPLETS[machine]
    return tuple(
        f"{prefix}{suffix}"
        for prefix in ("/usr/lib", "/lib")
        for suffix in (f"/{triplet}", "64", f"/{triplet}/nvidia/current")
    )


def scripts(root: pathlib.Path, files: DriverFiles) -> tuple[str, ...]:
    """The binaries of `files` that are scripts (`#!`), not the driver's programs, by their path in the root: a
    wrapper such as a `/usr/bin/nvidia-smi` that execs the driver's real one elsewhere, which the container does
    not get. Reads the first two bytes of each."""
    found = []
    for binary in files.binaries:
        try:
            with open(root / binary.real.lstrip("/"), "rb") as program:
                if program.read(2) == b"#!":
                    found.append(binary.path)
        except OSError:
            continue
    return tuple(found)


def _executable(root: pathlib.Path, name: str) -> File | None:
    """The first `name` in the root's standard binary directories that is an executable file."""
    for directory in _BIN_DIRS:
        real = resolve(root, f"{directory}/{name}")
        if real is None:
            continue
        target = root / real.lstrip("/")
        if target.is_file() and os.access(target, os.X_OK):
            return File(path=f"{directory}/{name}", real=real)
    return None


def edits(files: DriverFiles, *, host_root: pathlib.Path) -> cdi.ContainerEdits:
    """The CDI edits every claim spec shares for these files. Pure.

    Each library is mounted read-only under LIBRARY_DIR by its file name and each of its
    ld-cache names (a bind mount of the file itself, so no symlink has to exist in the image).
    Binaries, firmware and sockets are mounted at their paths in the root, where an image's
    PATH and the driver expect them. With the root's nvidia-cdi-hook, its `update-ldcache`
    hook adds LIBRARY_DIR to the container's ld cache; without it LD_LIBRARY_PATH names the
    directory (CDI replaces an image's own LD_LIBRARY_PATH; NVIDIA's CUDA images set this very
    value). Host paths are `host_root` + the path in the root.
    """

    def host(path: str) -> str:
        return str(host_root / path.lstrip("/"))

    mounts: list[Mapping[str, object]] = []
    for library in files.libraries:
        for name in library.names:
            mounts.append(cdi.mount(host(library.path), f"{LIBRARY_DIR}/{name}", options=_MOUNT_OPTIONS))
    for file in (*files.binaries, *files.firmware, *files.sockets):
        mounts.append(cdi.mount(host(file.real), file.path, options=_MOUNT_OPTIONS))
    if files.hook is not None:
        hook = {
            "hookName": "createContainer",
            "path": host(files.hook.real),
            "args": [HOOK, "update-ldcache", "--folder", LIBRARY_DIR],
        }
        return cdi.ContainerEdits(mounts=tuple(mounts), hooks=(hook,))
    return cdi.ContainerEdits(env=(f"LD_LIBRARY_PATH={LD_LIBRARY_PATH}",), mounts=tuple(mounts))


class NativeEdits:
    """`cdi.CommonEdits` from the driver root itself, without nvidia-ctk.

    `root` is where the agent reads the driver root, `host_root` where the host has it (the same
    unless the root is mounted into the agent's container elsewhere). `check()` discovers once
    and raises DriverFilesError, so the agent refuses to start on a wrong root; the edits are then
    cached (a driver upgrade restarts the agent, whose NVML version changes with it).
    """

    def __init__(self, *, root: pathlib.Path, host_root: pathlib.Path, driver_version: str) -> None:
        self._root = root
        self._host_root = host_root
        self._version = driver_version
        self._cached: cdi.ContainerEdits | None = None

    def check(self) -> DriverFiles:
        files = discover(self._root, driver_version=self._version)
        self._cached = edits(files, host_root=self._host_root)
        return files

    def common_edits(self) -> cdi.ContainerEdits:
        if self._cached is None:
            self.check()
        assert self._cached is not None
        return self._cached
