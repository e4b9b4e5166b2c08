"""Churn traces for `dractl simulate --trace`: the file format, its loader and a deterministic generator.

What it does: reads and validates a trace file into ordered events whose objects are model
values (`load`, `parse`), writes one (`write`), and generates traces for a named claim mix
(`generate`, `parse_spec` for `--generate mix=reference,seed=1,claims=200`; `write_generated`
writes one as it is generated, in memory that does not grow with the claims; at most
`MAX_GENERATED_CLAIMS` claims on `MAX_GENERATED_NODES` nodes, and optionally up to
`MAX_GENERATED_GANGS` gangs: `gangs=N`). What it must not
do: allocate or replay (the replay consumes `Trace.events`), evaluate CEL, or talk to a
cluster. Pure apart from `load`, `write` and `write_generated`, which read and write the one file
or stream they are given.

The format: one YAML or JSON object (JSON where the text is JSON, else YAML, flow style
included, read as `simulate -f` reads manifests: `decode.documents`), at most 64 MiB.

    apiVersion: dractl.io/v1alpha1
    kind: Trace
    metadata: {name: reference-seed-1}
    spec:
      generator: mix=reference,seed=1,claims=200   # optional: how it was made, informational
      cluster:                                    # optional: what exists from time 0
        examples:                                 # example nodes of dractl/examples, renamed
        - {file: 20-dgx-a100-01.yaml, node: a100-01}
        objects:                                  # any manifests `dractl simulate -f` reads
        - {apiVersion: resource.k8s.io/v1, kind: DeviceClass, ...}
      events:
      - at: 0                                     # seconds from the start, a number >= 0
        arrive: {apiVersion: resource.k8s.io/v1, kind: ResourceClaim, metadata: {...}, spec: {...}}
      - at: 1.5
        arrive:
          apiVersion: v1
          kind: Pod                               # its claims: named ones or from a template
          metadata: {name: p, annotations: {dractl.io/departs-after: "120"}}
          spec: {resourceClaims: [{name: gpu, resourceClaimTemplateName: training-gpu}], ...}
      - at: 60
        depart: {kind: ResourceClaim, name: c-00001, namespace: default}

An event has `at` and exactly one of `arrive` (a ResourceClaim, Pod or PodGroup manifest, of
either PodGroup API, decoded by `dractl.model.decode` exactly as `simulate -f` decodes it) and
`depart` (`kind`, `name`, and `namespace`, default `default`). PodGroups of the two APIs share
one set of names in a trace. An arriving object annotated `dractl.io/departs-after:
"<seconds>"` departs that long after it arrives, as if a `depart` event said so. An example
node (`cluster.examples`) is one of the files `20-*.yaml`, `21-*.yaml`, `22-*.yaml` of the
built-in examples with the node's name replaced everywhere (node, pool, slice names) and its
GPU uuids replaced by uuids derived from the new name, plus its Node object from
`10-nodes.yaml`, renamed alike, with the example's optional `labels` added (a rack, say);
the DeviceClasses of `00-deviceclasses.yaml` come with them.

Order: events are sorted by time; at equal times departures come before arrivals (what
leaves frees room for what comes), and otherwise file order holds. Validation collects every
problem and raises `TraceError`; each message names the file, the event index as written and
the field (`trace.yaml: events[3].at: must be a number of seconds >= 0, got "soon"`). An
object may not arrive while an object of the same kind and name is present, and may only
depart once, after it arrived.

Claims the generator writes carry the annotation `dractl.io/shapes` (`shapes_of` reads it):
their request shapes (`metrics.RequestShape` spellings), so the replay can judge stranded
memory against the pending claims without reading CEL.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import pathlib
import random
import re
import textwrap
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import yaml

from dractl import model
from dractl.model import decode
from dractl.simulate import metrics

API_VERSION = "dractl.io/v1alpha1"
KIND = "Trace"
DEPARTS_AFTER = "dractl.io/departs-after"
SHAPES = "dractl.io/shapes"
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
# The example node files a trace may reuse, by the kind of node each one is.
EXAMPLE_NODES = {"a100": "20-dgx-a100-01.yaml", "h100": "21-dgx-h100-01.yaml", "t4": "22-t4-node-01.yaml"}
_NODE_FILE = "10-nodes.yaml"
_CLASS_FILE = "00-deviceclasses.yaml"
_ARRIVING_KINDS = ("ResourceClaim", "Pod", "PodGroup")
_EVENT_KEYS = frozenset({"at", "arrive", "depart"})
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_NAMESPACE = uuid.UUID("6b1d3f52-59b3-4a4c-9a7e-2f4a1c0d8e11")
# What `generate` makes at most. 50,000 claims are about 33 MB of YAML and 48 MB of JSON, within the 64 MiB
# `--trace` reads (`decode.read_text`) whatever the mix; Kubernetes supports clusters of up to 5,000 nodes.
MAX_GENERATED_CLAIMS = 50_000
MAX_GENERATED_NODES = 5_000
# A gang is a PodGroup and up to 4 pods, about 2.5 KB of YAML: 2,000 gangs keep the largest trace within 64 MiB.
MAX_GENERATED_GANGS = 2_000
RACK_LABEL = "dractl.io/rack"
"""The node label of the racks a generated trace with gangs puts its example nodes in (`_RACK_NODES` a rack)."""
_MAX_LABELS = 64  # extra labels of one example node; a Node rarely has more than a few dozen
# A trace longer than a century of seconds is a typo, and so is a time Python cannot order.
_MAX_SECONDS = 100 * 365 * 24 * 3600


class TraceError(ValueError):
    """A trace file that cannot be replayed; `problems` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclasses.dataclass(frozen=True, slots=True)
