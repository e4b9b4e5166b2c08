"""Device health of the node agent: NVML events in, device taints and a health report out.

What it does: a `Monitor` reads XID and GPU-lost events from the `backend.NvmlBackend` on its
own thread (a bounded wait per poll, so stopping is prompt), turns them into device taints
named as the NVIDIA DRA driver names them (`<driver>/xid` with the XID code as value,
`<driver>/gpu-lost`; effect NoSchedule, or None for the XIDs NVIDIA treats as application
errors), and clears them again when the device recovers: a lost GPU when NVML answers for it
again, an XID taint after a quiet period without further XIDs on a GPU that answers, except
the XIDs after which the GPU must be reset (`RESET_XIDS`): those stay until it is, and so does
`<driver>/reset-required` (the driver's recovery action as value) while NVML says a GPU needs a
reset, also when the agent starts after the XID. The taints
feed the slice publisher (observers get the whole device -> taints mapping on every change)
and the kubelet's health stream (`report()` / `wait_report()`: Healthy, Unhealthy or Unknown
per (pool, device)).

What it must not do: import grpc (the plugin streams the report), talk to the Kubernetes API
(the publisher does, through an observer), or change GPU state. It only reads the backend,
and only under the lock it is given, since backends are not thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from dractl import model
from dractl.node import backend

_log = structlog.get_logger(__name__)

# XIDs the NVIDIA DRA driver ignores (application errors, not hardware faults): its taint for
# them has effect None, so they are visible on the device but never repel pods.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# XIDs after which NVIDIA's Xid catalog has the GPU reset (or the node rebooted) before it takes work
# again: double-bit ECC (48), row-remapping pending or failed (63, 64), NVLink (74), fallen off the bus
# (79), uncontained ECC (95), GSP RPC timeout and error (119, 120), unrecovered ECC (140), and the
# recovery action the driver announces (154). Their taints outlast the quiet period.
RESET_XIDS = frozenset({48, 63, 64, 74, 79, 95, 119, 120, 140, 154})

# The kubelet marks a device Unknown when it is not re-reported within its timeout (30 s by
# default), so every report carries this and the plugin re-sends well within it.
HEALTH_CHECK_TIMEOUT_S = 30

_DEVICE_NAME = re.compile(r"^gpu-(?P<minor>\d+)(?:-|\Z)")


class Status(enum.Enum):
    UNKNOWN = "Unknown"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclasses.dataclass(frozen=True, slots=True)
class MonitoredDevice:
    """A published device and the physical GPU behind it.

    `uuid` is the device's own NVML UUID (`GPU-...` for a full GPU, `MIG-...` for a static MIG
    device) or None for a device that has none yet (a dynamic-MIG partition).
    """

    name: str
    minor: int
    uuid: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One line of the health report: `last_updated` in Unix seconds, `message` one line."""

    pool: str
    device: str
    status: Status
    last_updated: int
    message: str = ""


def devices_from_slices(slices: Iterable[model.ResourceSlice]) -> tuple[MonitoredDevice, ...]:
    """The devices of the node's slices with their parent GPU's minor, in slice order.

    Pure. The minor comes from the NVIDIA device names (`gpu-<minor>` and `gpu-<minor>-...`);
    devices named otherwise are not GPU-backed and are left out.
    """
    found = []
    for resource_slice in slices:
        for device in resource_slice.devices:
            match = _DEVICE_NAME.match(device.name)
            if match is None:
                continue
            uuid = device.attributes.get("uuid")
            scalar = uuid.scalar if uuid is not None else None
            text = scalar if isinstance(scalar, str) else None
            found.append(MonitoredDevice(name=device.name, minor=int(match["minor"]), uuid=text))
    return tuple(found)


TaintObserver = Callable[[Mapping[str, tuple[model.DeviceTaint, ...]]], None]


@dataclasses.dataclass(slots=True)
class _GpuState:
    lost: bool = False
    xid: int | None = None  # the latest XID seen, kept until the GPU has been quiet long enough
    xid_at: float = 0.0
    mig_xids: dict[str, int] = dataclasses.field(default_factory=dict)  # MIG uuid -> XID
    reset_xid: int | None = None  # the latest XID that needs a GPU reset, kept until the GPU is reset
    recovery: backend.RecoveryAction = backend.RecoveryAction.NONE  # as NVML last said, when it resets


