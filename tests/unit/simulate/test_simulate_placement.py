"""Where a pod may run: nodeName, nodeSelector against Node labels, and shared claims already allocated."""

from __future__ import annotations

from support.simulate_manifests import CLASS, CLUSTER, SLICES, load, pod

from dractl import model
from dractl.model import placement


def _named(node: str) -> model.NodeSelector:
    field = model.NodeSelectorRequirement(key="metadata.name", operator="In", values=(node,))
    return model.NodeSelector(terms=(model.NodeSelectorTerm(match_fields=(field,)),))


def _on(node: str) -> model.AllocationResult:
    return model.AllocationResult(node_selector=_named(node))


def test_no_constraints_means_any_node() -> None:
    """Guards: a pod without nodeName, nodeSelector or allocated shared claims may use any node (None)."""
    objects = load(CLUSTER, pod("p", templates={"g": "t"}))
    assert placement.candidates(
        objects.pods[0], allocated={}, cluster=placement.known_nodes(objects)
    ) == placement.Candidates(nodes=None)


def test_node_name_and_node_selector_narrow_the_nodes() -> None:
    """Guards: spec.nodeName pins the pod; spec.nodeSelector keeps the Nodes whose labels match."""
    objects = load(
        CLUSTER,
        pod("named", templates={"g": "t"}, extra="nodeName: node-b"),
        pod("selected", templates={"g": "t"}, extra="nodeSelector: {pool: large}"),
    )
    cluster = placement.known_nodes(objects)
    named, selected = objects.pods
    assert placement.candidates(named, allocated={}, cluster=cluster).nodes == ("node-b",)
    assert placement.candidates(selected, allocated={}, cluster=cluster).nodes == ("node-b",)


def test_node_selector_matching_no_node_is_a_problem() -> None:
    """Guards: a nodeSelector that matches no Node leaves no candidates and says which selector."""
    objects = load(CLUSTER, pod("p", templates={"g": "t"}, extra="nodeSelector: {pool: huge}"))
    result = placement.candidates(objects.pods[0], allocated={}, cluster=placement.known_nodes(objects))
    assert result.nodes == ()
    assert result.problem == "pod default/p: spec.nodeSelector (pool=huge) does not match any Node"


def test_node_selector_is_ignored_without_nodes() -> None:
    """Guards: without Node objects there are no labels, so nodeSelector does not restrict the pod."""
    objects = load(CLASS, SLICES, pod("p", templates={"g": "t"}, extra="nodeSelector: {pool: huge}"))
    cluster = placement.known_nodes(objects)
    assert not cluster.has_nodes
    assert placement.candidates(objects.pods[0], allocated={}, cluster=cluster).nodes is None


def test_allocated_shared_claim_pins_the_pod() -> None:
    """Guards: a claim already allocated on a node pins the pod there, and a conflicting nodeName is explained."""
    objects = load(
        CLUSTER, pod("p", claims={"s": "shared"}), pod("q", claims={"s": "shared"}, extra="nodeName: node-a")
    )
    cluster = placement.known_nodes(objects)
    free, named = objects.pods
    assert placement.candidates(free, allocated={"default/shared": _on("node-b")}, cluster=cluster).nodes == ("node-b",)
    assert (
        placement.candidates(free, allocated={"default/shared": model.AllocationResult()}, cluster=cluster).nodes
        is None
    )
    conflict = placement.candidates(named, allocated={"default/shared": _on("node-b")}, cluster=cluster)
    assert conflict.nodes == ()
    assert (
        conflict.problem
        == "pod default/q shares ResourceClaim default/shared, which is allocated on node-b, where the pod cannot run"
    )


def test_cluster_without_nodes_takes_node_names_from_slices() -> None:
    """Guards: without Node objects the known nodes are those the slices name, sorted."""
    objects = load(CLASS, SLICES)
    assert placement.known_nodes(objects).names == ("node-a", "node-b")