class Arrival:
    """`object` arrives at `at` seconds; `index` is its event's index in the file."""

    at: float
    object: model.ResourceClaim | model.Pod | model.PodGroup
    index: int

    @property
    def kind(self) -> str:
        if isinstance(self.object, model.ResourceClaim):
            return "ResourceClaim"
        return "Pod" if isinstance(self.object, model.Pod) else "PodGroup"

    @property
    def key(self) -> str:
        return f"{self.object.meta.namespace}/{self.object.meta.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Departure:
    """The object `kind` `namespace/name` leaves at `at`; `implied` when a `departs-after`
    annotation of the arrival at event `index` said so, else `index` is the depart event's."""

    at: float
    kind: str
    namespace: str
    name: str
    index: int
    implied: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


Event = Arrival | Departure


@dataclasses.dataclass(frozen=True, slots=True)
class ExampleNode:
    """One built-in example node file, reused under the name `node`, its Node with `labels` added (a rack, say)."""

    file: str
    node: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Trace:
    """A validated trace: the cluster at time 0 (decoded), the events in replay order, and
    the document it came from (JSON-able; `write` writes it back as it is)."""

    name: str
    cluster: model.Objects
    events: tuple[Event, ...]
    document: Mapping[str, Any]
    file: str = "<trace>"


# --- loading -------------------------------------------------------------------------------------


def load(path: str | pathlib.Path) -> Trace:
    """Read and validate one trace file, or standard input for `-` (named `<stdin>`), as `simulate -f`
    reads its inputs (`decode.read_text`: at most 64 MiB); raises `TraceError` naming the input. Reads
    the file (or standard input) only."""
    try:
        text = decode.read_text(
            path, binary="a trace is YAML or JSON", too_large="a trace is read whole: replay a shorter one"
        )
    except decode.ReadError as error:
        raise TraceError([str(error)]) from None
    return parse_text(text, file=decode.input_name(path))


def parse_text(text: str, *, file: str = "<trace>") -> Trace:
    """Parse and validate a trace's text: JSON where it is JSON, else YAML (flow style included), as
    `simulate -f` parses manifests (`decode.documents`). Pure."""
    try:
        documents = [d for d in decode.documents(text, file=file) if d is not None]
    except decode.DecodeError as error:
        raise TraceError(error.problems) from None
    if len(documents) != 1:
        raise TraceError([f"{file}: a trace is one YAML document (kind: {KIND}), found {len(documents)}"])
    return parse(documents[0], file=file)


def parse(document: object, *, file: str = "<trace>") -> Trace:
    """Validate one parsed trace document (dicts and lists as JSON or YAML give them). Pure.

    Raises `TraceError` with every problem found; see the module docstring for the rules.
    """
    problems: list[str] = []
    if not isinstance(document, dict):
        raise TraceError([f"{file}: must be a mapping with apiVersion: {API_VERSION} and kind: {KIND}"])
    if document.get("apiVersion") != API_VERSION:
        problems.append(f"{file}: apiVersion: must be {API_VERSION}, got {_shown(document.get('apiVersion'))}")
    if document.get("kind") != KIND:
        problems.append(f"{file}: kind: must be {KIND}, got {_shown(document.get('kind'))}")
    meta = document.get("metadata")
    given = meta.get("name") if isinstance(meta, dict) else None
    name = given if isinstance(given, str) else ""
    spec = document.get("spec")
    if not isinstance(spec, dict):
        problems.append(f"{file}: spec: required, a mapping with events (and optionally cluster)")
        raise TraceError(problems)
    for key in spec:
        if key not in ("generator", "cluster", "events"):
            problems.append(f"{file}: spec.{key}: unknown field (expected generator, cluster, events)")
    cluster = _cluster(spec.get("cluster"), file=file, problems=problems)
    events = _events(spec.get("events"), file=file, problems=problems, cluster=cluster)
    if problems:
        raise TraceError(problems)
    return Trace(name=name, cluster=cluster, events=events, document=document, file=file)


def _shown(value: object) -> str:
    return "nothing" if value is None else json.dumps(value, default=str)[:60]


