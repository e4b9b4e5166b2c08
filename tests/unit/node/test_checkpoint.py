"""The checkpoint file: versioned JSON with a checksum, atomic writes, corrupt and foreign-boot files handled."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib

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
    """Guards: first start: no file means an empty checkpoint and no warning."""
    loaded = checkpoint.load(tmp_path / "absent.json", boot_id="b1")
    assert loaded == checkpoint.Loaded(checkpoint=checkpoint.Checkpoint(boot_id="b1"))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        pytest.param(lambda doc: "garbage{", "not JSON", id="bad-json"),
        pytest.param(lambda doc: {**doc, "checksum": "0" * 64}, "checksum mismatch", id="checksum"),
        pytest.param(lambda doc: {**doc, "version": 2}, "unknown version 2", id="version"),
        pytest.param(
            lambda doc: {**doc, "data": {**doc["data"], "claims": {"u1": {"uid": "u1"}}}},
            "checksum mismatch",
            id="edited",
        ),
    ],
)
def test_corrupt_file_gives_empty_checkpoint_and_warning(tmp_path: pathlib.Path, mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    """Guards: bad JSON, checksum mismatch, unknown version: an empty checkpoint and a warning, no raise."""
    path = tmp_path / "checkpoint.json"
    checkpoint.Writer(path).save(checkpoint.Checkpoint(boot_id="b1", claims={"u1": RECORD}))
    changed = mutate(json.loads(path.read_text()))
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    loaded = checkpoint.load(path, boot_id="b1")
    assert loaded.checkpoint == checkpoint.Checkpoint(boot_id="b1")
    assert loaded.warning is not None and str(path) in loaded.warning and reason in loaded.warning


def test_malformed_record_with_a_valid_checksum_is_corrupt_not_a_crash(tmp_path: pathlib.Path) -> None:
    """Guards: a malformed record with a matching checksum is a warning, not a KeyError."""
    path = tmp_path / "checkpoint.json"
    data = {"bootId": "b1", "claims": {"u1": {"uid": "u1"}}}
    import hashlib

    checksum = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    path.write_text(json.dumps({"version": checkpoint.VERSION, "checksum": checksum, "data": data}))
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
    (escapes included), so the checksum of its `data` is the one a reader recomputes."""
    path = tmp_path / "checkpoint.json"
    odd = dataclasses.replace(RECORD, uid='u"\\é', name="ünïcode\n")
    checkpoint.Writer(path).save(
        checkpoint.Checkpoint(boot_id='b"1', claims={"u1": RECORD, odd.uid: odd, "a0": RECORD})
    )
    blob = path.read_bytes()
    document = json.loads(blob)
    assert blob == json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    data = json.dumps(document["data"], sort_keys=True, separators=(",", ":")).encode()
    assert document["checksum"] == hashlib.sha256(data).hexdigest()
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
