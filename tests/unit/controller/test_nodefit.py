"""Node filtering for dractl's scheduler: kube-scheduler's filters (unschedulable, nodeName, taints, node affinity,
host ports, cpu/memory/pods), its wording, what is reported as unsupported, and malformed Pods and Nodes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dractl.controller import nodefit

# --- builders ------------------------------------------------------------------------------


def raw_pod(
    *,
    name: str = "web",
    containers: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers if containers is not None else [{"name": "main"}], **spec}
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u-1"}, "spec": body}


def pod(**kwargs: Any) -> nodefit.PodNeeds:
    return nodefit.PodNeeds.from_raw(raw_pod(**kwargs))


def requests(**amounts: str) -> dict[str, Any]:
    return {"name": "main", "resources": {"requests": dict(amounts)}}


def raw_node(
    name: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool | None = None,
    allocatable: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }


def node(name: str = "n1", **kwargs: Any) -> nodefit.NodeInfo:
    return nodefit.NodeInfo.from_raw(raw_node(name, **kwargs))


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        e["values"] = list(values)
    return e


# --- node name and unschedulable -------------------------------------------------------------


def test_node_name_must_equal_the_node() -> None:
    """Guards: a pod with spec.nodeName fits only that node, with kube-scheduler's NodeName wording elsewhere."""
    p = pod(nodeName="n2")
    assert nodefit.fit(p, node("n2"), nodefit.EMPTY) is None
    assert nodefit.fit(p, node("n1"), nodefit.EMPTY) == "node(s) didn't match the requested node name"


@pytest.mark.parametrize(
    ("tolerations", "fits"),
    [
        ([], False),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}], True),
        ([{"operator": "Exists"}], True),
        ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}], False),
    ],
    ids=["no-toleration", "exact", "any-effect", "tolerate-everything", "wrong-effect"],
)
def test_an_unschedulable_node_is_refused_unless_tolerated(tolerations: list[dict[str, str]], fits: bool) -> None:
    """Guards: spec.unschedulable refuses the node ("node(s) were unschedulable") unless the pod tolerates
    node.kubernetes.io/unschedulable:NoSchedule."""
    reason = nodefit.fit(pod(tolerations=tolerations), node(unschedulable=True), nodefit.EMPTY)
    assert reason == (None if fits else "node(s) were unschedulable")


# --- taints and tolerations ------------------------------------------------------------------

GPU_TAINT = {"key": "gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "true", "effect": "NoSchedule"}, True),  # operator defaults to Equal
        ({"key": "gpu", "operator": "Equal", "value": "false", "effect": "NoSchedule"}, False),
        ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "operator": "Exists"}, True),  # empty effect matches every effect
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"operator": "Exists", "effect": "NoExecute"}, False),
    ],
    ids=[
        "equal",
        "default-operator-equal",
        "equal-other-value",
        "exists",
        "exists-any-effect",
        "exists-other-effect",
        "other-key",
        "everything",
        "everything-but-other-effect",
    ],
)
def test_toleration_rules(toleration: dict[str, str], tolerated: bool) -> None:
    """Guards: core/v1's ToleratesTaint: Equal compares values, Exists ignores them, an empty effect matches all
    effects, an empty key with Exists matches all keys."""
    reason = nodefit.fit(pod(tolerations=[toleration]), node(taints=[GPU_TAINT]), nodefit.EMPTY)
    assert reason == (None if tolerated else "node(s) had untolerated taint {gpu: true}")


@pytest.mark.parametrize(
    ("effect", "refused"),
    [("NoSchedule", True), ("NoExecute", True), ("PreferNoSchedule", False)],
    ids=["no-schedule", "no-execute", "prefer-no-schedule"],
)
def test_only_no_schedule_and_no_execute_taints_filter(effect: str, refused: bool) -> None:
    """Guards: NoSchedule and NoExecute taints refuse an intolerant pod; PreferNoSchedule only scores and is ignored."""
    reason = nodefit.fit(pod(), node(taints=[{"key": "k", "value": "v", "effect": effect}]), nodefit.EMPTY)
    assert reason == ("node(s) had untolerated taint {k: v}" if refused else None)