def _cluster(raw: object, *, file: str, problems: list[str]) -> model.Objects:
    if raw is None:
        return model.Objects()
    if not isinstance(raw, dict):
        problems.append(f"{file}: spec.cluster: must be a mapping with examples and/or objects")
        return model.Objects()
    for key in raw:
        if key not in ("examples", "objects"):
            problems.append(f"{file}: spec.cluster.{key}: unknown field (expected examples, objects)")
    nodes: list[ExampleNode] = []
    examples = raw.get("examples", [])
    if not isinstance(examples, list):
        problems.append(f"{file}: spec.cluster.examples: must be a list of {{file, node}}")
        examples = []
    seen: set[str] = set()
    for i, item in enumerate(examples):
        where = f"{file}: spec.cluster.examples[{i}]"
        if not isinstance(item, dict) or not {"file", "node"} <= set(item) <= {"file", "node", "labels"}:
            problems.append(f"{where}: must be a mapping with file and node (and optionally labels)")
            continue
        example, node = item["file"], item["node"]
        labels = _labels(item.get("labels", {}), where=f"{where}.labels", problems=problems)
        if labels is None:
            continue
        if example not in EXAMPLE_NODES.values():
            choices = ", ".join(sorted(EXAMPLE_NODES.values()))
            problems.append(f"{where}.file: must be one of the example nodes ({choices}), got {_shown(example)}")
        elif not isinstance(node, str) or not _DNS_LABEL.match(node):
            problems.append(f"{where}.node: must be a DNS label (lower case letters, digits, '-'), got {_shown(node)}")
        elif node in seen:
            problems.append(f"{where}.node: {node} is already used by an earlier example")
        else:
            seen.add(node)
            nodes.append(ExampleNode(file=example, node=node, labels=labels))
    objects = raw.get("objects", [])
    if not isinstance(objects, list):
        problems.append(f"{file}: spec.cluster.objects: must be a list of manifests")
        objects = []
    try:
        given = decode.load_documents(objects, file=f"{file}: spec.cluster.objects")
    except decode.DecodeError as error:
        problems.extend(error.problems)
        given = model.Objects()
    return _merge(example_cluster(nodes), given)


def _labels(raw: object, *, where: str, problems: list[str]) -> tuple[tuple[str, str], ...] | None:
    """An example node's extra labels (label key -> value, as a Node's metadata.labels holds them), or None when
    they are not."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping of label keys to values")
        return None
    bad = next((k for k, v in raw.items() if not isinstance(k, str) or not isinstance(v, str) or not k), None)
    if bad is not None or len(raw) > _MAX_LABELS:
        problems.append(f"{where}: must map at most {_MAX_LABELS} label keys to string values, got {_shown(raw)}")
        return None
    return tuple(sorted(raw.items()))


def _merge(*parts: model.Objects) -> model.Objects:
    return model.Objects(
        **{
            field.name: tuple(value for part in parts for value in getattr(part, field.name))
            for field in dataclasses.fields(model.Objects)
        }
    )


def example_cluster(nodes: Sequence[ExampleNode]) -> model.Objects:
    """The example nodes renamed, after the example DeviceClasses; empty for no nodes. Pure.

    Each example file is decoded once (cached); a renamed node shares every value that does not
    name the node, so a cluster of 1,000 example nodes costs about a millisecond per node.
    """
    if not nodes:
        return model.Objects()
    return _merge(model.Objects(device_classes=_decoded(_CLASS_FILE).device_classes), *map(_renamed, nodes))


_DEVICE_FIELDS = tuple(field.name for field in dataclasses.fields(model.Device))


@functools.cache
def _decoded(name: str) -> model.Objects:
    return decode.load_paths([EXAMPLES / name])


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """How to rename one example file: its node name, and per slice and device the attribute
    keys that hold a GPU uuid (`uuid`, `parentUUID`)."""

    node: str
    slices: tuple[model.ResourceSlice, ...]
    uuid_keys: tuple[tuple[tuple[str, ...], ...], ...]
    template: model.Node


@functools.cache
def _plan(file: str) -> _Plan:
    slices = _decoded(file).resource_slices
    old = next(s.node_name for s in slices if s.node_name)

    def holds_uuid(value: model.DeviceAttribute) -> bool:
        return (
            value.kind is model.AttributeKind.STRING
            and not value.is_list
            and bool(_GPU_UUID.fullmatch(str(value.scalar)))
        )

    keys = tuple(tuple(tuple(k for k, v in d.attributes.items() if holds_uuid(v)) for d in s.devices) for s in slices)
    template = next(n for n in _decoded(_NODE_FILE).nodes if n.meta.name == old)
    return _Plan(node=old, slices=slices, uuid_keys=keys, template=template)


def _renamed(node: ExampleNode) -> model.Objects:
    """One example node under its new name: node, pool and slice names, and GPU uuids derived from it."""
    plan = _plan(node.file)
    source = model.Source(file=f"{node.file} as {node.node}")
    uuids: dict[str, model.DeviceAttribute] = {}

    def name(text: str) -> str:
        return text.replace(plan.node, node.node)

    def attribute(value: model.DeviceAttribute) -> model.DeviceAttribute:
        old = str(value.scalar)
        found = uuids.get(old)
        if found is None:
            found = uuids[old] = dataclasses.replace(value, values=(_uuid(old, node=node.node),))
        return found

    def device(d: model.Device, keys: tuple[str, ...]) -> model.Device:
        if not keys:
            return d
        attributes = dict(d.attributes)
        for key in keys:
            attributes[key] = attribute(attributes[key])
        # dataclasses.replace costs four times this on the 150,000 devices of 1,000 nodes.
        fields = {name: getattr(d, name) for name in _DEVICE_FIELDS}
        fields["attributes"] = attributes
        return model.Device(**fields)

    renamed = tuple(
        dataclasses.replace(
            s,
            meta=dataclasses.replace(s.meta, name=name(s.meta.name)),
            pool=dataclasses.replace(s.pool, name=name(s.pool.name)),
            node_name=name(s.node_name) if s.node_name else s.node_name,
            devices=tuple(device(d, k) for d, k in zip(s.devices, keys, strict=True)),
            source=dataclasses.replace(source, document=s.source.document),
        )
        for s, keys in zip(plan.slices, plan.uuid_keys, strict=True)
    )
    labels = {**{k: name(v) for k, v in plan.template.meta.labels.items()}, **dict(node.labels)}
    meta = dataclasses.replace(plan.template.meta, name=node.node, labels=labels)
    return model.Objects(resource_slices=renamed, nodes=(model.Node(meta=meta, source=source),))


def _uuid(old: str, *, node: str) -> str:
    """A GPU uuid for node `node` derived from the example's: unique per node, the same every time."""
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{old}"))


