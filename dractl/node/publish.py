"""The node agent's ResourceSlice publisher: make the API hold exactly the desired slices, writing only the difference.

What it does: `Publisher.publish(desired)` takes the slices this node should publish (from
`slices`, pool = node name), lists the slices that exist for this node and driver (field
selector `spec.nodeName`, `spec.driver`), and compares their content (everything but name,
resourceVersion and the pool's generation and slice count). If every desired slice already
exists unchanged, nothing is written. Otherwise the pool's generation is bumped (one past the
highest existing one) in every slice, existing slices are updated in place (PUT with their
resourceVersion as precondition), missing ones are created, and extra ones deleted, in that
order, so a reader never sees the new generation incomplete for longer than the writes take.
Each slice gets an owner reference to the Node (its uid read on each publish), so the slices go
when the Node goes. A write conflict, or a slice gone before its update, leads to a fresh list and
a new attempt (bounded).

`Publisher.watch(on_change)` keeps an informer on this node's slices of the driver and one on
its Node, and calls `on_change` on every event, so a slice someone deleted or edited (the
kubelet deletes all of a node's slices when it starts) or a Node registered again is repaired
by the next publish within seconds, as the upstream resourceslice controller does.
`Publisher.dropped_fields(desired)` sends the slices as dry-run creates and reports each field
the server did not keep: an API server silently drops the fields of a feature gate that is off
(`sharedCounters`/`consumesCounters`: DRAPartitionableDevices, `allowMultipleAllocations`/
`requestPolicy`: DRAConsumableCapacity, `taints`: DRADeviceTaints), and slices without them
would mean something else (MIG placements that overlap). `server_version()` reads /version, from
which the agent picks the slice layout.

What it must not do: delete slices on shutdown (the kubelet removes them once the driver is
gone; a restarting agent finds and keeps them), touch slices of other nodes or drivers, decide
what the slices contain, or write when nothing changed.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dractl import model
from dractl.kube import client as kube_client
from dractl.kube import informer
from dractl.model import encode

log = logging.getLogger(__name__)

_ATTEMPTS = 3
_MAX_TAINTED_DEVICES = 64


class PublishError(Exception):
    """The slices could not be published; str() says which node and why."""


class NodeMissing(PublishError):
    """There is no Node object of the agent's node name: nothing can own the slices."""


class Feature(enum.Enum):
    """A ResourceSlice feature behind a Kubernetes feature gate (the value): alpha and off by default in 1.34
    and 1.35, beta and on by default from 1.36 (`ON_BY_DEFAULT_FROM`)."""

    PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
    CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
    DEVICE_TAINTS = "DRADeviceTaints"


ON_BY_DEFAULT_FROM = (1, 36)
# The slice fields an API server drops when the feature gate that guards them is off.
_GATED_FIELDS = {
    "sharedCounters": Feature.PARTITIONABLE_DEVICES,
    "consumesCounters": Feature.PARTITIONABLE_DEVICES,
    "allowMultipleAllocations": Feature.CONSUMABLE_CAPACITY,
    "requestPolicy": Feature.CONSUMABLE_CAPACITY,
    "taints": Feature.DEVICE_TAINTS,
}
# A taint put on one device of the dry-run probe, to learn whether the server keeps device taints.
PROBE_TAINT = model.DeviceTaint(key="dractl.dev/probe", value="", effect=model.TaintEffect.NO_SCHEDULE.value)


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """A field the API server did not keep: where (`spec.devices[3].consumesCounters`) and the gate it needs."""

    path: str
    feature: Feature | None


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """What one `publish` wrote, and the pool generation the slices carry now."""

    generation: int
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