def test_the_first_untolerated_taint_is_named_and_an_empty_value_shows_empty() -> None:
    """Guards: the reason names the first untolerated taint in the node's order, worded `{key: value}` with an empty
    value shown as nothing, as kube-scheduler does ("{node-role.kubernetes.io/control-plane: }")."""
    taints = [
        {"key": "tolerated", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": "gpu", "value": "true", "effect": "NoSchedule"},
    ]
    p = pod(tolerations=[{"key": "tolerated", "operator": "Exists"}])
    assert nodefit.fit(p, node(taints=taints), nodefit.EMPTY) == (
        "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"
    )


def test_an_unknown_toleration_operator_tolerates_nothing_and_is_reported() -> None:
    """Guards: a toleration operator dractl does not know (a newer API's) tolerates no taint and is listed in
    `unsupported`, not silently dropped or crashing."""
    p = pod(tolerations=[{"key": "gpu", "operator": "Gt", "value": "1"}])
    assert any("spec.tolerations[0].operator 'Gt'" in s for s in p.unsupported)
    assert nodefit.fit(p, node(taints=[GPU_TAINT]), nodefit.EMPTY) == "node(s) had untolerated taint {gpu: true}"


# --- node selector and required node affinity --------------------------------------------------

AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"


def test_node_selector_needs_every_label_equal() -> None:
    """Guards: spec.nodeSelector matches only nodes carrying every label with the same value."""
    p = pod(nodeSelector={"zone": "a", "gpu": "h100"})
    assert nodefit.fit(p, node(labels={"zone": "a", "gpu": "h100", "x": "y"}), nodefit.EMPTY) is None
    assert nodefit.fit(p, node(labels={"zone": "a", "gpu": "a100"}), nodefit.EMPTY) == AFFINITY_REASON
    assert nodefit.fit(p, node(labels={"zone": "a"}), nodefit.EMPTY) == AFFINITY_REASON


@pytest.mark.parametrize(
    ("requirement", "labels", "matches"),
    [
        (expr("zone", "In", "a", "b"), {"zone": "b"}, True),
        (expr("zone", "In", "a", "b"), {"zone": "c"}, False),
        (expr("zone", "In", "a"), {}, False),
        (expr("zone", "NotIn", "a"), {"zone": "b"}, True),
        (expr("zone", "NotIn", "a"), {}, True),
        (expr("zone", "NotIn", "a"), {"zone": "a"}, False),
        (expr("zone", "Exists"), {"zone": ""}, True),
        (expr("zone", "Exists"), {}, False),
        (expr("zone", "DoesNotExist"), {}, True),
        (expr("zone", "DoesNotExist"), {"zone": "a"}, False),
        (expr("gpus", "Gt", "4"), {"gpus": "8"}, True),
        (expr("gpus", "Gt", "4"), {"gpus": "4"}, False),
        (expr("gpus", "Lt", "4"), {"gpus": "2"}, True),
        (expr("gpus", "Lt", "4"), {"gpus": "4"}, False),
        (expr("gpus", "Gt", "4"), {}, False),
        (expr("gpus", "Gt", "4"), {"gpus": "eight"}, False),
        (expr("gpus", "Gt", "four"), {"gpus": "8"}, False),
        (expr("gpus", "Lt", "-1"), {"gpus": "-2"}, True),
    ],
    ids=[
        "in",
        "in-other-value",
        "in-missing-label",
        "notin",
        "notin-missing-label",
        "notin-listed",
        "exists",
        "exists-missing",
        "doesnotexist",
        "doesnotexist-present",
        "gt",
        "gt-equal",
        "lt",
        "lt-equal",
        "gt-missing-label",
        "gt-label-not-integer",
        "gt-value-not-integer",
        "lt-negative",
    ],
)
def test_affinity_operators(requirement: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    """Guards: each node affinity operator as core/v1 defines it; Gt and Lt parse integers and a value that does
    not parse (on the node or in the pod) makes the term match nothing."""
    reason = nodefit.fit(
        pod(affinity=affinity({"matchExpressions": [requirement]})), node(labels=labels), nodefit.EMPTY
    )
    assert reason == (None if matches else AFFINITY_REASON)


def test_terms_are_ored_and_expressions_anded() -> None:
    """Guards: a node matching any one term fits; within a term every expression must match."""
    p = pod(
        affinity=affinity(
            {"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "Exists")]},
            {"matchExpressions": [expr("zone", "In", "b")]},
        )
    )
    assert nodefit.fit(p, node(labels={"zone": "a", "gpu": "1"}), nodefit.EMPTY) is None
    assert nodefit.fit(p, node(labels={"zone": "b"}), nodefit.EMPTY) is None
    assert nodefit.fit(p, node(labels={"zone": "a"}), nodefit.EMPTY) == AFFINITY_REASON


@pytest.mark.parametrize(
    ("field", "node_name", "matches"),
    [
        ({"key": "metadata.name", "operator": "In", "values": ["n1"]}, "n1", True),
        ({"key": "metadata.name", "operator": "In", "values": ["n1"]}, "n2", False),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}, "n2", True),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}, "n1", False),
        ({"key": "metadata.uid", "operator": "In", "values": ["n1"]}, "n1", False),
    ],
    ids=["in", "in-other", "notin", "notin-listed", "not-a-node-field"],
)
def test_match_fields_select_by_node_name(field: dict[str, Any], node_name: str, matches: bool) -> None:
    """Guards: matchFields on metadata.name select nodes by name; any other field makes the term match nothing."""
    reason = nodefit.fit(pod(affinity=affinity({"matchFields": [field]})), node(node_name), nodefit.EMPTY)
    assert reason == (None if matches else AFFINITY_REASON)


