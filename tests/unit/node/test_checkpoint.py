"""The checkpoint file: versioned JSON with a checksum, atomic writes, corrupt and foreign-boot files handled,
older versions migrated, newer ones refused untouched, and the file shared by the processes of a rolling update."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
from typing import Any

import pytest

from dractl.node import checkpoint

RECORD = checkpoint.ClaimRecord(
    uid="u1",
    namespace="ns",
    name="c",
    phase=checkpoint.Phase.COMPLETED,
    devices=(
        checkpoint.DeviceRecord(
            requests=("gpu",),
            pool="n",
            device="gpu-0",
            cdi_device_ids=("k8s.gpu.nvidia.com/claim=u1-gpu-0",),
            share_id="abcde",
        ),
    ),
    cdi_spec="/var/run/cdi/k8s.gpu.nvidia.com-claim_u1.yaml",
    mig=(
        checkpoint.MigRecord(
            device="gpu-1-mig-1g10gb-19-2",
            parent_minor=1,
            parent_uuid="GPU-x",
            profile_id=19,
            start=2,
            size=1,
            gi_id=3,
            ci_id=0,
            uuid="MIG-y",
        ),
    ),
    mps_daemons=("u1-abcde",),
    time_slices={0: 3},
    compute_minors=(0,),
    exclusive=("gpu-1-mig-1g10gb-19-2",),
    shared=("gpu-0",),
)


def _intact(version: int, data: dict[str, Any]) -> dict[str, Any]:
    """A document as an agent of `version` (2 or later) writes it: the checksum over `data` and `version`."""
    covered = json.dumps({"data": data, "version": version}, sort_keys=True, separators=(",", ":"))
    return {"checksum": hashlib.sha256(covered.encode()).hexdigest(), "data": data, "version": version}


def test_save_then_load_round_trips_every_field(tmp_path: pathlib.Path) -> None:
    """Guards: every record field (devices, MIG ids, MPS, time-slices keyed by int minor) survives a save and load."""
    path = tmp_path / "checkpoint.json"
    checkpoint.Writer(path).save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    loaded = checkpoint.load(path, boot_id="b1")
    assert loaded.warning is None
    assert loaded.checkpoint.claims == {"u1": RECORD}


def test_file_has_version_and_checksum_and_no_temp_file_is_left(tmp_path: pathlib.Path) -> None:
    """Guards: the format carries version and checksum; the atomic write leaves only the target file."""
    path = tmp_path / "checkpoint.json"
    writer = checkpoint.Writer(path)
    writer.save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    writer.save(checkpoint.Checkpoint(boot_id="b1"))
    document = json.loads(path.read_text())
    assert document["version"] == checkpoint.VERSION and len(document["checksum"]) == 64
    assert os.listdir(tmp_path) == ["checkpoint.json"]


def test_missing_file_is_an_empty_checkpoint_without_warning(tmp_path: pathlib.Path) -> None:
    """Guards: first start: no file means an empty checkpoint, found ABSENT (for the state to rebuild), no warning."""
    loaded = checkpoint.load(tmp_path / "absent.json", boot_id="b1")
    assert loaded == checkpoint.Loaded(checkpoint=checkpoint.Checkpoint(boot_id="b1"), found=checkpoint.Found.ABSENT)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        pytest.param(lambda doc: "garbage{", "not JSON", id="bad-json"),
        pytest.param(lambda doc: {**doc, "checksum": "0" * 64}, "checksum mismatch", id="checksum"),
        pytest.param(
            lambda doc: {**doc, "version": checkpoint.VERSION + 1},
            f"checksum mismatch (version {checkpoint.VERSION + 1})",
            id="version-number-damaged",
        ),
        pytest.param(lambda doc: {**doc, "version": 0}, "version 0 is not one any agent wrote", id="version-0"),
        pytest.param(lambda doc: {**doc, "version": "2"}, "version '2' is not one any agent wrote", id="version-text"),
        pytest.param(
            lambda doc: {**doc, "data": {**doc["data"], "claims": {"u1": {"uid": "u1"}}}},
            "checksum mismatch",
            id="edited",
        ),
    ],
)
def test_corrupt_file_gives_empty_checkpoint_and_warning(tmp_path: pathlib.Path, mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    """Guards: bad JSON, checksum mismatch, a damaged or impossible version: CORRUPT, an empty checkpoint and a
    warning, no raise; a version number raised by damage is never taken for a newer agent's file."""
    path = tmp_path / "checkpoint.json"
    checkpoint.Writer(path).save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    changed = mutate(json.loads(path.read_text()))
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    loaded = checkpoint.load(path, boot_id="b1")
    assert loaded.checkpoint == checkpoint.Checkpoint(boot_id="b1") and loaded.found is checkpoint.Found.CORRUPT
    assert loaded.warning is not None and str(path) in loaded.warning and reason in loaded.warning


