"""The node agent wired together: fake GPUs, an in-test claim source and publisher, real sockets and HTTP."""

from __future__ import annotations

import collections.abc
import dataclasses
import io
import os
import pathlib
import re
import signal
import socket
import threading
import time
from collections.abc import Sequence

import controlplane
import grpc
import pytest
import structlog
from support import kubelet, observe
from support.state_inputs import Claims, claim, result

from dractl import config, model
from dractl._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from dractl.node import agent, backend, fakegpu, publish

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
UID = "0c1d2e3f-0000-4000-8000-0000000000a1"


class FakePublisher:
    """Records every publish (the thread that made it, and whether the registration socket existed then); can fail
    on demand, hang like a slow API server while `gate` is set and not yet open (`hanging` says one is), and report
    each publish as a repair of slices someone else changed while `repairing` is set."""

    def __init__(self, registration_socket: pathlib.Path) -> None:
        self.registration_socket = registration_socket
        self.published: list[tuple[model.ResourceSlice, ...]] = []
        self.socket_existed: list[bool] = []
        self.threads: list[threading.Thread] = []
        self.failures = 0
        self.cond = threading.Condition()
        self.gate: threading.Event | None = None
        self.hanging = threading.Event()
        self.repairing = False

    def publish(self, desired: Sequence[model.ResourceSlice]) -> publish.Result | None:
        if self.gate is not None:
            self.hanging.set()
            assert self.gate.wait(timeout=60)
        with self.cond:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("apiserver unreachable")
            self.published.append(tuple(desired))
            self.socket_existed.append(self.registration_socket.exists())
            self.threads.append(threading.current_thread())
            self.cond.notify_all()
        # As the real publisher answers when it had to rewrite slices someone else changed.
        return publish.Result(generation=len(self.published), updated=1) if self.repairing else None

    def wait_for(
        self, predicate: collections.abc.Callable[[tuple[model.ResourceSlice, ...]], bool], *, timeout: float = 20
    ) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: bool(self.published) and predicate(self.published[-1]), timeout=timeout)


@pytest.fixture
def settings(tmp_path: pathlib.Path, sock_dir: pathlib.Path) -> config.NodeAgent:
    return kubelet.agent_settings(tmp_path, sock_dir, health_port=0, metrics_port=0)


@pytest.fixture
def gpus() -> fakegpu.FakeGpus:
    return fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=NODE)


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def publisher(sock_dir: pathlib.Path) -> FakePublisher:
    return FakePublisher(sock_dir / "reg" / f"{DRIVER}-reg.sock")


@pytest.fixture
def node_agent(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> collections.abc.Iterator[agent.Agent]:
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05)
    a.start()
    yield a
    a.stop()


def _tainted(slices: tuple[model.ResourceSlice, ...], device: str) -> tuple[model.DeviceTaint, ...]:
    return next(d.taints for s in slices for d in s.devices if d.name == device)


def test_slices_are_published_before_the_plugin_registers(node_agent: agent.Agent, publisher: FakePublisher) -> None:
    """Guards: the first publish happens before the registration socket exists, with every GPU and no taints."""
    assert publisher.socket_existed[0] is False
    devices = [d.name for s in publisher.published[0] for d in s.devices]
    assert devices == [f"gpu-{i}" for i in range(8)]
    assert all(not d.taints for s in publisher.published[0] for d in s.devices)
    assert node_agent.sockets.registration.exists() and node_agent.sockets.dra.exists()