def test_an_empty_term_matches_nothing_and_selector_and_affinity_both_apply() -> None:
    """Guards: a term without requirements selects no node (another term may still match), and nodeSelector and
    required affinity must both hold."""
    only_empty = pod(affinity=affinity({}))
    assert nodefit.fit(only_empty, node(labels={"zone": "a"}), nodefit.EMPTY) == AFFINITY_REASON
    with_other = pod(affinity=affinity({}, {"matchExpressions": [expr("zone", "In", "a")]}))
    assert nodefit.fit(with_other, node(labels={"zone": "a"}), nodefit.EMPTY) is None
    both = pod(nodeSelector={"gpu": "h100"}, affinity=affinity({"matchExpressions": [expr("zone", "In", "a")]}))
    assert nodefit.fit(both, node(labels={"zone": "a"}), nodefit.EMPTY) == AFFINITY_REASON
    assert nodefit.fit(both, node(labels={"zone": "a", "gpu": "h100"}), nodefit.EMPTY) is None


def test_preferred_affinity_is_ignored_silently() -> None:
    """Guards: preferred node and pod affinity only score nodes: they neither filter nor appear in `unsupported`."""
    term = {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "a")]}}
    pod_term = {"weight": 1, "podAffinityTerm": {"topologyKey": "zone"}}
    p = pod(
        affinity={
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [pod_term]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [pod_term]},
        }
    )
    assert p.unsupported == ()
    assert p.required_terms == ()
    assert nodefit.fit(p, node(labels={"zone": "b"}), nodefit.EMPTY) is None


# --- resources ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "memory", "cpu_milli", "memory_bytes"),
    [
        ("100m", "1Gi", 100, 2**30),
        ("0.5", "512Mi", 500, 512 * 2**20),
        ("1e3", "1e3", 1_000_000, 1000),
        ("2", "1G", 2000, 10**9),
        ("1u", "100m", 1, 1),  # both round up, like MilliValue and Value
        (3, 4096, 3000, 4096),  # YAML integers
    ],
    ids=["milli-and-gi", "fraction", "exponent", "decimal-suffix", "round-up", "integers"],
)
def test_quantities_become_millicores_and_bytes(cpu: Any, memory: Any, cpu_milli: int, memory_bytes: int) -> None:
    """Guards: cpu is read in millicores and memory in bytes through dractl.model.quantity, rounding up."""
    p = pod(containers=[{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}])
    assert (p.cpu_milli, p.memory) == (cpu_milli, memory_bytes)


def test_limits_stand_in_for_missing_requests() -> None:
    """Guards: a resource with a limit and no request is requested at its limit (the API server's defaulting); an
    explicit request wins over the limit."""
    p = pod(
        containers=[
            {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"memory": "256Mi"}}}
        ]
    )
    assert (p.cpu_milli, p.memory) == (2000, 256 * 2**20)


