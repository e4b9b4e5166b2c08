"""Node state without a trustworthy checkpoint (corrupt, a directory, missing, older, newer) and shared by two agents.

A corrupt or missing checkpoint is rebuilt from the claims the API says are on this node (here the in-test
ClaimSource: claims with a result in the node's pool and a reserving pod) and from the CDI specs and MIG
instances that exist; what it rebuilds must be exactly what the prepares recorded. Two State objects on the same
directories play two agents of a rolling update; one FakeGpus and one FakeMps are the node's hardware they share.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pathlib
import threading

import pytest
from support.state_inputs import Node, claim, config, gpu_config, make_node, result

from dractl.node import backend, cdi, checkpoint, state

UID = "5e6f7a8b-0000-4000-8000-000000000001"
UID2 = "5e6f7a8b-0000-4000-8000-000000000002"
UID3 = "5e6f7a8b-0000-4000-8000-000000000003"
MIG_A = "gpu-1-mig-3g40gb-9-0"
MIG_B = "gpu-1-mig-2g20gb-14-4"


def _checkpoint(node: Node) -> pathlib.Path:
    return node.state_dir / state.CHECKPOINT_FILE


def _corrupt(node: Node) -> None:
    path = _checkpoint(node)
    path.write_bytes(path.read_bytes()[:-7])


def _prepare_three(node: Node) -> tuple[state.State, list[state.ClaimRef]]:
    """Three claims held by pods on this node: dynamic MIG with MPS beside a whole GPU, a MIG device alone, and a
    time-sliced whole GPU; all prepared."""
    s = node.state()
    mps = config(gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}}), requests=["gpu"])
    sliced = config(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))
    refs = [
        node.claims.put(claim("mixed", UID, [result("gpu-0"), result(MIG_A, "mig")], [mps], reserved=True)),
        node.claims.put(claim("mig", UID2, [result(MIG_B)], reserved=True)),
        node.claims.put(claim("sliced", UID3, [result("gpu-5")], [sliced], reserved=True)),
    ]
    for ref in refs:
        s.prepare(ref)
    return s, refs


def _instances(node: Node) -> list[tuple[int, backend.Placement]]:
    return [(gi.profile_id, gi.placement) for gi in node.gpus.gpu_instances(1)]


def test_a_corrupt_checkpoint_is_rebuilt_to_exactly_the_records_the_prepares_made(tmp_path: pathlib.Path) -> None:
    """Guards issue 15: after corruption while claims are prepared, the rebuilt records equal the ones the prepares
    wrote (devices, MIG ids, MPS daemons, time-slices); the sweep keeps every CDI spec, MIG instance and daemon; a
    prepare answers the same without the API; unprepare still undoes everything exactly."""
    node = make_node(tmp_path, dynamic_mig=True)
    first, refs = _prepare_three(node)
    before = first.prepared()
    answers = {ref.uid: first.prepare(ref) for ref in refs}
    specs, instances, daemons = node.cdi_files(), _instances(node), node.mps.daemons()
    _corrupt(node)

    rebuilt = node.state()
    assert rebuilt.sweep() == state.SweepResult()
    assert rebuilt.prepared() == before
    assert (node.cdi_files(), _instances(node), node.mps.daemons()) == (specs, instances, daemons)
    (notice,) = node.warnings
    assert notice.reason == "CheckpointRebuilt"
    assert (
        "3 prepared claim(s) (default/mig, default/mixed, default/sliced), 0 to roll back or finish" in notice.message
    )
    reads = node.claims.reads
    assert {ref.uid: rebuilt.prepare(ref) for ref in refs} == answers
    assert node.claims.reads == reads

    for ref in refs:
        rebuilt.unprepare(ref)
    assert node.cdi_files() == [] and node.gpus.gpu_instances(1) == () and node.mps.daemons() == ()
    assert node.gpus.time_slice(5) is backend.TimeSlice.DEFAULT
    assert node.gpus.compute_mode(0) is backend.ComputeMode.DEFAULT


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda path: (path.unlink(), path.mkdir()), id="directory"),
        pytest.param(lambda path: path.unlink(), id="removed"),
    ],
)
def test_a_directory_at_the_path_or_no_file_at_all_is_rebuilt_too(tmp_path: pathlib.Path, damage) -> None:  # type: ignore[no-untyped-def]
    """Guards: a directory where the checkpoint belongs (the agent exited 1 for ever) or a deleted checkpoint: the
    state is rebuilt with every prepared claim, and the sweep destroys nothing."""
    node = make_node(tmp_path, dynamic_mig=True)
    first, _ = _prepare_three(node)
    before, instances = first.prepared(), _instances(node)
    damage(_checkpoint(node))
    rebuilt = node.state()
    assert rebuilt.sweep() == state.SweepResult()
    assert rebuilt.prepared() == before and _instances(node) == instances
    assert [n.reason for n in node.warnings] == ["CheckpointRebuilt"]


def test_an_interrupted_prepare_is_rebuilt_as_started_and_unprepare_removes_its_instance(
    tmp_path: pathlib.Path,
) -> None:
    """Guards: corruption after a prepare died between its GPU instance and its compute instance: the claim comes
    back PrepareStarted owning the placement, so the sweep keeps the instance, and unprepare destroys it."""
    node = make_node(tmp_path, dynamic_mig=True)
    ref = node.claims.put(claim("m", UID, [result(MIG_B)], reserved=True))
    node.state().sweep()
    # What a prepare killed right after NVML made the GPU instance leaves (its PrepareStarted record then lost).
    node.gpus.set_mig_mode(1, backend.MigMode.ENABLED)
    node.gpus.create_gpu_instance(1, profile_id=14, placement=backend.Placement(4, 2))
    _checkpoint(node).write_bytes(b"\x00\x01")

    rebuilt = node.state()
    assert rebuilt.sweep().destroyed_mig == ()
    record = rebuilt.prepared()[UID]
    assert record.phase is checkpoint.Phase.STARTED
    assert [(m.device, m.start, m.size, m.gi_id) for m in record.mig] == [(MIG_B, 4, 2, None)]
    assert _instances(node) == [(14, backend.Placement(4, 2))]
    rebuilt.unprepare(ref)
    assert node.gpus.gpu_instances(1) == () and rebuilt.prepared() == {}


def test_claims_no_pod_on_this_node_holds_are_not_rebuilt_and_are_swept(tmp_path: pathlib.Path) -> None:
    """Guards: the rebuild takes only claims reserved for pods on this node: a prepared claim whose pod is gone
    loses its CDI spec and MIG instance to the sweep, a held one keeps both."""
    node = make_node(tmp_path, dynamic_mig=True)
    s = node.state()
    held = node.claims.put(claim("held", UID, [result(MIG_A)], reserved=True))
    left = node.claims.put(claim("left", UID2, [result(MIG_B)]))
    s.prepare(held)
    s.prepare(left)
    _corrupt(node)
    swept = node.state().sweep()
    assert swept.removed_cdi_files == (cdi.spec_path(node.cdi_root, UID2),)
    assert len(swept.destroyed_mig) == 1
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, UID).name]
    assert _instances(node) == [(9, backend.Placement(0, 4))]


def test_while_the_api_cannot_be_read_nothing_is_removed_and_calls_fail_to_be_retried(tmp_path: pathlib.Path) -> None:
    """Guards: a corrupt checkpoint while the API is down: the sweep removes nothing and says why, prepare and
    unprepare fail with a retryable error naming the claim and the reason; once the API answers, the next sweep
    rebuilds and the node's devices are all still there."""
    node = make_node(tmp_path, dynamic_mig=True)
    first, refs = _prepare_three(node)
    before, specs, instances = first.prepared(), node.cdi_files(), _instances(node)
    _corrupt(node)
    node.claims.error = RuntimeError("connection refused")

    s = node.state()
    swept = s.sweep()
    assert swept.unprepared == swept.removed_cdi_files == swept.destroyed_mig == swept.stopped_mps == ()
    (error,) = swept.errors
    assert "the node's prepared claims must be rebuilt (checkpoint" in error and "connection refused" in error
    for call in (s.prepare, s.unprepare):
        with pytest.raises(state.PrepareError) as caught:
            call(refs[1])
        assert str(caught.value).startswith("claim default/mig: the node's prepared claims must be rebuilt")
        assert str(caught.value).endswith("cannot be read: connection refused; the kubelet retries")
    assert (node.cdi_files(), _instances(node)) == (specs, instances)

    node.claims.error = None
    assert s.sweep() == state.SweepResult()
    assert s.prepared() == before


