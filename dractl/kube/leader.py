"""Lease-based leader election (coordination.k8s.io/v1), the protocol of client-go's leaderelection.

What it does: `Elector.try_acquire_or_renew()` is one step of the protocol: create the Lease
if it does not exist; renew it if this identity holds it; take it over if it is free or its
holder has not renewed for `lease_duration` seconds *as observed by this elector's clock*
(clocks of different machines are never compared, as in client-go); otherwise report not
leading. Every write is an update with the Lease's resourceVersion as precondition, so two
electors never both win. `run()` loops over that step until stopped, calls `on_started` on
becoming leader and `on_stopped` on losing the lease (renewal failing for `renew_deadline`) or
stopping, and releases the Lease on a clean stop so a successor need not wait.

What it must not do: decide anything but who leads, or trust the holder's timestamps for
expiry. Time comes from an injectable `Clock`.
"""

from __future__ import annotations

import dataclasses
import datetime
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


def _micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """client-go's defaults: 15 s lease, renew within 10 s, retry every 2 s."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Elector:
    """One candidate. `try_acquire_or_renew` is safe to call from one thread at a time."""

    def __init__(self, client: kube_client.Client, config: Config, *, clock: Clock | None = None) -> None:
        self._client = client
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen on the Lease
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self.leading = False

    def _spec(self, *, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": acquire_time,
            "renewTime": _micro_time(self._clock.wall()),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One protocol step; returns whether this elector holds the Lease afterwards. API failures count as not."""
        try:
            leading = self._step()
        except kube_client.ApiError as error:
            log.info("lease %s/%s: %s", self.config.namespace, self.config.name, error)
            leading = False
        self.leading = leading
        if leading:
            self._last_renewal = self._clock.monotonic()
        return leading

    def _step(self) -> bool:
        now = self._clock.monotonic()
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
                        "metadata": {"name": self.config.name, "namespace": self.config.namespace},
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
            if now < self._observed_at + duration:
                return False  # Held, and renewed within its duration as far as we can tell.
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire_time = str(spec.get("acquireTime") or "")
        if holder != self.config.identity:
            transitions += 1
            acquire_time = _micro_time(self._clock.wall())
        updated = dict(lease)
        updated["spec"] = {**spec, **self._spec(acquire_time=acquire_time, transitions=transitions)}
        try:
            stored = self._client.update(kube_client.LEASES, updated)
        except kube_client.Conflict:
            return False  # Someone else wrote it since we read it; look again next time.
        stored_spec = stored.get("spec") or {}
        self._observed = (self.config.identity, str(stored_spec.get("renewTime") or ""))
        self._observed_at = now
        return True

    def release(self) -> None:
        """Give the Lease up if this elector holds it (holder cleared), so a successor takes over at once."""
        if not self.leading:
            return
        self.leading = False
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
        """Campaign until `stop` is set; lead while renewals succeed within `renew_deadline`; release on stop.

        `on_step(leading)` is called after every protocol step (a heartbeat for liveness probes:
        a loop that stops calling it is wedged). Callbacks run on this loop's thread, so they must
        return quickly: a slow one delays the next renewal.
        """
        try:
            while not stop.is_set():
                was_leading = self.leading
                leading = self.try_acquire_or_renew()
                if leading and not was_leading:
                    on_started()
                elif was_leading and not leading:
                    if self._clock.monotonic() - self._last_renewal < self.config.renew_deadline:
                        self.leading = True  # A failed renewal inside the deadline: keep leading, retry.
                    else:
                        on_stopped()
                if on_step is not None:
                    on_step(self.leading)
                stop.wait(self.config.retry_period)
        finally:
            if self.leading:
                self.release()
                on_stopped()
