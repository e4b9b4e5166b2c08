"""Kubernetes Events (core/v1) about objects dractl acts on, de-duplicated like client-go's recorder.

What it does: `Recorder.event(ref, type=..., reason=..., message=...)` creates an Event with
the involved object, reason, message, type (`Normal` or `Warning`), first/last timestamps,
`count` 1 and the reporting component `dractl`. The same (object, type, reason, message) again
patches that Event's `count` and `lastTimestamp` instead of creating another one (the simple
form of client-go's EventCorrelator, without its spam filter). If that Event expired meanwhile,
a new one is created.

What it must not do: raise (Events are best effort: failures are logged), block a caller for
long (one request per event), or record anything but what it is told.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import threading
import uuid
from collections.abc import Callable

from dractl import model
from dractl.kube import client as kube_client

log = logging.getLogger(__name__)

COMPONENT = "dractl"
NORMAL = "Normal"
WARNING = "Warning"
_CACHE_SIZE = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about. `namespace` is "" for cluster-scoped objects."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def of(cls, meta: model.ObjectMeta, *, api_version: str, kind: str) -> ObjectRef:
        """The reference to a decoded object: `ObjectRef.of(claim.meta, api_version=..., kind="ResourceClaim")`."""
        return cls(api_version=api_version, kind=kind, name=meta.name, namespace=meta.namespace, uid=meta.uid)

    def as_dict(self) -> dict[str, str]:
        fields = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
        }
        return {key: value for key, value in fields.items() if value}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    """Sends Events for one component (and host). Thread-safe; remembers the last 4096 distinct events."""

    def __init__(
        self,
        client: kube_client.Client,
        *,
        component: str = COMPONENT,
        host: str = "",
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._clock = clock
        self._lock = threading.Lock()
        # (ref, type, reason, message) -> (event namespace, event name, count), oldest first.
        self._seen: collections.OrderedDict[tuple[ObjectRef, str, str, str], tuple[str, str, int]] = (
            collections.OrderedDict()
        )

    def event(self, ref: ObjectRef, *, type: str, reason: str, message: str) -> None:
        """Record one occurrence. API failures are logged, never raised; a `type` other than Normal or
        Warning is a programming error (ValueError)."""
        if type not in (NORMAL, WARNING):
            raise ValueError(f"event type must be {NORMAL} or {WARNING}, not {type!r}")
        identity = (ref, type, reason, message)
        with self._lock:
            seen = self._seen.get(identity)
        now = _timestamp(self._clock())
        try:
            if seen is not None:
                namespace, name, count = seen
                try:
                    self._client.patch(
                        kube_client.EVENTS, name, namespace=namespace, patch={"count": count + 1, "lastTimestamp": now}
                    )
                    self._remember(identity, (namespace, name, count + 1))
                    return
                except kube_client.NotFound:
                    pass  # The Event expired (the API server's TTL): start a new one.
            namespace = ref.namespace or "default"
            name = f"{ref.name}.{uuid.uuid4().hex[:16]}"
            self._client.create(
                kube_client.EVENTS,
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": ref.as_dict(),
                    "reason": reason,
                    "message": message,
                    "type": type,
                    "count": 1,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "source": {
                        key: value for key, value in (("component", self._component), ("host", self._host)) if value
                    },
                    "reportingComponent": self._component,
                    "reportingInstance": self._host or self._component,
                },
                namespace=namespace,
            )
            self._remember(identity, (namespace, name, 1))
        except kube_client.ApiError as error:
            log.warning("could not record event %s %s on %s %s: %s", type, reason, ref.kind, ref.name, error)

    def _remember(self, identity: tuple[ObjectRef, str, str, str], entry: tuple[str, str, int]) -> None:
        with self._lock:
            self._seen[identity] = entry
            self._seen.move_to_end(identity)
            while len(self._seen) > _CACHE_SIZE:
                self._seen.popitem(last=False)
