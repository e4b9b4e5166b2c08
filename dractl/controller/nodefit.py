"""Node filtering for dractl's scheduler: which nodes a pod may run on, before any device is allocated.

What it does: decodes what scheduling needs from raw Pod and Node objects (`PodNeeds.from_raw`,
`NodeInfo.from_raw`) and runs kube-scheduler's node filters on them, in kube-scheduler's order and
with its wording: NodeUnschedulable ("node(s) were unschedulable"), NodeName, TaintToleration
(NoSchedule and NoExecute taints), NodeAffinity (`spec.nodeSelector` and required node affinity,
matched by the model's one node-selector implementation, `dractl.model.nodes`), NodePorts (host
ports) and NodeResourcesFit (cpu, memory and the pod count against allocatable minus what the pods
bound there request). `filter_nodes` splits nodes into feasible ones and reasons, `summary` words the
reasons as kube-scheduler's "0/5 nodes are available: ..." message.

What dractl does not filter on is never silently ignored: `PodNeeds.unsupported` holds one sentence
per such feature (required inter-pod affinity and anti-affinity, topology spread constraints that
refuse scheduling, volumes that need volume binding, extended resources such as `nvidia.com/gpu`
requested through device plugins, toleration operators dractl does not know), for the scheduler to
report on the pod. Preferences (preferred affinity, `ScheduleAnyway` spread) only score nodes in
kube-scheduler and are ignored.

What it must not do: I/O, import a Kubernetes client, hold state, or let malformed input escape as
anything but `Invalid` with a message naming the object and the field. Everything here is pure.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from dractl.model import nodes, quantity, types

# kube-scheduler's reasons, word for word (pkg/scheduler/framework/plugins/*).
UNSCHEDULABLE = "node(s) were unschedulable"
NODE_NAME = "node(s) didn't match the requested node name"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
NODE_PORTS = "node(s) didn't have free ports for the requested pod ports"
TOO_MANY_PODS = "Too many pods"
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
NO_NODES = "no nodes available to schedule pods"

REASON_SEPARATOR = "; "
"""Joins the reasons of one node when several resources are short ("Insufficient cpu; Insufficient memory");
`summary` counts each part on its own, as kube-scheduler counts each reason of a node's status."""

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
"""The taint a pod must tolerate (effect NoSchedule) to be placed on a cordoned node."""

_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
_FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule only lowers a node's score
_TOLERATION_OPERATORS = frozenset({"", "Equal", "Exists"})
_EXPRESSION_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_FILTERED_RESOURCES = frozenset({"cpu", "memory"})
_PROTOCOLS = frozenset({"TCP", "UDP", "SCTP"})
_ANY_IP = "0.0.0.0"
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


class Invalid(ValueError):
    """A Pod or Node that cannot be read; the message names the object and the field, e.g.
    `Pod ns/web: spec.containers[0].resources.requests.cpu: 'abc' is not a quantity (...)`."""


# --- Values --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Toleration:
    """One entry of `pod.spec.tolerations`; `operator` "" means Equal, as in core/v1."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """core/v1's `Toleration.ToleratesTaint`: an empty effect matches every effect, an empty key
        (operator Exists) every key; Equal compares values. Pure."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclasses.dataclass(frozen=True, slots=True)
class Taint:
    """One entry of `node.spec.taints`."""

    key: str
    value: str
    effect: str  # NoSchedule, PreferNoSchedule or NoExecute


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class HostPort:
    """A host port a container binds; `ip` "0.0.0.0" stands for every address (also when unset)."""

    ip: str
    protocol: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        """Whether two bindings cannot share a node: same protocol and port, and the same address or
        either one binding every address (kube-scheduler's HostPortInfo rule). Pure."""
        if self.protocol != other.protocol or self.port != other.port:
            return False
        return self.ip == other.ip or _ANY_IP in (self.ip, other.ip)