def _events(raw: object, *, file: str, problems: list[str], cluster: model.Objects) -> tuple[Event, ...]:
    if not isinstance(raw, list):
        problems.append(f"{file}: spec.events: required, a list of events (at, and arrive or depart)")
        return ()
    templates = {(t.meta.namespace, t.meta.name) for t in cluster.resource_claim_templates}
    for group in cluster.pod_groups:
        problems.extend(_missing_templates(group, where=f"{file}: spec.cluster.objects", templates=templates))
    events: list[Event] = []
    for i, item in enumerate(raw):
        where = f"{file}: events[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be a mapping with at, and arrive or depart")
            continue
        unknown = sorted(str(k) for k in item if k not in _EVENT_KEYS)
        if unknown:
            problems.append(f"{where}.{unknown[0]}: unknown field (an event has at, and arrive or depart)")
        at = _time(item.get("at"), where=f"{where}.at", problems=problems)
        if ("arrive" in item) == ("depart" in item):
            problems.append(f"{where}: needs exactly one of arrive (a ResourceClaim, Pod or PodGroup) and depart")
            continue
        if at is None:
            continue
        if "arrive" in item:
            arriving = _arrival(item["arrive"], at=at, index=i, where=where, problems=problems, templates=templates)
            events.extend(arriving)
        else:
            departure = _departure(item["depart"], at=at, index=i, where=f"{where}.depart", problems=problems)
            if departure is not None:
                events.append(departure)
    # Departures first at equal times, then file order; an implied departure follows its arrival.
    keys = [(e.at, type(e) is Arrival, e.index, type(e) is Departure, n) for n, e in enumerate(events)]
    keys.sort()
    ordered = tuple(events[k[-1]] for k in keys)
    _check_presence(ordered, file=file, problems=problems)
    return ordered


def _time(raw: object, *, where: str, problems: list[str]) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        problems.append(f"{where}: must be a number of seconds >= 0, got {_shown(raw)}")
        return None
    if raw > _MAX_SECONDS:
        problems.append(f"{where}: {raw} seconds is more than a century: write seconds from the trace's start")
        return None
    return float(raw)


def _arrival(
    raw: object, *, at: float, index: int, where: str, problems: list[str], templates: set[tuple[str, str]]
) -> list[Event]:
    path = f"{where}.arrive"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a ResourceClaim, Pod or PodGroup manifest")
        return []
    kind = raw.get("kind")
    if kind not in _ARRIVING_KINDS:
        got = "no kind" if kind is None else f"kind {_shown(kind)}"
        problems.append(f"{path}.kind: only a ResourceClaim, a Pod or a PodGroup arrives, got {got}")
        return []
    value: model.ResourceClaim | model.Pod | model.PodGroup
    try:
        if kind == "PodGroup":
            # `load_object` decodes the kinds a watch delivers; a PodGroup of either API decodes as a manifest does.
            groups = decode.load_documents([raw], file=path).pod_groups
            if not groups:
                problems.append(
                    f"{path}.apiVersion: a PodGroup is scheduling.k8s.io/v1alpha2 or scheduling.x-k8s.io/v1alpha1, "
                    f"got {_shown(raw.get('apiVersion'))}"
                )
                return []
            value = groups[0]
        else:
            decoded = decode.load_object(raw, source=path)
            assert isinstance(decoded, model.ResourceClaim | model.Pod)  # guaranteed by the kind checked above
            value = decoded
    except decode.DecodeError as error:
        problems.extend(error.problems)
        return []
    arrival = Arrival(at=at, object=value, index=index)
    if not isinstance(value, model.ResourceClaim):
        problems.extend(_missing_templates(value, where=path, templates=templates))
    out: list[Event] = [arrival]
    after = value.meta.annotations.get(DEPARTS_AFTER)
    if after is not None:
        seconds = _seconds(after)
        if seconds is None or seconds == 0:
            problems.append(
                f"{path}.metadata.annotations[{DEPARTS_AFTER}]: must be a number of seconds > 0, got {_shown(after)}"
            )
        else:
            out.append(
                Departure(
                    at=at + seconds,
                    kind=arrival.kind,
                    namespace=value.meta.namespace,
                    name=value.meta.name,
                    index=index,
                    implied=True,
                )
            )
    return out


