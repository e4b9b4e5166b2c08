"""Prepare and unprepare through `state.State` with fake GPUs and an in-test ClaimSource."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import pytest
from support import cdi_rules
from support.state_inputs import (
    claim,
    config,
    container_sees,
    env_of,
    gpu_config,
    make_node,
    result,
)

from dractl import model
from dractl.node import backend, cdi, checkpoint, state

UID = "0c1d2e3f-0000-4000-8000-000000000001"
UID2 = "0c1d2e3f-0000-4000-8000-000000000002"


def _spec(node, uid: str = UID):  # type: ignore[no-untyped-def]
    return cdi_rules.check_file(cdi.spec_path(node.cdi_root, uid))


def test_full_gpu_prepare_writes_a_valid_cdi_spec_and_returns_the_devices(tmp_path: pathlib.Path) -> None:
    """Guards: two full GPUs give two devices with CDI ids <uid>-<device>, env UUIDs in result order, /dev nodes."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("train", UID, [result("gpu-3"), result("gpu-1")]))
    devices = s.prepare(ref)
    assert devices == (
        state.PreparedDevice(
            requests=("gpu",), pool="node-a", device="gpu-3", cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={UID}-gpu-3",)
        ),
        state.PreparedDevice(
            requests=("gpu",), pool="node-a", device="gpu-1", cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={UID}-gpu-1",)
        ),
    )
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
    spec = _spec(node)
    uuids = {g.minor: g.uuid for g in node.gpus.gpus()}
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert env_of(spec, f"{UID}-gpu-3") == {
        "NVIDIA_VISIBLE_DEVICES": f"{uuids[3]},{uuids[1]}",
        "CUDA_VISIBLE_DEVICES": f"{uuids[3]},{uuids[1]}",
    }
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia3"]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


def test_prepare_twice_returns_the_same_answer_without_reading_the_claim_again(tmp_path: pathlib.Path) -> None:
    """Guards: idempotency: a completed claim returns its saved devices, also after a restart."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("train", UID, [result("gpu-0")]))
    first = s.prepare(ref)
    reads = node.claims.reads
    assert s.prepare(ref) == first
    assert node.state().prepare(ref) == first
    assert node.claims.reads == reads


def test_a_repeated_prepare_writes_again_a_spec_that_is_gone(tmp_path: pathlib.Path) -> None:
    """Guards: the CDI directory emptied while a claim is prepared (a cleaned tmpfs, by hand): the kubelet's repeated
    prepare returns the same CDI ids and the spec they name exists again, as the prepare wrote it, without a read of
    the claim; a Warning notice says so."""
    node = make_node(tmp_path, dynamic_mig=True)
    s = node.state()
    ref = node.claims.put(claim("m", UID, [result("gpu-1-mig-3g40gb-9-4", "large"), result("gpu-2", "whole")]))
    first = s.prepare(ref)
    path = cdi.spec_path(node.cdi_root, UID)
    written = _spec(node)
    path.unlink()
    reads = node.claims.reads
    assert s.prepare(ref) == first
    assert _spec(node) == written and node.claims.reads == reads
    assert [w.reason for w in node.warnings] == ["CDISpecRestored"]
    assert node.warnings[0].message == (
        f"the CDI spec of prepared claim default/m was gone from {node.cdi_root}; written again from the checkpoint "
        f"as {path.name}"
    )


def test_an_agent_start_writes_again_every_prepared_claims_spec_that_is_gone(tmp_path: pathlib.Path) -> None:
    """Guards: a restarted agent's first sweep writes again the spec of every prepared claim whose spec is gone (the
    CDI directory was emptied while it was down), so a container restart of a running pod finds its devices; specs
    that exist are left as they are."""
    node = make_node(tmp_path)
    s = node.state()
    s.prepare(node.claims.put(claim("a", UID, [result("gpu-0")])))
    s.prepare(node.claims.put(claim("b", UID2, [result("gpu-1", "x"), result("gpu-2", "y")])))
    gone = cdi.spec_path(node.cdi_root, UID2)
    written = _spec(node, UID2)
    gone.unlink()
    kept = cdi.spec_path(node.cdi_root, UID)
    before = kept.stat().st_mtime_ns
    result_ = node.state().sweep()
    assert result_ == state.SweepResult(restored_cdi_files=(gone,))
    assert _spec(node, UID2) == written and kept.stat().st_mtime_ns == before
    assert node.state().sweep() == state.SweepResult()


def test_a_spec_gone_with_a_record_of_an_older_agent_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    """Guards: a prepared claim recorded by a version-2 agent (no CDI devices in its record) whose spec is gone: the
    repeated prepare fails naming the claim, the file and what to do, and the sweep lists the same, never a crash."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("a", UID, [result("gpu-0")]))
    s.prepare(ref)
    path = cdi.spec_path(node.cdi_root, UID)
    path.unlink()
    document = json.loads((node.state_dir / state.CHECKPOINT_FILE).read_text())
    del document["data"]["claims"][UID]["cdi_devices"]
    covered = json.dumps({"data": document["data"], "version": 2}, sort_keys=True, separators=(",", ":"))
    document.update(version=2, checksum=hashlib.sha256(covered.encode()).hexdigest())
    (node.state_dir / state.CHECKPOINT_FILE).write_text(json.dumps(document))
    older = node.state()
    message = (
        f"{path} is gone, and the checkpoint record, written by an older agent, does not hold its devices: delete the "
        "claim's pods so that it is prepared again"
    )
    with pytest.raises(state.PrepareError) as caught:
        older.prepare(ref)
    assert str(caught.value) == f"claim default/a: its CDI spec is gone and cannot be written again: {message}"
    assert older.sweep().errors == (f"claim default/a: its CDI spec is gone and cannot be written ({message})",)


