"""The kubelet plugin over real unix sockets: a gRPC client plays the kubelet against `plugin.Plugin`."""

from __future__ import annotations

import collections.abc
import pathlib
import socket
import stat
import threading
import time

import grpc
import pytest
import structlog

from dractl._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from dractl.node import backend, health, plugin, state

DRIVER = "gpu.nvidia.com"
POOL = "node-a"


class FakePreparer:
    """Answers from a table: uid -> devices, or uid -> exception; records calls and concurrency."""

    def __init__(self) -> None:
        self.devices: dict[str, tuple[state.PreparedDevice, ...]] = {}
        self.errors: dict[str, Exception] = {}
        self.calls: list[tuple[str, state.ClaimRef]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self._active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def _enter(self, op: str, claim: state.ClaimRef) -> None:
        with self._lock:
            self.calls.append((op, claim))
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=20)

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1

    def prepare(self, claim: state.ClaimRef) -> tuple[state.PreparedDevice, ...]:
        self._enter("prepare", claim)
        try:
            if claim.uid in self.errors:
                raise self.errors[claim.uid]
            return self.devices.get(claim.uid, ())
        finally:
            self._leave()

    def unprepare(self, claim: state.ClaimRef) -> None:
        self._enter("unprepare", claim)
        try:
            if claim.uid in self.errors:
                raise self.errors[claim.uid]
        finally:
            self._leave()


@pytest.fixture
def sockets(sock_dir: pathlib.Path) -> plugin.Sockets:
    return plugin.socket_paths(driver_name=DRIVER, registrar_dir=sock_dir / "reg", plugins_dir=sock_dir / "plugins")


@pytest.fixture
def preparer() -> FakePreparer:
    return FakePreparer()


@pytest.fixture
def calls() -> list[plugin.Call]:
    return []


@pytest.fixture
def running(
    sockets: plugin.Sockets, preparer: FakePreparer, calls: list[plugin.Call]
) -> collections.abc.Iterator[plugin.Plugin]:
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer, on_call=calls.append)
    p.start()
    yield p
    p.stop(grace_s=0)


def _channel(path: pathlib.Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{path}")


def _claim(pb2: object, uid: str, name: str = "", namespace: str = "default") -> object:
    return pb2.Claim(namespace=namespace, name=name or f"claim-{uid}", uid=uid)  # type: ignore[attr-defined]


GPU0 = state.PreparedDevice(
    requests=("gpu",), pool=POOL, device="gpu-0", cdi_device_ids=("k8s.gpu.nvidia.com/claim=u1-gpu-0",)
)
SHARED = state.PreparedDevice(
    requests=("gpu", "other"),
    pool=POOL,
    device="gpu-1",
    cdi_device_ids=("k8s.gpu.nvidia.com/claim=u1-gpu-1", "k8s.gpu.nvidia.com/claim=common"),
    share_id="4d2a8d3c-0000-4000-8000-000000000001",
)


# --- registration --------------------------------------------------------------------------------


def test_get_info_advertises_the_driver_and_dra_services(running: plugin.Plugin, sockets: plugin.Sockets) -> None:
    """Guards: GetInfo answers type DRAPlugin, the driver name, the DRA socket as endpoint, v1 then v1beta1."""
    with _channel(sockets.registration) as channel:
        info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=5
        )
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(sockets.dra)
    assert pathlib.Path(info.endpoint).is_absolute()
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def test_health_services_are_advertised_only_when_served(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: with a health source GetInfo adds v1 and v1alpha1 DRAResourceHealth, and both answer."""
    source = _StaticHealth()
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer, health_source=source)
    p.start()
    try:
        with _channel(sockets.registration) as channel:
            info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=5
            )
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        with _channel(sockets.dra) as channel:
            for stub, pb2 in (
                (health_v1_pb2_grpc.DRAResourceHealthStub(channel), health_v1_pb2),
                (health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel), health_v1alpha1_pb2),
            ):
                stream = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest(), timeout=10)
                first = next(stream)
                stream.cancel()
                assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
                    (POOL, "gpu-0", pb2.HEALTHY)
                ]
    finally:
        p.stop(grace_s=0)


def test_without_health_source_the_health_service_is_unimplemented(
    running: plugin.Plugin, sockets: plugin.Sockets
) -> None:
    """Guards: a plugin that advertises no health service does not serve one either (UNIMPLEMENTED)."""
    with _channel(sockets.dra) as channel:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest(), timeout=5
        )
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_dra_socket_answers_before_the_registration_socket_exists(
    sockets: plugin.Sockets, preparer: FakePreparer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: when the registration socket is bound, the DRA socket already exists and answers a call."""
    seen: list[tuple[bool, list[str]]] = []
    original = plugin.Plugin._serve

    def serve(self: plugin.Plugin, path: pathlib.Path, handlers: list[object]) -> object:
        if path == sockets.registration:
            assert not sockets.registration.exists()
            with _channel(sockets.dra) as channel:
                response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(), timeout=5
                )
            seen.append((sockets.dra.exists(), list(response.claims)))
        return original(self, path, handlers)

    monkeypatch.setattr(plugin.Plugin, "_serve", serve)
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer)
    p.start()
    try:
        assert seen == [(True, [])]
        assert sockets.registration.exists()
    finally:
        p.stop(grace_s=0)