def _content(body: Mapping[str, Any]) -> Any:
    """What decides whether a slice must be rewritten: its spec without the pool's bookkeeping, and its owners.

    Device taints are compared without `timeAdded`: the API server fills it in when a taint
    arrives without one, so the stored slice always has it and the desired one may not.
    """
    spec = dict(body.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    pool.pop("resourceSliceCount", None)
    spec["pool"] = pool
    if spec.get("devices"):
        spec["devices"] = [
            {**device, "taints": [{k: v for k, v in taint.items() if k != "timeAdded"} for taint in device["taints"]]}
            if device.get("taints")
            else device
            for device in spec["devices"]
        ]
    metadata = body.get("metadata") or {}
    return spec, metadata.get("ownerReferences") or [], metadata.get("labels") or {}


class Publisher:
    """Publishes one node's slices for one driver. Not thread-safe: one caller (the agent's publish loop)."""

    def __init__(self, client: kube_client.Client, *, driver: str, node_name: str) -> None:
        self._client = client
        self.driver = driver
        self.node_name = node_name

    @property
    def _field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver}"

    def server_version(self) -> kube_client.ServerVersion:
        """The version whose API the server serves (one GET /version). Raises `client.ApiError`."""
        return self._client.server_version()

    def watch(self, on_change: Callable[[], None]) -> Watch:
        """Start informers on this node's slices of the driver and on its Node; `on_change` is called (from their
        threads) after every event, including the first list. It should only wake the publishing thread."""
        return Watch(self._client, slice_selector=self._field_selector, node_name=self.node_name, on_change=on_change)

    def dropped_fields(self, desired: Sequence[model.ResourceSlice]) -> tuple[Dropped, ...]:
        """The fields of `desired` the API server would not keep, learnt from dry-run creates (nothing is stored).

        Probes the first slice with counter sets and the first with devices, the latter with
        `PROBE_TAINT` added to its first device, so one start-up check covers every gated field.
        Needs no Node object. Raises `client.ApiError` when the server refuses the slices.
        """
        probes: list[dict[str, Any]] = []
        with_counters = next((s for s in desired if s.shared_counters), None)
        with_devices = next((s for s in desired if s.devices), None)
        if with_counters is not None:
            probes.append(encode.resource_slice(with_counters))
        if with_devices is not None:
            first = with_devices.devices[0]
            tainted = dataclasses.replace(first, taints=(*first.taints, PROBE_TAINT))
            # A slice with a tainted device holds at most 64 devices: the probe keeps the first 64.
            devices = (tainted, *with_devices.devices[1:_MAX_TAINTED_DEVICES])
            probes.append(encode.resource_slice(dataclasses.replace(with_devices, devices=devices)))
        dropped: list[Dropped] = []
        for body in probes:
            body["metadata"] = {"generateName": f"{self.node_name}-{self.driver}-"}
            stored = self._client.create(kube_client.RESOURCE_SLICES, body, dry_run=True)
            dropped.extend(_missing(body["spec"], stored.get("spec") or {}, "spec"))
        return tuple(dict.fromkeys(dropped))

    def _owner(self) -> dict[str, Any]:
        """The owner reference to this node's Node, its uid read afresh (one GET, no write).

        Read on every publish because a Node deleted and registered again has a new uid: slices
        still owned by the old uid would be garbage-collected after every publish.
        """
        try:
            node = self._client.get(kube_client.NODES, self.node_name)
        except kube_client.NotFound:
            raise NodeMissing(
                f"cannot publish ResourceSlices for node {self.node_name}: "
                "the Node object does not exist (is --node-name right?)"
            ) from None
        uid = str((node.get("metadata") or {}).get("uid") or "")
        return {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid, "controller": True}

    def _existing(self) -> list[dict[str, Any]]:
        """This node's slices for the driver, in name order, each normalized through the model.

        Decoding and encoding again gives the same shape `encode` gives the desired slices, so
        equal content compares equal whatever defaults the server spells out. A slice that does
        not decode keeps its raw form, compares unequal and is rewritten.
        """
        result = self._client.list(kube_client.RESOURCE_SLICES, field_selector=self._field_selector)
        return sorted((normalized(raw) for raw in result.items), key=lambda raw: str(raw["metadata"].get("name")))

    def _bodies(self, desired: Sequence[model.ResourceSlice]) -> list[dict[str, Any]]:
        owner = self._owner()
        bodies = []
        for value in desired:
            if value.driver != self.driver or value.node_name != self.node_name:
                raise PublishError(
                    f"slice {value.meta.name or value.pool.name}: spec.driver {value.driver!r} and "
                    f"spec.nodeName {value.node_name!r} must be {self.driver!r} and "
                    f"{self.node_name!r} for this publisher"
                )
            body = encode.resource_slice(value)
            metadata = {
                key: item
                for key, item in body["metadata"].items()
                if key in ("name", "generateName", "labels", "annotations")
            }
            metadata["ownerReferences"] = [owner]
            body["metadata"] = metadata
            bodies.append(body)
        return bodies

    def publish(self, desired: Sequence[model.ResourceSlice]) -> Result:
        """Make this node's slices for the driver equal `desired`. Idempotent: unchanged input writes nothing.

        A slice deleted or changed by someone else between the list and the write (a 404 or 409 on it) makes it
        list again and redo the difference (bounded). Raises `PublishError` (`NodeMissing` when there is no Node),
        or `client.ApiError` when the API server keeps failing.
        """
        bodies = self._bodies(desired)
        for attempt in range(_ATTEMPTS):
            try:
                return self._publish(bodies)
            except (kube_client.Conflict, kube_client.AlreadyExists, kube_client.NotFound) as conflict:
                # Someone (or an earlier attempt of ours) wrote or deleted meanwhile: list again, redo the difference.
                log.info("node %s: slices changed while publishing (%s); listing again", self.node_name, conflict)
                if attempt == _ATTEMPTS - 1:
                    raise PublishError(
                        f"cannot publish ResourceSlices for node {self.node_name}: they kept "
                        f"changing underneath ({conflict})"
                    ) from conflict
        raise AssertionError("unreachable")

    def _publish(self, bodies: list[dict[str, Any]]) -> Result:
        existing = self._existing()
        generations = [int(((raw.get("spec") or {}).get("pool") or {}).get("generation") or 0) for raw in existing]
        current = max(generations, default=0)
        # Pair desired with existing slices: same name first, then equal content, then the rest in name order.
        by_name = {str(raw["metadata"]["name"]): raw for raw in existing}
        pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        unpaired: list[dict[str, Any]] = []
        for body in bodies:
            name = body["metadata"].get("name")
            if name and name in by_name:
                pairs.append((body, by_name.pop(name)))
            else:
                unpaired.append(body)
        leftover = list(by_name.values())
        still: list[dict[str, Any]] = []
        for body in unpaired:
            match = next((raw for raw in leftover if _content(raw) == _content(body)), None)
            if match is not None:
                leftover.remove(match)
                pairs.append((body, match))
            else:
                still.append(body)
        for body in still:
            pairs.append((body, leftover.pop(0) if leftover and not body["metadata"].get("name") else None))
        count = len(bodies)
        unchanged = not leftover and all(
            raw is not None
            and _content(raw) == _content(body)
            and int(raw["spec"]["pool"].get("resourceSliceCount") or 0) == count
            and len(set(generations)) == 1
            for body, raw in pairs
        )
        if unchanged:
            return Result(generation=current)
        generation = (
            current + 1
            if existing
            else max([int(body["spec"]["pool"].get("generation") or 0) for body in bodies], default=0)
        )
        created = updated = deleted = 0
        for body, raw in pairs:
            body["spec"]["pool"]["generation"] = generation
            body["spec"]["pool"]["resourceSliceCount"] = count
            if raw is None:
                if not body["metadata"].get("name"):
                    body["metadata"]["generateName"] = f"{self.node_name}-{self.driver}-"
                self._client.create(kube_client.RESOURCE_SLICES, body)
                created += 1
            else:
                metadata = dict(body["metadata"])
                metadata.pop("generateName", None)
                metadata["name"] = raw["metadata"]["name"]
                metadata["resourceVersion"] = raw["metadata"]["resourceVersion"]
                self._client.update(kube_client.RESOURCE_SLICES, {**body, "metadata": metadata})
                updated += 1
        for raw in leftover:
            try:
                self._client.delete(
                    kube_client.RESOURCE_SLICES,
                    raw["metadata"]["name"],
                    resource_version=raw["metadata"]["resourceVersion"],
                )
            except kube_client.NotFound:
                pass  # Already gone: what we wanted.
            deleted += 1
        log.info(
            "node %s: published %d slices at pool generation %d (%d created, %d updated, %d deleted)",
            self.node_name,
            count,
            generation,
            created,
            updated,
            deleted,
        )
        return Result(generation=generation, created=created, updated=updated, deleted=deleted)


