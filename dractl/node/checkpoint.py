"""The node agent's checkpoint: which claims are prepared here and every side effect made.

What it does: holds the records of prepared claims (PrepareStarted with what is about to be
created, PrepareCompleted with the prepared devices and every side effect: CDI file, MIG
instances, MPS daemon, time-slice settings) and reads and writes them as one versioned JSON
file with a checksum, written atomically (temp file, fsync, rename, fsync of the directory).
The file is canonical JSON (compact, sorted keys), the form the checksum covers, so a
`Writer` re-encodes only the claims that changed since its last write. `Writer.changed` tells
whether another process (a second agent during a rolling update) replaced the file since this
one last read or wrote it, and `FileLock` is the lock those processes share around their changes.

Versions: 1 had the checksum cover `data` only; 2 covers `data` and `version`, so a damaged
version number reads as corruption, never as a newer file; 3 records each prepared claim's CDI
devices (`cdi_devices`), so a spec removed from the CDI directory can be written again. From version 2 on the envelope
(`checksum`, `data`, `version`, the checksum over the canonical JSON of `data` and `version`)
is fixed: a later version changes only `data`, so any agent can tell an intact newer file from
a corrupt one. An older file is read and migrated (version 1's `data` is version 2's); an
intact newer one raises `NewerVersion` and is never written over. A missing file, a corrupt one
(bad JSON, checksum mismatch, malformed record, a directory or other non-file at the path) and
one from another boot are not errors: `Loaded.found` says which, for the caller to rebuild or
discard; `Writer.read` moves a corrupt one aside (to `<name>.corrupt`) so the path can be written
again. What it must not do: touch GPUs or CDI files, or decide what a record means (state does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "VERSION",
    "OLDEST_VERSION",
    "NewerVersion",
    "Found",
    "FileLock",
    "Phase",
    "DeviceRecord",
    "MigRecord",
    "ClaimRecord",
    "Checkpoint",
    "Loaded",
    "load",
    "Writer",
    "read_boot_id",
]

VERSION = 3
OLDEST_VERSION = 1


class Phase(enum.Enum):
    STARTED = "PrepareStarted"
    COMPLETED = "PrepareCompleted"


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One prepared device: both what the kubelet gets back for it (`state.PreparedDevice` is this
    type) and how the checkpoint records it. A field added here is also a field of the file, so
    it changes the checkpoint format: bump `VERSION` with it.
    """

    requests: tuple[str, ...]  # base request names ("gpu", not "gpu/sub")
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]  # fully-qualified CDI names
    share_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MigRecord:
    """A dynamic MIG instance: planned (ids None) in PrepareStarted, created in PrepareCompleted.

    The placement (`parent_minor`, `profile_id`, `start`, `size`) identifies the instance
    even when the ids were never recorded: rollback destroys whatever GPU instance sits
    exactly there.
    """

    device: str
    parent_minor: int
    parent_uuid: str
    profile_id: int
    start: int
    size: int
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRecord:
    """One claim. `time_slices` maps a GPU minor to the interval set on it (0-3)."""

    uid: str
    namespace: str
    name: str
    phase: Phase
    devices: tuple[DeviceRecord, ...] = ()
    cdi_spec: str | None = None
    mig: tuple[MigRecord, ...] = ()
    mps_daemons: tuple[str, ...] = ()  # MPS control daemons this claim uses (shared ones too)
    time_slices: Mapping[int, int] = dataclasses.field(default_factory=dict)
    compute_minors: tuple[int, ...] = ()  # GPUs put in EXCLUSIVE_PROCESS compute mode for MPS
    exclusive: tuple[str, ...] = ()  # devices held exclusively (not admin access, not shares)
    shared: tuple[str, ...] = ()  # devices held as shares of a multi-allocatable device
    # The `devices` entries of the claim's CDI spec (name and containerEdits, as the spec holds them), so a spec
    # removed from the CDI directory is written again from here. Empty in a record of a version-2 agent.
    cdi_devices: tuple[Mapping[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    boot_id: str
    claims: Mapping[str, ClaimRecord] = dataclasses.field(default_factory=dict)


class Found(enum.Enum):
    """What was at the checkpoint path."""

    CURRENT = "current"  # a file of this version
    OLDER = "older"  # a file of an older version, migrated
    ABSENT = "absent"  # nothing: a first start, or the file was removed
    CORRUPT = "corrupt"  # unreadable content, or not a regular file
    OTHER_BOOT = "other boot"  # written before a reboot: its claims are gone with the boot


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What `load` or `Writer.read` found: the checkpoint to use (empty unless CURRENT or OLDER), the version
    the file had (None when none was read), and for CORRUPT and OTHER_BOOT the warning that says why."""

    checkpoint: Checkpoint
    found: Found
    version: int | None = None
    warning: str | None = None


class NewerVersion(Exception):
    """The checkpoint was written by a newer agent: this one must not use it (nor write over it).
    str() names the file and both versions."""

    def __init__(self, path: pathlib.Path, version: int) -> None:
        self.path = path
        self.version = version
        super().__init__(
            f"checkpoint {path} is version {version}, written by a newer dractl node agent; this agent reads "
            f"versions {OLDEST_VERSION} to {VERSION}"
        )


def read_boot_id(path: pathlib.Path) -> str:
    """The kernel's boot id (`/proc/sys/kernel/random/boot_id`); empty when unreadable."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _encode_claim(record: ClaimRecord) -> dict[str, Any]:
    raw = dataclasses.asdict(record)
    raw["phase"] = record.phase.value
    raw["time_slices"] = {str(minor): interval for minor, interval in sorted(record.time_slices.items())}
    return raw


def _decode_claim(raw: Mapping[str, Any]) -> ClaimRecord:
    return ClaimRecord(
        uid=str(raw["uid"]),
        namespace=str(raw["namespace"]),
        name=str(raw["name"]),
        phase=Phase(raw["phase"]),
        devices=tuple(
            DeviceRecord(
                requests=tuple(d["requests"]),
                pool=d["pool"],
                device=d["device"],
                cdi_device_ids=tuple(d["cdi_device_ids"]),
                share_id=d.get("share_id"),
            )
            for d in raw.get("devices", ())
        ),
        cdi_spec=raw.get("cdi_spec"),
        mig=tuple(MigRecord(**m) for m in raw.get("mig", ())),
        mps_daemons=tuple(raw.get("mps_daemons", ())),
        time_slices={int(minor): int(interval) for minor, interval in raw.get("time_slices", {}).items()},
        compute_minors=tuple(int(m) for m in raw.get("compute_minors", ())),
        exclusive=tuple(raw.get("exclusive", ())),
        shared=tuple(raw.get("shared", ())),
        cdi_devices=tuple(_cdi_device(d) for d in raw.get("cdi_devices", ())),
    )


def _cdi_device(raw: object) -> Mapping[str, Any]:
    """One recorded CDI device entry; raises ValueError unless it has the shape a spec's device has."""
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("name"), str)
        or not isinstance(raw.get("containerEdits", {}), dict)
    ):
        raise ValueError(f"a cdi_devices entry must be an object with a name and containerEdits, got {raw!r:.80}")
    return raw