def test_get_info_advertises_health(node_agent: agent.Agent) -> None:
    """Guards: the agent's plugin serves the health stream, so GetInfo advertises both health versions."""
    with grpc.insecure_channel(f"unix:{node_agent.sockets.registration}") as channel:
        info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=5
        )
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_prepare_through_the_agent_is_counted_in_metrics(
    node_agent: agent.Agent, claims: Claims, settings: config.NodeAgent
) -> None:
    """Guards: a claim prepared over the socket writes its CDI spec, and /metrics counts the call and the devices."""
    ref = claims.put(claim("train", UID, [result("gpu-2")]))
    assert kubelet.prepare(node_agent.sockets.dra, ref)[UID].error == ""
    assert (settings.cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.yaml").exists()
    status, text = observe.get(node_agent.metrics_port, "/metrics")
    assert status == 200
    assert 'dractl_node_requests_total{api="v1",operation="prepare"} 1.0' in text
    assert 'dractl_node_claims_total{operation="prepare"} 1.0' in text
    assert "dractl_node_published_devices 8.0" in text
    assert 'dractl_node_request_duration_seconds_count{operation="prepare"} 1.0' in text


def test_a_tick_writes_again_a_prepared_claims_spec_that_was_removed(
    node_agent: agent.Agent, claims: Claims, settings: config.NodeAgent
) -> None:
    """Guards: the CDI directory emptied while the agent runs (a container of a prepared claim restarting needs its
    spec, and the kubelet does not prepare again): the next tick, not only the 10-minute sweep, writes it again."""
    ref = claims.put(claim("train", UID, [result("gpu-2")]))
    assert kubelet.prepare(node_agent.sockets.dra, ref)[UID].error == ""
    spec = settings.cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.yaml"
    written = spec.read_text()
    spec.unlink()
    node_agent.tick()
    assert spec.read_text() == written


def test_an_xid_taints_the_slice_and_shows_on_the_health_stream(
    node_agent: agent.Agent, gpus: fakegpu.FakeGpus, publisher: FakePublisher
) -> None:
    """Guards: an XID injected in the fake GPUs republishes gpu-0 with the xid taint and streams it UNHEALTHY."""
    with grpc.insecure_channel(f"unix:{node_agent.sockets.dra}") as channel:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest(), timeout=30
        )
        first = next(stream)
        assert {d.device.device_name: d.health for d in first.devices}["gpu-0"] == health_v1_pb2.HEALTHY
        gpus.inject_xid(0, 79)
        second = next(stream)
        stream.cancel()
    assert {d.device.device_name: d.health for d in second.devices}["gpu-0"] == health_v1_pb2.UNHEALTHY
    assert publisher.wait_for(lambda slices: bool(_tainted(slices, "gpu-0")))
    assert _tainted(publisher.published[-1], "gpu-0") == (
        model.DeviceTaint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule"),
    )
    assert _tainted(publisher.published[-1], "gpu-1") == ()
    assert "dractl_node_unhealthy_devices 1.0" in observe.get(node_agent.metrics_port, "/metrics")[1]


def test_liveness_checks_both_sockets(node_agent: agent.Agent) -> None:
    """Guards: /healthz is 200 while both sockets answer and 503 naming the failing calls once they do not."""
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")
    assert node_agent.plugin is not None
    node_agent.plugin.stop(grace_s=0)
    status, text = observe.get(node_agent.health_port, "/healthz")
    assert status == 503
    assert "/pluginregistration.Registration/GetInfo" in text and "NodePrepareResources" in text


def test_stop_removes_sockets_and_leaves_slices(node_agent: agent.Agent, publisher: FakePublisher) -> None:
    """Guards: stop() removes both sockets, is idempotent, and never publishes an empty set (slices stay)."""
    sockets = node_agent.sockets
    node_agent.stop()
    node_agent.stop()
    assert not sockets.dra.exists() and not sockets.registration.exists()
    assert all(len(slices) > 0 for slices in publisher.published)


def test_a_start_creates_a_missing_cdi_root_and_leaves_nothing_in_it(node_agent: agent.Agent) -> None:
    """Guards: the start-up check of --cdi-root creates the directory (missing in the fixture's settings) and removes
    the file that proved it writable, so the runtime never reads anything there but claim specs."""
    assert node_agent.settings.cdi_root.is_dir()
    assert list(node_agent.settings.cdi_root.iterdir()) == []