def test_unprepare_removes_the_spec_and_unknown_claims_succeed(tmp_path: pathlib.Path) -> None:
    """Guards: unprepare deletes the CDI file and the record; unpreparing an unknown claim or twice succeeds."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("train", UID, [result("gpu-0")]))
    s.prepare(ref)
    s.unprepare(ref)
    assert node.cdi_files() == []
    assert s.prepared() == {}
    s.unprepare(ref)
    s.unprepare(state.ClaimRef(namespace="x", name="y", uid="never-seen"))
    assert node.state().prepared() == {}


def test_subrequest_names_are_reported_as_base_request_names(tmp_path: pathlib.Path) -> None:
    """Guards: a result for request gpu/large is returned with request name gpu (the kubelet matches base names)."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, [result("gpu-0", "gpu/large")]))
    (device,) = node.state().prepare(ref)
    assert device.requests == ("gpu",)


def test_results_of_other_drivers_are_left_out(tmp_path: pathlib.Path) -> None:
    """Guards: only results for our driver are prepared; another driver's devices are that driver's to prepare."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, [result("gpu-0"), result("nic-0", driver="net.example.com")]))
    assert [d.device for d in node.state().prepare(ref)] == ["gpu-0"]


@pytest.mark.parametrize(
    "results",
    [
        pytest.param([result("gpu-1", pool="node-b")], id="only-another-pool"),
        pytest.param([result("gpu-0"), result("gpu-1", pool="node-b")], id="this-pool-and-another"),
    ],
)
def test_a_result_in_another_nodes_pool_is_the_claims_error(
    tmp_path: pathlib.Path, results: list[model.DeviceRequestAllocationResult]
) -> None:
    """Guards: a claim allocated to another node's GPUs fails with an error naming the result, its pool and this
    node's (it was "prepared" with 0 devices), and nothing is made or recorded."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, results))
    s = node.state()
    index = len(results) - 1
    with pytest.raises(state.PrepareError) as caught:
        s.prepare(ref)
    assert str(caught.value) == (
        f"claim default/c: status.allocation.devices.results[{index}] is device gpu-1 in pool node-b, not in this "
        "node's pool node-a: the claim is allocated to another node"
    )
    assert s.prepared() == {} and node.cdi_files() == []