def _canonical(value: object) -> str:
    """Compact JSON with sorted keys: what the checksum covers, and the whole file's form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _claim_entry(uid: str, record: ClaimRecord) -> str:
    """One `"<uid>":{record}` member of the canonical `claims` object."""
    return f"{_canonical(uid)}:{_canonical(_encode_claim(record))}"


def _covered(version: int, data: str) -> str:
    """What the checksum covers, given `data` as canonical JSON: `data` alone in version 1; from version 2 on the
    canonical JSON of `{"data": ..., "version": ...}`, which is also the file's tail after its checksum."""
    return data if version == 1 else f'{{"data":{data},"version":{version}}}'


def _checksum(version: int, data: str) -> str:
    return hashlib.sha256(_covered(version, data).encode()).hexdigest()


def _document(boot_id: str, entries: Iterable[str]) -> bytes:
    """The file's bytes from the claim entries in uid order: `_canonical` of the whole document,
    assembled from the parts so an entry encoded earlier can be reused as it is."""
    data = f'{{"bootId":{_canonical(boot_id)},"claims":{{{",".join(entries)}}}}}'
    covered = _covered(VERSION, data)
    checksum = hashlib.sha256(covered.encode()).hexdigest()
    return f'{{"checksum":"{checksum}",{covered[1:]}'.encode()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: the document as canonical JSON (compact, sorted keys). Pure and deterministic.

    The checksum covers the canonical JSON of `data` and `version`, which is exactly the file after its checksum.
    """
    return _document(checkpoint.boot_id, (_claim_entry(uid, r) for uid, r in sorted(checkpoint.claims.items())))


def _decode(blob: bytes, path: pathlib.Path) -> tuple[int, str, dict[str, ClaimRecord]]:
    """Version, boot id and claims from the file's bytes, migrated to this version. Raises ValueError naming
    what is wrong (corrupt), or NewerVersion for an intact file of a later version."""
    try:
        document = json.loads(blob)
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    version = document.get("version")
    if type(version) is not int or version < OLDEST_VERSION:
        raise ValueError(f"version {version!r} is not one any agent wrote")
    data = document.get("data")
    if not isinstance(data, dict) or _checksum(version, _canonical(data)) != document.get("checksum"):
        raise ValueError(f"checksum mismatch (version {version})")
    if version > VERSION:
        raise NewerVersion(path, version)
    # Version 1's `data` is version 2's, and version 2's records are version 3's without `cdi_devices`: reading them
    # is the whole migration.
    try:
        claims = {str(uid): _decode_claim(raw) for uid, raw in data["claims"].items()}
        return version, str(data["bootId"]), claims
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"malformed record ({type(err).__name__}: {err})") from None


def _loaded(path: pathlib.Path, blob: bytes, *, boot_id: str) -> Loaded:
    empty = Checkpoint(boot_id=boot_id)
    try:
        version, recorded_boot, claims = _decode(blob, path)
    except ValueError as err:
        return Loaded(checkpoint=empty, found=Found.CORRUPT, warning=f"checkpoint {path} is corrupt ({err})")
    if boot_id and recorded_boot and recorded_boot != boot_id:
        return Loaded(
            checkpoint=empty,
            found=Found.OTHER_BOOT,
            version=version,
            warning=f"checkpoint {path} was written before a reboot (boot id {recorded_boot}, now {boot_id}); "
            f"discarding {len(claims)} prepared claim(s)",
        )
    return Loaded(
        checkpoint=Checkpoint(boot_id=boot_id or recorded_boot, claims=claims),
        found=Found.CURRENT if version == VERSION else Found.OLDER,
        version=version,
    )


def load(path: pathlib.Path, *, boot_id: str) -> Loaded:
    """Read the checkpoint without changing anything. Bad content is never an exception: a missing
    file is ABSENT, a corrupt one CORRUPT with a warning (also a directory at the path), one written
    during another boot OTHER_BOOT with a warning; an older version is read as this one (OLDER).
    Raises NewerVersion for an intact file of a later version, OSError when an existing file
    cannot be read (permissions, I/O error).
    """
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return Loaded(checkpoint=Checkpoint(boot_id=boot_id), found=Found.ABSENT)
    except IsADirectoryError:
        return _not_a_file(path, boot_id=boot_id, what="a directory")
    return _loaded(path, blob, boot_id=boot_id)


def _not_a_file(path: pathlib.Path, *, boot_id: str, what: str) -> Loaded:
    return Loaded(
        checkpoint=Checkpoint(boot_id=boot_id),
        found=Found.CORRUPT,
        warning=f"checkpoint {path} is corrupt ({what}, not a file)",
    )


def _move_aside(path: pathlib.Path) -> pathlib.Path:
    """Rename a corrupt checkpoint (file, directory or other) to `<name>.corrupt`, replacing an earlier one,
    so the path can be written again and the bad content is still there to look at."""
    aside = path.with_name(f"{path.name}.corrupt")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(aside.lstat().st_mode):
            shutil.rmtree(aside)
        else:
            aside.unlink()
    os.replace(path, aside)
    return aside


def write_atomically(path: pathlib.Path, blob: bytes, *, fsync: bool = True) -> None:
    """Replace `path` with `blob` so a reader sees the old or the new file, never a part.

    The temp file lives in the same directory (so rename is atomic) and is named
    `.<name>.*.tmp`; with `fsync` the file and the directory are flushed so the rename also
    survives a power loss.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise
    if not fsync:
        return
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class _Held:
    """An open file descriptor kept so its inode cannot be reused while it is held; closed when replaced,
    or when its owner is garbage-collected."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def replace(self, fd: int | None) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = fd


class Writer:
    """Reads and saves successive checkpoints of one file, encoding only the claims that changed.

    Each claim's encoded entry is kept with the record it was made from and reused while the
    checkpoint holds that very record (records are immutable, so identity is enough): a write
    after one claim changed encodes that claim only, however many others are prepared. The
    bytes are always `encode(checkpoint)`'s. The file last read or written stays open, so
    `changed()` can tell by inode, exactly, whether another process has replaced it since (an
    inode cannot be reused while it is open). Not thread-safe: the state calls it under its lock.
    """

    def __init__(self, path: pathlib.Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._entries: dict[str, tuple[ClaimRecord, str]] = {}
        self._held = _Held()
        weakref.finalize(self, self._held.replace, None)

    def read(self, *, boot_id: str) -> Loaded:
        """`load` the file and remember it for `changed()`. A corrupt one, or anything but a regular file at
        the path, is moved aside to `<name>.corrupt` (the warning says so) and the path is then ABSENT for
        `changed()`. Raises NewerVersion (the file untouched) or OSError as `load` does."""
        self._entries = {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._held.replace(None)
            return Loaded(checkpoint=Checkpoint(boot_id=boot_id), found=Found.ABSENT)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                with os.fdopen(os.dup(fd), "rb") as handle:
                    loaded = _loaded(self.path, handle.read(), boot_id=boot_id)
            else:
                what = "a directory" if stat.S_ISDIR(mode) else "a special file"
                loaded = _not_a_file(self.path, boot_id=boot_id, what=what)
        except BaseException:
            os.close(fd)
            raise
        if loaded.found is not Found.CORRUPT:
            self._held.replace(fd)
            return loaded
        os.close(fd)
        self._held.replace(None)
        aside = _move_aside(self.path)
        return dataclasses.replace(loaded, warning=f"{loaded.warning}; moved to {aside}")

    def changed(self) -> bool:
        """Whether the file at the path is not the one this writer last read or wrote (another process
        replaced, created or removed it). One stat; exact."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return self._held.fd is not None
        if self._held.fd is None:
            return True
        held = os.fstat(self._held.fd)
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def save(self, checkpoint: Checkpoint) -> None:
        """Write the checkpoint atomically (see `write_atomically`). Idempotent. The caller holds the
        `FileLock` of the directory when other processes may write too, so no write comes in between
        the rename and the open that remembers the new file."""
        entries = {}
        for uid, record in checkpoint.claims.items():
            known = self._entries.get(uid)
            entries[uid] = known if known is not None and known[0] is record else (record, _claim_entry(uid, record))
        self._entries = entries
        blob = _document(checkpoint.boot_id, (entries[uid][1] for uid in sorted(entries)))
        write_atomically(self.path, blob, fsync=self._fsync)
        self._held.replace(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))


class FileLock:
    """An exclusive lock that processes on one node share: flock(2) on `path`, created if missing.

    flock belongs to the open file, not to a thread: threads of one process must hold a lock of
    their own around `held()` (the state's lock). Blocking, with no timeout, like that lock. A
    process that dies releases it.
    """

    def __init__(self, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._held = _Held()
        self._held.replace(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        weakref.finalize(self, self._held.replace, None)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        fd = self._held.fd
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