def test_containers_sum_and_init_containers_take_the_max() -> None:
    """Guards: the containers' requests add up; a regular init container counts only when it is larger (per
    resource), as PodRequests computes it."""
    p = pod(
        containers=[requests(cpu="1", memory="1Gi"), requests(cpu="1", memory="1Gi")],
        initContainers=[requests(cpu="3", memory="1Gi"), requests(cpu="1", memory="4Gi")],
    )
    assert (p.cpu_milli, p.memory) == (3000, 4 * 2**30)


def test_sidecar_init_containers_add_to_everything_after_them() -> None:
    """Guards: a restartable (sidecar) init container adds to the main containers and to every init container
    started after it."""
    sidecar = {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    p = pod(
        containers=[requests(cpu="1", memory="1Gi")],
        initContainers=[sidecar, requests(cpu="2", memory="1Gi")],
    )
    # cpu: max(1 + 0.5, 2 + 0.5) = 2.5; memory: max(1 + 1, 1 + 1) = 2Gi.
    assert (p.cpu_milli, p.memory) == (2500, 2 * 2**30)
    before = pod(containers=[requests(cpu="1")], initContainers=[requests(cpu="2"), {**sidecar, "name": "late"}])
    assert before.cpu_milli == 2000  # the init container ran before the sidecar started: max(2, 1 + 0.5)


def test_overhead_and_pod_level_resources() -> None:
    """Guards: spec.overhead is added to the requests, and pod-level spec.resources replace the containers'
    aggregate for the resources they name."""
    p = pod(containers=[requests(cpu="1", memory="1Gi")], overhead={"cpu": "250m", "memory": "64Mi"})
    assert (p.cpu_milli, p.memory) == (1250, 2**30 + 64 * 2**20)
    level = pod(containers=[requests(cpu="1", memory="1Gi")], resources={"limits": {"cpu": "4"}})
    assert (level.cpu_milli, level.memory) == (4000, 2**30)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        (nodefit.Usage(cpu_milli=7000), "Insufficient cpu"),
        (nodefit.Usage(memory=31 * 2**30), "Insufficient memory"),
        (nodefit.Usage(pods=110), "Too many pods"),
        (
            nodefit.Usage(cpu_milli=8000, memory=32 * 2**30, pods=110),
            "Too many pods; Insufficient cpu; Insufficient memory",
        ),
        (nodefit.Usage(cpu_milli=6000, memory=30 * 2**30, pods=109), None),
    ],
    ids=["cpu", "memory", "pods", "all-three", "exactly-fits"],
)
def test_requests_against_allocatable_minus_used(used: nodefit.Usage, expected: str | None) -> None:
    """Guards: cpu, memory and the pod count are checked against allocatable minus what bound pods take, worded as
    NodeResourcesFit ("Insufficient cpu", "Insufficient memory", "Too many pods"), every short resource listed."""
    p = pod(containers=[requests(cpu="2", memory="2Gi")])
    assert nodefit.fit(p, node(), used) == expected


def test_a_pod_requesting_nothing_fits_an_overcommitted_node() -> None:
    """Guards: zero requests are not compared, so an overcommitted node still takes a best-effort pod."""
    assert nodefit.fit(pod(), node(), nodefit.Usage(cpu_milli=9000, memory=40 * 2**30, pods=1)) is None


def test_a_node_without_allocatable_takes_no_pod() -> None:
    """Guards: a node that has not reported allocatable counts as zero, as kube-scheduler reads it."""
    bare = nodefit.NodeInfo.from_raw({"metadata": {"name": "new"}})
    assert (bare.cpu_milli, bare.memory, bare.pods) == (0, 0, 0)
    assert nodefit.fit(pod(), bare, nodefit.EMPTY) == "Too many pods"


def test_usage_sums_bound_pods_per_node() -> None:
    """Guards: `usage` and `usage_by_node` sum requests, pod counts and host ports of the pods bound to a node."""
    a = pod(name="a", nodeName="n1", containers=[requests(cpu="1", memory="1Gi")])
    b = pod(name="b", nodeName="n1", containers=[requests(cpu="500m")])
    c = pod(name="c", nodeName="n2", containers=[requests(memory="2Gi")])
    unbound = pod(name="d", containers=[requests(cpu="9")])
    by_node = nodefit.usage_by_node([a, b, c, unbound])
    assert by_node == {
        "n1": nodefit.Usage(cpu_milli=1500, memory=2**30, pods=2),
        "n2": nodefit.Usage(memory=2 * 2**30, pods=1),
    }
    assert nodefit.usage([a, b]) == by_node["n1"]
    assert nodefit.usage([]) == nodefit.EMPTY