def test_refused_registration_is_logged_not_fatal(running: plugin.Plugin, sockets: plugin.Sockets) -> None:
    """Guards: NotifyRegistrationStatus(false, error) is recorded and the plugin keeps serving GetInfo."""
    with _channel(sockets.registration) as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="none of services supported"),
            timeout=5,
        )
        assert running.registration_status == plugin.RegistrationStatus(
            registered=False, error="none of services supported"
        )
        stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        assert running.registration_status == plugin.RegistrationStatus(registered=True, error="")
        assert stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5).name == DRIVER


# --- sockets ------------------------------------------------------------------------------------


def _leave_stale_socket(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # closing without unlinking leaves the file behind, as a killed process does


def test_stale_sockets_are_replaced(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: sockets left by a killed agent are removed and the new servers answer on the same paths."""
    _leave_stale_socket(sockets.dra)
    _leave_stale_socket(sockets.registration)
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer)
    p.start()
    try:
        assert plugin.probe(sockets) == []
    finally:
        p.stop(grace_s=0)


@pytest.mark.parametrize("which", ["dra", "registration"])
def test_a_non_socket_at_a_socket_path_is_a_clear_error(
    sockets: plugin.Sockets, preparer: FakePreparer, which: str
) -> None:
    """Guards: a regular file where a socket belongs is left alone and start() names the path and the flag."""
    path = getattr(sockets, which)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a socket")
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer)
    flag = "--kubelet-plugins-dir" if which == "dra" else "--kubelet-registrar-dir"
    with pytest.raises(plugin.PluginError, match=f"{path} exists and is not a socket: remove it or change {flag}"):
        p.start()
    p.stop(grace_s=0)
    assert path.read_text() == "not a socket"


def test_stop_removes_both_sockets_and_probe_reports_them_gone(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: stop() removes both sockets (the kubelet deregisters) and is idempotent; probe() then fails."""
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer)
    p.start()
    assert sockets.dra.exists() and sockets.registration.exists()
    p.stop(grace_s=0)
    p.stop(grace_s=0)
    assert not sockets.dra.exists() and not sockets.registration.exists()
    problems = plugin.probe(sockets, timeout_s=0.5)
    assert len(problems) == 2
    assert "/pluginregistration.Registration/GetInfo" in problems[0]
    assert "NodePrepareResources" in problems[1]


def test_socket_path_over_the_unix_limit_names_the_flag(tmp_path: pathlib.Path) -> None:
    """Guards: a registrar dir too deep for AF_UNIX is refused up front, naming --kubelet-registrar-dir."""
    with pytest.raises(plugin.PluginError, match="--kubelet-registrar-dir"):
        plugin.socket_paths(driver_name=DRIVER, registrar_dir=pathlib.Path("/" + "r" * 120), plugins_dir=tmp_path)


def test_socket_paths_are_the_kubelets_conventions() -> None:
    """Guards: <registrar>/<driver>-reg.sock and <plugins>/<driver>/dra.sock."""
    sockets = plugin.socket_paths(
        driver_name=DRIVER,
        registrar_dir=pathlib.Path("/var/lib/kubelet/plugins_registry"),
        plugins_dir=pathlib.Path("/var/lib/kubelet/plugins"),
    )
    assert sockets == plugin.Sockets(
        registration=pathlib.Path("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"),
        dra=pathlib.Path("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"),
    )


# --- prepare and unprepare ----------------------------------------------------------------------------


def test_prepare_v1_translates_devices_and_per_claim_errors(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer, calls: list[plugin.Call]
) -> None:
    """Guards: v1 NodePrepareResources answers every claim UID: devices (with share_id) or that claim's error."""
    preparer.devices["u1"] = (GPU0, SHARED)
    preparer.errors["u2"] = state.PrepareError(
        "ResourceClaim default/claim-u2: not allocated (status.allocation is empty)"
    )
    with _channel(sockets.dra) as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[_claim(dra_v1_pb2, "u1"), _claim(dra_v1_pb2, "u2")]),
            timeout=5,
        )
    assert sorted(response.claims) == ["u1", "u2"]
    ok = response.claims["u1"]
    assert ok.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in ok.devices] == [
        (["gpu"], POOL, "gpu-0", ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]),
        (["gpu", "other"], POOL, "gpu-1", ["k8s.gpu.nvidia.com/claim=u1-gpu-1", "k8s.gpu.nvidia.com/claim=common"]),
    ]
    assert not ok.devices[0].HasField("share_id")
    assert ok.devices[1].share_id == SHARED.share_id
    assert response.claims["u2"].error == "ResourceClaim default/claim-u2: not allocated (status.allocation is empty)"
    assert list(response.claims["u2"].devices) == []
    assert [c.uid for _, c in preparer.calls] == ["u1", "u2"]
    assert preparer.calls[0][1] == state.ClaimRef(namespace="default", name="claim-u1", uid="u1")
    assert calls == [plugin.Call(operation="prepare", api="v1", claims=2, errors=1, seconds=calls[0].seconds)]