def test_malformed_record_with_a_valid_checksum_is_corrupt_not_a_crash(tmp_path: pathlib.Path) -> None:
    """Guards: a malformed record with a matching checksum is a warning, not a KeyError."""
    path = tmp_path / "checkpoint.json"
    data = {"bootId": "b1", "claims": {"u1": {"uid": "u1"}}}
    path.write_text(json.dumps(_intact(checkpoint.VERSION, data)))
    loaded = checkpoint.load(path, boot_id="b1")
    assert loaded.checkpoint.claims == {} and loaded.warning is not None and "malformed record" in loaded.warning


def test_other_boot_discards_the_records_with_a_warning(tmp_path: pathlib.Path) -> None:
    """Guards: a checkpoint from before a reboot is dropped (MIG instances and MPS daemons did not survive it)."""
    path = tmp_path / "checkpoint.json"
    checkpoint.Writer(path).save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    loaded = checkpoint.load(path, boot_id="b2")
    assert loaded.checkpoint == checkpoint.Checkpoint(boot_id="b2")
    assert loaded.warning is not None and "b1" in loaded.warning and "discarding 1 prepared claim(s)" in loaded.warning


def test_boot_id_is_read_from_the_given_path(tmp_path: pathlib.Path) -> None:
    """Guards: the boot id path is injectable; an unreadable one gives an empty id, not a crash."""
    (tmp_path / "boot_id").write_text("abc-123\n")
    assert checkpoint.read_boot_id(tmp_path / "boot_id") == "abc-123"
    assert checkpoint.read_boot_id(tmp_path / "missing") == ""


def test_save_without_fsync_is_still_atomic_and_readable(tmp_path: pathlib.Path) -> None:
    """Guards: fsync=False (the fast path) still writes through a temp file and rename, and reads back the same."""
    path = tmp_path / "checkpoint.json"
    checkpoint.Writer(path, fsync=False).save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    assert os.listdir(tmp_path) == ["checkpoint.json"]
    assert checkpoint.load(path, boot_id="b1").checkpoint.claims == {"u1": RECORD}


def test_the_file_is_canonical_json_and_its_data_part_is_what_the_checksum_covers(tmp_path: pathlib.Path) -> None:
    """Guards: the file, assembled from per-claim parts, is exactly the document's compact sorted-key JSON
    (escapes included), and its checksum covers `data` and `version`: exactly the file after the checksum."""
    path = tmp_path / "checkpoint.json"
    odd = dataclasses.replace(RECORD, uid='u"\\é', name="ünïcode\n")
    checkpoint.Writer(path).save(
        checkpoint.Checkpoint(boot_id='b"1', claims={"u1": RECORD, odd.uid: odd, "a0": RECORD})
    )
    blob = path.read_bytes()
    document = json.loads(blob)
    assert blob == json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    covered = json.dumps(
        {"data": document["data"], "version": document["version"]}, sort_keys=True, separators=(",", ":")
    )
    assert blob == f'{{"checksum":"{document["checksum"]}",{covered[1:]}'.encode()
    assert document["checksum"] == hashlib.sha256(covered.encode()).hexdigest()
    assert checkpoint.load(path, boot_id='b"1').checkpoint.claims == {"u1": RECORD, odd.uid: odd, "a0": RECORD}


def test_the_writer_encodes_only_changed_claims_and_writes_what_encode_writes(
    tmp_path: pathlib.Path, encoded_claims: list[str]
) -> None:
    """Guards: successive saves through one Writer encode only added or replaced records (not the 100 kept),
    and the bytes equal a fresh `encode` of the same checkpoint."""
    records = {f"u{n:03d}": dataclasses.replace(RECORD, uid=f"u{n:03d}") for n in range(100)}
    writer = checkpoint.Writer(tmp_path / "checkpoint.json", fsync=False)
    writer.save(checkpoint.Checkpoint(boot_id="b1", claims=records))
    assert len(encoded_claims) == 100
    encoded_claims.clear()
    changed = dict(records)
    changed["u007"] = dataclasses.replace(records["u007"], phase=checkpoint.Phase.STARTED)
    del changed["u050"]
    changed["u100"] = dataclasses.replace(RECORD, uid="u100")
    later = checkpoint.Checkpoint(boot_id="b1", claims=changed)
    writer.save(later)
    assert sorted(encoded_claims) == ["u007", "u100"]
    assert writer.path.read_bytes() == checkpoint.encode(later)
    assert checkpoint.load(writer.path, boot_id="b1").checkpoint.claims == changed