@pytest.mark.parametrize(
    ("raw", "occupies"),
    [
        ({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}, True),
        ({"spec": {"nodeName": "n1"}}, True),
        ({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}}, False),
        ({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}}, False),
        ({"spec": {}}, False),
        ({"spec": "junk"}, False),
    ],
    ids=["running", "no-status", "succeeded", "failed", "unbound", "malformed"],
)
def test_only_bound_unfinished_pods_occupy_a_node(raw: dict[str, Any], occupies: bool) -> None:
    """Guards: finished (Succeeded/Failed) and unbound pods do not count against a node; malformed input does not
    raise."""
    assert nodefit.occupies(raw) is occupies


# --- host ports ------------------------------------------------------------------------------


def port(host_port: int, *, ip: str | None = None, protocol: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"name": "c", "ports": [{"containerPort": 8080, "hostPort": host_port}]}
    if ip is not None:
        p["ports"][0]["hostIP"] = ip
    if protocol is not None:
        p["ports"][0]["protocol"] = protocol
    return p


@pytest.mark.parametrize(
    ("held", "wanted", "conflict"),
    [
        (port(80), port(80), True),
        (port(80), port(81), False),
        (port(80, protocol="UDP"), port(80), False),
        (port(80, ip="10.0.0.1"), port(80, ip="10.0.0.2"), False),
        (port(80, ip="10.0.0.1"), port(80), True),
        (port(80), port(80, ip="10.0.0.1"), True),
        (port(80, ip="10.0.0.1"), port(80, ip="10.0.0.1"), True),
    ],
    ids=["same", "other-port", "other-protocol", "other-ips", "any-ip-wanted", "any-ip-held", "same-ip"],
)
def test_host_ports_conflict(held: dict[str, Any], wanted: dict[str, Any], conflict: bool) -> None:
    """Guards: a host port taken on the node (same protocol and port, same address or either on every address)
    refuses the node with NodePorts' wording."""
    used = nodefit.usage([pod(name="held", containers=[held])])
    reason = nodefit.fit(pod(containers=[wanted]), node(), used)
    assert reason == ("node(s) didn't have free ports for the requested pod ports" if conflict else None)


def test_host_network_defaults_host_ports_to_container_ports() -> None:
    """Guards: on the host network a container port binds the host port of the same number (API defaulting)."""
    p = pod(hostNetwork=True, containers=[{"name": "c", "ports": [{"containerPort": 9000}]}])
    assert p.host_ports == (nodefit.HostPort(ip="0.0.0.0", protocol="TCP", port=9000),)
    assert pod(containers=[{"name": "c", "ports": [{"containerPort": 9000}]}]).host_ports == ()


# --- unsupported features ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "mentions"),
    [
        (
            {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "z"}]}}},
            "spec.affinity.podAffinity",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "z"}]}
                }
            },
            "spec.affinity.podAntiAffinity",
        ),
        (
            {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]},
            "topologySpreadConstraints",
        ),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z"}]}, "topologySpreadConstraints"),
        ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "pvc"}}]}, "volumes data"),
        ({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]}, "volumes scratch"),
        ({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "nvidia.com/gpu"),
        ({"containers": [{"name": "c", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}]}, "ephemeral-storage"),
        ({"overhead": {"example.com/thing": "1"}}, "example.com/thing"),
    ],
    ids=[
        "pod-affinity",
        "pod-anti-affinity",
        "spread-do-not-schedule",
        "spread-default-is-do-not-schedule",
        "pvc-volume",
        "ephemeral-volume",
        "extended-resource",
        "ephemeral-storage",
        "extended-overhead",
    ],
)
def test_what_dractl_does_not_filter_on_is_reported(spec: dict[str, Any], mentions: str) -> None:
    """Guards: each filter kube-scheduler applies and dractl does not is listed in `unsupported` with a sentence
    naming it, never silently ignored."""
    body = {"containers": [{"name": "main"}], **spec}
    p = nodefit.PodNeeds.from_raw({"metadata": {"name": "web", "namespace": "ns"}, "spec": body})
    assert len(p.unsupported) == 1
    assert mentions in p.unsupported[0]