@dataclasses.dataclass(frozen=True, slots=True)
class PodNeeds:
    """What scheduling a pod needs from a node.

    Invariants: `cpu_milli` (millicores) and `memory` (bytes) are the effective requests as
    kube-scheduler computes them: the larger of (the sum of the containers plus the restartable
    init containers) and (each init container plus the restartable ones started before it), per
    resource, replaced by pod-level `spec.resources` where set, plus `spec.overhead`; missing
    requests default to limits, as the API server does. `required_terms` is empty when the pod has
    no required node affinity (the API refuses a required affinity without terms). `unsupported`
    holds one sentence per feature the pod uses that dractl's filter does not check.
    """

    namespace: str
    name: str
    uid: str
    node_name: str
    node_selector: Mapping[str, str]
    required_terms: tuple[types.NodeSelectorTerm, ...]
    tolerations: tuple[Toleration, ...]
    cpu_milli: int
    memory: int
    pods: int = 1
    unsupported: tuple[str, ...] = ()
    host_ports: tuple[HostPort, ...] = ()

    @staticmethod
    def from_raw(pod: Mapping[str, Any]) -> PodNeeds:
        """Decode a core/v1 Pod (a JSON-shaped mapping). Raises `Invalid` naming the pod and the field. Pure."""
        return _decode_pod(pod)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeInfo:
    """What filtering needs from a Node. `cpu_milli`, `memory` and `pods` are `status.allocatable`
    (0 where missing, as kube-scheduler reads a node that has not reported yet)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    cpu_milli: int
    memory: int
    pods: int

    @staticmethod
    def from_raw(node: Mapping[str, Any]) -> NodeInfo:
        """Decode a core/v1 Node (a JSON-shaped mapping). Raises `Invalid` naming the node and the field. Pure."""
        return _decode_node(node)


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """What the pods bound to one node take from it: summed requests, the pod count and host ports."""

    cpu_milli: int = 0
    memory: int = 0
    pods: int = 0
    host_ports: frozenset[HostPort] = frozenset()

    def plus(self, pod: PodNeeds) -> Usage:
        """This usage with one more pod on the node (for assuming a decision before the API write). Pure."""
        return Usage(
            cpu_milli=self.cpu_milli + pod.cpu_milli,
            memory=self.memory + pod.memory,
            pods=self.pods + pod.pods,
            host_ports=self.host_ports | frozenset(pod.host_ports),
        )


EMPTY = Usage()


def usage(pods: Iterable[PodNeeds]) -> Usage:
    """The summed usage of these pods (the caller passes the pods bound to one node). Pure."""
    total = EMPTY
    for pod in pods:
        total = total.plus(pod)
    return total


def usage_by_node(pods: Iterable[PodNeeds]) -> dict[str, Usage]:
    """The usage of every node that pods are bound to, keyed by `node_name`; pods without a node are
    skipped. The caller passes only pods that occupy their node (see `occupies`). Pure."""
    grouped: dict[str, list[PodNeeds]] = collections.defaultdict(list)
    for pod in pods:
        if pod.node_name:
            grouped[pod.node_name].append(pod)
    return {name: usage(members) for name, members in grouped.items()}


def occupies(pod: Mapping[str, Any]) -> bool:
    """Whether a raw pod counts against its node: it is bound (`spec.nodeName`) and not finished
    (phase Succeeded or Failed), as kube-scheduler's cache counts pods. Pure; never raises."""
    spec, status = pod.get("spec"), pod.get("status")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return isinstance(node, str) and bool(node) and phase not in _DONE_PHASES


# --- Filtering -----------------------------------------------------------------------------