def test_a_container_sees_the_devices_of_the_requests_it_names_and_all_when_it_names_none(
    tmp_path: pathlib.Path,
) -> None:
    """Guards: a claim with two requests: a container that names one sees exactly that request's GPUs, in its env and
    its device nodes; one that names none sees every GPU of the claim in both (CDI env edits are last-wins, so without
    the claim's every-request entry its env would name only the last request's GPUs)."""
    node = make_node(tmp_path)
    ref = node.claims.put(claim("c", UID, [result("gpu-0", "a"), result("gpu-1", "b"), result("gpu-2", "a")]))
    prepared = node.state().prepare(ref)
    spec = _spec(node)
    uuids = {g.minor: g.uuid for g in node.gpus.gpus()}
    for requests, minors in (((), [0, 1, 2]), (("a",), [0, 2]), (("b",), [1])):
        env, nodes = container_sees(spec, prepared, requests=requests)
        visible = ",".join(uuids[m] for m in minors)
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == (visible, visible), requests
        assert [n for n in nodes if n[len("/dev/nvidia") :].isdigit()] == [f"/dev/nvidia{m}" for m in minors]


def test_a_claim_of_one_request_has_no_every_request_entry(tmp_path: pathlib.Path) -> None:
    """Guards: the every-request entry is only for claims of two requests or more: a one-request claim of two GPUs
    returns its two devices, and a container sees both."""
    node = make_node(tmp_path)
    prepared = node.state().prepare(node.claims.put(claim("c", UID, [result("gpu-0"), result("gpu-1")])))
    assert [(d.device, d.requests) for d in prepared] == [("gpu-0", ("gpu",)), ("gpu-1", ("gpu",))]
    env, _ = container_sees(_spec(node), prepared)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in node.gpus.gpus()[:2])


def test_a_mig_pair_of_one_parent_is_seen_whole_by_a_container_that_names_no_request(tmp_path: pathlib.Path) -> None:
    """Guards: the seed's MIG pair (large-slice + small-slice on one parent): a container naming neither request sees
    both MIG devices in its env; each container naming one sees only its own."""
    node = make_node(tmp_path, dynamic_mig=True)
    large, small = "gpu-1-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-2"
    ref = node.claims.put(claim("m", UID, [result(large, "large-slice"), result(small, "small-slice")]))
    prepared = node.state().prepare(ref)
    made = {d.profile_id: d.uuid for d in node.gpus.mig_devices(1)}
    spec = _spec(node)
    seen = {
        requests: container_sees(spec, prepared, requests=requests)[0]["CUDA_VISIBLE_DEVICES"]
        for requests in ((), ("large-slice",), ("small-slice",))
    }
    assert seen == {(): f"{made[9]},{made[19]}", ("large-slice",): made[9], ("small-slice",): made[19]}


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        pytest.param(None, "claim default/c: ResourceClaim not found", id="missing"),
        pytest.param(
            claim("c", "another-uid", [result("gpu-0")]), "UID is another-uid, the kubelet asked for", id="uid-changed"
        ),
        pytest.param(claim("c", UID, allocated=False), "not allocated", id="not-allocated"),
        pytest.param(
            claim("c", UID, [result("gpu-9")]), "device gpu-9: this node has no GPU with minor 9", id="unknown-gpu"
        ),
        pytest.param(
            claim("c", UID, [result("tpu-0")]), "device tpu-0: not a device this driver publishes", id="foreign-device"
        ),
    ],
)
def test_prepare_refuses_bad_claims_with_a_message_naming_the_claim(
    tmp_path: pathlib.Path, stored, message: str
) -> None:  # type: ignore[no-untyped-def]
    """Guards: a missing, replaced or unallocated claim, or unknown device: PrepareError, nothing left."""
    node = make_node(tmp_path)
    if stored is not None:
        node.claims.put(stored)
    s = node.state()
    with pytest.raises(state.PrepareError, match="claim default/c") as caught:
        s.prepare(state.ClaimRef(namespace="default", name="c", uid=UID))
    assert message in str(caught.value)
    assert s.prepared() == {}
    assert node.cdi_files() == []


def test_an_api_failure_is_the_claims_error(tmp_path: pathlib.Path) -> None:
    """Guards: an exception from the ClaimSource becomes a PrepareError, not a crash of the handler."""
    node = make_node(tmp_path)
    s = node.state()
    assert s.sweep() == state.SweepResult()  # the start-up sweep: no checkpoint yet, nothing to rebuild
    node.claims.error = RuntimeError("connection refused")
    with pytest.raises(state.PrepareError, match="claim default/c: cannot read the ResourceClaim: connection refused"):
        s.prepare(state.ClaimRef(namespace="default", name="c", uid=UID))