def _missing_templates(value: model.Pod | model.PodGroup, *, where: str, templates: set[tuple[str, str]]) -> list[str]:
    """One problem per `spec.resourceClaims` entry of a pod or PodGroup naming a template the cluster lacks."""
    kind = "Pod" if isinstance(value, model.Pod) else "PodGroup"
    namespace = value.meta.namespace
    return [
        f"{where}: {kind} {namespace}/{value.meta.name}: spec.resourceClaims[{i}].resourceClaimTemplateName: no "
        f"ResourceClaimTemplate {namespace}/{name} in spec.cluster"
        for i, entry in enumerate(value.resource_claims)
        if (name := entry.resource_claim_template_name) is not None and (namespace, name) not in templates
    ]


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= _MAX_SECONDS else None


def _departure(raw: object, *, at: float, index: int, where: str, problems: list[str]) -> Departure | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping with kind, name and namespace")
        return None
    unknown = sorted(str(k) for k in raw if k not in ("kind", "name", "namespace"))
    if unknown:
        problems.append(f"{where}.{unknown[0]}: unknown field (expected kind, name, namespace)")
    kind, name, namespace = raw.get("kind"), raw.get("name"), raw.get("namespace", "default")
    if kind not in _ARRIVING_KINDS:
        problems.append(f"{where}.kind: must be ResourceClaim, Pod or PodGroup, got {_shown(kind)}")
        return None
    if not isinstance(name, str) or not name:
        problems.append(f"{where}.name: required, the name of an object that arrived earlier")
        return None
    if not isinstance(namespace, str) or not namespace:
        problems.append(f"{where}.namespace: must be a namespace name, got {_shown(namespace)}")
        return None
    return Departure(at=at, kind=kind, namespace=namespace, name=name, index=index)


def _check_presence(events: Sequence[Event], *, file: str, problems: list[str]) -> None:
    """Arrivals of present objects and departures of absent ones, in replay order."""
    present: set[tuple[str, str]] = set()
    for event in events:
        if isinstance(event, Arrival):
            if (event.kind, event.key) in present:
                problems.append(
                    f"{file}: events[{event.index}].arrive: {event.kind} {event.key} arrives at {event.at:g}s "
                    "while it is still present (it has not departed)"
                )
            present.add((event.kind, event.key))
        elif (event.kind, event.key) in present:
            present.discard((event.kind, event.key))
        else:
            field = f"arrive.metadata.annotations[{DEPARTS_AFTER}]" if event.implied else "depart"
            problems.append(
                f"{file}: events[{event.index}].{field}: {event.kind} {event.key} departs at {event.at:g}s "
                "but is not present then (it never arrived, has departed already, or arrives later)"
            )