def reasons(pod: PodNeeds, node: NodeInfo, used: Usage) -> tuple[str, ...]:
    """Why the pod cannot run on the node; empty when it fits. Pure.

    The filters run in kube-scheduler's default order and stop at the first that fails, so a
    node has one reason, except that resource checks report every short resource, as
    NodeResourcesFit does ("Too many pods", "Insufficient cpu", "Insufficient memory").
    """
    if node.unschedulable and not _tolerated(pod.tolerations, Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule")):
        return (UNSCHEDULABLE,)
    if pod.node_name and pod.node_name != node.name:
        return (NODE_NAME,)
    for taint in node.taints:
        # The first untolerated taint is named, in the node's order, as kube-scheduler does.
        if taint.effect in _FILTERED_EFFECTS and not _tolerated(pod.tolerations, taint):
            return (f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}",)
    if not _affinity_matches(pod, node):
        return (NODE_AFFINITY,)
    if any(want.conflicts(have) for want in pod.host_ports for have in used.host_ports):
        return (NODE_PORTS,)
    short: list[str] = []
    if used.pods + pod.pods > node.pods:
        short.append(TOO_MANY_PODS)
    # A zero request fits even on an overcommitted node, as in NodeResourcesFit.
    if pod.cpu_milli > 0 and pod.cpu_milli > node.cpu_milli - used.cpu_milli:
        short.append(INSUFFICIENT_CPU)
    if pod.memory > 0 and pod.memory > node.memory - used.memory:
        short.append(INSUFFICIENT_MEMORY)
    return tuple(short)


def fit(pod: PodNeeds, node: NodeInfo, used: Usage) -> str | None:
    """None when the pod fits on the node, else the reason (several short resources joined by
    `REASON_SEPARATOR`). Pure."""
    found = reasons(pod, node, used)
    return REASON_SEPARATOR.join(found) if found else None


def filter_nodes(
    pod: PodNeeds, nodes_: Iterable[NodeInfo], used: Mapping[str, Usage]
) -> tuple[list[str], dict[str, str]]:
    """The feasible node names, sorted, and `{node: reason}` for the others. A node missing from
    `used` has nothing bound to it. Pure; the result does not depend on the order of `nodes_`."""
    feasible: list[str] = []
    refused: dict[str, str] = {}
    for node in nodes_:
        reason = fit(pod, node, used.get(node.name, EMPTY))
        if reason is None:
            feasible.append(node.name)
        else:
            refused[node.name] = reason
    return sorted(feasible), dict(sorted(refused.items()))


def summary(reasons_: Mapping[str, str], total: int) -> str:
    """kube-scheduler's message for a pod no node takes, e.g. "0/5 nodes are available: 2 Insufficient
    cpu, 3 node(s) had untolerated taint {gpu: true}." Each distinct reason (a reason joined by
    `REASON_SEPARATOR` counts once per part) is prefixed with its node count, and the entries are
    sorted as text, as kube-scheduler sorts them. The available count is `total` minus the nodes with
    a reason (0 when the caller passes a reason for every node). Pure."""
    if total <= 0:
        return NO_NODES
    counts = collections.Counter(part for reason in reasons_.values() for part in reason.split(REASON_SEPARATOR))
    parts = sorted(f"{count} {reason}" for reason, count in counts.items())
    head = f"{max(total - len(reasons_), 0)}/{total} nodes are available"
    return f"{head}: {', '.join(parts)}." if parts else f"{head}."


def _tolerated(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


def _affinity_matches(pod: PodNeeds, node: NodeInfo) -> bool:
    """`spec.nodeSelector` (every label equal) and required node affinity (terms ORed, requirements
    ANDed; a term the API would not parse, such as a Gt value that is not an integer, matches nothing)."""
    if any(node.labels.get(key) != value for key, value in pod.node_selector.items()):
        return False
    if not pod.required_terms:
        return True
    return any(nodes.term_matches(term, name=node.name, labels=node.labels) for term in pod.required_terms)


# --- Decoding ------------------------------------------------------------------------------


class _Reader:
    """Typed field access for one object; every failure raises `Invalid` prefixed with the object's name."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, path: str, message: str) -> NoReturn:
        raise Invalid(f"{self.label}: {path}: {message}")

    def obj(self, raw: object, path: str) -> Mapping[str, Any]:
        """A mapping; a missing (null) field reads as empty."""
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.fail(path, f"must be an object, got {_kind(raw)}")
        return raw

    def items(self, raw: object, path: str) -> list[Any]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.fail(path, f"must be a list, got {_kind(raw)}")
        return raw

    def text(self, m: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
        raw = m.get(key)
        if raw is None or raw == "":
            if required:
                self.fail(_join(path, key), "required")
            return ""
        if not isinstance(raw, str):
            self.fail(_join(path, key), f"must be a string, got {_kind(raw)}")
        return raw

    def texts(self, m: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
        items = self.items(m.get(key), _join(path, key))
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{_join(path, key)}[{i}]", f"must be a string, got {_kind(item)}")
        return tuple(items)

    def text_map(self, raw: object, path: str) -> dict[str, str]:
        m = self.obj(raw, path)
        for key, value in m.items():
            if not isinstance(key, str) or not isinstance(value, str):
                self.fail(f"{path}.{key}", f"must be a string, got {_kind(value)}")
        return dict(m)

    def amount(self, raw: object, path: str) -> quantity.Quantity:
        try:
            q = quantity.parse(raw)
        except quantity.QuantityError as exc:
            self.fail(path, str(exc))
        if q.value < 0:
            self.fail(path, f"must not be negative, got {quantity.shown(q.text)}")
        if not quantity.fits_int64(q):
            self.fail(path, f"{quantity.shown(q.text)} is too large")
        return q


def _kind(raw: object) -> str:
    if raw is None:
        return "null"
    if isinstance(raw, Mapping):
        return "an object"
    names = {list: "a list", str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    return names.get(type(raw), f"a {type(raw).__name__}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _metadata(kind: str, raw: object, *, namespaced: bool) -> tuple[_Reader, Mapping[str, Any]]:
    """The reader for an object named as in messages ("Pod ns/name", "Node name") and its metadata."""
    if not isinstance(raw, Mapping):
        raise Invalid(f"{kind}: must be an object, got {_kind(raw)}")
    meta = raw.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    shown = name if isinstance(name, str) and name else "<unnamed>"
    if namespaced:
        shown = f"{ns if isinstance(ns, str) and ns else 'default'}/{shown}"
    r = _Reader(f"{kind} {shown}")
    meta = r.obj(meta, "metadata")
    r.text(meta, "name", "metadata", required=True)
    return r, meta


def _decode_node(raw: Mapping[str, Any]) -> NodeInfo:
    r, meta = _metadata("Node", raw, namespaced=False)
    spec = r.obj(raw.get("spec"), "spec")
    status = r.obj(raw.get("status"), "status")
    taints = []
    for i, item in enumerate(r.items(spec.get("taints"), "spec.taints")):
        path = f"spec.taints[{i}]"
        t = r.obj(item, path)
        effect = r.text(t, "effect", path, required=True)
        if effect not in _EFFECTS:
            r.fail(f"{path}.effect", f"must be one of NoSchedule, PreferNoSchedule, NoExecute, got {effect!r}")
        taints.append(Taint(key=r.text(t, "key", path, required=True), value=r.text(t, "value", path), effect=effect))
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        r.fail("spec.unschedulable", f"must be a boolean, got {_kind(unschedulable)}")
    allocatable = r.obj(status.get("allocatable"), "status.allocatable")
    amounts = {
        key: r.amount(allocatable[key], f"status.allocatable.{key}") if key in allocatable else None
        for key in ("cpu", "memory", "pods")
    }
    return NodeInfo(
        name=meta["name"],
        labels=r.text_map(meta.get("labels"), "metadata.labels"),
        taints=tuple(taints),
        unschedulable=unschedulable,
        cpu_milli=_milli(amounts["cpu"]),
        memory=_whole(amounts["memory"]),
        pods=_whole(amounts["pods"]),
    )


def _milli(q: quantity.Quantity | None) -> int:
    """Millicores, rounded up like resource.Quantity's MilliValue."""
    return 0 if q is None else math.ceil(q.value * 1000)


def _whole(q: quantity.Quantity | None) -> int:
    """A whole amount (bytes, pods), rounded up like resource.Quantity's Value."""
    return 0 if q is None else q.as_int()


@dataclasses.dataclass(frozen=True, slots=True)
class _Amounts:
    """cpu (millicores) and memory (bytes) of one container or of the pod, while summing."""

    cpu: int = 0
    memory: int = 0

    def plus(self, other: _Amounts) -> _Amounts:
        return _Amounts(self.cpu + other.cpu, self.memory + other.memory)

    def max(self, other: _Amounts) -> _Amounts:
        return _Amounts(max(self.cpu, other.cpu), max(self.memory, other.memory))


def _requests(r: _Reader, resources: Mapping[str, Any], path: str, extended: set[str]) -> dict[str, int]:
    """The requests of one `resources` block by resource name, limits standing in for missing requests
    (the API server's defaulting); names beyond cpu and memory go to `extended`."""
    requests = r.obj(resources.get("requests"), f"{path}.requests")
    limits = r.obj(resources.get("limits"), f"{path}.limits")
    found: dict[str, int] = {}
    for source, field in ((limits, "limits"), (requests, "requests")):  # requests win over limits
        for name, raw in source.items():
            q = r.amount(raw, f"{path}.{field}.{name}")
            if name not in _FILTERED_RESOURCES:
                if q.value > 0:
                    extended.add(str(name))
                continue
            found[name] = _milli(q) if name == "cpu" else _whole(q)
    return found


def _amounts(found: Mapping[str, int]) -> _Amounts:
    return _Amounts(found.get("cpu", 0), found.get("memory", 0))


def _container_requests(r: _Reader, container: Mapping[str, Any], path: str, extended: set[str]) -> _Amounts:
    return _amounts(_requests(r, r.obj(container.get("resources"), f"{path}.resources"), f"{path}.resources", extended))


def _host_ports(r: _Reader, container: Mapping[str, Any], path: str, *, host_network: bool) -> list[HostPort]:
    result = []
    for i, item in enumerate(r.items(container.get("ports"), f"{path}.ports")):
        ppath = f"{path}.ports[{i}]"
        p = r.obj(item, ppath)
        port = p.get("hostPort")
        if port is None and host_network:
            port = p.get("containerPort")  # the API server defaults hostPort to containerPort on the host network
        if port is None or port == 0:
            continue
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            r.fail(f"{ppath}.hostPort", f"must be a port number between 1 and 65535, got {port!r}")
        protocol = r.text(p, "protocol", ppath) or "TCP"
        if protocol not in _PROTOCOLS:
            r.fail(f"{ppath}.protocol", f"must be one of TCP, UDP, SCTP, got {protocol!r}")
        result.append(HostPort(ip=r.text(p, "hostIP", ppath) or _ANY_IP, protocol=protocol, port=port))
    return result


def _decode_resources(r: _Reader, spec: Mapping[str, Any], unsupported: list[str]) -> tuple[_Amounts, list[HostPort]]:
    """The pod's effective cpu and memory requests (kube-scheduler's PodRequests) and its host ports."""
    extended: set[str] = set()
    host_network = spec.get("hostNetwork") is True
    ports: list[HostPort] = []
    containers = _Amounts()
    for i, item in enumerate(r.items(spec.get("containers"), "spec.containers")):
        path = f"spec.containers[{i}]"
        c = r.obj(item, path)
        containers = containers.plus(_container_requests(r, c, path, extended))
        ports.extend(_host_ports(r, c, path, host_network=host_network))
    sidecars, init_peak = _Amounts(), _Amounts()
    for i, item in enumerate(r.items(spec.get("initContainers"), "spec.initContainers")):
        path = f"spec.initContainers[{i}]"
        c = r.obj(item, path)
        own = _container_requests(r, c, path, extended)
        if r.text(c, "restartPolicy", path) == "Always":
            # A sidecar keeps running: it adds to every later init container and to the main containers.
            sidecars = sidecars.plus(own)
            init_peak = init_peak.max(sidecars)
            ports.extend(_host_ports(r, c, path, host_network=host_network))
        else:
            init_peak = init_peak.max(own.plus(sidecars))
    total = containers.plus(sidecars).max(init_peak)
    if "resources" in spec:
        # Pod-level resources replace the containers' aggregate for the resources they name.
        found = _requests(r, r.obj(spec.get("resources"), "spec.resources"), "spec.resources", extended)
        total = _Amounts(found.get("cpu", total.cpu), found.get("memory", total.memory))
    overhead = r.obj(spec.get("overhead"), "spec.overhead")
    for name, raw in overhead.items():
        q = r.amount(raw, f"spec.overhead.{name}")
        if name == "cpu":
            total = total.plus(_Amounts(cpu=_milli(q)))
        elif name == "memory":
            total = total.plus(_Amounts(memory=_whole(q)))
        elif q.value > 0:
            extended.add(str(name))
    if extended:
        unsupported.append(
            f"requests of {', '.join(sorted(extended))} are not checked against node allocatable "
            "(dractl filters nodes on cpu, memory and pod count only; request devices through resource claims)"
        )
    return total, ports


def _decode_terms(r: _Reader, spec: Mapping[str, Any]) -> tuple[types.NodeSelectorTerm, ...]:
    path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = r.obj(spec.get("affinity"), "spec.affinity")
    node_affinity = r.obj(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    if node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is None:
        return ()
    required = r.obj(node_affinity["requiredDuringSchedulingIgnoredDuringExecution"], path)
    terms = []
    for i, item in enumerate(r.items(required.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")):
        tpath = f"{path}.nodeSelectorTerms[{i}]"
        t = r.obj(item, tpath)
        terms.append(
            types.NodeSelectorTerm(
                match_expressions=_decode_requirements(r, t, "matchExpressions", tpath),
                match_fields=_decode_requirements(r, t, "matchFields", tpath),
            )
        )
    if not terms:
        r.fail(f"{path}.nodeSelectorTerms", "required: at least one term")
    return tuple(terms)


def _decode_requirements(
    r: _Reader, term: Mapping[str, Any], key: str, path: str
) -> tuple[types.NodeSelectorRequirement, ...]:
    """The requirements of one term. Only the shape is checked here: a requirement the API accepts but
    that cannot match (a Gt value that is not an integer, a field other than metadata.name) makes its
    term match nothing when matched, as in kube-scheduler."""
    result = []
    for i, item in enumerate(r.items(term.get(key), f"{path}.{key}")):
        rpath = f"{path}.{key}[{i}]"
        m = r.obj(item, rpath)
        operator = r.text(m, "operator", rpath, required=True)
        if operator not in _EXPRESSION_OPERATORS:
            r.fail(f"{rpath}.operator", f"must be one of {', '.join(sorted(_EXPRESSION_OPERATORS))}, got {operator!r}")
        result.append(
            types.NodeSelectorRequirement(
                key=r.text(m, "key", rpath, required=True), operator=operator, values=r.texts(m, "values", rpath)
            )
        )
    return tuple(result)


def _decode_tolerations(r: _Reader, spec: Mapping[str, Any], unsupported: list[str]) -> tuple[Toleration, ...]:
    result = []
    for i, item in enumerate(r.items(spec.get("tolerations"), "spec.tolerations")):
        path = f"spec.tolerations[{i}]"
        t = r.obj(item, path)
        operator = r.text(t, "operator", path) or "Equal"
        key = r.text(t, "key", path)
        effect = r.text(t, "effect", path)
        if effect and effect not in _EFFECTS:
            r.fail(f"{path}.effect", f"must be one of NoSchedule, PreferNoSchedule, NoExecute, got {effect!r}")
        if operator not in _TOLERATION_OPERATORS:
            # A newer API may define more operators; such a toleration tolerates nothing here, and says so.
            unsupported.append(
                f"{path}.operator {operator!r} is not supported: that toleration tolerates no taint here"
            )
        elif operator == "Equal" and not key:
            r.fail(f"{path}.operator", "must be Exists when key is empty")
        result.append(Toleration(key=key, operator=operator, value=r.text(t, "value", path), effect=effect))
    return tuple(result)


def _decode_unsupported(r: _Reader, spec: Mapping[str, Any], unsupported: list[str]) -> None:
    """Sentences for the filters kube-scheduler applies and dractl does not."""
    affinity = r.obj(spec.get("affinity"), "spec.affinity")
    for field, what in (("podAffinity", "inter-pod affinity"), ("podAntiAffinity", "inter-pod anti-affinity")):
        block = r.obj(affinity.get(field), f"spec.affinity.{field}")
        if r.items(
            block.get("requiredDuringSchedulingIgnoredDuringExecution"),
            f"spec.affinity.{field}.requiredDuringSchedulingIgnoredDuringExecution",
        ):
            unsupported.append(
                f"spec.affinity.{field}.requiredDuringSchedulingIgnoredDuringExecution ({what}) is not supported: "
                "dractl does not filter nodes on the pods running there"
            )
    spread = r.items(spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints")
    hard = [
        i
        for i, item in enumerate(spread)
        if r.obj(item, f"spec.topologySpreadConstraints[{i}]").get("whenUnsatisfiable", "DoNotSchedule")
        == "DoNotSchedule"
    ]
    if hard:
        unsupported.append(
            "spec.topologySpreadConstraints with whenUnsatisfiable DoNotSchedule are not supported: "
            "dractl does not spread pods across topology domains"
        )
    claimed = []
    for i, item in enumerate(r.items(spec.get("volumes"), "spec.volumes")):
        v = r.obj(item, f"spec.volumes[{i}]")
        if v.get("persistentVolumeClaim") is not None or v.get("ephemeral") is not None:
            claimed.append(r.text(v, "name", f"spec.volumes[{i}]") or f"#{i}")
    if claimed:
        unsupported.append(
            f"volumes {', '.join(claimed)} need volume binding (persistentVolumeClaim or ephemeral), "
            "which dractl does not do: the node is not checked against the volumes' topology"
        )


def _decode_pod(raw: Mapping[str, Any]) -> PodNeeds:
    r, meta = _metadata("Pod", raw, namespaced=True)
    spec = r.obj(raw.get("spec"), "spec")
    unsupported: list[str] = []
    tolerations = _decode_tolerations(r, spec, unsupported)
    requests, ports = _decode_resources(r, spec, unsupported)
    required_terms = _decode_terms(r, spec)
    _decode_unsupported(r, spec, unsupported)
    return PodNeeds(
        namespace=r.text(meta, "namespace", "metadata") or "default",
        name=meta["name"],
        uid=r.text(meta, "uid", "metadata"),
        node_name=r.text(spec, "nodeName", "spec"),
        node_selector=r.text_map(spec.get("nodeSelector"), "spec.nodeSelector"),
        required_terms=required_terms,
        tolerations=tolerations,
        cpu_milli=requests.cpu,
        memory=requests.memory,
        unsupported=tuple(unsupported),
        host_ports=tuple(sorted(set(ports))),
    )
