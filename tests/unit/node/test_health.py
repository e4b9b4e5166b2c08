"""Device health: backend events become taints and a health report, and clear again on recovery."""

from __future__ import annotations

import threading
import time

import pytest
import structlog
from support import devices

from dractl import model
from dractl.node import backend, fakegpu, health

DRIVER = "gpu.nvidia.com"
POOL = "node-a"


class EventBackend:
    """The backend calls the monitor makes: queued events, a probe that fails for lost GPUs, and the recovery
    action per GPU (NONE unless set; a GPU in `mute` answers NOT_SUPPORTED, as older drivers do)."""

    def __init__(self) -> None:
        self.events: list[backend.Event] = []
        self.lost: set[int] = set()
        self.wait_error: backend.NvmlError | None = None
        self.cond = threading.Condition()
        self.recovery: dict[int, backend.RecoveryAction] = {}
        self.mute: set[int] = set()

    def push(self, *events: backend.Event) -> None:
        with self.cond:
            self.events.extend(events)
            self.cond.notify_all()

    def wait_events(self, *, timeout_s: float) -> tuple[backend.Event, ...]:
        if self.wait_error is not None:
            raise self.wait_error
        with self.cond:
            self.cond.wait_for(lambda: bool(self.events), timeout=timeout_s)
            events, self.events = tuple(self.events), []
            return events

    def compute_mode(self, minor: int) -> backend.ComputeMode:
        if minor in self.lost:
            raise backend.NvmlError(backend.Return.GPU_IS_LOST, f"gpu {minor}")
        return backend.ComputeMode.DEFAULT

    def recovery_action(self, minor: int) -> backend.RecoveryAction:
        if minor in self.mute:
            raise backend.NvmlError(backend.Return.NOT_SUPPORTED, f"gpu {minor}")
        return self.recovery.get(minor, backend.RecoveryAction.NONE)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


DEVICES = (
    health.MonitoredDevice("gpu-0", 0, "GPU-0"),
    health.MonitoredDevice("gpu-0-mig-1g10gb-19-0", 0, "MIG-a"),
    health.MonitoredDevice("gpu-0-mig-1g10gb-19-1", 0, "MIG-b"),
    health.MonitoredDevice("gpu-1", 1, "GPU-1"),
)


@pytest.fixture
def fake() -> EventBackend:
    return EventBackend()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def monitor(fake: EventBackend, clock: Clock) -> health.Monitor:
    return health.Monitor(
        backend=fake,
        driver_name=DRIVER,
        pool=POOL,
        devices=DEVICES,
        xid_quiet_s=60,
        poll_s=0.01,
        clock=clock,  # type: ignore[arg-type]
    )


def _xid(code: str, effect: str = "NoSchedule") -> model.DeviceTaint:
    return model.DeviceTaint(key=f"{DRIVER}/xid", value=code, effect=effect)


LOST = model.DeviceTaint(key=f"{DRIVER}/gpu-lost", effect="NoSchedule")


def test_no_events_means_no_taints_and_healthy_devices(monitor: health.Monitor) -> None:
    """Guards: a quiet node publishes no taints and reports every device Healthy."""
    assert monitor.taints() == {d.name: () for d in DEVICES}
    assert [(h.device, h.status) for h in monitor.report()] == [(d.name, health.Status.HEALTHY) for d in DEVICES]


def test_gpu_xid_taints_the_gpu_and_its_mig_devices(monitor: health.Monitor) -> None:
    """Guards: an XID on a GPU taints it and every MIG device on it (NoSchedule, value = code), not other GPUs."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=0, gpu_uuid="GPU-0", xid=79)])
    taints = monitor.taints()
    assert taints["gpu-0"] == (_xid("79"),)
    assert taints["gpu-0-mig-1g10gb-19-0"] == (_xid("79"),)
    assert taints["gpu-0-mig-1g10gb-19-1"] == (_xid("79"),)
    assert taints["gpu-1"] == ()
    report = {h.device: h for h in monitor.report()}
    assert report["gpu-0"].status is health.Status.UNHEALTHY
    assert report["gpu-0"].message == f"{DRIVER}/xid=79"
    assert report["gpu-1"].status is health.Status.HEALTHY


def test_mig_xid_taints_only_that_mig_device(monitor: health.Monitor) -> None:
    """Guards: an XID from a MIG device taints that MIG device only."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=0, gpu_uuid="GPU-0", mig_uuid="MIG-b", xid=94)])
    taints = monitor.taints()
    assert taints["gpu-0-mig-1g10gb-19-1"] == (_xid("94"),)
    assert taints["gpu-0"] == () and taints["gpu-0-mig-1g10gb-19-0"] == ()