def test_a_device_held_by_another_claim_is_refused(tmp_path: pathlib.Path) -> None:
    """Guards: no double use: a non-admin device prepared for one claim is refused to another, naming both claims and
    the pods each is reserved for (the kubelet puts the message in an Event on the refused pod)."""
    node = make_node(tmp_path)
    s = node.state()
    s.prepare(node.claims.put(claim("first", UID, [result("gpu-0")], reserved=True)))
    with pytest.raises(state.PrepareError) as caught:
        s.prepare(node.claims.put(claim("second", UID2, [result("gpu-0")], reserved=True)))
    assert str(caught.value) == (
        "claim default/second (pod default/pod-second): device gpu-0 is already prepared for claim default/first "
        f"(uid {UID}) (pod default/pod-first); it cannot be used by two claims at once (were they allocated by two "
        "schedulers?)"
    )
    assert list(s.prepared()) == [UID]


def test_a_device_held_by_a_pod_groups_claim_names_the_group(tmp_path: pathlib.Path) -> None:
    """Guards: the refusal names the consumers of a claim reserved for a PodGroup (KEP-5729) by their resource."""
    node = make_node(tmp_path)
    s = node.state()
    group = model.ResourceClaimConsumerReference(
        resource="podgroups", name="train", uid="g1", api_group="scheduling.k8s.io"
    )
    held = dataclasses.replace(claim("first", UID, [result("gpu-0")]), reserved_for=(group,))
    s.prepare(node.claims.put(held))
    with pytest.raises(state.PrepareError, match=r"for claim default/first \(uid [^)]*\) \(podgroups default/train\);"):
        s.prepare(node.claims.put(claim("second", UID2, [result("gpu-0")])))


def test_admin_access_may_reach_a_held_device(tmp_path: pathlib.Path) -> None:
    """Guards: an adminAccess result is not refused for a device another claim holds (monitoring)."""
    node = make_node(tmp_path)
    s = node.state()
    s.prepare(node.claims.put(claim("first", UID, [result("gpu-0")])))
    devices = s.prepare(node.claims.put(claim("monitor", UID2, [result("gpu-0", admin=True)])))
    assert [d.device for d in devices] == ["gpu-0"]


def test_two_shares_of_one_multi_allocatable_gpu_are_both_prepared(tmp_path: pathlib.Path) -> None:
    """Guards: shares of one GPU in two claims both prepare; memory is enforced per client by MPS."""
    node = make_node(tmp_path)
    s = node.state()
    a = s.prepare(node.claims.put(claim("a", UID, [result("gpu-0", share_id="a1b2c", memory="10Gi")])))
    b = s.prepare(node.claims.put(claim("b", UID2, [result("gpu-0", share_id="d3e4f", memory="20Gi")])))
    assert a[0].share_id == "a1b2c" and b[0].share_id == "d3e4f"
    assert a[0].cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={UID}-gpu-0-a1b2c",)
    uuid = node.gpus.gpus()[0].uuid
    assert list(node.mps.running) == [f"shared-{uuid}"]
    env = env_of(_spec(node, UID2), f"{UID2}-gpu-0-d3e4f")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    s.unprepare(state.ClaimRef("default", "a", UID))
    assert list(node.mps.running) == [f"shared-{uuid}"]  # the other share still uses the daemon
    s.unprepare(state.ClaimRef("default", "b", UID2))
    assert node.mps.running == {}


def test_a_share_and_a_whole_use_of_one_gpu_are_refused(tmp_path: pathlib.Path) -> None:
    """Guards: a share of a GPU cannot join a claim holding that GPU whole, and vice versa."""
    node = make_node(tmp_path)
    s = node.state()
    s.prepare(node.claims.put(claim("a", UID, [result("gpu-0", share_id="a1b2c")])))
    with pytest.raises(state.PrepareError, match="device gpu-0 is already prepared"):
        s.prepare(node.claims.put(claim("b", UID2, [result("gpu-0")])))