def test_a_failed_publish_is_retried(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards: the API being unreachable at start-up does not stop the agent; tick() publishes once it is back."""
    publisher.failures = 1
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05)
    a.start()
    try:
        assert publisher.published == []
        assert a.sockets.registration.exists()
        a.tick()
        assert publisher.wait_for(lambda slices: bool(slices))
        assert len(publisher.published) == 1
    finally:
        a.stop()


def test_a_hanging_publish_does_not_hold_up_health_events_and_the_newest_taints_win(
    node_agent: agent.Agent, gpus: fakegpu.FakeGpus, publisher: FakePublisher
) -> None:
    """Guards: slices are published off the NVML event thread: while the API server hangs on the publish
    for one XID, the monitor still takes in the next one, and once the API answers the last publish carries
    both taints, no publish going back to an older state."""
    monitor = node_agent.monitor
    assert monitor is not None
    publisher.gate = threading.Event()
    try:
        gpus.inject_xid(0, 79)
        assert publisher.hanging.wait(timeout=20)
        version, _ = monitor.wait_report(after=-1, timeout_s=0)
        gpus.inject_xid(1, 48)
        # Well short of the hang's own timeout, so only a monitor free of the publish gets here.
        deadline = time.monotonic() + 10
        while not monitor.taints()["gpu-1"] and time.monotonic() < deadline:
            version, _ = monitor.wait_report(after=version, timeout_s=deadline - time.monotonic())
        assert monitor.taints()["gpu-1"], "the monitor took no event in while a publish hung"
    finally:
        publisher.gate.set()
    assert publisher.wait_for(lambda slices: bool(_tainted(slices, "gpu-0")) and bool(_tainted(slices, "gpu-1")))
    tainted = [{d.name for s in slices for d in s.devices if d.taints} for slices in publisher.published]
    assert all(before <= after for before, after in zip(tainted, tainted[1:], strict=False))


def test_a_failure_building_the_slices_is_logged_and_the_publisher_thread_retries_at_the_next_tick(
    node_agent: agent.Agent, gpus: fakegpu.FakeGpus, publisher: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: an exception on the publisher thread (here from reading the taints) is logged with its traceback
    and does not end the thread: the next tick publishes the taint the failed attempt was for."""
    monitor = node_agent.monitor
    assert monitor is not None
    taints = monitor.taints
    failed = threading.Event()

    def fail_once() -> collections.abc.Mapping[str, tuple[model.DeviceTaint, ...]]:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("taints unreadable")
        return taints()

    monkeypatch.setattr(monitor, "taints", fail_once)
    with structlog.testing.capture_logs() as logs:
        gpus.inject_xid(0, 79)
        assert failed.wait(timeout=20)
        deadline = time.monotonic() + 20
        while not publisher.wait_for(lambda slices: bool(_tainted(slices, "gpu-0")), timeout=0.05):
            assert time.monotonic() < deadline, "no publish after the failure: the publisher thread is gone"
            node_agent.tick()
    failures = [log for log in logs if log["event"] == "publishing ResourceSlices failed; retrying at the next tick"]
    assert [(log["log_level"], log["exc_info"]) for log in failures] == [("error", True)]


def test_a_publisher_thread_that_outlived_stop_ends_when_its_publish_returns(
    settings: config.NodeAgent,
    gpus: fakegpu.FakeGpus,
    claims: Claims,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards: a publisher thread still hanging in a publish when stop() stopped waiting for it ends as soon as
    that publish returns, after the agent started again with a new publisher thread and without any wake-up:
    it publishes nothing more and leaves the new thread's wake-ups to the new thread."""
    monkeypatch.setattr(agent, "PUBLISHER_JOIN_S", 0.05)
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05)
    a.start()
    gate = threading.Event()
    try:
        old = a._publishing
        assert old is not None
        publisher.gate = gate
        gpus.inject_xid(0, 79)
        assert publisher.hanging.wait(timeout=20)
        publisher.gate = None  # only the publish under way hangs
        published_by_old = publisher.threads.count(old)
        a.stop()
        assert old.is_alive()
        a.start()
        new = a._publishing
        assert new is not None and new is not old
        count = len(publisher.published)
        a._on_taints({})
        assert publisher.wait_for(lambda slices: len(publisher.published) > count)
        assert publisher.threads[-1] is new
        gate.set()
        old.join(timeout=20)
        assert not old.is_alive(), "the old publisher thread is still waiting after its publish returned"
        assert publisher.threads.count(old) == published_by_old + 1
    finally:
        gate.set()
        a.stop()


def test_a_recurring_publish_failure_logs_its_traceback_once_until_a_publish_succeeds(
    node_agent: agent.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: a failure on the publisher thread that recurs logs its traceback the first time only, then one
    warning line per repeat; another error gets its own traceback, and once a publish succeeds the first error
    logs its traceback again."""
    monitor = node_agent.monitor
    assert monitor is not None
    taints = monitor.taints
    unreadable = (RuntimeError, "taints unreadable")
    script: list[tuple[type[Exception], str] | None] = [unreadable] * 3 + [(ValueError, "bad taint"), unreadable]
    script += [None, unreadable]
    attempted = threading.Condition()

    def scripted() -> collections.abc.Mapping[str, tuple[model.DeviceTaint, ...]]:
        with attempted:
            outcome = script.pop(0) if script else None
            attempted.notify_all()
        if outcome is not None:
            raise outcome[0](outcome[1])
        return taints()

    monkeypatch.setattr(monitor, "taints", scripted)
    with structlog.testing.capture_logs() as logs:
        deadline = time.monotonic() + 20
        with attempted:
            while script:
                assert time.monotonic() < deadline, "the publisher thread stopped trying"
                node_agent._on_taints({})
                attempted.wait(timeout=0.05)
        failures: list[tuple[str, bool, str | None]] = []
        while len(failures) < 6:
            assert time.monotonic() < deadline, f"only {len(failures)} failures logged"
            time.sleep(0.005)
            failures = [
                (log["log_level"], log.get("exc_info", False), log.get("error"))
                for log in logs
                if log["event"].startswith("publishing ResourceSlices failed")
            ]
    assert failures == [
        ("error", True, "RuntimeError: taints unreadable"),
        ("warning", False, "RuntimeError: taints unreadable"),
        ("warning", False, "RuntimeError: taints unreadable"),
        ("error", True, "ValueError: bad taint"),
        ("warning", False, "RuntimeError: taints unreadable"),
        ("error", True, "RuntimeError: taints unreadable"),
    ]


def test_bad_fake_profile_is_one_line(settings: config.NodeAgent) -> None:
    """Guards: an unknown --fake-profile ends with one error line naming it and exit 1, no traceback, no sockets."""
    err = io.StringIO()
    bad = dataclasses.replace(settings, fake_profile="no-such-profile")
    assert agent.run(bad, err=err) == 1
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dractl node-agent: error: ") and "no-such-profile" in lines[0]
    assert not (settings.kubelet_plugins_dir / DRIVER / "dra.sock").exists()


def test_nvml_without_a_driver_is_one_line(settings: config.NodeAgent) -> None:
    """Guards: --device-source nvml on a machine without the NVIDIA driver is one clear line and exit 1."""
    if _driver_present():
        pytest.skip("an NVIDIA driver is present here; this test needs a machine without one")
    err = io.StringIO()
    real = dataclasses.replace(settings, device_source=config.DeviceSource.NVML)
    assert agent.run(real, err=err) == 1
    lines = err.getvalue().splitlines()
    assert len(lines) == 1
    assert "NVML" in lines[0] and "is the NVIDIA driver installed?" in lines[0] and "Traceback" not in lines[0]


def test_sigterm_shuts_down_gracefully(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards: run() returns 0 on SIGTERM with both sockets removed and the slices left published."""
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05)
    registration = a.sockets.registration
    original = signal.getsignal(signal.SIGTERM)

    def terminate_when_up() -> None:
        # Up means: serving and the agent's own SIGTERM handler installed (else SIGTERM kills pytest).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            registration.exists() and signal.getsignal(signal.SIGTERM) is not original
        ):
            time.sleep(0.01)
        if signal.getsignal(signal.SIGTERM) is original:
            missing_handler.append(True)
            fallback.set()  # end run() without killing the test process
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    missing_handler: list[bool] = []
    fallback = threading.Event()

    killer = threading.Thread(target=terminate_when_up)
    killer.start()
    err = io.StringIO()
    code = agent.run(settings, err=err, agent=a, stop=fallback)
    killer.join(timeout=20)
    assert missing_handler == []
    assert code == 0
    assert not registration.exists() and not a.sockets.dra.exists()
    assert publisher.published and all(publisher.published)
    assert signal.getsignal(signal.SIGTERM) is original