def test_prepare_v1beta1_answers_without_share_id(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer, calls: list[plugin.Call]
) -> None:
    """Guards: the v1beta1 service answers the same devices, dropping share_id it has no field for."""
    preparer.devices["u1"] = (SHARED,)
    with _channel(sockets.dra) as channel:
        response = dra_v1beta1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[_claim(dra_v1beta1_pb2, "u1")]), timeout=5
        )
    (device,) = response.claims["u1"].devices
    assert (device.pool_name, device.device_name, list(device.cdi_device_ids)) == (
        POOL,
        "gpu-1",
        list(SHARED.cdi_device_ids),
    )
    assert [c.api for c in calls] == ["v1beta1"]


@pytest.mark.parametrize(
    ("pb2", "stub"),
    [(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub)],
    ids=["v1", "v1beta1"],
)
def test_unprepare_answers_every_claim(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer, pb2: object, stub: type
) -> None:
    """Guards: NodeUnprepareResources answers every claim UID: empty error on success, the message on failure."""
    preparer.errors["u2"] = state.PrepareError("ResourceClaim default/claim-u2: MIG device still in use")
    with _channel(sockets.dra) as channel:
        response = stub(channel).NodeUnprepareResources(
            pb2.NodeUnprepareResourcesRequest(claims=[_claim(pb2, uid) for uid in ("u1", "u2", "u3")]),
            timeout=5,
        )
    assert {uid: entry.error for uid, entry in response.claims.items()} == {
        "u1": "",
        "u2": "ResourceClaim default/claim-u2: MIG device still in use",
        "u3": "",
    }
    assert [(op, c.uid) for op, c in preparer.calls] == [("unprepare", "u1"), ("unprepare", "u2"), ("unprepare", "u3")]