def test_time_slicing_is_set_and_reset_only_when_no_claim_uses_the_gpu(tmp_path: pathlib.Path) -> None:
    """Guards: TimeSlicing sets the interval; unprepare resets it only when no other claim uses the GPU."""
    node = make_node(tmp_path)
    s = node.state()
    ts = config(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))
    s.prepare(node.claims.put(claim("a", UID, [result("gpu-2", share_id="aaaaa")], [ts])))
    s.prepare(node.claims.put(claim("b", UID2, [result("gpu-2", share_id="bbbbb")], [ts])))
    assert node.gpus.time_slice(2) is backend.TimeSlice.LONG
    assert s.prepared()[UID].time_slices == {2: 3}
    s.unprepare(state.ClaimRef("default", "a", UID))
    assert node.gpus.time_slice(2) is backend.TimeSlice.LONG
    s.unprepare(state.ClaimRef("default", "b", UID2))
    assert node.gpus.time_slice(2) is backend.TimeSlice.DEFAULT


def test_mps_config_starts_a_daemon_with_its_settings_and_stops_it(tmp_path: pathlib.Path) -> None:
    """Guards: MPS: a daemon per claim with its settings, exclusive compute mode, CDI edits; all undone."""
    node = make_node(tmp_path)
    s = node.state()
    mps = config(
        gpu_config(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"1": "5Gi"},
                },
            }
        )
    )
    ref = node.claims.put(claim("m", UID, [result("gpu-4"), result("gpu-5")], [mps]))
    s.prepare(ref)
    uuids = {g.minor: g.uuid for g in node.gpus.gpus()}
    (settings,) = node.mps.running.values()
    assert settings.uuids == (uuids[4], uuids[5])
    assert settings.active_thread_percentage == 50
    assert dict(settings.pinned_limits_mib) == {uuids[4]: 10240, uuids[5]: 5120}
    assert node.gpus.compute_mode(4) is backend.ComputeMode.EXCLUSIVE_PROCESS
    spec = _spec(node)
    device = spec["devices"][0]["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in device["env"]
    assert {m["containerPath"] for m in device["mounts"]} == {"/tmp/nvidia-mps", "/dev/shm"}
    s.unprepare(ref)
    assert node.mps.running == {}
    assert node.mps.calls == [("start", settings.daemon_id), ("stop", settings.daemon_id)]
    assert node.gpus.compute_mode(4) is backend.ComputeMode.DEFAULT


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param(
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "opaque.parameters.apiVersion: must be resource.nvidia.com/v1beta1",
            id="api-version",
        ),
        pytest.param(gpu_config(bogus=1), "opaque.parameters.bogus: unknown field", id="unknown-field"),
        pytest.param(
            gpu_config({"strategy": "Spatial"}),
            "opaque.parameters.sharing.strategy: must be TimeSlicing or MPS",
            id="strategy",
        ),
        pytest.param(
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
            "sharing.timeSlicingConfig.interval: must be Default, Short, Medium or Long",
            id="interval",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer from 0 to 100",
            id="percentage",
        ),
        pytest.param(
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"7": "1Gi"}}}),
            "defaultPerDevicePinnedMemoryLimit: '7' is neither the UUID nor the index",
            id="per-device-index",
        ),
    ],
)
def test_bad_opaque_config_is_refused_naming_claim_index_and_field(
    tmp_path: pathlib.Path, parameters, message: str
) -> None:  # type: ignore[no-untyped-def]
    """Guards: a bad opaque config: one message with claim, config index, source and field."""
    node = make_node(tmp_path)
    other = config({"anything": True}, driver="net.example.com")
    ref = node.claims.put(claim("c", UID, [result("gpu-0")], [other, config(parameters)]))
    s = node.state()
    with pytest.raises(state.PrepareError) as caught:
        s.prepare(ref)
    text = str(caught.value)
    assert text.startswith("claim default/c: status.allocation.devices.config[1] (FromClaim)")
    assert message in text
    assert s.prepared() == {} and node.cdi_files() == []


