"""The node agent's checkpoint: which claims are prepared here and every side effect made.

What it does: holds the records of prepared claims (PrepareStarted with what is about to be
created, PrepareCompleted with the prepared devices and every side effect: CDI file, MIG
instances, MPS daemon, time-slice settings) and reads and writes them as one versioned JSON
file with a checksum, written atomically (temp file, fsync, rename, fsync of the directory).
The file is canonical JSON (compact, sorted keys), the form the checksum covers, so a
`Writer` re-encodes only the claims that changed since its last write. A missing file is an
empty checkpoint; a corrupt one (bad JSON, checksum mismatch, unknown version) or one from
another boot is discarded with a warning, never an exception, so the agent cannot crash-loop
on it. What it must not do: touch GPUs or CDI files, or decide what a record means (state
does).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "VERSION",
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

VERSION = 1


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


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    boot_id: str
    claims: Mapping[str, ClaimRecord] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What `load` found: the checkpoint to use and, when it was discarded, why."""

    checkpoint: Checkpoint
    warning: str | None = None


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
    )


def _canonical(value: object) -> str:
    """Compact JSON with sorted keys: what the checksum covers, and the whole file's form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _claim_entry(uid: str, record: ClaimRecord) -> str:
    """One `"<uid>":{record}` member of the canonical `claims` object."""
    return f"{_canonical(uid)}:{_canonical(_encode_claim(record))}"


def _document(boot_id: str, entries: Iterable[str]) -> bytes:
    """The file's bytes from the claim entries in uid order: `_canonical` of the whole document,
    assembled from the parts so an entry encoded earlier can be reused as it is."""
    data = f'{{"bootId":{_canonical(boot_id)},"claims":{{{",".join(entries)}}}}}'
    checksum = hashlib.sha256(data.encode()).hexdigest()
    return f'{{"checksum":"{checksum}","data":{data},"version":{VERSION}}}'.encode()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: the document as canonical JSON (compact, sorted keys). Pure and deterministic.

    The checksum covers the canonical JSON of `data`, which is exactly the `data` part of the file.
    """
    return _document(checkpoint.boot_id, (_claim_entry(uid, r) for uid, r in sorted(checkpoint.claims.items())))


def _decode(blob: bytes) -> tuple[str, dict[str, ClaimRecord]]:
    """Boot id and claims from the file's bytes; raises ValueError naming what is wrong."""
    try:
        document = json.loads(blob)
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if document.get("version") != VERSION:
        raise ValueError(f"unknown version {document.get('version')!r} (this agent reads version {VERSION})")
    data = document.get("data")
    if not isinstance(data, dict) or hashlib.sha256(_canonical(data).encode()).hexdigest() != document.get("checksum"):
        raise ValueError("checksum mismatch")
    try:
        claims = {str(uid): _decode_claim(raw) for uid, raw in data["claims"].items()}
        return str(data["bootId"]), claims
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"malformed record ({type(err).__name__}: {err})") from None


def load(path: pathlib.Path, *, boot_id: str) -> Loaded:
    """Read the checkpoint. Never raises for bad content: a missing file gives an empty
    checkpoint, a corrupt one or one written during another boot gives an empty checkpoint
    and a warning. Only an unreadable existing file (permissions, I/O error) raises OSError.
    """
    empty = Checkpoint(boot_id=boot_id)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return Loaded(checkpoint=empty)
    try:
        recorded_boot, claims = _decode(blob)
    except ValueError as err:
        return Loaded(checkpoint=empty, warning=f"checkpoint {path} is corrupt ({err}); starting from an empty state")
    if boot_id and recorded_boot and recorded_boot != boot_id:
        return Loaded(
            checkpoint=empty,
            warning=f"checkpoint {path} was written before a reboot (boot id {recorded_boot}, now {boot_id}); "
            f"discarding {len(claims)} prepared claim(s)",
        )
    return Loaded(checkpoint=Checkpoint(boot_id=boot_id or recorded_boot, claims=claims))


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


class Writer:
    """Saves successive checkpoints to one file, encoding only the claims that changed.

    Each claim's encoded entry is kept with the record it was made from and reused while the
    checkpoint holds that very record (records are immutable, so identity is enough): a write
    after one claim changed encodes that claim only, however many others are prepared. The
    bytes are always `encode(checkpoint)`'s. Not thread-safe: the state writes under its lock.
    """

    def __init__(self, path: pathlib.Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._entries: dict[str, tuple[ClaimRecord, str]] = {}

    def save(self, checkpoint: Checkpoint) -> None:
        """Write the checkpoint atomically (see `write_atomically`). Idempotent."""
        entries = {}
        for uid, record in checkpoint.claims.items():
            known = self._entries.get(uid)
            entries[uid] = known if known is not None and known[0] is record else (record, _claim_entry(uid, record))
        self._entries = entries
        blob = _document(checkpoint.boot_id, (entries[uid][1] for uid in sorted(entries)))
        write_atomically(self.path, blob, fsync=self._fsync)