def test_unexpected_exception_is_one_line_for_that_claim_only(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards: a bug below the plugin becomes that claim's one-line error; later claims are still prepared."""
    preparer.errors["u1"] = KeyError("gpu-9")
    preparer.devices["u2"] = (GPU0,)
    with _channel(sockets.dra) as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[_claim(dra_v1_pb2, "u1"), _claim(dra_v1_pb2, "u2")]),
            timeout=5,
        )
    assert response.claims["u1"].error == "ResourceClaim default/claim-u1 (uid u1): prepare failed: KeyError: 'gpu-9'"
    assert "\n" not in response.claims["u1"].error
    assert response.claims["u2"].error == "" and len(response.claims["u2"].devices) == 1


def test_a_claim_listed_twice_gets_one_entry_with_its_devices_once(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards: a uid repeated in one request is one response entry holding its devices once, not twice."""
    preparer.devices["u1"] = (GPU0,)
    with _channel(sockets.dra) as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[_claim(dra_v1_pb2, "u1"), _claim(dra_v1_pb2, "u1")]),
            timeout=5,
        )
    assert list(response.claims) == ["u1"]
    assert response.claims["u1"].error == "" and [d.device_name for d in response.claims["u1"].devices] == ["gpu-0"]


def test_a_claim_without_name_is_refused_naming_the_field(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards: a request claim lacking name is that claim's error naming the field; the preparer is not called."""
    with _channel(sockets.dra) as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(namespace="ns", uid="u1")]), timeout=5
        )
    assert response.claims["u1"].error == "ResourceClaim ns/? (uid u1): the kubelet's request has no name"
    assert preparer.calls == []


class OverlapDetector(FakePreparer):
    """Each call waits (bounded) for another call to enter too; with serialized requests none ever does."""

    def __init__(self) -> None:
        super().__init__()
        self.cond = threading.Condition()

    def prepare(self, claim: state.ClaimRef) -> tuple[state.PreparedDevice, ...]:
        with self.cond:
            self.calls.append(("prepare", claim))
            self._active += 1
            self.max_active = max(self.max_active, self._active)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self._active > 1, timeout=1.0)
            self._active -= 1
        return ()


def test_concurrent_requests_reach_the_preparer_together(sockets: plugin.Sockets) -> None:
    """Guards: the plugin serializes calls per claim only: two concurrent NodePrepareResources calls for
    different claims are in the preparer at once, so one claim's API read holds up no other."""
    detector = OverlapDetector()
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=detector)
    p.start()
    results: list[object] = []

    def call(uid: str) -> None:
        with _channel(sockets.dra) as channel:
            results.append(
                dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[_claim(dra_v1_pb2, uid)]), timeout=20
                )
            )

    threads = [threading.Thread(target=call, args=(uid,)) for uid in ("a", "b")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    finally:
        p.stop(grace_s=0)
    assert len(results) == 2 and len(detector.calls) == 2
    assert detector.max_active == 2


def _lock_users(p: plugin.Plugin, uid: str) -> int:
    """How many calls hold or wait for the claim's lock (0: it has no entry)."""
    entry = p._claim_locks._entries.get(uid)
    return 0 if entry is None else entry.users


def _wait_for_lock_users(p: plugin.Plugin, uid: str, users: int) -> None:
    deadline = time.monotonic() + 20
    while _lock_users(p, uid) != users:
        assert time.monotonic() < deadline, f"claim {uid}: {_lock_users(p, uid)} lock users, expected {users}"
        time.sleep(0.005)


def _call(sockets: plugin.Sockets, operation: str, uids: collections.abc.Sequence[str]) -> object:
    with _channel(sockets.dra) as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        claims = [_claim(dra_v1_pb2, uid) for uid in uids]
        if operation == "prepare":
            return stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=20)
        return stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=20)