def test_a_plain_pod_reports_nothing_unsupported() -> None:
    """Guards: ordinary volumes, ScheduleAnyway spread and zero extended requests are not reported."""
    p = pod(
        volumes=[{"name": "cfg", "configMap": {"name": "x"}}, {"name": "tmp", "emptyDir": {}}],
        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "ScheduleAnyway"}],
        containers=[{"name": "c", "resources": {"requests": {"cpu": "1", "example.com/x": "0"}}}],
    )
    assert p.unsupported == ()


# --- filter_nodes and summary ----------------------------------------------------------------


def test_filter_nodes_splits_feasible_nodes_and_reasons() -> None:
    """Guards: `filter_nodes` returns the feasible names sorted and a reason for every other node, using each node's
    usage (none when missing)."""
    p = pod(containers=[requests(cpu="2")])
    cluster = [
        node("c"),
        node("a"),
        node("tainted", taints=[GPU_TAINT]),
        node("full"),
        node("b", unschedulable=True),
    ]
    feasible, refused = nodefit.filter_nodes(p, cluster, {"full": nodefit.Usage(cpu_milli=7000)})
    assert feasible == ["a", "c"]
    assert refused == {
        "b": "node(s) were unschedulable",
        "full": "Insufficient cpu",
        "tainted": "node(s) had untolerated taint {gpu: true}",
    }


def test_summary_reads_like_kube_scheduler() -> None:
    """Guards: the message is "0/N nodes are available: <count> <reason>, ...." with entries sorted as text, and a
    node short of several resources counts once for each."""
    reasons = {
        "a": "Insufficient cpu",
        "b": "Insufficient cpu; Insufficient memory",
        "c": "node(s) had untolerated taint {gpu: true}",
        "d": "node(s) had untolerated taint {gpu: true}",
        "e": "Insufficient cpu",
    }
    assert nodefit.summary(reasons, 5) == (
        "0/5 nodes are available: 1 Insufficient memory, 2 node(s) had untolerated taint {gpu: true}, "
        "3 Insufficient cpu."
    )


def test_summary_edge_cases() -> None:
    """Guards: no nodes at all gives kube-scheduler's "no nodes available to schedule pods"; nodes without a reason
    count as available; no reason at all still ends in a full stop."""
    assert nodefit.summary({}, 0) == "no nodes available to schedule pods"
    assert nodefit.summary({"a": "Too many pods"}, 3) == "2/3 nodes are available: 1 Too many pods."
    assert nodefit.summary({}, 2) == "2/2 nodes are available."


# --- malformed input ---------------------------------------------------------------------------

POD_CASES: list[tuple[Any, str]] = [
    (raw_pod(containers=[requests(cpu="abc")]), "Pod ns/web: spec.containers[0].resources.requests.cpu: 'abc'"),
    (raw_pod(containers=[requests(memory="-1Gi")]), "spec.containers[0].resources.requests.memory: must not be"),
    (raw_pod(containers=[requests(cpu="1e400")]), "spec.containers[0].resources.requests.cpu:"),
    (raw_pod(containers=[{"name": "c", "resources": {"limits": {"cpu": []}}}]), "resources.limits.cpu"),
    (raw_pod(containers="one"), "spec.containers: must be a list, got a string"),
    (raw_pod(initContainers=[{"resources": {"requests": "lots"}}]), "spec.initContainers[0].resources.requests"),
    (raw_pod(overhead={"cpu": "x"}), "spec.overhead.cpu"),
    (raw_pod(nodeSelector={"zone": 1}), "spec.nodeSelector.zone: must be a string"),
    (raw_pod(nodeName=3), "spec.nodeName: must be a string, got an integer"),
    (raw_pod(tolerations={"key": "a"}), "spec.tolerations: must be a list"),
    (raw_pod(tolerations=[{"key": "a", "effect": "Sometimes"}]), "spec.tolerations[0].effect"),
    (raw_pod(tolerations=[{"operator": "Equal", "value": "x"}]), "spec.tolerations[0].operator: must be Exists"),
    (raw_pod(affinity=affinity()), "nodeSelectorTerms: required: at least one term"),
    (raw_pod(affinity=affinity({"matchExpressions": [expr("z", "Near", "a")]})), "matchExpressions[0].operator"),
    (raw_pod(affinity=affinity({"matchExpressions": [{"operator": "Exists"}]})), "matchExpressions[0].key: required"),
    (raw_pod(affinity=affinity({"matchExpressions": [{"key": "z", "operator": "In", "values": [1]}]})), "values[0]"),
    (raw_pod(affinity={"nodeAffinity": "yes"}), "spec.affinity.nodeAffinity: must be an object"),
    (raw_pod(containers=[port(70000)]), "spec.containers[0].ports[0].hostPort: must be a port number"),
    (raw_pod(containers=[port(80, protocol="QUIC")]), "spec.containers[0].ports[0].protocol"),
    (raw_pod(volumes=["data"]), "spec.volumes[0]: must be an object"),
    ({"metadata": {"namespace": "ns"}, "spec": {}}, "Pod ns/<unnamed>: metadata.name: required"),
    ({"metadata": {"name": "p"}, "spec": []}, "Pod default/p: spec: must be an object, got a list"),
    ("pod", "Pod: must be an object"),
]


