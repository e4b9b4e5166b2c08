"""Crash safety of node state: interrupted prepares, corrupt checkpoints, reboots, and the stale-state sweep."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from support import cdi_rules
from support.state_inputs import claim, config, gpu_config, make_node, result

from dractl.node import backend, cdi, checkpoint, sharing, state, visibility

UID = "1a2b3c4d-0000-4000-8000-000000000001"
UID2 = "1a2b3c4d-0000-4000-8000-000000000002"
MIG_A = "gpu-1-mig-3g40gb-9-0"
MIG_B = "gpu-1-mig-2g20gb-14-4"


class Crash(BaseException):
    """A simulated process death: not an Exception, so no handler in state runs."""


class CrashingEdits:
    def common_edits(self) -> cdi.ContainerEdits:
        raise Crash()


class CrashAfterGpuInstance:
    """Wraps the fake: the process dies right after NVML made the GPU instance, before any id is recorded."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_compute_instance(self, minor: int, *, gi_id: int) -> backend.MigDevice:
        raise Crash()


def test_crash_after_mig_creation_is_rolled_back_on_retry(tmp_path: pathlib.Path) -> None:
    """Guards: killed after MIG and MPS: PrepareStarted stays; a new State rolls back, prepares once."""
    node = make_node(tmp_path, dynamic_mig=True)
    mps = config(gpu_config({"strategy": "MPS"}), requests=["gpu"])
    ref = node.claims.put(claim("m", UID, [result("gpu-0"), result(MIG_A, "mig")], [mps]))
    node.common = CrashingEdits()
    with pytest.raises(Crash):
        node.state().prepare(ref)
    record = node.state().prepared()[UID]
    assert record.phase is checkpoint.Phase.STARTED
    assert [m.gi_id is not None for m in record.mig] == [True]
    assert len(node.mps.running) == 1
    node.common = cdi.NoCommonEdits()
    retried = node.state()
    devices = retried.prepare(ref)
    assert [(d.device, d.requests) for d in devices] == [
        ("gpu-0", ("gpu",)),
        (MIG_A, ("mig",)),
        (MIG_A, (visibility.ALL_REQUESTS,)),
    ]
    assert len(node.gpus.gpu_instances(1)) == 1  # the first attempt's instance was destroyed, one made again
    assert node.mps.calls[1][0] == "stop" and len(node.mps.running) == 1
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
    assert retried.prepared()[UID].phase is checkpoint.Phase.COMPLETED


def test_crash_before_mig_ids_are_recorded_is_rolled_back_by_placement(tmp_path: pathlib.Path) -> None:
    """Guards: a GPU instance made just before the crash (no id recorded) is destroyed by placement."""
    node = make_node(tmp_path, dynamic_mig=True)
    ref = node.claims.put(claim("m", UID, [result(MIG_B)]))
    crashing = state.State(
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        backend=CrashAfterGpuInstance(node.gpus),
        claims=node.claims,
        cdi_root=node.cdi_root,
        state_dir=node.state_dir,
        mps=node.mps,
        common_edits=cdi.NoCommonEdits(),
        dynamic_mig=True,
        boot_id_path=node.boot_id,
        proc_root=node.proc,
    )
    with pytest.raises(Crash):
        crashing.prepare(ref)
    assert [gi.placement for gi in node.gpus.gpu_instances(1)] == [backend.Placement(4, 2)]
    assert node.gpus.mig_devices(1) == ()
    node.state().prepare(ref)
    (made,) = node.gpus.mig_devices(1)
    assert made.placement == backend.Placement(4, 2) and len(node.gpus.gpu_instances(1)) == 1