def test_a_claim_that_cannot_be_planned_any_more_keeps_its_spec_until_unprepared(tmp_path: pathlib.Path) -> None:
    """Guards: a claim on this node whose allocation no longer fits the GPUs (its GPU gone) is rebuilt with its CDI
    spec only, the notice names the problem, the sweep keeps the spec, and unprepare removes it."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("c", UID, [result("gpu-3")], reserved=True))
    s.prepare(ref)
    node.claims.put(claim("c", UID, [result("gpu-9")], reserved=True))  # as if gpu-3 had been renumbered
    _corrupt(node)
    rebuilt = node.state()
    assert rebuilt.sweep() == state.SweepResult()
    (notice,) = node.warnings
    assert "0 prepared claim(s), 1 to roll back or finish (default/c)" in notice.message
    assert notice.message.endswith("; claim default/c: device gpu-9: this node has no GPU with minor 9")
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, UID).name]
    rebuilt.unprepare(ref)
    assert node.cdi_files() == []


def test_a_newer_agents_checkpoint_stops_the_state_and_nothing_is_touched(tmp_path: pathlib.Path) -> None:
    """Guards: a checkpoint of version + 1 makes State() raise NewerVersion naming both versions; the file, the CDI
    specs and the MIG instances stay as they are."""
    node = make_node(tmp_path, dynamic_mig=True)
    _prepare_three(node)
    data = {"bootId": "boot-1", "claims": {}, "whatever": "a newer agent keeps"}
    covered = json.dumps({"data": data, "version": checkpoint.VERSION + 1}, sort_keys=True, separators=(",", ":"))
    blob = f'{{"checksum":"{hashlib.sha256(covered.encode()).hexdigest()}",{covered[1:]}'.encode()
    _checkpoint(node).write_bytes(blob)
    specs, instances = node.cdi_files(), _instances(node)
    with pytest.raises(checkpoint.NewerVersion, match=f"is version {checkpoint.VERSION + 1}, written by a newer"):
        node.state()
    assert _checkpoint(node).read_bytes() == blob
    assert (node.cdi_files(), _instances(node), node.warnings) == (specs, instances, [])


def test_a_version_1_checkpoint_is_used_as_it_is_and_written_as_this_version_at_the_next_change(
    tmp_path: pathlib.Path,
) -> None:
    """Guards: the checkpoint an older agent left (version 1, rewritten here by its rule) keeps every claim: the
    sweep keeps their devices, unprepare undoes one, and only then is the file written, in this version."""
    node = make_node(tmp_path, dynamic_mig=True)
    first, refs = _prepare_three(node)
    before = first.prepared()
    document = json.loads(_checkpoint(node).read_bytes())
    data = json.dumps(document["data"], sort_keys=True, separators=(",", ":"))
    old = {"version": 1, "checksum": hashlib.sha256(data.encode()).hexdigest(), "data": document["data"]}
    _checkpoint(node).write_text(json.dumps(old))

    s = node.state()
    assert s.sweep() == state.SweepResult() and s.prepared() == before and node.warnings == []
    assert json.loads(_checkpoint(node).read_bytes())["version"] == 1
    s.unprepare(refs[1])
    assert json.loads(_checkpoint(node).read_bytes())["version"] == checkpoint.VERSION
    assert node.state().prepared() == {uid: r for uid, r in before.items() if uid != UID2}


def test_two_states_on_one_node_share_the_checkpoint(tmp_path: pathlib.Path) -> None:
    """Guards rolling updates: a second agent's state started beside the first sees the claims the first prepares
    (and answers them without the API), its sweep keeps their devices, its unprepare undoes them, and the first
    then sees them gone."""
    node = make_node(tmp_path, dynamic_mig=True)
    old, new = node.state(), node.state()
    old.sweep()
    ref = node.claims.put(claim("m", UID, [result(MIG_A)], reserved=True))
    devices = old.prepare(ref)
    assert new.sweep() == state.SweepResult()
    reads = node.claims.reads
    assert new.prepare(ref) == devices and node.claims.reads == reads
    new.unprepare(ref)
    assert old.prepared() == {} and node.gpus.gpu_instances(1) == () and node.cdi_files() == []
    other = node.claims.put(claim("n", UID2, [result(MIG_B)], reserved=True))
    new.prepare(other)
    assert list(old.prepared()) == [UID2]


class _Gate:
    """Common CDI edits that wait on an event: holds a prepare inside its side effects."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()

    def common_edits(self) -> cdi.ContainerEdits:
        self.inside.set()
        assert self.go.wait(timeout=30)
        return cdi.ContainerEdits()