def _driver_present() -> bool:
    """Whether real NVML initializes here (then the no-driver tests cannot run)."""
    from dractl.node import backend, nvml

    try:
        nvml.NvmlBackend().close()
    except backend.NvmlError:
        return False
    return True


@pytest.mark.parametrize("endpoint", ["health", "metrics"])
def test_a_taken_port_is_one_line_naming_the_flags_before_anything_is_served(
    endpoint: str, settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards: a port another process holds ends the start with one line naming the address, the port and both
    flags, before any slice is published or any socket made."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = dataclasses.replace(settings, **{f"{endpoint}_port": port, f"{endpoint}_address": "127.0.0.1"})
        err = io.StringIO()
        a = agent.Agent(taken, gpus=gpus, claims=claims, publisher=publisher)
        assert agent.run(taken, err=err, agent=a) == 1
    path = "/healthz" if endpoint == "health" else "/metrics"
    assert err.getvalue().splitlines() == [
        f"dractl node-agent: error: cannot serve {path} on 127.0.0.1:{port} (--{endpoint}-address 127.0.0.1, "
        f"--{endpoint}-port {port}): Address already in use; choose another with --{endpoint}-port or "
        f"--{endpoint}-address, or -1 to turn it off"
    ]
    assert publisher.published == []
    assert not a.sockets.registration.exists() and not a.sockets.dra.exists()


def test_an_address_that_is_not_an_ip_is_one_line(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards --metrics-address: a host name instead of an IP address is one line naming the flag."""
    bad = dataclasses.replace(settings, metrics_address="node-a.local")
    err = io.StringIO()
    assert agent.run(bad, err=err, agent=agent.Agent(bad, gpus=gpus, claims=claims, publisher=publisher)) == 1
    assert err.getvalue() == "dractl node-agent: error: --metrics-address 'node-a.local' is not an IP address\n"


def test_a_prepare_stuck_in_nvml_fails_healthz_naming_the_claim_and_the_call(
    settings: config.NodeAgent, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards: a prepare that hangs in an NVML call (dynamic MIG, create_compute_instance) makes /healthz 503 with
    the claim and the call once it has run longer than the bound; the probe itself answers at once."""
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=NODE)
    gpus.fail("create_compute_instance", action=fakegpu.FaultAction.HANG)
    dynamic = dataclasses.replace(settings, mig_mode=config.MigMode.DYNAMIC)
    a = agent.Agent(dynamic, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05, stuck_after_s=0.2)
    a.start()
    ref = claims.put(claim("infer", UID, [result("gpu-1-mig-1g10gb-19-0")]))
    answers: list[object] = []
    try:
        assert observe.get(a.health_port, "/healthz") == (200, "ok\n")
        with grpc.insecure_channel(f"unix:{a.sockets.dra}") as channel:
            call = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources.future(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=UID)]
                ),
                timeout=60,
            )
            call.add_done_callback(lambda done: answers.append(done.result()))
            controlplane.wait_until(gpus.hung, what="the prepare hanging in NVML", timeout=20)
            status, text = controlplane.wait_until(
                lambda: (answer := observe.get(a.health_port, "/healthz"))[0] == 503 and answer,
                what="/healthz failing on the stuck prepare",
                timeout=20,
            )
            assert re.fullmatch(
                f"NodePrepareResources of claim {ref.namespace}/{ref.name} \\(uid {UID}\\) has run for [0-9]+ s, "
                "waiting in NVML create_compute_instance\n",
                text,
            ), text
            gpus.close()  # Ends the hang: the prepare fails and rolls back.
            call.result(timeout=30)
    finally:
        a.stop()
    assert answers and "injected hang" in str(answers[0])