def normalized(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored slice in the shape `encode` gives the desired ones, its metadata as stored.

    Decoded and encoded again through the model, so equal content compares equal whatever
    defaults the server spells out. The model takes counter sets and devices only in separate
    slices (Kubernetes 1.35 and later); a Kubernetes 1.34 slice holding both is normalized in
    two halves. A slice that does not decode keeps its raw form, compares unequal and is rewritten.
    """
    spec = raw.get("spec") or {}
    halves = [raw]
    if spec.get("devices") and spec.get("sharedCounters"):
        halves = [
            {**raw, "spec": {key: value for key, value in spec.items() if key != drop}}
            for drop in ("sharedCounters", "devices")
        ]
    encoded: list[dict[str, Any]] = []
    for half in halves:
        value = kube_client.decode(half)
        if not isinstance(value, model.ResourceSlice):
            return {**raw, "metadata": raw.get("metadata") or {}}
        encoded.append(encode.resource_slice(value))
    normalized = encoded[0]
    for other in encoded[1:]:
        normalized["spec"].update(other["spec"])
    normalized["metadata"] = raw.get("metadata") or {}
    return normalized


def _missing(sent: Any, stored: Any, path: str) -> list[Dropped]:
    """The fields present in `sent` and absent from `stored`, walking maps and same-length lists. Pure."""
    if isinstance(sent, Mapping) and isinstance(stored, Mapping):
        found: list[Dropped] = []
        for key, value in sent.items():
            where = f"{path}.{key}"
            if key not in stored:
                found.append(Dropped(path=where, feature=_GATED_FIELDS.get(key)))
            else:
                found.extend(_missing(value, stored[key], where))
        return found
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [d for i, (a, b) in enumerate(zip(sent, stored, strict=True)) for d in _missing(a, b, f"{path}[{i}]")]
    return []


class Watch:
    """The informers behind `Publisher.watch`: this node's slices of the driver and its Node. `stop()` ends both."""

    def __init__(
        self, client: kube_client.Client, *, slice_selector: str, node_name: str, on_change: Callable[[], None]
    ) -> None:
        def changed(*_: object) -> None:
            on_change()

        handlers: informer.Handlers[dict[str, Any]] = informer.Handlers(
            on_add=changed, on_update=changed, on_delete=changed
        )
        # Raw objects, not model values: a slice the model refuses must still wake the publisher, which rewrites it.
        self.slices: informer.Informer[dict[str, Any]] = informer.Informer(
            client, kube_client.RESOURCE_SLICES, decode=dict, handlers=handlers, field_selector=slice_selector
        )
        self.node: informer.Informer[dict[str, Any]] = informer.Informer(
            client, kube_client.NODES, decode=dict, handlers=handlers, field_selector=f"metadata.name={node_name}"
        )
        self.slices.start()
        self.node.start()

    def stop(self) -> None:
        """End both informers. Idempotent."""
        self.slices.stop()
        self.node.stop()