def test_the_state_file_lock_is_held_through_a_prepares_side_effects(tmp_path: pathlib.Path) -> None:
    """Guards: while one agent's prepare makes its side effects, another process cannot take the node's state
    lock (so it never reads a checkpoint between PrepareStarted and PrepareCompleted); afterwards it can."""
    node = make_node(tmp_path, dynamic_mig=True)
    gate = _Gate()
    node.common = gate
    s = node.state()
    s.sweep()
    ref = node.claims.put(claim("m", UID, [result(MIG_A)], reserved=True))
    worker = threading.Thread(target=s.prepare, args=(ref,))
    worker.start()
    fd = os.open(node.state_dir / state.LOCK_FILE, os.O_RDWR)
    try:
        assert gate.inside.wait(timeout=30)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        gate.go.set()
        worker.join(timeout=30)
        assert not worker.is_alive()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert s.prepared()[UID].phase is checkpoint.Phase.COMPLETED


def test_an_agent_finding_a_newer_agents_checkpoint_refuses_calls_and_never_writes_over_it(
    tmp_path: pathlib.Path,
) -> None:
    """Guards a rolling update to a newer checkpoint version: once the new agent has written its version, the old
    agent's calls fail naming both versions (the kubelet uses the newest plugin) and the file stays the new one."""
    node = make_node(tmp_path)
    s = node.state()
    s.sweep()
    ref = node.claims.put(claim("c", UID, [result("gpu-0")], reserved=True))
    data = {"bootId": "boot-1", "claims": {}}
    covered = json.dumps({"data": data, "version": checkpoint.VERSION + 1}, sort_keys=True, separators=(",", ":"))
    blob = f'{{"checksum":"{hashlib.sha256(covered.encode()).hexdigest()}",{covered[1:]}'.encode()
    checkpoint.write_atomically(_checkpoint(node), blob)  # as the other agent writes it: a new file
    with pytest.raises(state.PrepareError) as caught:
        s.prepare(ref)
    assert str(caught.value).startswith(f"claim default/c: checkpoint {_checkpoint(node)} is version ")
    assert "so it leaves the node to the newer one" in str(caught.value)
    assert s.sweep().errors and _checkpoint(node).read_bytes() == blob and node.cdi_files() == []
