"""Where a pod may run: nodeName, nodeSelector against Node labels, and shared claims already allocated."""

from __future__ import annotations

import pytest
from simulate_manifests import CLASS, CLUSTER, SLICES, load, pod

from dractl import model
from dractl.simulate import placement


def _selector(*terms: model.NodeSelectorTerm) -> model.NodeSelector:
    return model.NodeSelector(terms=terms)


def _expr(key: str, operator: str, *values: str) -> model.NodeSelectorTerm:
    return model.NodeSelectorTerm(match_expressions=(model.NodeSelectorRequirement(key=key, operator=operator, values=values),))


def _named(node: str) -> model.NodeSelector:
    field = model.NodeSelectorRequirement(key="metadata.name", operator="In", values=(node,))
    return _selector(model.NodeSelectorTerm(match_fields=(field,)))


def _on(node: str) -> model.AllocationResult:
    return model.AllocationResult(node_selector=_named(node))


LABELS = {"zone": "a", "gpus": "8"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (_selector(_expr("zone", "In", "a", "b")), True),
        (_selector(_expr("zone", "In", "b")), False),
        (_selector(_expr("zone", "NotIn", "b")), True),
        (_selector(_expr("missing", "NotIn", "b")), True),
        (_selector(_expr("zone", "Exists")), True),
        (_selector(_expr("zone", "DoesNotExist")), False),
        (_selector(_expr("gpus", "Gt", "4")), True),
        (_selector(_expr("gpus", "Lt", "4")), False),
        (_selector(_expr("zone", "Gt", "4")), False),
        (_selector(_expr("zone", "In", "b"), _expr("gpus", "Exists")), True),
        (_selector(model.NodeSelectorTerm()), False),
        (_named("node-1"), True),
        (_named("node-2"), False),
    ],
    ids=["in", "not-in-values", "notin", "notin-absent-key", "exists", "does-not-exist", "gt", "lt",
         "gt-non-integer", "terms-ored", "empty-term-selects-nothing", "match-fields-name", "match-fields-other-name"],
)
def test_selector_matches_like_core_v1(selector: model.NodeSelector, expected: bool) -> None:
    """Guards: NodeSelector semantics: ORed terms, ANDed requirements, every operator, matchFields on metadata.name."""
    assert placement.selector_matches(selector, name="node-1", labels=LABELS) is expected


def test_no_constraints_means_any_node() -> None:
    """Guards: a pod without nodeName, nodeSelector or allocated shared claims may use any node (None)."""
    objects = load(CLUSTER, pod("p", templates={"g": "t"}))
    assert placement.candidates(objects.pods[0], allocated={}, cluster=placement.Cluster.of(objects)) == placement.Candidates(nodes=None)


def test_node_name_and_node_selector_narrow_the_nodes() -> None:
    """Guards: spec.nodeName pins the pod; spec.nodeSelector keeps the Nodes whose labels match."""
    objects = load(CLUSTER, pod("named", templates={"g": "t"}, extra="nodeName: node-b"), pod("selected", templates={"g": "t"}, extra="nodeSelector: {pool: large}"))
    cluster = placement.Cluster.of(objects)
    named, selected = objects.pods
    assert placement.candidates(named, allocated={}, cluster=cluster).nodes == ("node-b",)
    assert placement.candidates(selected, allocated={}, cluster=cluster).nodes == ("node-b",)


def test_node_selector_matching_no_node_is_a_problem() -> None:
    """Guards: a nodeSelector that matches no Node leaves no candidates and says which selector."""
    objects = load(CLUSTER, pod("p", templates={"g": "t"}, extra="nodeSelector: {pool: huge}"))
    result = placement.candidates(objects.pods[0], allocated={}, cluster=placement.Cluster.of(objects))
    assert result.nodes == ()
    assert result.problem == "pod default/p: spec.nodeSelector (pool=huge) does not match any Node"


def test_node_selector_is_ignored_without_nodes() -> None:
    """Guards: without Node objects there are no labels, so nodeSelector does not restrict the pod."""
    objects = load(CLASS, SLICES, pod("p", templates={"g": "t"}, extra="nodeSelector: {pool: huge}"))
    cluster = placement.Cluster.of(objects)
    assert not cluster.has_nodes
    assert placement.candidates(objects.pods[0], allocated={}, cluster=cluster).nodes is None


def test_allocated_shared_claim_pins_the_pod() -> None:
    """Guards: a claim already allocated on a node pins the pod there, and a conflicting nodeName is explained."""
    objects = load(CLUSTER, pod("p", claims={"s": "shared"}), pod("q", claims={"s": "shared"}, extra="nodeName: node-a"))
    cluster = placement.Cluster.of(objects)
    free, named = objects.pods
    assert placement.candidates(free, allocated={"default/shared": _on("node-b")}, cluster=cluster).nodes == ("node-b",)
    assert placement.candidates(free, allocated={"default/shared": model.AllocationResult()}, cluster=cluster).nodes is None
    conflict = placement.candidates(named, allocated={"default/shared": _on("node-b")}, cluster=cluster)
    assert conflict.nodes == ()
    assert conflict.problem == "pod default/q shares ResourceClaim default/shared, which is allocated on node-b, where the pod cannot run"


def test_cluster_without_nodes_takes_node_names_from_slices() -> None:
    """Guards: without Node objects the known nodes are those the slices name, sorted."""
    objects = load(CLASS, SLICES)
    assert placement.Cluster.of(objects).names == ("node-a", "node-b")