def test_an_agent_restarted_after_mig_prepares_publishes_what_the_first_one_did(
    settings: config.NodeAgent, claims: Claims, publisher: FakePublisher, tmp_path: pathlib.Path
) -> None:
    """Guards the rule for whole and MIG across restarts: in dynamic mode an A100 whose MIG instance was prepared
    (MIG mode turned on) and released (left on) is published whole again by the next agent, with the same devices
    as the first agent published."""
    dynamic = dataclasses.replace(settings, mig_mode=config.MigMode.DYNAMIC)

    def fresh() -> fakegpu.FakeGpus:
        return fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=NODE, state_file=tmp_path / "gpus.json")

    first = agent.Agent(dynamic, gpus=fresh(), claims=claims, publisher=publisher, health_poll_s=0.05)
    first.start()
    try:
        ref = claims.put(claim("infer", UID, [result("gpu-0-mig-1g10gb-19-0")]))
        assert kubelet.prepare(first.sockets.dra, ref)[UID].error == ""
        assert kubelet.unprepare(first.sockets.dra, ref)[UID].error == ""
    finally:
        first.stop()
    published_first = publisher.published[0]
    assert {"gpu-0", "gpu-0-mig-1g10gb-19-0"} <= {d.name for s in published_first for d in s.devices}
    assert fresh().gpus()[0].mig_mode is backend.MigMode.ENABLED and fresh().gpu_instances(0) == ()
    second = agent.Agent(dynamic, gpus=fresh(), claims=claims, publisher=publisher, health_poll_s=0.05)
    second.start()
    second.stop()
    assert publisher.published[-1] == published_first