def shapes_of(claim: model.ResourceClaim) -> tuple[metrics.RequestShape, ...]:
    """The request shapes a claim declares in its `dractl.io/shapes` annotation (comma-separated
    `metrics.RequestShape` spellings); empty when it has none or one does not parse. Pure."""
    text = claim.meta.annotations.get(SHAPES, "")
    try:
        return tuple(metrics.parse_shape(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()


# --- writing -------------------------------------------------------------------------------------


def dumps(trace: Trace, *, as_json: bool = False) -> str:
    """The trace's document as YAML (or JSON). Pure; `parse_text` of the result gives an equal trace."""
    if as_json:
        return json.dumps(trace.document, indent=1, sort_keys=False) + "\n"
    return _yaml(trace.document)


class _Dumper(yaml.CSafeDumper):
    """Safe YAML without anchors: events share nothing, and aliases would only confuse readers."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def write(trace: Trace, path: str | pathlib.Path) -> None:
    """Write the trace to `path`: JSON when it ends in `.json`, else YAML. Writes that file only."""
    target = pathlib.Path(path)
    target.write_text(dumps(trace, as_json=target.suffix == ".json"), encoding="utf-8")


# --- generating ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
    """What `generate` makes: a mix, a seed, how many claims, how many nodes of each example
    kind (`a100`, `h100`, `t4`), claims per round, the share of present claims that depart
    at the start of each later round, and how many gangs (PodGroups and their pods) arrive among them."""

    mix: str
    seed: int = 1
    claims: int = 200
    nodes: Mapping[str, int] = dataclasses.field(default_factory=lambda: {"a100": 8, "h100": 8, "t4": 4})
    round: int = 10
    departures: float = 0.3
    gangs: int = 0

    def __str__(self) -> str:
        parts = [f"mix={self.mix}", f"seed={self.seed}", f"claims={self.claims}"]
        parts += [f"{kind}={count}" for kind, count in self.nodes.items()]
        # Written only when there are gangs: a spec without them reads as it did before gangs existed.
        gangs = [f"gangs={self.gangs}"] if self.gangs else []
        return ",".join([*parts, f"round={self.round}", f"departures={self.departures:g}", *gangs])


def parse_spec(text: str) -> Spec:
    """`mix=reference,seed=1,claims=200[,a100=8,h100=8,t4=4][,round=10][,departures=0.3][,gangs=0]` -> Spec.

    Raises ValueError with one message naming the spec and the key. Pure.
    """
    values: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--generate {text!r}: {part.strip()!r} is not key=value (as in mix=reference,seed=1)")
        if key in values:
            raise ValueError(f"--generate {text!r}: {key} is given twice")
        values[key] = value
    mix = values.pop("mix", None)
    if mix is None:
        raise ValueError(f"--generate {text!r}: mix is required (one of {', '.join(MIXES)})")
    if mix not in MIXES:
        raise ValueError(f"--generate {text!r}: mix {mix!r} is unknown (one of {', '.join(MIXES)})")
    defaults = Spec(mix=mix)
    nodes = dict(defaults.nodes) if not values.keys() & EXAMPLE_NODES.keys() else {}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("seed", "claims", "round", "gangs", *EXAMPLE_NODES):
            number = _integer(value)
            least = 0 if key in (*EXAMPLE_NODES, "seed", "gangs") else 1
            if number is None or number < least:
                raise ValueError(f"--generate {text!r}: {key} must be an integer >= {least}, got {value!r}")
            if key == "gangs" and number > MAX_GENERATED_GANGS:
                raise ValueError(f"--generate {text!r}: gangs must be at most {MAX_GENERATED_GANGS}, got {number}")
            if key in EXAMPLE_NODES:
                nodes[key] = number
            else:
                kwargs[key] = number
        elif key == "departures":
            share = _seconds(value)
            if share is None or share > 1:
                raise ValueError(f"--generate {text!r}: departures must be a share from 0 to 1, got {value!r}")
            kwargs[key] = share
        else:
            keys = ", ".join(["mix", "seed", "claims", *EXAMPLE_NODES, "round", "departures", "gangs"])
            raise ValueError(f"--generate {text!r}: unknown key {key!r} (known: {keys})")
    if not any(nodes.values()):
        raise ValueError(f"--generate {text!r}: the cluster has no node (give a100=, h100= or t4= above 0)")
    bound = _bound(kwargs.get("claims", defaults.claims), sum(nodes.values()))
    if bound is not None:
        raise ValueError(f"--generate {text!r}: {bound}")
    return Spec(mix=mix, nodes={k: nodes[k] for k in EXAMPLE_NODES if nodes.get(k)}, **kwargs)


def _integer(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[0-9]{1,9}", text) else None


@dataclasses.dataclass(frozen=True, slots=True)
class _Share:
    """One kind of claim of a mix and its share of the stream."""

    name: str
    weight: float


# Claim mixes: shares of the claim stream. `reference`: one GPU with at least 40Gi, MIG slices,
# 2 or 4 GPUs of any model in one NVLink partition, 8 GPUs on one node. `h100-nvlink`: the same
# shares, but the memory floor is drawn from 8Gi to 70Gi (8Gi fits a T4) and the NVLink claims
# select H100s only, as the built-in example's NVLink claim does.
MIXES: Mapping[str, tuple[_Share, ...]] = {
    "reference": (
        _Share("gpu-memory-floor", 0.40),
        _Share("one-mig-slice", 0.30),
        _Share("two-mig-slices-one-parent", 0.10),
        _Share("nvlink-gpus", 0.15),
        _Share("eight-gpus", 0.05),
    ),
    "h100-nvlink": (
        _Share("gpu-memory-range", 0.40),
        _Share("one-mig-slice", 0.30),
        _Share("two-mig-slices-one-parent", 0.10),
        _Share("nvlink-h100", 0.15),
        _Share("eight-gpus", 0.05),
    ),
}
# One MIG slice: profiles and weights (small slices are the common ask).
_ONE_SLICE = (("1g.10gb", 0.4), ("1g.20gb", 0.15), ("2g.20gb", 0.25), ("3g.40gb", 0.2))
# Two slices of one parent: the seed article's pair first.
_TWO_SLICES = (("3g.40gb", "1g.10gb"), ("2g.20gb", "1g.10gb"), ("1g.10gb", "1g.10gb"), ("2g.20gb", "2g.20gb"))
_ROUND_SECONDS = 60.0
_MEMORY_FLOOR = "40Gi"
_MEMORY_FLOORS = ("8Gi", "16Gi", "24Gi", "32Gi", "40Gi", "48Gi", "64Gi", "70Gi")
_H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'


def generate(
    spec: Spec | str | None = None,
    *,
    mix: str = "reference",
    seed: int = 1,
    claims: int = 200,
    nodes: Mapping[str, int] | None = None,
    claims_per_round: int = 10,
    departures: float = 0.3,
    gangs: int = 0,
) -> Trace:
    """A trace for `spec` (a `Spec`, its spec string, or else the keyword arguments): the
    example-node cluster and a claim stream.

    Deterministic: the same spec gives an equal trace (a `random.Random(seed)` is the only
    source of choices). Claims arrive in rounds of `spec.round`, one round a minute, spread
    evenly over it; at the start of every round after the first, `departures` of the claims
    then present (rounded to the nearest whole claim, chosen by the seeded generator) depart.
    With `gangs`, the nodes are put in racks of 4 (label `RACK_LABEL`) and that many gangs arrive
    spread evenly over the rounds, each at the start of its round: a v1alpha2 PodGroup (minCount its
    size, 2 to 4 pods, topology key the rack) and then its pods a second apart, each with 1, 2, 4 or 8
    GPUs from a template of the cluster, the whole gang leaving 2 to 5 rounds later. The claim stream is
    the same as without gangs. Pure; raises ValueError for a bad spec string.
    """
    if isinstance(spec, str):
        spec = parse_spec(spec)
    elif spec is None:
        spec = Spec(
            mix=mix,
            seed=seed,
            claims=claims,
            nodes=dict(nodes or Spec(mix=mix).nodes),
            round=claims_per_round,
            departures=departures,
            gangs=gangs,
        )
    header, events = _generated(spec)
    document = {**header, "spec": {**header["spec"], "events": list(events)}}
    return parse(copy.deepcopy(document), file=f"<generated {spec}>")


def write_generated(spec: Spec, out: TextIO, *, as_json: bool = False) -> None:
    """Write the trace `generate(spec)` makes, byte for byte as `dumps` writes it, one event at a time: memory
    stays that of one event (and the names of the claims present), whatever the number of claims. Writes to `out`
    only; raises ValueError for a spec out of bounds."""
    header, events = _generated(spec)
    if as_json:
        # The events are the document's last field: the header is written around them, each event indented to
        # where `json.dumps(document, indent=1)` puts it.
        text = json.dumps({**header, "spec": {**header["spec"], "events": None}}, indent=1, sort_keys=False)
        before, _, after = text.rpartition('"events": null')
        out.write(before + '"events": ')
        first = True
        for event in events:
            out.write(("[\n" if first else ",\n") + textwrap.indent(json.dumps(event, indent=1), "   "))
            first = False
        out.write(("[]" if first else "\n  ]") + after + "\n")
        return
    out.write(_yaml(header) + "  events:\n")
    for event in events:
        # Dumped inside the same nesting as in the whole document, so that indentation and line width come out
        # alike; the two lines of the nesting are dropped.
        out.write(_yaml({"spec": {"events": [event]}}).split("\n", 2)[2])


def _yaml(document: Mapping[str, Any]) -> str:
    return yaml.dump(dict(document), Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=120)


def _generated(spec: Spec) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """The document of `spec`'s trace without its events, and the events, made as they are iterated. Raises
    ValueError for a spec out of bounds."""
    _check(spec)
    examples: list[dict[str, Any]] = [
        {"file": EXAMPLE_NODES[kind], "node": f"{kind}-{i:02d}"}
        for kind, count in spec.nodes.items()
        for i in range(1, count + 1)
    ]
    cluster: dict[str, Any] = {"examples": examples}
    if spec.gangs:
        # Gangs are placed in one rack: the nodes are put in racks in order, and the members' claims come from the
        # templates of the cluster.
        for n, example in enumerate(examples):
            example["labels"] = {RACK_LABEL: f"r{n // _RACK_NODES + 1:02d}"}
        cluster["objects"] = [_gang_template(gpus) for gpus in _GANG_GPUS]
    header = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": f"{spec.mix}-seed-{spec.seed}"},
        "spec": {"generator": str(spec), "cluster": cluster},
    }
    return header, _events_of(spec)


def _events_of(spec: Spec) -> Iterator[dict[str, Any]]:
    rng = random.Random(spec.seed)
    # The gangs draw from a generator of their own, so that the claim stream is that of the same spec without gangs.
    gang_rng = random.Random(f"gangs/{spec.seed}")
    shares = MIXES[spec.mix]
    present: dict[str, None] = {}  # in arrival order; a dict, so that a departure is not a scan
    width = max(5, len(str(spec.claims)))
    rounds = -(-spec.claims // spec.round)
    gangs = iter(range(spec.gangs))
    gang = next(gangs, None)
    for number in range(spec.claims):
        in_round, round_index = number % spec.round, number // spec.round
        start = round_index * _ROUND_SECONDS
        if in_round == 0 and round_index > 0 and present:
            leaving = rng.sample(list(present), k=round(len(present) * spec.departures))
            for name in sorted(leaving):
                yield {"at": start, "depart": {"kind": "ResourceClaim", "name": name, "namespace": "default"}}
                del present[name]
        # The gangs arrive spread evenly over the rounds, at the start of theirs.
        while in_round == 0 and gang is not None and gang * rounds // spec.gangs == round_index:
            yield from _gang_events(gang, width=len(str(spec.gangs)), start=start, rng=gang_rng)
            gang = next(gangs, None)
        name = f"c-{number + 1:0{width}d}"
        share = rng.choices(shares, weights=[s.weight for s in shares])[0]
        at = start + round(in_round * _ROUND_SECONDS / spec.round, 3)
        yield {"at": at, "arrive": _claim(share.name, name=name, rng=rng)}
        present[name] = None


# Gangs: pods per gang (the gang's minCount: all or nothing), GPUs per pod, and how many rounds a gang runs.
_GANG_SIZES = (2, 3, 4)
_GANG_GPUS = (1, 2, 4, 8)
_GANG_ROUNDS = (2, 3, 4, 5)
_RACK_NODES = 4


def _gang_template(gpus: int) -> dict[str, Any]:
    """The ResourceClaimTemplate of a gang member with `gpus` GPUs, its claims' shapes annotated."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gang-gpus-{gpus}", "namespace": "default"},
        "spec": {
            "metadata": {"annotations": {SHAPES: ",".join(["gpu"] * gpus)}},
            "spec": {"devices": {"requests": [_request("gpus", "gpu.nvidia.com", count=gpus)]}},
        },
    }


def _gang_events(number: int, *, width: int, start: float, rng: random.Random) -> Iterator[dict[str, Any]]:
    """Gang `number`: its PodGroup (minCount its size, placed in one rack) at `start`, then its pods one second
    apart (the gang is placed once the last has come), all leaving together some rounds after `start`."""
    name = f"g-{number + 1:0{width}d}"
    size, gpus, runs = rng.choice(_GANG_SIZES), rng.choice(_GANG_GPUS), rng.choice(_GANG_ROUNDS) * _ROUND_SECONDS
    yield {
        "at": start,
        "arrive": {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default", "annotations": {DEPARTS_AFTER: f"{runs:g}"}},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": size}},
                "schedulingConstraints": {"topology": [{"key": RACK_LABEL}]},
            },
        },
    }
    for member in range(size):
        yield {
            "at": start + member,
            "arrive": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{member}",
                    "namespace": "default",
                    "labels": {"dractl.io/mix": "gang"},
                    "annotations": {DEPARTS_AFTER: f"{runs - member:g}"},
                },
                "spec": {
                    "schedulingGroup": {"podGroupName": name},
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"gang-gpus-{gpus}"}],
                    "containers": [
                        {"name": "trainer", "image": "trainer", "resources": {"claims": [{"name": "gpus"}]}}
                    ],
                },
            },
        }