def test_crash_after_the_cdi_file_is_written_leaves_no_stale_spec(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: killed after the CDI write: unprepare (no retry) removes the spec and the MIG instance."""
    node = make_node(tmp_path, dynamic_mig=True)
    ref = node.claims.put(claim("m", UID, [result(MIG_A)]))
    original = cdi.write_spec

    def write_then_die(*args: Any, **kwargs: Any) -> pathlib.Path:
        original(*args, **kwargs)
        raise Crash()

    monkeypatch.setattr(cdi, "write_spec", write_then_die)
    with pytest.raises(Crash):
        node.state().prepare(ref)
    monkeypatch.setattr(cdi, "write_spec", original)
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
    node.state().unprepare(ref)
    assert node.cdi_files() == [] and node.gpus.gpu_instances(1) == ()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"{not json", "not JSON", id="bad-json"),
        pytest.param(None, "checksum mismatch", id="checksum"),
        pytest.param(
            json.dumps({"version": 99, "checksum": "", "data": {}}).encode(),
            "checksum mismatch (version 99)",
            id="version-without-a-valid-checksum",
        ),
        pytest.param(b"[]", "not a JSON object", id="not-object"),
    ],
)
def test_corrupt_checkpoint_is_rebuilt_without_the_claims_no_pod_here_holds(
    tmp_path: pathlib.Path, content: bytes | None, reason: str
) -> None:
    """Guards: a corrupt checkpoint: one CheckpointRebuilt notice naming the reason and where the file went; a
    prepared claim no pod on this node holds (not reserved) is not rebuilt, so the sweep removes its spec; the claim
    prepares again, and the rebuilt checkpoint raises no second notice."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, [result("gpu-0")]))
    node.state().prepare(ref)
    path = node.state_dir / state.CHECKPOINT_FILE
    if content is None:
        content = path.read_bytes().replace(b'"PrepareCompleted"', b'"PrepareStarted"')
    path.write_bytes(content)
    fresh = node.state()
    assert fresh.prepared() == {}
    (notice,) = node.warnings
    assert notice.reason == "CheckpointRebuilt"
    assert f"checkpoint {path} is corrupt (" in notice.message and reason in notice.message
    assert f"moved to {path}.corrupt" in notice.message and "0 prepared claim(s)" in notice.message
    assert (node.state_dir / "checkpoint.json.corrupt").read_bytes() == content
    assert fresh.sweep().removed_cdi_files == (cdi.spec_path(node.cdi_root, UID),)
    assert [d.device for d in fresh.prepare(ref)] == ["gpu-0"]
    assert node.state().prepared()[UID].phase is checkpoint.Phase.COMPLETED
    assert len(node.warnings) == 1


def test_changed_boot_id_discards_the_checkpoint_with_a_warning(tmp_path: pathlib.Path) -> None:
    """Guards: after a reboot the old records are dropped with a Warning; the sweep removes their files."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, [result("gpu-0")]))
    node.state().prepare(ref)
    node.boot_id.write_text("boot-2\n")
    fresh = node.state()
    assert fresh.prepared() == {}
    ((reason, message),) = [(n.reason, n.message) for n in node.warnings]
    assert reason == "NodeStateReset" and "before a reboot" in message and "boot-2" in message
    assert fresh.sweep().removed_cdi_files == (cdi.spec_path(node.cdi_root, UID),)
    assert node.state().prepared() == {} and len(node.warnings) == 1


def test_sweep_unprepares_claims_that_are_gone_or_replaced(tmp_path: pathlib.Path) -> None:
    """Guards: the sweep unprepares claims deleted or recreated with another UID, and keeps live ones."""
    node = make_node(tmp_path, dynamic_mig=True)
    s = node.state()
    gone = node.claims.put(claim("gone", UID, [result(MIG_A)]))
    live = node.claims.put(claim("live", UID2, [result("gpu-2")]))
    replaced = node.claims.put(claim("replaced", "1a2b3c4d-0000-4000-8000-000000000003", [result("gpu-3")]))
    for ref in (gone, live, replaced):
        s.prepare(ref)
    node.claims.delete("default", "gone")
    node.claims.put(claim("replaced", "1a2b3c4d-0000-4000-8000-000000000099", [result("gpu-3")]))
    swept = s.sweep()
    assert sorted(swept.unprepared) == sorted([gone.uid, replaced.uid])
    assert list(s.prepared()) == [live.uid]
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID2}.yaml"]
    assert node.gpus.gpu_instances(1) == ()
    assert s.sweep() == state.SweepResult()


def test_sweep_removes_stray_cdi_files_and_orphan_mig_instances(tmp_path: pathlib.Path) -> None:
    """Guards: unowned CDI files and MIG instances are removed; others' files and owned instances stay."""
    node = make_node(tmp_path, dynamic_mig=True)
    s = node.state()
    s.prepare(node.claims.put(claim("m", UID, [result(MIG_A)])))
    node.cdi_root.joinpath(f"k8s.gpu.nvidia.com-claim_{UID2}.yaml").write_text("cdiVersion: 0.5.0\n")
    node.cdi_root.joinpath("nvidia.com-gpu.yaml").write_text("cdiVersion: 0.5.0\n")
    orphan = node.gpus.create_gpu_instance(1, profile_id=19, placement=backend.Placement(6, 1))
    node.gpus.create_compute_instance(1, gi_id=orphan.gi_id)
    swept = s.sweep()
    assert swept.removed_cdi_files == (cdi.spec_path(node.cdi_root, UID2),)
    assert swept.destroyed_mig == (f"gpu-1/gi{orphan.gi_id}",)
    assert [gi.placement for gi in node.gpus.gpu_instances(1)] == [backend.Placement(0, 4)]
    assert sorted(node.cdi_files()) == sorted([f"k8s.gpu.nvidia.com-claim_{UID}.yaml", "nvidia.com-gpu.yaml"])


def test_sweep_keeps_claims_it_cannot_read(tmp_path: pathlib.Path) -> None:
    """Guards: an API failure during the sweep is reported, and the claim is not unprepared on a guess."""
    node = make_node(tmp_path)
    s = node.state()
    s.prepare(node.claims.put(claim("c", UID, [result("gpu-0")])))
    node.claims.error = RuntimeError("apiserver down")
    swept = s.sweep()
    assert swept.unprepared == () and "apiserver down" in swept.errors[0]
    assert list(s.prepared()) == [UID]


def test_interrupted_prepare_of_a_claim_that_is_gone_is_swept(tmp_path: pathlib.Path) -> None:
    """Guards: a PrepareStarted record of a deleted claim is rolled back by the sweep."""
    node = make_node(tmp_path, dynamic_mig=True)
    ref = node.claims.put(claim("m", UID, [result(MIG_A)]))
    node.common = CrashingEdits()
    with pytest.raises(Crash):
        node.state().prepare(ref)
    node.claims.delete("default", "m")
    node.common = cdi.NoCommonEdits()
    s = node.state()
    assert s.sweep().unprepared == (UID,)
    assert node.gpus.gpu_instances(1) == () and s.prepared() == {}


def test_spec_written_for_every_kind_of_device_is_valid_cdi(tmp_path: pathlib.Path) -> None:
    """Guards: a claim mixing a whole GPU, a MIG device and an MPS share yields one spec passing every CDI rule."""
    node = make_node(tmp_path, dynamic_mig=True)
    mps = config(
        gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}), requests=["shared"]
    )
    ref = node.claims.put(
        claim("mix", UID, [result("gpu-0"), result(MIG_A, "mig"), result("gpu-2", "shared", share_id="s1s2s")], [mps])
    )
    node.state().prepare(ref)
    spec = cdi_rules.check_file(cdi.spec_path(node.cdi_root, UID))
    assert [d["name"] for d in spec["devices"]] == [
        f"{UID}-gpu-0",
        f"{UID}-{MIG_A}",
        f"{UID}-gpu-2-s1s2s",
        f"{UID}-{visibility.ALL_REQUESTS}",
    ]


def test_sweep_stops_mps_daemons_no_claim_uses(tmp_path: pathlib.Path) -> None:
    """Guards: an MPS daemon no prepared claim uses is stopped by the sweep; a claimed one keeps running."""
    node = make_node(tmp_path)
    s = node.state()
    mps = config(gpu_config({"strategy": "MPS"}))
    s.prepare(node.claims.put(claim("m", UID, [result("gpu-0")], [mps])))
    (kept,) = node.mps.daemons()
    node.mps.start(sharing.MpsSettings(daemon_id="leftover-abcde", uuids=("GPU-x",)))
    assert s.sweep().stopped_mps == ("leftover-abcde",)
    assert node.mps.daemons() == (kept,)