def test_healthz_listens_on_an_ipv6_address(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards --health-address on an IPv6 node: /healthz is served on [::1]."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback address")
    v6 = dataclasses.replace(settings, health_address="::1")
    a = agent.Agent(v6, gpus=gpus, claims=claims, publisher=publisher)
    a.start()
    try:
        assert observe.get(a.health_port, "/healthz", host="[::1]") == (200, "ok\n")
    finally:
        a.stop()


def test_a_mig_prepare_on_an_a100_another_client_holds_is_a_per_claim_error(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards the Ampere reset rule at prepare: turning MIG on for a MIG device on an A100 that DCGM holds fails
    that claim with NVML's answer naming the GPU and the holder, leaves no instance, and the GPU stays whole."""
    gpus.hold(1, "dcgm-exporter")
    dynamic = dataclasses.replace(settings, mig_mode=config.MigMode.DYNAMIC)
    a = agent.Agent(dynamic, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05)
    a.start()
    try:
        ref = claims.put(claim("infer", UID, [result("gpu-1-mig-1g10gb-19-0")]))
        error = kubelet.prepare(a.sockets.dra, ref)[UID].error
    finally:
        a.stop()
    assert f"{ref.namespace}/{ref.name}" in error and "GPU 1" in error and "dcgm-exporter" in error, error
    assert gpus.gpus()[1].mig_mode is backend.MigMode.DISABLED and gpus.gpu_instances(1) == ()


def test_a_health_taint_is_published_at_once_during_a_repair_back_off(
    settings: config.NodeAgent, gpus: fakegpu.FakeGpus, claims: Claims, publisher: FakePublisher
) -> None:
    """Guards: repairs in a row make the next repair wait (here 600 s, far past this test's deadline), but an XID
    that changes the node's own slices is published without waiting for it: a fight over the slices (a second
    agent, slices deleted by hand) must not hide a failed GPU from the scheduler."""
    a = agent.Agent(settings, gpus=gpus, claims=claims, publisher=publisher, health_poll_s=0.05, repair_backoff_s=600)
    a.start()
    try:
        publisher.repairing = True
        for _ in range(2):  # two repairs in a row: the next publish would wait 600 s
            before = len(publisher.published)
            a._on_api_change()
            assert publisher.wait_for(lambda _slices, before=before: len(publisher.published) > before)
        assert (a.metrics.registry.get_sample_value("dractl_node_slice_repairs_total") or 0) >= 2
        a._on_api_change()  # another echo: now in the back-off
        gpus.inject_xid(0, 79)
        assert publisher.wait_for(lambda slices: bool(_tainted(slices, "gpu-0")), timeout=30)
    finally:
        a.stop()


def test_repairs_in_a_row_survive_the_publishes_between_them_and_end_after_a_quiet_row() -> None:
    """Guards against two agents for one node rewriting each other's slices at full speed: the echo of our own
    write (a publish that wrote nothing) between two repairs does not end the row, so the wait keeps doubling; a
    repair `REPAIR_ROW_S` after the last starts a new row with no wait."""
    repairs = agent._Repairs()
    now = 100.0
    waits = []
    for _ in range(6):
        repairs.record(agent._Outcome.REPAIRED, now)
        repairs.record(agent._Outcome.PUBLISHED, now + 0.01)  # the echo of that write
        waits.append(repairs.delay(now + 0.02))
        now += 1.0 + waits[-1]
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
    later = now + agent.REPAIR_ROW_S
    assert repairs.delay(later) == 0.0
    repairs.record(agent._Outcome.REPAIRED, later)
    assert (repairs.count, repairs.delay(later)) == (1, 0.0)
    for _ in range(40):
        repairs.record(agent._Outcome.REPAIRED, later)
    assert repairs.delay(later) == agent.REPAIR_BACKOFF_MAX_S