class Monitor:
    """Health of one node's devices, driven by backend events; thread-safe.

    Invariants: a device's taints are a pure function of its GPU's state (lost, latest XID,
    per-MIG XIDs); observers are called with the complete mapping (every monitored device,
    tainted or not) exactly when that mapping changes, outside the monitor's lock; the report
    version increases on every change, so `wait_report(after=v)` never misses one.
    """

    def __init__(
        self,
        *,
        backend: backend.NvmlBackend,
        driver_name: str,
        pool: str,
        devices: Sequence[MonitoredDevice],
        lost: Iterable[int] = (),
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        xid_quiet_s: float = 300.0,
        poll_s: float = 1.0,
        backend_lock: contextlib.AbstractContextManager[object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._pool = pool
        self._xid_key = f"{driver_name}/xid"
        self._lost_key = f"{driver_name}/gpu-lost"
        self._reset_key = f"{driver_name}/reset-required"
        self._ignored = frozenset(ignored_xids)
        self._xid_quiet_s = xid_quiet_s
        self._poll_s = poll_s
        self._backend_lock: contextlib.AbstractContextManager[object] = backend_lock or threading.Lock()
        self._clock = clock
        self._devices = tuple(devices)
        self._gpus = {device.minor: _GpuState() for device in self._devices}
        # GPUs already lost when the inventory was read start tainted; probes clear them.
        for minor in lost:
            if minor in self._gpus:
                self._gpus[minor].lost = True
        # A GPU still waiting for a reset when the agent starts (the XID came before it) starts tainted.
        for minor, state in self._gpus.items():
            action = self._recovery(minor)
            if action is not None and action.resets:
                state.recovery = action
        self._uuid_to_minor = {d.uuid: d.minor for d in self._devices if d.uuid is not None}
        self._events_readable = True  # False while reading events fails: the report says Unknown
        self._read_failure: str | None = None  # the failure last logged, while reading events keeps failing
        self._cond = threading.Condition()
        self._version = 0
        self._taints = self._compute_taints()
        self._observers: list[TaintObserver] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what others read --------------------------------------------------------------------

    def subscribe(self, observer: TaintObserver) -> None:
        """Call `observer(device -> taints)` on every change of the taints, on the monitor's thread.

        The observer must return quickly: until it does, no further NVML event is read. Slow
        work (an API write) belongs on a thread of its own that the observer only wakes.
        """
        self._observers.append(observer)

    def taints(self) -> dict[str, tuple[model.DeviceTaint, ...]]:
        """Every monitored device's current taints (an empty tuple when healthy). A copy."""
        with self._cond:
            return dict(self._taints)

    def report(self) -> tuple[DeviceHealth, ...]:
        """The complete health list, one entry per monitored device, in device order."""
        with self._cond:
            return self._report()

    def wait_report(self, *, after: int, timeout_s: float) -> tuple[int, tuple[DeviceHealth, ...]]:
        """Wait up to `timeout_s` for a report newer than version `after`; return (version, report).

        Returns at once when the current version differs from `after` (pass -1 to get the
        current report immediately); on timeout it returns the current, unchanged report.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._version != after, timeout=timeout_s)
            return self._version, self._report()

    # --- running -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start reading events on a daemon thread. Call once."""
        self._thread = threading.Thread(target=self._run, name="dractl-health", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop the event thread and wait for it (at most one poll). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()

    def poll_once(self) -> None:
        """Wait for events once (up to the poll interval), apply them, then check for recoveries.

        Never raises: a failed event read marks the report Unknown until a read succeeds
        again (GPU_IS_LOST marks every GPU lost instead). A failure is logged when it starts (or
        changes), not at every poll, and the first read that works again is logged too.
        """
        try:
            events = self._backend.wait_events(timeout_s=self._poll_s)
        except backend.NvmlError as err:
            if err.code == backend.Return.GPU_IS_LOST:
                self.handle((backend.Event(kind=backend.EventKind.GPU_LOST),))
            else:
                if str(err) != self._read_failure:
                    _log.warning("health: reading GPU events failed; devices report Unknown", error=str(err))
                    self._read_failure = str(err)
                self._set_readable(False)
                # Waiting here keeps a persistently failing backend from spinning the CPU.
                self._stop.wait(self._poll_s)
            return
        if self._read_failure is not None:
            _log.info("health: reading GPU events works again", failed_with=self._read_failure)
            self._read_failure = None
        self._set_readable(True)
        if events:
            self.handle(events)
        self.check_recovery()

    # --- transitions -------------------------------------------------------------------------

    def handle(self, events: Iterable[backend.Event]) -> None:
        """Apply events to the GPUs' states; notify observers if any taint changed."""
        now = self._clock()
        with self._cond:
            for event in events:
                self._apply(event, now)
        self._publish_if_changed()

    def _apply(self, event: backend.Event, now: float) -> None:
        minor = event.minor
        if minor is None and event.gpu_uuid is not None:
            minor = self._uuid_to_minor.get(event.gpu_uuid)
        if event.kind is backend.EventKind.GPU_LOST or minor is None:
            # An event that names no GPU we know cannot be attributed: the NVIDIA driver then
            # treats every GPU as lost, and so do we (recovery probes clear the ones that answer).
            targets = [minor] if minor is not None and minor in self._gpus else list(self._gpus)
            for target in targets:
                self._gpus[target].lost = True
            _log.warning("health: GPU lost", minors=targets, xid=event.xid or None)
            return
        state = self._gpus.get(minor)
        if state is None:
            _log.info("health: event for an unmonitored GPU ignored", minor=minor, xid=event.xid)
            return
        if event.xid in RESET_XIDS:
            # The whole GPU needs the reset, whichever of its MIG devices reported it.
            state.reset_xid = event.xid
        elif event.mig_uuid is not None and event.mig_uuid in self._uuid_to_minor:
            state.mig_xids[event.mig_uuid] = event.xid
        else:
            state.xid = event.xid
        state.xid_at = now
        _log.warning(
            "health: XID", minor=minor, xid=event.xid, mig_uuid=event.mig_uuid, needs_reset=event.xid in RESET_XIDS
        )

    def check_recovery(self) -> None:
        """Clear what has recovered: lost GPUs that NVML answers for again, XID taints of answering
        GPUs quiet for `xid_quiet_s`, and a GPU's reset XID and reset-required taint once NVML's
        recovery action, having asked for a reset, says none is needed (the GPU was reset). Where
        NVML cannot tell, a reset XID stays until the agent restarts, which a GPU reset needs anyway
        (the agent holds the GPU through NVML). Probes run under the backend lock."""
        now = self._clock()
        with self._cond:
            candidates = {
                minor
                for minor, state in self._gpus.items()
                if state.lost
                or state.reset_xid is not None
                or state.recovery.resets
                or ((state.xid is not None or state.mig_xids) and now - state.xid_at >= self._xid_quiet_s)
            }
        if not candidates:
            return
        answering = {minor for minor in candidates if self._probe(minor)}
        actions = {minor: self._recovery(minor) for minor in answering}
        with self._cond:
            for minor in answering:
                state = self._gpus[minor]
                if state.lost:
                    state.lost = False
                    _log.info("health: GPU answers again", minor=minor)
                if (state.xid is not None or state.mig_xids) and now - state.xid_at >= self._xid_quiet_s:
                    state.xid = None
                    state.mig_xids.clear()
                    _log.info("health: XID taint cleared after a quiet period", minor=minor)
                action = actions[minor]
                if action is not None and action.resets:
                    state.recovery = action
                elif action is backend.RecoveryAction.NONE and state.recovery.resets:
                    _log.info("health: GPU was reset; its reset taints are cleared", minor=minor, xid=state.reset_xid)
                    state.recovery = backend.RecoveryAction.NONE
                    state.reset_xid = None
        self._publish_if_changed()

    def _recovery(self, minor: int) -> backend.RecoveryAction | None:
        """NVML's recovery action for the GPU, or None where it cannot say (older drivers, errors)."""
        try:
            with self._backend_lock:
                return self._backend.recovery_action(minor)
        except backend.NvmlError:
            return None

    def _probe(self, minor: int) -> bool:
        try:
            with self._backend_lock:
                self._backend.compute_mode(minor)
        except backend.NvmlError:
            return False
        return True

    def _set_readable(self, readable: bool) -> None:
        with self._cond:
            if self._events_readable == readable:
                return
            self._events_readable = readable
            self._bump()

    # --- derived values ------------------------------------------------------------------------

    def _compute_taints(self) -> dict[str, tuple[model.DeviceTaint, ...]]:
        taints: dict[str, tuple[model.DeviceTaint, ...]] = {}
        for device in self._devices:
            state = self._gpus[device.minor]
            found: list[model.DeviceTaint] = []
            if state.lost:
                found.append(model.DeviceTaint(key=self._lost_key, effect=model.TaintEffect.NO_SCHEDULE.value))
            xid = state.mig_xids.get(device.uuid, state.xid) if device.uuid is not None else state.xid
            if state.reset_xid is not None:
                xid = state.reset_xid
            if xid is not None:
                effect = model.TaintEffect.NONE if xid in self._ignored else model.TaintEffect.NO_SCHEDULE
                found.append(model.DeviceTaint(key=self._xid_key, value=str(xid), effect=effect.value))
            if state.recovery.resets:
                found.append(
                    model.DeviceTaint(
                        key=self._reset_key,
                        value=state.recovery.name.lower().replace("_", "-"),
                        effect=model.TaintEffect.NO_SCHEDULE.value,
                    )
                )
            taints[device.name] = tuple(found)
        return taints

    def _publish_if_changed(self) -> None:
        with self._cond:
            taints = self._compute_taints()
            if taints == self._taints:
                return
            self._taints = taints
            self._bump()
        for observer in list(self._observers):
            try:
                observer(dict(taints))
            except Exception:  # noqa: BLE001 - one failing observer must not stop health tracking
                _log.exception("health: taint observer failed")

    def _bump(self) -> None:
        # Called with the lock held.
        self._version += 1
        self._cond.notify_all()

    def _report(self) -> tuple[DeviceHealth, ...]:
        # Called with the lock held.
        report = []
        # The status is re-determined on every poll, so it is as fresh as the report itself.
        now = int(self._clock())
        for device in self._devices:
            taints = self._taints[device.name]
            repelling = [t for t in taints if t.effect != model.TaintEffect.NONE.value]
            if not self._events_readable:
                status, message = Status.UNKNOWN, "GPU events cannot be read"
            elif repelling:
                status = Status.UNHEALTHY
                message = "; ".join(f"{t.key}={t.value}" if t.value else t.key for t in repelling)
            else:
                status, message = Status.HEALTHY, ""
            report.append(
                DeviceHealth(pool=self._pool, device=device.name, status=status, last_updated=now, message=message)
            )
        return tuple(report)