def _check(spec: Spec) -> None:
    """The checks `parse_spec` makes, for a `Spec` built in code; ValueError naming the field."""
    if spec.mix not in MIXES:
        raise ValueError(f"generate: mix {spec.mix!r} is unknown (one of {', '.join(MIXES)})")
    if spec.seed < 0 or spec.claims < 1 or spec.round < 1:
        raise ValueError(f"generate {spec}: seed must be >= 0, claims and round >= 1")
    if not 0 <= spec.gangs <= MAX_GENERATED_GANGS:
        raise ValueError(f"generate {spec}: gangs must be from 0 to {MAX_GENERATED_GANGS}")
    if not 0 <= spec.departures <= 1:
        raise ValueError(f"generate {spec}: departures must be a share from 0 to 1")
    unknown = sorted(set(spec.nodes) - EXAMPLE_NODES.keys())
    if unknown:
        raise ValueError(f"generate: node kind {unknown[0]!r} is unknown (one of {', '.join(EXAMPLE_NODES)})")
    if any(count < 0 for count in spec.nodes.values()) or not any(spec.nodes.values()):
        raise ValueError(f"generate {spec}: node counts must be >= 0 and the cluster needs a node")
    bound = _bound(spec.claims, sum(spec.nodes.values()))
    if bound is not None:
        raise ValueError(f"generate {spec}: {bound}")