def test_liveness_probe_takes_no_claim_lock_and_never_waits(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards: the empty NodePrepareResources of the liveness probe answers while a long prepare holds its claim's
    lock and an unprepare of that claim waits for it, and it adds no lock entry."""
    preparer.gate = threading.Event()
    threads = [
        threading.Thread(target=_call, args=(sockets, "prepare", ["slow"])),
        threading.Thread(target=_call, args=(sockets, "unprepare", ["slow"])),
    ]
    threads[0].start()
    try:
        assert preparer.entered.wait(timeout=10)
        threads[1].start()
        _wait_for_lock_users(running, "slow", 2)
        assert plugin.probe(sockets, timeout_s=5) == []
        assert {uid: entry.users for uid, entry in running._claim_locks._entries.items()} == {"slow": 2}
    finally:
        preparer.gate.set()
        for thread in threads:
            if thread.ident is not None:
                thread.join(timeout=20)
    assert [(op, c.uid) for op, c in preparer.calls] == [("prepare", "slow"), ("unprepare", "slow")]
    assert running._claim_locks._entries == {}


def test_a_call_that_cannot_take_a_claim_lock_in_time_answers_each_claim_still_running(
    sockets: plugin.Sockets, preparer: FakePreparer, calls: list[plugin.Call]
) -> None:
    """Guards: a request holds the locks of all its claims from before its first: while a prepare of [u2, u3] is
    still in the preparer for u2, an unprepare of [u3, u1] waits at most the claim lock timeout, then answers each
    of its claims that u3's call is still running without calling the preparer, and lets go of u1's lock."""
    preparer.gate = threading.Event()
    p = plugin.Plugin(
        driver_name=DRIVER, sockets=sockets, preparer=preparer, on_call=calls.append, claim_lock_timeout_s=0.05
    )
    p.start()
    thread = threading.Thread(target=_call, args=(sockets, "prepare", ["u2", "u3"]))
    thread.start()
    try:
        assert preparer.entered.wait(timeout=10)
        response = _call(sockets, "unprepare", ["u3", "u1"])
        calls_meanwhile = [(op, c.uid) for op, c in preparer.calls]
        held_meanwhile = {uid: entry.users for uid, entry in p._claim_locks._entries.items()}
    finally:
        preparer.gate.set()
        thread.join(timeout=20)
        p.stop(grace_s=0)
    busy = "another call for claim default/claim-u3 (uid u3) is still running; the kubelet retries"
    assert {uid: entry.error for uid, entry in response.claims.items()} == {"u3": busy, "u1": busy}  # type: ignore[attr-defined]
    assert calls_meanwhile == [("prepare", "u2")]
    assert held_meanwhile == {"u2": 1, "u3": 1}
    assert [(c.operation, c.claims, c.errors) for c in calls] == [("unprepare", 2, 2), ("prepare", 2, 0)]
    assert p._claim_locks._entries == {}


def test_claim_locks_are_taken_in_sorted_uid_order() -> None:
    """Guards: a call takes its claims' locks in sorted UID order whatever the request's order, so two calls naming
    the same claims in opposite orders cannot each hold one and wait for the other: a call for [b, a] waits for a's
    lock without holding b's, then holds both."""
    locks = plugin._ClaimLocks()
    answers: list[tuple[str | None, list[str]]] = []

    def take() -> None:
        with locks.held(["b", "a"], timeout_s=20) as busy:
            answers.append((busy, sorted(locks._entries)))

    thread = threading.Thread(target=take)
    with locks.held(["a"], timeout_s=0) as busy:
        assert busy is None
        thread.start()
        deadline = time.monotonic() + 20
        while locks._entries["a"].users < 2:
            assert time.monotonic() < deadline, "the second call never waited for a's lock"
            time.sleep(0.005)
        assert "b" not in locks._entries
    thread.join(timeout=20)
    assert answers == [(None, ["a", "b"])]
    assert locks._entries == {}


# --- two agents on one node (rolling updates) -------------------------------------------------------------

POD_A = "0f1e2d3c-aaaa-4000-8000-000000000001"
POD_B = "0f1e2d3c-bbbb-4000-8000-000000000002"


def _pod_sockets(sock_dir: pathlib.Path, pod_uid: str) -> plugin.Sockets:
    return plugin.socket_paths(
        driver_name=DRIVER, registrar_dir=sock_dir / "reg", plugins_dir=sock_dir / "plugins", pod_uid=pod_uid
    )


def test_socket_paths_with_a_pod_uid_are_upstreams_rolling_update_names() -> None:
    """Guards: with a pod UID the sockets are <driver>-<podUID>-reg.sock and <driver>/dra-<podUID>.sock, as
    upstream's kubeletplugin helper names them; a UID that cannot be part of a file name is refused naming the flag."""
    sockets = plugin.socket_paths(
        driver_name=DRIVER,
        registrar_dir=pathlib.Path("/var/lib/kubelet/plugins_registry"),
        plugins_dir=pathlib.Path("/var/lib/kubelet/plugins"),
        pod_uid=POD_A,
    )
    assert sockets == plugin.Sockets(
        registration=pathlib.Path(f"/var/lib/kubelet/plugins_registry/gpu.nvidia.com-{POD_A}-reg.sock"),
        dra=pathlib.Path(f"/var/lib/kubelet/plugins/gpu.nvidia.com/dra-{POD_A}.sock"),
    )
    with pytest.raises(plugin.PluginError, match=r"^--pod-uid '\.\./x' must be letters, digits"):
        plugin.socket_paths(
            driver_name=DRIVER, registrar_dir=pathlib.Path("/r"), plugins_dir=pathlib.Path("/p"), pod_uid="../x"
        )


def test_a_second_plugin_on_served_sockets_refuses_to_start_and_leaves_them_alone(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards issue 15: a second agent on the same fixed socket names no longer removes the running one's sockets
    (whose SIGTERM then left none): it refuses with one line naming the socket and --pod-uid, and the first still
    answers on both."""
    with pytest.raises(plugin.PluginError) as caught:
        plugin.check_sockets(sockets)
    second = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=FakePreparer())
    with pytest.raises(plugin.PluginError) as started:
        second.start()
    second.stop(grace_s=0)
    message = (
        f"another node agent is serving {sockets.dra}: stop it first, or give each agent its own sockets with "
        "--pod-uid (rolling updates)"
    )
    assert str(caught.value) == str(started.value) == message
    assert plugin.probe(sockets) == []


def test_two_plugins_with_pod_uids_serve_side_by_side_and_one_stopping_leaves_the_other(
    sock_dir: pathlib.Path, preparer: FakePreparer
) -> None:
    """Guards: two agents of a rolling update each serve their own sockets in the same directories, GetInfo names
    each one's own DRA socket, and the old one's stop removes only its own sockets."""
    old = plugin.Plugin(driver_name=DRIVER, sockets=_pod_sockets(sock_dir, POD_A), preparer=preparer)
    new = plugin.Plugin(driver_name=DRIVER, sockets=_pod_sockets(sock_dir, POD_B), preparer=preparer)
    old.start()
    new.start()
    try:
        for p in (old, new):
            with _channel(p.sockets.registration) as channel:
                info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_pb2.InfoRequest(), timeout=5
                )
            assert info.endpoint == str(p.sockets.dra)
        old.stop(grace_s=0)
        assert not old.sockets.dra.exists() and not old.sockets.registration.exists()
        assert plugin.probe(new.sockets) == []
    finally:
        old.stop(grace_s=0)
        new.stop(grace_s=0)


def test_claim_locks_hold_between_the_plugins_of_two_processes(sock_dir: pathlib.Path) -> None:
    """Guards: with one claim lock file, an unprepare sent to the new agent while the old one still prepares that
    claim waits for it (answering "still running" once its lock timeout passes, calling nothing), a call for another
    claim goes through at once, and once the prepare is done the unprepare runs."""
    lock_file = sock_dir / "claims.lock"
    slow = FakePreparer()
    slow.gate = threading.Event()
    fast = FakePreparer()
    old = plugin.Plugin(
        driver_name=DRIVER, sockets=_pod_sockets(sock_dir, POD_A), preparer=slow, claim_lock_file=lock_file
    )
    new = plugin.Plugin(
        driver_name=DRIVER,
        sockets=_pod_sockets(sock_dir, POD_B),
        preparer=fast,
        claim_lock_file=lock_file,
        claim_lock_timeout_s=0.2,
    )
    old.start()
    new.start()
    thread = threading.Thread(target=_call, args=(old.sockets, "prepare", ["u1"]))
    thread.start()
    try:
        assert slow.entered.wait(timeout=10)
        waited = _call(new.sockets, "unprepare", ["u1"])
        other = _call(new.sockets, "unprepare", ["u2"])
        calls_meanwhile = [(op, c.uid) for op, c in fast.calls]
    finally:
        slow.gate.set()
        thread.join(timeout=20)
    try:
        after = _call(new.sockets, "unprepare", ["u1"])
    finally:
        old.stop(grace_s=0)
        new.stop(grace_s=0)
    busy = "another call for claim default/claim-u1 (uid u1) is still running; the kubelet retries"
    assert waited.claims["u1"].error == busy  # type: ignore[attr-defined]
    assert other.claims["u2"].error == ""  # type: ignore[attr-defined]
    assert calls_meanwhile == [("unprepare", "u2")]
    assert after.claims["u1"].error == ""  # type: ignore[attr-defined]
    assert [(op, c.uid) for op, c in fast.calls] == [("unprepare", "u2"), ("unprepare", "u1")]


def test_each_claims_outcome_is_logged_with_the_claim_and_the_reason(
    running: plugin.Plugin, sockets: plugin.Sockets, preparer: FakePreparer
) -> None:
    """Guards issue 15: a failed prepare is a warning naming the claim, its uid and the reason (not a count), and a
    successful one shows at info with its devices; the call's summary is only at debug."""
    preparer.devices["u1"] = (GPU0,)
    preparer.errors["u2"] = state.PrepareError("claim default/claim-u2: ResourceClaim not found")
    with structlog.testing.capture_logs() as logs:
        _call(sockets, "prepare", ["u1", "u2"])
    outcomes = [
        {key: entry[key] for key in ("log_level", "event", "claim", "uid") if key in entry}
        | ({"devices": entry["devices"]} if "devices" in entry else {"error": entry.get("error")})
        for entry in logs
        if entry["log_level"] != "debug"
    ]
    assert outcomes == [
        {
            "log_level": "info",
            "event": "plugin: prepare done",
            "claim": "default/claim-u1",
            "uid": "u1",
            "devices": ["gpu-0"],
        },
        {
            "log_level": "warning",
            "event": "plugin: prepare failed",
            "claim": "default/claim-u2",
            "uid": "u2",
            "error": "claim default/claim-u2: ResourceClaim not found",
        },
    ]


# --- health stream --------------------------------------------------------------------------------


class _StaticHealth:
    def wait_report(self, *, after: int, timeout_s: float) -> tuple[int, tuple[health.DeviceHealth, ...]]:
        return 1, (health.DeviceHealth(pool=POOL, device="gpu-0", status=health.Status.HEALTHY, last_updated=7),)


class _EventBackend:
    def __init__(self) -> None:
        self.events: list[backend.Event] = []
        self.cond = threading.Condition()

    def push(self, event: backend.Event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def wait_events(self, *, timeout_s: float) -> tuple[backend.Event, ...]:
        with self.cond:
            self.cond.wait_for(lambda: bool(self.events), timeout=timeout_s)
            events, self.events = tuple(self.events), []
            return events

    def compute_mode(self, minor: int) -> backend.ComputeMode:
        return backend.ComputeMode.DEFAULT

    def recovery_action(self, minor: int) -> backend.RecoveryAction:
        return backend.RecoveryAction.NONE


def test_health_stream_reports_an_xid_as_unhealthy(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: the stream sends the full Healthy list first, then UNHEALTHY with the taint message after an XID."""
    events = _EventBackend()
    monitor = health.Monitor(
        backend=events,  # type: ignore[arg-type]
        driver_name=DRIVER,
        pool=POOL,
        devices=(health.MonitoredDevice("gpu-0", 0, "GPU-0"), health.MonitoredDevice("gpu-1", 1, "GPU-1")),
        poll_s=0.05,
    )
    monitor.start()
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer, health_source=monitor)
    p.start()
    try:
        with _channel(sockets.dra) as channel:
            stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest(), timeout=20
            )
            first = next(stream)
            assert [(d.device.device_name, d.health) for d in first.devices] == [
                ("gpu-0", health_v1_pb2.HEALTHY),
                ("gpu-1", health_v1_pb2.HEALTHY),
            ]
            assert all(d.health_check_timeout_seconds == 30 and d.last_updated_time > 0 for d in first.devices)
            events.push(backend.Event(kind=backend.EventKind.XID, minor=1, xid=79))
            second = next(stream)
            stream.cancel()
        by_name = {d.device.device_name: d for d in second.devices}
        assert by_name["gpu-1"].health == health_v1_pb2.UNHEALTHY
        assert by_name["gpu-1"].message == f"{DRIVER}/xid=79"
        assert by_name["gpu-0"].health == health_v1_pb2.HEALTHY
    finally:
        p.stop(grace_s=0)
        monitor.stop()


def test_health_stream_resends_the_list_without_changes(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: with no change the full list is re-sent every health_resend_s, so the kubelet never times out."""
    p = plugin.Plugin(
        driver_name=DRIVER, sockets=sockets, preparer=preparer, health_source=_StaticHealth(), health_resend_s=0.05
    )
    p.start()
    try:
        with _channel(sockets.dra) as channel:
            stream = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=20
            )
            messages = [next(stream) for _ in range(3)]
            stream.cancel()
        assert all(len(m.devices) == 1 for m in messages)
    finally:
        p.stop(grace_s=0)


def test_stop_ends_an_open_health_stream(sockets: plugin.Sockets, preparer: FakePreparer) -> None:
    """Guards: stop() returns and removes the sockets even while the kubelet holds a health stream open."""
    p = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer, health_source=_StaticHealth())
    p.start()
    channel = _channel(sockets.dra)
    stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health_v1_pb2.NodeWatchResourcesRequest(), timeout=30
    )
    next(stream)
    p.stop(grace_s=0.5)
    assert not sockets.dra.exists()
    # The stream ends: cleanly (the generator saw the stop) or cancelled by the server.
    with pytest.raises((StopIteration, grpc.RpcError)):
        for _ in range(100):
            next(stream)
    channel.close()


@pytest.mark.parametrize("which", ["dra", "registration"])
def test_stop_leaves_a_socket_a_second_agent_bound_after_ours_was_removed(
    sockets: plugin.Sockets, preparer: FakePreparer, which: str
) -> None:
    """Guards: an agent whose socket was removed, and a second agent then bound its own at the same path: stopping
    the first removes nothing of the second's (gRPC removes the path it bound when it stops, so it must never have
    bound this one), and the second still answers."""
    first = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=preparer)
    first.start()
    path = getattr(sockets, which)
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
        second.bind(str(path))
        second.listen(1)
        first.stop(grace_s=0)
        assert stat.S_ISSOCK(path.lstat().st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # nothing of the first is left either