@pytest.mark.parametrize(("raw", "message"), POD_CASES, ids=[f"pod-{i}" for i in range(len(POD_CASES))])
def test_a_malformed_pod_raises_invalid_naming_the_field(raw: Any, message: str) -> None:
    """Guards: a malformed pod raises `nodefit.Invalid` whose message names the pod and the field, never another
    exception."""
    with pytest.raises(nodefit.Invalid) as caught:
        nodefit.PodNeeds.from_raw(raw)
    assert message in str(caught.value)
    assert str(caught.value).startswith("Pod")


NODE_CASES: list[tuple[Any, str]] = [
    (raw_node(taints=[{"value": "v", "effect": "NoSchedule"}]), "Node n1: spec.taints[0].key: required"),
    (raw_node(taints=[{"key": "k"}]), "Node n1: spec.taints[0].effect: required"),
    (raw_node(taints=[{"key": "k", "effect": "Never"}]), "spec.taints[0].effect: must be one of"),
    (raw_node(taints={"key": "k"}), "spec.taints: must be a list"),
    (raw_node(allocatable={"cpu": "abc"}), "Node n1: status.allocatable.cpu: 'abc' is not a quantity"),
    (raw_node(allocatable={"pods": "-3"}), "status.allocatable.pods: must not be negative"),
    (raw_node(labels={"zone": None}), "metadata.labels.zone: must be a string"),  # type: ignore[dict-item]
    ({**raw_node(), "spec": {"unschedulable": "yes"}}, "spec.unschedulable: must be a boolean"),
    ({"metadata": {}}, "Node <unnamed>: metadata.name: required"),
    ({"metadata": {"name": "n"}, "status": {"allocatable": ["cpu"]}}, "Node n: status.allocatable: must be an object"),
    (None, "Node: must be an object, got null"),
]


@pytest.mark.parametrize(("raw", "message"), NODE_CASES, ids=[f"node-{i}" for i in range(len(NODE_CASES))])
def test_a_malformed_node_raises_invalid_naming_the_field(raw: Any, message: str) -> None:
    """Guards: a malformed node (a taint without key, a bad quantity, ...) raises `nodefit.Invalid` naming the node
    and the field."""
    with pytest.raises(nodefit.Invalid) as caught:
        nodefit.NodeInfo.from_raw(raw)
    assert message in str(caught.value)


# --- properties ----------------------------------------------------------------------------------

