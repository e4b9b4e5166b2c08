"""Where a pod may go: its `spec.nodeName`, its `spec.nodeSelector` against Node labels, and
the nodes where the claims it shares with earlier pods are already usable. Node discovery and
node-selector matching are `model.nodes`'s, shared with the allocator. Shared by `dractl simulate`
and `dractl explain` (which may not import each other), hence here in the model layer.

Pure: no I/O and no allocation; every function returns the same answer for the same input.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping

from dractl import model
from dractl.model import nodes as model_nodes

Cluster = model_nodes.Cluster
"""The nodes the input knows and their labels (see `model.nodes.discover`)."""


def known_nodes(objects: model.Objects) -> Cluster:
    """The input's nodes: its Node objects, or else the nodes its slices name. Pure."""
    return model_nodes.discover(nodes=objects.nodes, slices=objects.resource_slices)


def _known(cluster: Cluster, name: str) -> bool:
    at = bisect.bisect_left(cluster.names, name)
    return at < len(cluster.names) and cluster.names[at] == name


@dataclasses.dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes a pod may use: None means any node; an empty tuple means none, and then
    `problem` says which rule excluded the last ones."""

    nodes: tuple[str, ...] | None
    problem: str | None = None


def nodes_of(allocation: model.AllocationResult, cluster: Cluster) -> tuple[str, ...] | None:
    """The known nodes where an allocation is usable; None when it is usable everywhere. Pure."""
    selector = allocation.node_selector
    if selector is None:
        return None
    named = model_nodes.named_nodes(selector)
    if named is not None:
        # The allocator's node-local selector pins names: no need to try every node.
        pinned = (n for n in named if _known(cluster, n))
        return tuple(sorted(n for n in pinned if _selects(selector, cluster, n)))
    return tuple(n for n in cluster.names if _selects(selector, cluster, n))


def _selects(selector: model.NodeSelector, cluster: Cluster, name: str) -> bool:
    return model_nodes.selector_matches(selector, name=name, labels=cluster.labels_of(name))


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