# A checkpoint as a version-1 agent wrote it, by hand: the checksum covered `data` only.
V1_DATA: dict[str, Any] = {
    "bootId": "b1",
    "claims": {
        "u1": {
            "uid": "u1",
            "namespace": "ns",
            "name": "c",
            "phase": "PrepareCompleted",
            "devices": [
                {
                    "requests": ["gpu"],
                    "pool": "n",
                    "device": "gpu-1-mig-1g10gb-19-2",
                    "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=u1-gpu-1-mig-1g10gb-19-2"],
                    "share_id": None,
                }
            ],
            "cdi_spec": "/var/run/cdi/k8s.gpu.nvidia.com-claim_u1.yaml",
            "mig": [
                {
                    "device": "gpu-1-mig-1g10gb-19-2",
                    "parent_minor": 1,
                    "parent_uuid": "GPU-x",
                    "profile_id": 19,
                    "start": 2,
                    "size": 1,
                    "gi_id": 3,
                    "ci_id": 0,
                    "uuid": "MIG-y",
                }
            ],
            "mps_daemons": [],
            "time_slices": {"0": 3},
            "compute_minors": [],
            "exclusive": ["gpu-1-mig-1g10gb-19-2"],
            "shared": [],
        }
    },
}
V1_RECORD = checkpoint.ClaimRecord(
    uid="u1",
    namespace="ns",
    name="c",
    phase=checkpoint.Phase.COMPLETED,
    devices=(
        checkpoint.DeviceRecord(
            requests=("gpu",),
            pool="n",
            device="gpu-1-mig-1g10gb-19-2",
            cdi_device_ids=("k8s.gpu.nvidia.com/claim=u1-gpu-1-mig-1g10gb-19-2",),
        ),
    ),
    cdi_spec="/var/run/cdi/k8s.gpu.nvidia.com-claim_u1.yaml",
    mig=(
        checkpoint.MigRecord(
            device="gpu-1-mig-1g10gb-19-2",
            parent_minor=1,
            parent_uuid="GPU-x",
            profile_id=19,
            start=2,
            size=1,
            gi_id=3,
            ci_id=0,
            uuid="MIG-y",
        ),
    ),
    time_slices={0: 3},
    exclusive=("gpu-1-mig-1g10gb-19-2",),
)