def test_ignored_xid_is_an_informational_taint_and_stays_healthy(monitor: health.Monitor) -> None:
    """Guards: XIDs NVIDIA treats as application errors (e.g. 13) get effect None and keep the device Healthy."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=13)])
    assert monitor.taints()["gpu-1"] == (_xid("13", "None"),)
    assert {h.device: h.status for h in monitor.report()}["gpu-1"] is health.Status.HEALTHY


def test_event_for_unknown_gpu_is_gpu_lost_for_all(monitor: health.Monitor) -> None:
    """Guards: an event that names no known GPU taints every device gpu-lost, as the NVIDIA driver does."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, xid=79)])
    assert all(taints == (LOST,) for taints in monitor.taints().values())


def test_gpu_lost_clears_when_the_gpu_answers_again(monitor: health.Monitor, fake: EventBackend) -> None:
    """Guards: a lost GPU stays tainted while NVML cannot reach it and is cleared once it answers."""
    fake.lost.add(1)
    monitor.handle([backend.Event(kind=backend.EventKind.GPU_LOST, minor=1)])
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == (LOST,)
    fake.lost.clear()
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == ()


def test_xid_clears_after_a_quiet_period_only(monitor: health.Monitor, clock: Clock) -> None:
    """Guards: an XID taint stays until the GPU has been free of XIDs for xid_quiet_s, then clears."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=94)])
    clock.now += 59
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == (_xid("94"),)
    clock.now += 1
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == ()


RESET = model.DeviceTaint(key=f"{DRIVER}/reset-required", value="gpu-reset", effect="NoSchedule")


@pytest.mark.parametrize("xid", sorted(health.RESET_XIDS))
def test_an_xid_that_needs_a_reset_stays_until_the_gpu_is_reset(
    monitor: health.Monitor, fake: EventBackend, clock: Clock, xid: int
) -> None:
    """Guards: an XID after which the GPU must be reset (48 and the others of NVIDIA's catalog) is not cleared by
    quiet time; NVML's recovery action adds reset-required; once NVML says no recovery is needed any more (the
    GPU was reset), both taints clear."""
    fake.recovery[1] = backend.RecoveryAction.GPU_RESET
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=xid)])
    clock.now += 3600
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == (_xid(str(xid)), RESET)
    assert {h.device: h.status for h in monitor.report()}["gpu-1"] is health.Status.UNHEALTHY
    fake.recovery[1] = backend.RecoveryAction.NONE
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == ()


def test_where_nvml_cannot_tell_a_reset_xid_stays_for_the_agents_life(
    monitor: health.Monitor, fake: EventBackend, clock: Clock
) -> None:
    """Guards: on a driver without the recovery action (NOT_SUPPORTED), or one that never asked for a reset, XID 48
    stays tainted however long it is quiet, and a later application XID does not replace it."""
    fake.mute.add(1)
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=48)])
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=94)])
    clock.now += 86400
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == (_xid("48"),)
    fake.mute.clear()
    monitor.check_recovery()
    assert monitor.taints()["gpu-1"] == (_xid("48"),)


def test_a_reset_xid_on_a_mig_device_taints_the_whole_gpu(monitor: health.Monitor) -> None:
    """Guards: a MIG device's XID 48 needs the parent GPU reset, so the GPU and all its MIG devices are tainted."""
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=0, gpu_uuid="GPU-0", mig_uuid="MIG-b", xid=48)])
    taints = monitor.taints()
    assert taints["gpu-0"] == taints["gpu-0-mig-1g10gb-19-0"] == taints["gpu-0-mig-1g10gb-19-1"] == (_xid("48"),)
    assert taints["gpu-1"] == ()


def test_a_gpu_waiting_for_a_reset_when_the_agent_starts_is_tainted(fake: EventBackend, clock: Clock) -> None:
    """Guards: an agent started after the XID (a restart without a reset) still keeps the GPU from new work: NVML's
    pending recovery action taints it and its MIG devices reset-required until the reset."""
    fake.recovery[0] = backend.RecoveryAction.NODE_REBOOT
    monitor = health.Monitor(backend=fake, driver_name=DRIVER, pool=POOL, devices=DEVICES, clock=clock)  # type: ignore[arg-type]
    reboot = model.DeviceTaint(key=f"{DRIVER}/reset-required", value="node-reboot", effect="NoSchedule")
    assert monitor.taints()["gpu-0"] == monitor.taints()["gpu-0-mig-1g10gb-19-0"] == (reboot,)
    assert monitor.taints()["gpu-1"] == ()
    fake.recovery[0] = backend.RecoveryAction.NONE
    monitor.check_recovery()
    assert monitor.taints()["gpu-0"] == ()


def test_observers_get_the_full_mapping_on_each_change_only(monitor: health.Monitor) -> None:
    """Guards: taint observers are called once per change with every device, and not when nothing changed."""
    calls: list[dict[str, tuple[model.DeviceTaint, ...]]] = []
    monitor.subscribe(lambda taints: calls.append(dict(taints)))
    event = backend.Event(kind=backend.EventKind.XID, minor=1, xid=48)
    monitor.handle([event])
    monitor.handle([event])
    assert len(calls) == 1
    assert set(calls[0]) == {d.name for d in DEVICES}
    assert calls[0]["gpu-1"] == (_xid("48"),)