def test_static_mig_device_is_prepared_with_its_caps_nodes(tmp_path: pathlib.Path) -> None:
    """Guards: static MIG: its UUID in env, parent and nvidia-cap nodes; unprepare keeps the device."""
    node = make_node(tmp_path, "a100-mig-mixed")
    existing = next(d for d in node.gpus.mig_devices(0) if d.profile_name == "2g.20gb")
    device = f"gpu-0-mig-2g20gb-{existing.profile_id}-{existing.placement.start}"
    gi_dir = node.proc / "driver/nvidia/capabilities/gpu0/mig" / f"gi{existing.gi_id}"
    (gi_dir / f"ci{existing.ci_id}").mkdir(parents=True)
    (gi_dir / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (gi_dir / f"ci{existing.ci_id}" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\n")
    s = node.state()
    ref = node.claims.put(claim("m", UID, [result(device)]))
    s.prepare(ref)
    spec = _spec(node)
    assert env_of(spec, f"{UID}-{device}")["NVIDIA_VISIBLE_DEVICES"] == existing.uuid
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    s.unprepare(ref)
    assert existing in node.gpus.mig_devices(0)


def test_static_mig_device_that_is_gone_is_refused(tmp_path: pathlib.Path) -> None:
    """Guards: static MIG never creates instances: a MIG device that does not exist is refused."""
    node = make_node(tmp_path, "a100-mig-mixed")
    ref = node.claims.put(claim("m", UID, [result("gpu-2-mig-1g10gb-19-0")]))
    with pytest.raises(state.PrepareError, match="no such MIG device exists on GPU 2"):
        node.state().prepare(ref)


def test_dynamic_mig_creates_instances_at_the_allocated_placement_and_destroys_them(tmp_path: pathlib.Path) -> None:
    """Guards: dynamic MIG: GI+CI made at the named placement, recorded with ids, destroyed on unprepare."""
    node = make_node(tmp_path, dynamic_mig=True)
    s = node.state()
    ref = node.claims.put(claim("m", UID, [result("gpu-1-mig-3g40gb-9-4"), result("gpu-1-mig-1g10gb-19-2")]))
    devices = s.prepare(ref)
    assert [d.device for d in devices] == ["gpu-1-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-2"]
    made = node.gpus.mig_devices(1)
    assert [(d.profile_id, d.placement) for d in made] == [(19, backend.Placement(2, 1)), (9, backend.Placement(4, 4))]
    record = s.prepared()[UID]
    assert record.phase is checkpoint.Phase.COMPLETED
    assert {(m.gi_id, m.uuid) for m in record.mig} == {(d.gi_id, d.uuid) for d in made}
    spec = _spec(node)
    big = next(d for d in made if d.profile_id == 9)
    assert env_of(spec, f"{UID}-gpu-1-mig-3g40gb-9-4")["CUDA_VISIBLE_DEVICES"].split(",")[0] == big.uuid
    s.unprepare(ref)
    assert node.gpus.gpu_instances(1) == ()


def test_dynamic_mig_placement_unknown_to_the_gpu_is_refused(tmp_path: pathlib.Path) -> None:
    """Guards: a MIG placement the GPU's profile does not allow is refused; nothing is created."""
    node = make_node(tmp_path, dynamic_mig=True)
    ref = node.claims.put(claim("m", UID, [result("gpu-1-mig-3g40gb-9-2")]))
    with pytest.raises(state.PrepareError, match="has no placement starting at 2"):
        node.state().prepare(ref)
    assert node.gpus.gpu_instances(1) == ()


def test_dynamic_mig_failure_rolls_back_the_instances_already_made(tmp_path: pathlib.Path) -> None:
    """Guards: an NVML failure on the second MIG device destroys the first and leaves no record nor CDI file."""
    node = make_node(tmp_path, dynamic_mig=True)
    node.gpus.fail("create_gpu_instance", backend.Return.INSUFFICIENT_RESOURCES, minor=2)
    s = node.state()
    ref = node.claims.put(claim("m", UID, [result("gpu-1-mig-1g10gb-19-0"), result("gpu-2-mig-1g10gb-19-0")]))
    with pytest.raises(state.PrepareError, match="claim default/m: prepare failed: NVML_ERROR_INSUFFICIENT_RESOURCES"):
        s.prepare(ref)
    assert node.gpus.gpu_instances(1) == () and node.gpus.gpu_instances(2) == ()
    assert s.prepared() == {} and node.cdi_files() == []
    assert [d.device for d in s.prepare(ref)] == ["gpu-1-mig-1g10gb-19-0", "gpu-2-mig-1g10gb-19-0"]


def test_nvidia_ctk_common_edits_are_merged_into_the_spec(tmp_path: pathlib.Path) -> None:
    """Guards: nvidia-ctk's common edits land in the spec-level containerEdits, still valid CDI."""
    generated = (
        '{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[],"containerEdits":{'
        '"env":["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"],'
        '"deviceNodes":[{"path":"/dev/nvidiactl"}],'
        '"hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-cdi-hook",'
        '"args":["nvidia-cdi-hook","update-ldcache"]}],'
        '"mounts":[{"hostPath":"/usr/lib/libcuda.so.580","containerPath":"/usr/lib/libcuda.so.580",'
        '"options":["ro","nosuid","bind"]}]}}'
    )
    node = make_node(tmp_path)
    node.common = cdi.NvidiaCtk(runner=lambda argv: generated, which=lambda name: "/usr/bin/nvidia-ctk")
    node.state().prepare(node.claims.put(claim("c", UID, [result("gpu-0")])))
    spec = _spec(node)
    common = spec["containerEdits"]
    assert common["env"] == ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"]
    assert common["hooks"][0]["args"][-1] == "update-ldcache"
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert common["mounts"][0]["containerPath"] == "/usr/lib/libcuda.so.580"


def test_prepare_returns_the_very_devices_the_checkpoint_records(tmp_path: pathlib.Path) -> None:
    """Guards: one type serves the kubelet's answer and the checkpoint: what prepare returns is the record's
    devices, after a restart too."""
    node = make_node(tmp_path)
    s = node.state()
    ref = node.claims.put(claim("train", UID, [result("gpu-0"), result("gpu-1", "other")]))
    devices = s.prepare(ref)
    assert s.prepared()[UID].devices == devices
    assert node.state().prepare(ref) == devices


@pytest.mark.parametrize(
    ("dynamic_mig", "devices"),
    [
        pytest.param(False, [f"gpu-{minor}" for minor in range(8)], id="8-whole-gpus"),
        pytest.param(
            True,
            ["gpu-1-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-2", "gpu-2-mig-1g10gb-19-0", "gpu-3"],
            id="dynamic-mig-instances-made",
        ),
    ],
)
def test_a_prepare_reads_the_gpu_list_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, dynamic_mig: bool, devices: list[str]
) -> None:
    """Guards: a prepare reads the node's GPU list once, not once per allocation result nor per MIG instance it
    creates (two on one GPU whose MIG mode the first one turns on)."""
    node = make_node(tmp_path, dynamic_mig=dynamic_mig)
    s = node.state()
    s.sweep()  # the start-up sweep, which builds the state of a node without a checkpoint (one more GPU read)
    ref = node.claims.put(claim("all", UID, [result(device) for device in devices]))
    reads = []
    gpus = node.gpus.gpus

    def counted() -> tuple[backend.GpuInfo, ...]:
        reads.append(1)
        return gpus()

    monkeypatch.setattr(node.gpus, "gpus", counted)
    assert len(s.prepare(ref)) == len(devices)
    assert len(reads) == 1


def test_a_prepare_encodes_only_its_own_claim_however_many_are_prepared(
    tmp_path: pathlib.Path, encoded_claims: list[str]
) -> None:
    """Guards: each checkpoint write re-encodes only the claim that changed: with 6 other claims prepared, a
    prepare (PrepareStarted, then PrepareCompleted) encodes one record twice, and the file still loads whole."""
    node = make_node(tmp_path)
    s = node.state()
    for minor in range(6):
        s.prepare(node.claims.put(claim(f"c{minor}", f"{UID[:-1]}{minor + 2}", [result(f"gpu-{minor}")])))
    encoded_claims.clear()
    s.prepare(node.claims.put(claim("new", UID, [result("gpu-7")])))
    assert encoded_claims == [UID, UID]
    assert node.state().prepared() == s.prepared() and len(s.prepared()) == 7
