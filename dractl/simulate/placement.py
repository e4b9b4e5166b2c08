"""Where a pod may go: its `spec.nodeName`, its `spec.nodeSelector` against Node labels, and
the nodes where the claims it shares with earlier pods are already usable.

Pure: no I/O and no allocation; every function returns the same answer for the same input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dractl import model


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """The node names the input knows (its Nodes, or else the nodes its slices name) and
    their labels. `has_nodes` says whether Node objects were given at all."""

    names: tuple[str, ...]
    labels: Mapping[str, Mapping[str, str]]
    has_nodes: bool

    @classmethod
    def of(cls, objects: model.Objects) -> Cluster:
        if objects.nodes:
            return cls(
                names=tuple(sorted(node.meta.name for node in objects.nodes)),
                labels={node.meta.name: node.meta.labels for node in objects.nodes},
                has_nodes=True,
            )
        names = {s.node_name for s in objects.resource_slices if s.node_name}
        names.update(d.node_name for s in objects.resource_slices for d in s.devices if d.node_name)
        return cls(names=tuple(sorted(names)), labels={}, has_nodes=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes a pod may use: None means any node; an empty tuple means none, and then
    `problem` says which rule excluded the last ones."""

    nodes: tuple[str, ...] | None
    problem: str | None = None


def _requirement_matches(requirement: model.NodeSelectorRequirement, values: Mapping[str, str]) -> bool:
    present = requirement.key in values
    value = values.get(requirement.key, "")
    match requirement.operator:
        case "In":
            return present and value in requirement.values
        case "NotIn":
            return not present or value not in requirement.values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            try:
                left, right = int(value), int(requirement.values[0])
            except (ValueError, IndexError):
                return False
            return present and (left > right if requirement.operator == "Gt" else left < right)
    return False


def selector_matches(selector: model.NodeSelector, *, name: str, labels: Mapping[str, str]) -> bool:
    """Whether a node with this name and labels is selected: terms are ORed, requirements
    ANDed, and a term without requirements selects nothing (as in core/v1). Pure."""
    fields = {"metadata.name": name}
    return any(
        (term.match_expressions or term.match_fields)
        and all(_requirement_matches(r, labels) for r in term.match_expressions)
        and all(_requirement_matches(r, fields) for r in term.match_fields)
        for term in selector.terms
    )


def nodes_of(allocation: model.AllocationResult, cluster: Cluster) -> tuple[str, ...] | None:
    """The known nodes where an allocation is usable; None when it is usable everywhere. Pure."""
    selector = allocation.node_selector
    if selector is None:
        return None
    return tuple(n for n in cluster.names if selector_matches(selector, name=n, labels=cluster.labels.get(n, {})))


def candidates(pod: model.Pod, *, allocated: Mapping[str, model.AllocationResult], cluster: Cluster) -> Candidates:
    """The nodes `pod` may use, given the allocations of its claims that are already
    allocated (by claim key). Pure.

    `spec.nodeSelector` is only checked when the input has Node objects, since labels live there.
    """
    where = f"pod {pod.meta.namespace}/{pod.meta.name}"
    nodes: tuple[str, ...] | None = None
    if pod.node_name:
        nodes = (pod.node_name,)
    if pod.node_selector and cluster.has_nodes:
        wanted = pod.node_selector.items()
        base = cluster.names if nodes is None else nodes
        nodes = tuple(n for n in base if wanted <= cluster.labels.get(n, {}).items())
        if not nodes:
            text = ", ".join(f"{k}={v}" for k, v in pod.node_selector.items())
            scope = f"its spec.nodeName {pod.node_name}" if pod.node_name else "any Node"
            return Candidates(nodes=(), problem=f"{where}: spec.nodeSelector ({text}) does not match {scope}")
    for key, allocation in allocated.items():
        usable = nodes_of(allocation, cluster)
        if usable is None:
            continue
        nodes = usable if nodes is None else tuple(n for n in nodes if n in usable)
        if not nodes:
            at = ", ".join(usable) or "no known node"
            return Candidates(
                nodes=(),
                problem=f"{where} shares ResourceClaim {key}, which is allocated on {at}, where the pod cannot run",
            )
    return Candidates(nodes=nodes)