_KEYS = st.sampled_from(["gpu", "zone", "dedicated", "example.com/team"])
_EFFECTS = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", ""])
_TOLERATIONS = st.lists(
    st.builds(
        lambda key, operator, value, effect: {
            k: v for k, v in {"key": key, "operator": operator, "value": value, "effect": effect}.items() if v
        },
        key=_KEYS,
        operator=st.sampled_from(["Equal", "Exists"]),
        value=st.sampled_from(["", "true", "a"]),
        effect=_EFFECTS,
    ).map(lambda t: {k: v for k, v in t.items() if not (k == "value" and t.get("operator") == "Exists")}),
    max_size=4,
)
_CONTAINERS = st.lists(
    st.fixed_dictionaries(
        {"name": st.just("c")},
        optional={
            "resources": st.fixed_dictionaries(
                {},
                optional={
                    "requests": st.fixed_dictionaries(
                        {},
                        optional={
                            "cpu": st.integers(0, 64_000).map(lambda m: f"{m}m"),
                            "memory": st.integers(0, 2**40),
                        },
                    )
                },
            )
        },
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, database=None, derandomize=True, deadline=None)
@given(containers=_CONTAINERS, tolerations=_TOLERATIONS, headroom=st.integers(0, 10**6))
def test_a_plain_node_with_room_always_fits(
    containers: list[dict[str, Any]], tolerations: list[dict[str, str]], headroom: int
) -> None:
    """Guards: a node with no taints and no label requirement whose allocatable covers what is used plus the pod's
    requests always takes the pod, whatever its tolerations."""
    p = pod(containers=containers, tolerations=tolerations)
    used = nodefit.Usage(cpu_milli=headroom, memory=headroom * 1024, pods=3)
    allocatable = {
        "cpu": f"{p.cpu_milli + headroom}m",
        "memory": str(p.memory + headroom * 1024),
        "pods": str(used.pods + 1),
    }
    assert nodefit.fit(p, node(allocatable=allocatable), used) is None


@settings(max_examples=150, database=None, derandomize=True, deadline=None)
@given(
    containers=_CONTAINERS,
    tolerations=_TOLERATIONS,
    effect=st.sampled_from(["NoSchedule", "NoExecute"]),
    key=st.sampled_from(["gpu", "zone", "dedicated", "example.com/team", "fresh.example.com/key"]),
)
def test_adding_an_untolerated_taint_always_refuses(
    containers: list[dict[str, Any]], tolerations: list[dict[str, str]], effect: str, key: str
) -> None:
    """Guards: a NoSchedule or NoExecute taint the pod does not tolerate refuses any node, whatever else fits, and
    the reason names that taint."""
    p = pod(containers=containers, tolerations=tolerations)
    taint = nodefit.Taint(key=key, value="untolerated-value", effect=effect)
    if any(t.tolerates(taint) for t in p.tolerations):
        return  # tolerated (an empty-key Exists toleration, or one on this key and any value): not this property
    roomy = node(allocatable={"cpu": "1000", "memory": "16Ti", "pods": "10"})
    assert nodefit.fit(p, roomy, nodefit.EMPTY) is None
    tainted = node(
        allocatable={"cpu": "1000", "memory": "16Ti", "pods": "10"},
        taints=[{"key": key, "value": "untolerated-value", "effect": effect}],
    )
    assert nodefit.fit(p, tainted, nodefit.EMPTY) == f"node(s) had untolerated taint {{{key}: untolerated-value}}"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=6) | st.sampled_from(["1Gi", "100m", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_FIELDS = st.sampled_from(
    [
        "containers",
        "initContainers",
        "tolerations",
        "affinity",
        "nodeSelector",
        "overhead",
        "volumes",
        "resources",
        "topologySpreadConstraints",
        "nodeName",
        "hostNetwork",
    ]
)


@settings(max_examples=300, database=None, derandomize=True, deadline=None)
@given(spec=st.dictionaries(_FIELDS, _JSON, max_size=4), node_spec=_JSON, node_status=_JSON)
def test_arbitrary_input_raises_only_invalid(spec: dict[str, Any], node_spec: Any, node_status: Any) -> None:
    """Guards: whatever JSON a pod or node holds, decoding either succeeds or raises `nodefit.Invalid`, and a decoded
    pair always gets an answer from `fit` (never a traceback)."""
    try:
        p = nodefit.PodNeeds.from_raw({"metadata": {"name": "p"}, "spec": spec})
        n = nodefit.NodeInfo.from_raw({"metadata": {"name": "n"}, "spec": node_spec, "status": node_status})
    except nodefit.Invalid as exc:
        assert str(exc).startswith(("Pod default/p: ", "Node n: "))
        return
    reason = nodefit.fit(p, n, nodefit.EMPTY)
    assert reason is None or isinstance(reason, str)