def _bound(claims: int, nodes: int) -> str | None:
    """Why a trace of `claims` claims on `nodes` nodes is too large to generate, or None."""
    if claims > MAX_GENERATED_CLAIMS:
        return (
            f"claims must be at most {MAX_GENERATED_CLAIMS}, got {claims}: a longer trace would be more than the "
            "64 MiB --trace reads"
        )
    if nodes > MAX_GENERATED_NODES:
        return (
            f"a100, h100 and t4 must add up to at most {MAX_GENERATED_NODES} nodes (the most one Kubernetes cluster "
            f"supports), got {nodes}"
        )
    return None


def _claim(kind: str, *, name: str, rng: random.Random) -> dict[str, Any]:
    """One claim manifest of a mix's kind, with its shapes annotated."""
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    shapes: list[str] = []
    if kind in ("gpu-memory-floor", "gpu-memory-range"):
        floor = _MEMORY_FLOOR if kind == "gpu-memory-floor" else rng.choice(_MEMORY_FLOORS)
        memory = f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{floor}")) >= 0'
        requests.append(_request("gpu", "gpu.nvidia.com", selectors=[memory]))
        shapes.append(f"gpu@{floor}")
    elif kind == "one-mig-slice":
        profile = rng.choices([p for p, _ in _ONE_SLICE], weights=[w for _, w in _ONE_SLICE])[0]
        requests.append(_request("slice", "mig.nvidia.com", selectors=[_profile(profile)]))
        shapes.append(f"mig:{profile}")
    elif kind == "two-mig-slices-one-parent":
        pair = rng.choice(_TWO_SLICES)
        for i, profile in enumerate(pair):
            requests.append(_request(f"slice-{i}", "mig.nvidia.com", selectors=[_profile(profile)]))
            shapes.append(f"mig:{profile}")
        constraints.append({"requests": ["slice-0", "slice-1"], "matchAttribute": "gpu.nvidia.com/parentUUID"})
    elif kind in ("nvlink-gpus", "nvlink-h100"):
        count = rng.choice((2, 4))
        selectors = [_H100] if kind == "nvlink-h100" else []
        requests.append(_request("gpus", "gpu.nvidia.com", selectors=selectors, count=count))
        constraints.append({"requests": ["gpus"], "matchAttribute": f"gpu.nvidia.com/partition{count}"})
        shapes.extend(["gpu"] * count)
    else:
        requests.append(_request("gpus", "gpu.nvidia.com", count=8))
        shapes.extend(["gpu"] * 8)
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"dractl.io/mix": kind},
            "annotations": {SHAPES: ",".join(shapes)},
        },
        "spec": {"devices": devices},
    }


def _request(name: str, device_class: str, *, selectors: Sequence[str] = (), count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": exactly}


def _profile(profile: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'


def arrivals(trace: Trace) -> Iterator[Arrival]:
    """The trace's arrivals in replay order. Pure."""
    return (e for e in trace.events if isinstance(e, Arrival))
