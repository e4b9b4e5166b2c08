"""Lease-based leader election (coordination.k8s.io/v1), the protocol of client-go's leaderelection.

What it does: `Elector.try_acquire_or_renew()` is one step of the protocol: create the Lease
if it does not exist; renew it if this identity holds it; take it over if it is free or its
holder has not renewed for `lease_duration` seconds *as observed by this elector's clock*
(clocks of different machines are never compared, as in client-go); otherwise report not
leading. Every write is an update with the Lease's resourceVersion as precondition, so two
electors never both win. `run()` loops over that step until stopped, calls `on_started` on
becoming leader and `on_stopped` on losing the lease (renewal failing for `renew_deadline`, or
another holder seen on it) or stopping, and releases the Lease on a clean stop so a successor
need not wait. A holder that runs in a pod in the Lease's namespace (`Config.pod`) names that pod
(name and UID) in the Lease's `dractl.io/holder-pod` annotation; a candidate that finds the Lease
held by such a holder whose pod no longer exists (or has ended) takes it over at once instead of
waiting out the lease: after `helm uninstall` deleted the Role before the last leader's pod
ended, that leader could not release the Lease, and the next install would otherwise wait.
Each elector has a `Fence`, which the process's writes check just before they
are sent: it lets them through only while the last successful renewal began less than
`renew_deadline` ago. A leader that was paused (SIGSTOP, a stalled VM) past its deadline thus
sends no write when it goes on, even before its loop notices that it lost.

What it must not do: decide anything but who leads, or trust the holder's timestamps for
expiry. Time comes from an injectable `Clock`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from dractl.kube import client as kube_client

log = logging.getLogger(__name__)


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds, for expiry."""
        ...

    def wall(self) -> datetime.datetime:
        """UTC time, for the Lease's timestamps."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


HOLDER_POD = "dractl.io/holder-pod"
"""The Lease annotation naming the holder's pod: JSON `{"identity", "pod", "uid"}`, written with the holder's identity
in the same update, so a holder that wrote none (another elector) is never mistaken for the pod named."""

_ENDED = ("Succeeded", "Failed")


def _micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """client-go's defaults: 15 s lease, renew within 10 s, retry every 2 s.

    `pod` is the name of the pod this candidate runs in, in `namespace` ("" when it runs in none
    there): its holder annotation lets a successor take over at once once the pod is gone.
    """

    namespace: str
    name: str
    identity: str
    pod: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Fence:
    """Whether this replica may still write: it leads, and its last successful renewal began less than
    `renew_deadline` seconds ago (`kube.client.WriteFence`). Thread-safe.

    Why that is safe: a standby takes the Lease over no sooner than the lease duration after it
    saw the last renewal, which it saw after that renewal began. So a write let through here
    reaches the server before any successor acts, with lease duration - renew deadline (5 s by
    default) to spare for its way there. The client asks again just before each piece of a write
    goes to the socket; what no check in the process can stop is a pause that falls between that
    last check and the socket: that one write goes out when the process goes on.

    The elector moves it: `renewed(began)` after each successful acquire or renewal, `close()`
    when leadership ends. It starts closed.
    """

    def __init__(self, *, lease: str, renew_deadline: float, clock: Clock) -> None:
        self.lease = lease
        self.renew_deadline = renew_deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._renewed: float | None = None  # when the last successful renewal began; None: closed

    def renewed(self, began: float) -> None:
        """A renewal (or the acquisition) that began at `began` (monotonic) succeeded."""
        with self._lock:
            self._renewed = began

    def close(self) -> None:
        """Leadership ended: no write passes any more (until a new acquisition)."""
        with self._lock:
            self._renewed = None

    def expired(self) -> bool:
        """True when closed or past the renew deadline."""
        return self._problem() is not None

    def check(self, what: str) -> None:
        """Raise `kube_client.Fenced` naming `what` and why when no write may be sent now."""
        problem = self._problem()
        if problem is not None:
            raise kube_client.Fenced(0, "Fenced", f"{what}: not sent: {problem}")

    def _problem(self) -> str | None:
        with self._lock:
            renewed = self._renewed
        if renewed is None:
            return f"this replica does not hold the Lease {self.lease}"
        age = self._clock.monotonic() - renewed
        if age >= self.renew_deadline:
            return (
                f"the Lease {self.lease} was last renewed {age:.1f}s ago, past the renew deadline "
                f"({self.renew_deadline:g}s): another replica may lead"
            )
        return None


class Elector:
    """One candidate. `try_acquire_or_renew` is safe to call from one thread at a time.

    `leading` is whether it holds the Lease as far as it knows: set by a successful step, cleared
    when it gives up (the renew deadline passed, or another holder is on the Lease) or releases.
    A failed renewal within the deadline leaves it set. `fence` lets writes through while it leads.
    """

    def __init__(self, client: kube_client.Client, config: Config, *, clock: Clock | None = None) -> None:
        self._client = client
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen on the Lease
        self._observed_at = 0.0
        self._holder = ""  # the holder the last step saw, when another candidate holds the Lease
        self._own_pod: dict[str, str] | None = None  # this candidate's HOLDER_POD record, once its pod was read
        self._alive: str = ""  # the last HOLDER_POD annotation whose pod was found running (read once per holder)
        self.leading = False
        self.fence = Fence(
            lease=f"{config.namespace}/{config.name}", renew_deadline=config.renew_deadline, clock=self._clock
        )

    def _spec(self, *, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": acquire_time,
            "renewTime": _micro_time(self._clock.wall()),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One protocol step; returns whether this elector holds the Lease afterwards. API failures count as not.

        Success sets `leading` and moves the fence (from when the step began). Finding the Lease
        held by another candidate while leading ends leadership at once (fence closed).
        """
        began = self._clock.monotonic()
        self._holder = ""
        try:
            held = self._step(began)
        except kube_client.ApiError as error:
            # A warning, as client-go logs these as errors: a Lease the server refuses (401, 403) or cannot be
            # reached leaves the replica a standby for ever, which a log read at warning level must show.
            log.warning("lease %s/%s: cannot acquire or renew: %s", self.config.namespace, self.config.name, error)
            held = False
        if held:
            self.leading = True
            self.fence.renewed(began)
        elif self.leading and self._holder:
            self._give_up(f"the Lease is held by {self._holder}")
        return held

    def _give_up(self, why: str) -> None:
        self.leading = False
        self.fence.close()
        log.warning("lease %s/%s: no longer leading: %s", self.config.namespace, self.config.name, why)

    def _step(self, now: float) -> bool:
        try:
            lease = self._client.get(kube_client.LEASES, self.config.name, namespace=self.config.namespace)
        except kube_client.NotFound:
            now_text = _micro_time(self._clock.wall())
            try:
                self._client.create(
                    kube_client.LEASES,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": self._metadata({"name": self.config.name, "namespace": self.config.namespace}),
                        "spec": self._spec(acquire_time=now_text, transitions=0),
                    },
                )
            except kube_client.AlreadyExists:
                return False  # Another candidate created it first.
            self._observed, self._observed_at = (self.config.identity, now_text), now
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if holder and holder != self.config.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
            if now < self._observed_at + duration and not self._holder_pod_gone(lease, holder):
                self._holder = holder
                return False  # Held, and renewed within its duration as far as we can tell.
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire_time = str(spec.get("acquireTime") or "")
        if holder != self.config.identity:
            transitions += 1
            acquire_time = _micro_time(self._clock.wall())
        updated = dict(lease)
        updated["metadata"] = self._metadata(lease.get("metadata") or {})
        updated["spec"] = {**spec, **self._spec(acquire_time=acquire_time, transitions=transitions)}
        if self.leading and self.fence.expired():
            return False  # Paused past the deadline since the read: give up rather than renew late.
        try:
            stored = self._client.update(kube_client.LEASES, updated)
        except kube_client.Conflict:
            return False  # Someone else wrote it since we read it; look again next time.
        stored_spec = stored.get("spec") or {}
        self._observed = (self.config.identity, str(stored_spec.get("renewTime") or ""))
        self._observed_at = now
        return True

    def _metadata(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """The Lease's metadata as this candidate writes it: its HOLDER_POD record, or none when it has no pod."""
        annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != HOLDER_POD}
        record = self._pod_record()
        if record is not None:
            annotations[HOLDER_POD] = json.dumps(record, sort_keys=True)
        return {**metadata, "annotations": annotations}

    def _pod_record(self) -> dict[str, str] | None:
        """This candidate's HOLDER_POD record, its pod read once for the UID; None when it runs in no pod there (none
        configured, or none of that name: a hostname the kubelet shortened) or the read failed (tried again at the
        next write)."""
        if not self.config.pod:
            return None
        if self._own_pod is None:
            try:
                pod = self._client.get(kube_client.PODS, self.config.pod, namespace=self.config.namespace)
            except kube_client.ApiError as error:
                log.warning(
                    "lease %s/%s: cannot read this replica's pod %s, so a successor would wait out a lease this "
                    "replica could not release: %s",
                    self.config.namespace,
                    self.config.name,
                    self.config.pod,
                    error,
                )
                if isinstance(error, kube_client.NotFound) or error.status == 403:
                    self._own_pod = {}
                return None
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            self._own_pod = {"identity": self.config.identity, "pod": self.config.pod, "uid": uid}
        return self._own_pod or None

    def _holder_pod_gone(self, lease: dict[str, Any], holder: str) -> bool:
        """Whether the Lease's HOLDER_POD record for `holder` names a pod that no longer exists, was replaced (another
        UID) or has ended. False when there is no record for this holder or the pod cannot be read. The pod is
        read once per record: a pod found running is left to the lease's expiry after that.

        A pod leaves the API only once its kubelet saw its containers end, so its holder writes no more;
        a pod force-deleted on a node that still runs it is the exception (as for every controller)."""
        text = str(((lease.get("metadata") or {}).get("annotations") or {}).get(HOLDER_POD) or "")
        if not text or text == self._alive:
            return False
        try:
            record = json.loads(text)
        except ValueError:
            return False
        if not (isinstance(record, dict) and record.get("identity") == holder and record.get("pod")):
            return False
        try:
            pod = self._client.get(kube_client.PODS, str(record["pod"]), namespace=self.config.namespace)
        except kube_client.NotFound:
            pod = None
        except kube_client.ApiError as error:
            log.warning(
                "lease %s/%s: cannot read the holder's pod %s, so the lease is waited out: %s",
                self.config.namespace,
                self.config.name,
                record["pod"],
                error,
            )
            self._alive = text
            return False
        if pod is not None and (
            str((pod.get("metadata") or {}).get("uid") or "") == str(record.get("uid") or "")
            and (pod.get("status") or {}).get("phase") not in _ENDED
        ):
            self._alive = text
            return False
        log.warning(
            "lease %s/%s: the holder %s's pod %s is gone; taking the lease over at once",
            self.config.namespace,
            self.config.name,
            holder,
            record["pod"],
        )
        return True

    def release(self) -> None:
        """Give the Lease up if this elector holds it (holder cleared), so a successor takes over at once."""
        if not self.leading:
            return
        self.leading = False
        self.fence.close()
        try:
            lease = self._client.get(kube_client.LEASES, self.config.name, namespace=self.config.namespace)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.config.identity:
                return
            updated = dict(lease)
            updated["spec"] = {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(self._clock.wall()),
            }
            self._client.update(kube_client.LEASES, updated)
        except kube_client.ApiError as error:
            log.warning("lease %s/%s: release failed: %s", self.config.namespace, self.config.name, error)

    def run(
        self,
        stop: threading.Event,
        *,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        on_step: Callable[[bool], None] | None = None,
    ) -> None:
        """Campaign until `stop` is set or leadership is lost; lead while renewals succeed within `renew_deadline`;
        release on stop.

        Leadership is lost, `on_stopped` called and the loop ended (as client-go's `Run` ends) when
        the renew deadline passes without a successful renewal (checked before each step too, so a
        process that was paused past it gives up without sending anything) or another holder is
        seen on the Lease. `on_step(leading)` is called after every protocol step (a heartbeat for
        liveness probes: a loop that stops calling it is wedged). Callbacks run on this loop's
        thread, so they must return quickly: a slow one delays the next renewal.
        """
        try:
            while not stop.is_set():
                was_leading = self.leading
                if not (was_leading and self.fence.expired()):
                    self.try_acquire_or_renew()
                if was_leading and self.leading and self.fence.expired():
                    self._give_up(f"not renewed within the renew deadline ({self.config.renew_deadline:g}s)")
                if was_leading and not self.leading:
                    on_stopped()
                    return
                if self.leading and not was_leading:
                    on_started()
                if on_step is not None:
                    on_step(self.leading)
                stop.wait(self.config.retry_period)
        finally:
            if self.leading:
                self.release()
                on_stopped()