def _write_v1(path: pathlib.Path) -> bytes:
    checksum = hashlib.sha256(json.dumps(V1_DATA, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    blob = json.dumps({"version": 1, "checksum": checksum, "data": V1_DATA}).encode()
    path.write_bytes(blob)
    return blob


def test_a_hand_written_version_1_file_is_read_and_migrated(tmp_path: pathlib.Path) -> None:
    """Guards: an older agent's checkpoint (version 1, checksum over `data` only) is read with every record, found
    OLDER; reading changes nothing in it, and the next save writes the same records in this version."""
    path = tmp_path / "checkpoint.json"
    blob = _write_v1(path)
    writer = checkpoint.Writer(path, fsync=False)
    loaded = writer.read(boot_id="b1")
    assert (loaded.found, loaded.version, loaded.warning) == (checkpoint.Found.OLDER, 1, None)
    assert loaded.checkpoint.claims == {"u1": V1_RECORD}
    assert path.read_bytes() == blob
    writer.save(loaded.checkpoint)
    again = checkpoint.load(path, boot_id="b1")
    assert (again.found, again.version) == (checkpoint.Found.CURRENT, checkpoint.VERSION)
    assert again.checkpoint.claims == {"u1": V1_RECORD}


def test_a_version_1_file_damaged_is_corrupt(tmp_path: pathlib.Path) -> None:
    """Guards: version 1 files are checked by their own rule: one with an edited record is CORRUPT, not migrated."""
    path = tmp_path / "checkpoint.json"
    path.write_bytes(_write_v1(path).replace(b'"gi_id": 3', b'"gi_id": 4'))
    loaded = checkpoint.load(path, boot_id="b1")
    assert loaded.found is checkpoint.Found.CORRUPT and loaded.warning is not None
    assert "checksum mismatch (version 1)" in loaded.warning


def test_an_intact_newer_version_raises_naming_both_versions_and_is_left_as_it_is(tmp_path: pathlib.Path) -> None:
    """Guards: a checkpoint of version + 1 (intact by the envelope every later version keeps) raises NewerVersion
    naming the file and both versions, from `load` and from `Writer.read`, and stays byte for byte where it was."""
    path = tmp_path / "checkpoint.json"
    blob = json.dumps(_intact(checkpoint.VERSION + 1, {"somethingNew": [1, 2]})).encode()
    path.write_bytes(blob)
    for read in (lambda: checkpoint.load(path, boot_id="b1"), lambda: checkpoint.Writer(path).read(boot_id="b1")):
        with pytest.raises(checkpoint.NewerVersion) as caught:
            read()
        assert str(caught.value) == (
            f"checkpoint {path} is version {checkpoint.VERSION + 1}, written by a newer dractl node agent; "
            f"this agent reads versions 1 to {checkpoint.VERSION}"
        )
        assert caught.value.version == checkpoint.VERSION + 1
    assert path.read_bytes() == blob and os.listdir(tmp_path) == ["checkpoint.json"]


def test_a_directory_at_the_path_is_corrupt_and_moved_aside(tmp_path: pathlib.Path) -> None:
    """Guards: a directory where the checkpoint belongs is CORRUPT (not an OSError that stops the agent for ever);
    `Writer.read` moves it to checkpoint.json.corrupt with its content, so the next save succeeds."""
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    (path / "inside").write_text("kept")
    loaded = checkpoint.load(path, boot_id="b1")
    assert (
        loaded.found is checkpoint.Found.CORRUPT
        and loaded.warning == f"checkpoint {path} is corrupt (a directory, not a file)"
    )
    writer = checkpoint.Writer(path, fsync=False)
    read = writer.read(boot_id="b1")
    assert read.found is checkpoint.Found.CORRUPT
    assert read.warning == f"checkpoint {path} is corrupt (a directory, not a file); moved to {path}.corrupt"
    assert (tmp_path / "checkpoint.json.corrupt" / "inside").read_text() == "kept"
    writer.save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    assert checkpoint.load(path, boot_id="b1").checkpoint.claims == {"u1": RECORD}


def test_a_corrupt_file_is_moved_aside_replacing_an_earlier_one(tmp_path: pathlib.Path) -> None:
    """Guards: `Writer.read` keeps the latest corrupt file as checkpoint.json.corrupt (an earlier corrupt directory
    there is replaced), and the path is then free: a later read finds it ABSENT."""
    path = tmp_path / "checkpoint.json"
    (tmp_path / "checkpoint.json.corrupt").mkdir()
    path.write_bytes(b"{garbage")
    writer = checkpoint.Writer(path, fsync=False)
    assert writer.read(boot_id="b1").found is checkpoint.Found.CORRUPT
    assert (tmp_path / "checkpoint.json.corrupt").read_bytes() == b"{garbage"
    assert not path.exists() and writer.read(boot_id="b1").found is checkpoint.Found.ABSENT


def test_changed_tells_exactly_whether_another_writer_replaced_the_file(tmp_path: pathlib.Path) -> None:
    """Guards: a writer sees no change after its own read or save, and sees another process's save (the same bytes
    too: a new file), a removal and a creation, so a second agent's state is read again when it must be."""
    path = tmp_path / "checkpoint.json"
    mine, other = checkpoint.Writer(path, fsync=False), checkpoint.Writer(path, fsync=False)
    assert not mine.changed()  # nothing read, nothing there
    mine.save(checkpoint.Checkpoint(boot_id="b1"))
    assert not mine.changed()
    other.save(checkpoint.Checkpoint(boot_id="b1"))
    assert mine.changed() and not other.changed()
    mine.read(boot_id="b1")
    assert not mine.changed()
    path.unlink()
    assert mine.changed()
    mine.read(boot_id="b1")
    assert not mine.changed()
    other.save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    assert mine.changed()


def test_the_file_lock_excludes_other_open_files_until_released(tmp_path: pathlib.Path) -> None:
    """Guards: while `FileLock.held()` is in force, another open file (another process) cannot take the lock;
    afterwards it can."""
    lock = checkpoint.FileLock(tmp_path / "state.lock")
    fd = os.open(tmp_path / "state.lock", os.O_RDWR)
    try:
        with lock.held():
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