def test_a_failing_observer_does_not_stop_the_others(monitor: health.Monitor) -> None:
    """Guards: one observer raising is logged and the next observer still hears of the change."""
    seen: list[int] = []

    def broken(taints: object) -> None:
        raise RuntimeError("publisher down")

    monitor.subscribe(broken)
    monitor.subscribe(lambda taints: seen.append(len(taints)))
    monitor.handle([backend.Event(kind=backend.EventKind.XID, minor=1, xid=48)])
    assert seen == [len(DEVICES)]


def test_unreadable_events_report_unknown(monitor: health.Monitor, fake: EventBackend) -> None:
    """Guards: while reading events fails the report says Unknown; it returns to Healthy once reads succeed."""
    fake.wait_error = backend.NvmlError(backend.Return.UNKNOWN, "event set")
    monitor.poll_once()
    assert {h.status for h in monitor.report()} == {health.Status.UNKNOWN}
    fake.wait_error = None
    monitor.poll_once()
    assert {h.status for h in monitor.report()} == {health.Status.HEALTHY}


def test_a_failure_to_read_events_is_logged_once_not_at_every_poll(monitor: health.Monitor, fake: EventBackend) -> None:
    """Guards issue 15 (NVML read failures were logged every second): a failure is logged when it starts and when it
    changes, not at each of the polls it repeats in, and the first read that works again is logged once."""
    with structlog.testing.capture_logs() as logs:
        fake.wait_error = backend.NvmlError(backend.Return.UNKNOWN, "event set")
        for _ in range(5):
            monitor.poll_once()
        fake.wait_error = backend.NvmlError(backend.Return.DRIVER_NOT_LOADED, "driver")
        for _ in range(3):
            monitor.poll_once()
        fake.wait_error = None
        for _ in range(3):
            monitor.poll_once()
    assert [(entry["log_level"], entry["event"]) for entry in logs] == [
        ("warning", "health: reading GPU events failed; devices report Unknown"),
        ("warning", "health: reading GPU events failed; devices report Unknown"),
        ("info", "health: reading GPU events works again"),
    ]
    assert [entry.get("error") for entry in logs[:2]] == [
        str(backend.NvmlError(backend.Return.UNKNOWN, "event set")),
        str(backend.NvmlError(backend.Return.DRIVER_NOT_LOADED, "driver")),
    ]


def test_wait_report_returns_on_change_and_the_thread_stops_promptly(
    monitor: health.Monitor, fake: EventBackend
) -> None:
    """Guards: the event thread applies a pushed event (wait_report wakes on it) and stop() joins within a poll."""
    version, _ = monitor.wait_report(after=-1, timeout_s=0)
    monitor.start()
    try:
        fake.push(backend.Event(kind=backend.EventKind.XID, minor=0, xid=79))
        deadline = time.monotonic() + 10
        new_version, report = version, ()
        while new_version == version and time.monotonic() < deadline:
            new_version, report = monitor.wait_report(after=version, timeout_s=1)
        assert new_version != version
        assert {h.device: h.status for h in report}["gpu-0"] is health.Status.UNHEALTHY
    finally:
        monitor.stop(timeout_s=5)
    assert monitor._thread is not None and not monitor._thread.is_alive()


def test_devices_from_slices_reads_minor_and_uuid() -> None:
    """Guards: GPU and MIG devices of a slice map to their parent minor and own UUID; other names are left out."""
    slices = [
        devices.rslice(
            devices.device("gpu-3", attributes={"uuid": "GPU-3"}),
            devices.device("gpu-3-mig-3g40gb-9-4"),
            devices.device("nic-0"),
            name="s",
            node=POOL,
            driver=DRIVER,
            pool=POOL,
            generation=0,
        )
    ]
    assert health.devices_from_slices(slices) == (
        health.MonitoredDevice("gpu-3", 3, "GPU-3"),
        health.MonitoredDevice("gpu-3-mig-3g40gb-9-4", 3, None),
    )


def test_through_the_fake_gpus_xid_48_stays_until_reset_gpu() -> None:
    """Guards the fake driver's side of it: an XID injected with its recovery action keeps the GPU tainted past
    the quiet period until the test resets the GPU, as `nvidia-smi -r` would."""
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="n")
    clock = Clock()
    devices = (health.MonitoredDevice("gpu-0", 0, gpus.gpus()[0].uuid), health.MonitoredDevice("gpu-1", 1))
    monitor = health.Monitor(backend=gpus, driver_name=DRIVER, pool=POOL, devices=devices, poll_s=0, clock=clock)  # type: ignore[arg-type]
    gpus.inject_xid(0, 48, recovery=backend.RecoveryAction.GPU_RESET)
    monitor.poll_once()
    clock.now += 3600
    monitor.poll_once()
    assert monitor.taints()["gpu-0"] == (_xid("48"), RESET)
    gpus.reset_gpu(0)
    monitor.poll_once()
    assert monitor.taints() == {"gpu-0": (), "gpu-1": ()}
