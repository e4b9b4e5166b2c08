"""The plugin over the real `state.State` and fake GPUs: a gRPC client plays the kubelet end to end."""

from __future__ import annotations

import collections.abc
import dataclasses
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from support.state_inputs import Node, claim, config, gpu_config, make_node, result

from dractl import model
from dractl._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from dractl.node import backend, cdi, plugin, state

DRIVER = "gpu.nvidia.com"
UID = "0c1d2e3f-0000-4000-8000-00000000000a"
UID2 = "0c1d2e3f-0000-4000-8000-00000000000b"

APIS = [
    pytest.param((dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub), id="v1"),
    pytest.param((dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub), id="v1beta1"),
]


@dataclasses.dataclass
class Kubelet:
    """The kubelet's side: prepare/unprepare calls over the DRA socket of one API version; `server` is the plugin."""

    pb2: Any
    stub: Any
    node: Node
    sockets: plugin.Sockets
    server: plugin.Plugin

    def prepare(self, *refs: state.ClaimRef) -> object:
        request = self.pb2.NodePrepareResourcesRequest(  # type: ignore[attr-defined]
            claims=[self.pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
        )
        return self.stub.NodePrepareResources(request, timeout=30)  # type: ignore[attr-defined]

    def unprepare(self, *refs: state.ClaimRef) -> object:
        request = self.pb2.NodeUnprepareResourcesRequest(  # type: ignore[attr-defined]
            claims=[self.pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
        )
        return self.stub.NodeUnprepareResources(request, timeout=30)  # type: ignore[attr-defined]


def _serve(tmp_path: pathlib.Path, api: tuple[object, type], node: Node) -> collections.abc.Iterator[Kubelet]:
    sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    sockets = plugin.socket_paths(driver_name=DRIVER, registrar_dir=sock_dir / "reg", plugins_dir=sock_dir / "plugins")
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=node.state())
    p.start()
    channel = grpc.insecure_channel(f"unix:{sockets.dra}")
    try:
        yield Kubelet(pb2=api[0], stub=api[1](channel), node=node, sockets=sockets, server=p)
    finally:
        channel.close()
        p.stop(grace_s=0)
        shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture(params=APIS)
def kubelet(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> collections.abc.Iterator[Kubelet]:
    yield from _serve(tmp_path, request.param, make_node(tmp_path))


@pytest.fixture(params=APIS)
def dynamic_kubelet(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> collections.abc.Iterator[Kubelet]:
    yield from _serve(tmp_path, request.param, make_node(tmp_path, dynamic_mig=True))


@pytest.fixture(params=APIS)
def static_mig_kubelet(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> collections.abc.Iterator[Kubelet]:
    yield from _serve(tmp_path, request.param, make_node(tmp_path, "a100-mig-mixed"))


def _devices(entry: object) -> list[tuple[list[str], str, list[str]]]:
    return [
        (list(d.request_names), d.device_name, list(d.cdi_device_ids))
        for d in entry.devices  # type: ignore[attr-defined]
    ]


def test_full_gpus_prepare_and_unprepare(kubelet: Kubelet) -> None:
    """Guards: two full GPUs come back with base request names and CDI ids; the CDI spec goes on unprepare."""
    ref = kubelet.node.claims.put(claim("train", UID, [result("gpu-3", "gpu/large"), result("gpu-1")]))
    response = kubelet.prepare(ref)
    entry = response.claims[UID]  # type: ignore[attr-defined]
    assert entry.error == ""
    assert _devices(entry) == [
        (["gpu"], "gpu-3", [f"k8s.gpu.nvidia.com/claim={UID}-gpu-3"]),
        (["gpu"], "gpu-1", [f"k8s.gpu.nvidia.com/claim={UID}-gpu-1"]),
    ]
    assert all(d.pool_name == "node-a" for d in entry.devices)
    assert kubelet.node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
    again = kubelet.prepare(ref)
    assert again == response  # idempotent: the same answer
    unprepared = kubelet.unprepare(ref)
    assert unprepared.claims[UID].error == ""  # type: ignore[attr-defined]
    assert kubelet.node.cdi_files() == []


def test_dynamic_mig_instances_follow_prepare_and_unprepare(dynamic_kubelet: Kubelet) -> None:
    """Guards: dynamic MIG devices are created at their placement on prepare and destroyed on unprepare."""
    gpus = dynamic_kubelet.node.gpus
    ref = dynamic_kubelet.node.claims.put(claim("m", UID, [result("gpu-1-mig-3g40gb-9-4")]))
    entry = dynamic_kubelet.prepare(ref).claims[UID]  # type: ignore[attr-defined]
    assert entry.error == ""
    assert [d.device_name for d in entry.devices] == ["gpu-1-mig-3g40gb-9-4"]
    assert [(d.profile_id, d.placement) for d in gpus.mig_devices(1)] == [(9, backend.Placement(4, 4))]
    assert dynamic_kubelet.unprepare(ref).claims[UID].error == ""  # type: ignore[attr-defined]
    assert gpus.gpu_instances(1) == ()


def test_static_mig_device_is_prepared(static_mig_kubelet: Kubelet) -> None:
    """Guards: an existing (static) MIG device is prepared and left in place on unprepare."""
    node = static_mig_kubelet.node
    existing = next(d for d in node.gpus.mig_devices(0) if d.profile_name == "2g.20gb")
    device = f"gpu-0-mig-2g20gb-{existing.profile_id}-{existing.placement.start}"
    gi_dir = node.proc / "driver/nvidia/capabilities/gpu0/mig" / f"gi{existing.gi_id}"
    (gi_dir / f"ci{existing.ci_id}").mkdir(parents=True)
    (gi_dir / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (gi_dir / f"ci{existing.ci_id}" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\n")
    ref = node.claims.put(claim("m", UID, [result(device)]))
    entry = static_mig_kubelet.prepare(ref).claims[UID]  # type: ignore[attr-defined]
    assert entry.error == ""
    assert _devices(entry) == [(["gpu"], device, [cdi.qualified_name(UID, device)])]
    assert static_mig_kubelet.unprepare(ref).claims[UID].error == ""  # type: ignore[attr-defined]
    assert existing in node.gpus.mig_devices(0)


def test_shared_gpu_claims_carry_share_ids_in_v1_only(kubelet: Kubelet) -> None:
    """Guards: two claims sharing one GPU both prepare in one call; v1 returns each share_id, v1beta1 has none."""
    node = kubelet.node
    a = node.claims.put(claim("a", UID, [result("gpu-0", share_id="a1b2c", memory="10Gi")]))
    b = node.claims.put(claim("b", UID2, [result("gpu-0", share_id="d3e4f", memory="20Gi")]))
    response = kubelet.prepare(a, b)
    assert {uid: e.error for uid, e in response.claims.items()} == {UID: "", UID2: ""}  # type: ignore[attr-defined]
    first = response.claims[UID].devices[0]  # type: ignore[attr-defined]
    assert list(first.cdi_device_ids) == [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0-a1b2c"]
    if kubelet.pb2 is dra_v1_pb2:
        assert first.share_id == "a1b2c"
        assert response.claims[UID2].devices[0].share_id == "d3e4f"  # type: ignore[attr-defined]
    else:
        assert "share_id" not in type(first).DESCRIPTOR.fields_by_name


def test_time_slicing_and_mps_configs_are_applied(kubelet: Kubelet) -> None:
    """Guards: TimeSlicing and MPS opaque configs prepare over gRPC and reach the GPUs (time slice, compute mode)."""
    node = kubelet.node
    ts = config(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))
    mps = config(gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}))
    a = node.claims.put(claim("ts", UID, [result("gpu-2")], [ts]))
    b = node.claims.put(claim("mps", UID2, [result("gpu-4")], [mps]))
    response = kubelet.prepare(a, b)
    assert {uid: e.error for uid, e in response.claims.items()} == {UID: "", UID2: ""}  # type: ignore[attr-defined]
    assert node.gpus.time_slice(2) is backend.TimeSlice.LONG
    assert node.gpus.compute_mode(4) is backend.ComputeMode.EXCLUSIVE_PROCESS
    kubelet.unprepare(a, b)
    assert node.gpus.time_slice(2) is backend.TimeSlice.DEFAULT
    assert node.gpus.compute_mode(4) is backend.ComputeMode.DEFAULT


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        pytest.param(
            claim("c", UID, [result("gpu-0")], [config(gpu_config({"strategy": "Spatial"}))]),
            "opaque.parameters.sharing.strategy: must be TimeSlicing or MPS",
            id="bad-opaque-config",
        ),
        pytest.param(claim("c", UID, allocated=False), "not allocated", id="not-allocated"),
        pytest.param(claim("c", "another-uid", [result("gpu-0")]), "UID is another-uid", id="uid-changed"),
        pytest.param(None, "default/c", id="claim-gone"),
    ],
)
def test_bad_claims_fail_alone_with_a_message(kubelet: Kubelet, stored: object, message: str) -> None:
    """Guards: a bad claim gets its own error naming claim and field; the good claim in the same call prepares."""
    node = kubelet.node
    good = node.claims.put(claim("good", UID2, [result("gpu-5")]))
    if stored is not None:
        node.claims.put(stored)  # type: ignore[arg-type]
    bad = state.ClaimRef(namespace="default", name="c", uid=UID)
    response = kubelet.prepare(bad, good)
    assert sorted(response.claims) == sorted([UID, UID2])  # type: ignore[attr-defined]
    error = response.claims[UID].error  # type: ignore[attr-defined]
    assert message in error and "\n" not in error
    assert list(response.claims[UID].devices) == []  # type: ignore[attr-defined]
    assert response.claims[UID2].error == ""  # type: ignore[attr-defined]
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID2}.yaml"]


def test_unprepare_of_an_unknown_claim_succeeds(kubelet: Kubelet) -> None:
    """Guards: unpreparing a claim this node never prepared (or already unprepared) answers an empty error."""
    response = kubelet.unprepare(state.ClaimRef(namespace="default", name="never", uid=UID))
    assert response.claims[UID].error == ""  # type: ignore[attr-defined]


def _hang_reads(
    kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[threading.Event, threading.Event]:
    """Make reading the claim `name` hang until the second event is set; the first says a read began."""
    reading, release = threading.Event(), threading.Event()
    read = kubelet.node.claims.get_claim

    def get_claim(namespace: str, claim_name: str) -> model.ResourceClaim | None:
        if claim_name == name:
            reading.set()
            assert release.wait(timeout=60)
        return read(namespace, claim_name)

    monkeypatch.setattr(kubelet.node.claims, "get_claim", get_claim)
    return reading, release


def test_a_hanging_claim_read_does_not_hold_up_another_pods_prepare(
    kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: the API read holds only the locks of its own request's claims (not the state lock): while reading
    one pod's claim hangs, another pod's NodePrepareResources is answered, and the first completes once its read
    returns."""
    slow = kubelet.node.claims.put(claim("slow", UID, [result("gpu-0")]))
    fast = kubelet.node.claims.put(claim("fast", UID2, [result("gpu-1")]))
    reading, release = _hang_reads(kubelet, monkeypatch, slow.name)
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(kubelet.prepare(slow)))
    thread.start()
    try:
        assert reading.wait(timeout=20)
        # Well short of the hanging read's own timeout: serialized requests would miss this deadline.
        request = kubelet.pb2.NodePrepareResourcesRequest(  # type: ignore[attr-defined]
            claims=[kubelet.pb2.Claim(namespace=fast.namespace, name=fast.name, uid=fast.uid)]
        )
        response = kubelet.stub.NodePrepareResources(request, timeout=10)
        assert response.claims[UID2].error == ""
    finally:
        release.set()
        thread.join(timeout=30)
    assert len(answers) == 1 and answers[0].claims[UID].error == ""  # type: ignore[attr-defined]


def _lock_users(kubelet: Kubelet, uid: str) -> int:
    """How many calls hold or wait for the claim's lock in the plugin (0: it has no entry)."""
    entry = kubelet.server._claim_locks._entries.get(uid)
    return 0 if entry is None else entry.users


def _unprepare_during_read(
    kubelet: Kubelet,
    monkeypatch: pytest.MonkeyPatch,
    *,
    prepare: Sequence[state.ClaimRef],
    hang: state.ClaimRef,
    unprepare: state.ClaimRef,
) -> tuple[Any, Any]:
    """Prepare `prepare` in one call while reading `hang` hangs; meanwhile unprepare `unprepare` in another call
    and check that it waits for the claim's lock instead of returning. Returns both answers once the read ends."""
    reading, release = _hang_reads(kubelet, monkeypatch, hang.name)
    answers: dict[str, Any] = {}
    preparing = threading.Thread(target=lambda: answers.update(prepare=kubelet.prepare(*prepare)))
    unpreparing = threading.Thread(target=lambda: answers.update(unprepare=kubelet.unprepare(unprepare)))
    preparing.start()
    try:
        assert reading.wait(timeout=20)
        unpreparing.start()
        # The unprepare joins the claim's lock (its second user) while the read still hangs, and so cannot have
        # returned; without a lock held across the whole request it finds no record and returns at once.
        deadline = time.monotonic() + 20
        while _lock_users(kubelet, unprepare.uid) < 2 and unpreparing.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        waited = unpreparing.is_alive() and _lock_users(kubelet, unprepare.uid) == 2
    finally:
        release.set()
        preparing.join(timeout=30)
        if unpreparing.ident is not None:
            unpreparing.join(timeout=30)
    assert waited, "the unprepare returned while the prepare was still reading a claim"
    assert not preparing.is_alive() and not unpreparing.is_alive()
    assert kubelet.server._claim_locks._entries == {}
    return answers["prepare"], answers["unprepare"]


def test_an_unprepare_during_the_claim_read_waits_for_the_prepare_and_nothing_leaks(
    dynamic_kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: a prepare and an unprepare of one claim never interleave: an unprepare arriving while the prepare
    reads the claim waits for it, then undoes what it made (no record, CDI file, MIG instance or MPS daemon is
    left), and the claim's lock entry is dropped afterwards."""
    node = dynamic_kubelet.node
    mps = config(gpu_config({"strategy": "MPS"}), requests=["gpu"])
    ref = node.claims.put(claim("m", UID, [result("gpu-1-mig-1g10gb-19-2", "mig"), result("gpu-4")], [mps]))
    prepared, unprepared = _unprepare_during_read(dynamic_kubelet, monkeypatch, prepare=[ref], hang=ref, unprepare=ref)
    # Two requests: a device each, and the entry of a container that names neither.
    assert prepared.claims[UID].error == "" and len(prepared.claims[UID].devices) == 3
    assert unprepared.claims[UID].error == ""
    assert node.state().prepared() == {}
    assert node.cdi_files() == [] and node.mps.running == {} and node.gpus.gpu_instances(1) == ()


def test_an_unprepare_of_a_later_claim_in_a_prepare_request_waits_for_the_whole_request_and_nothing_leaks(
    dynamic_kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: a request holds the locks of all its claims from before its first: while a prepare of [A, B] still
    reads A, an unprepare of B waits (it would find no record of B and return, and B's MIG instance would leak),
    then undoes B once the prepare made it; A stays prepared."""
    node = dynamic_kubelet.node
    a = node.claims.put(claim("a", UID, [result("gpu-1-mig-1g10gb-19-2")]))
    b = node.claims.put(claim("b", UID2, [result("gpu-2-mig-1g10gb-19-0")]))
    prepared, unprepared = _unprepare_during_read(dynamic_kubelet, monkeypatch, prepare=[a, b], hang=a, unprepare=b)
    assert {uid: entry.error for uid, entry in prepared.claims.items()} == {UID: "", UID2: ""}
    assert unprepared.claims[UID2].error == ""
    assert list(node.state().prepared()) == [UID]
    assert node.gpus.gpu_instances(2) == () and len(node.gpus.gpu_instances(1)) == 1
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{UID}.yaml"]
