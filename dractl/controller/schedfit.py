"""The scheduler's view of the nodes: which pods count on each, and which nodes fit a pod.

What it does: `NodeFit` counts pods on nodes (bound ones as the pod cache shows them, and those
a decision assumed before the cache shows them bound), keeps each node's summed usage current
per change (a decision does not add up every pod of the cluster), and answers the node filter
(`nodefit`) for a pod: its answers are remembered per pod shape and brought up to date by
checking again only the nodes whose usage or object changed since, so a burst of like pods
costs one `nodefit` pass per node, not one per pod and node.

What it must not do: talk to the API, decide a placement, or touch the allocator. `NodeFit`
guards its own state with its own lock; the planner's lock may be held when it is taken, and
only the node cache's lock (a leaf) is taken under it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Sequence

from dractl import model
from dractl.controller import nodefit, schedplan
from dractl.kube import informer
from dractl.model import nodes as model_nodes

FIT_CACHE_LIMIT = 200_000
"""Remembered node-filter answers (pod shapes x nodes); past this the cache starts over."""
CHANGE_LOG_LIMIT = 100_000
"""Node changes remembered for bringing the node filter's answers up to date; past this the log starts over (and
every pod shape's answers are computed afresh once)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeState:
    """A node as the scheduler sees it: the model's node (for the allocator) and what the node filter reads.

    `info` is None when the node filter cannot read the node; `invalid` then says why (the node
    is left out of scheduling and logged).
    """

    node: model.Node
    info: nodefit.NodeInfo | None = None
    invalid: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Placed:
    """A pod counted on a node: seen bound in the cache, or `assumed` (bound by this scheduler, cache behind)."""

    uid: str
    needs: nodefit.PodNeeds  # with node_name set to the node
    assumed: bool


@dataclasses.dataclass(slots=True)
class _ShapeFit:
    """The node filter's answers for one pod shape over `infos`, current up to change number `epoch`: the nodes
    that fail with their reasons, and the others in `infos` order."""

    infos: tuple[nodefit.NodeInfo, ...]
    epoch: int
    unfit: dict[str, str]
    feasible: tuple[str, ...]


def _shape(needs: nodefit.PodNeeds) -> Hashable:
    """Everything of a pod that the node filter reads, as a key: pods of one Deployment share it. Pure."""
    return (
        needs.node_name,
        tuple(sorted(needs.node_selector.items())),
        needs.required_terms,
        needs.tolerations,
        needs.cpu_milli,
        needs.memory,
        needs.pods,
        needs.host_ports,
    )


class NodeFit:
    """Pods counted on nodes and the node filter's remembered answers, over the node cache `nodes`. Thread-safe."""

    def __init__(self, nodes: informer.Store[NodeState]) -> None:
        self._nodes = nodes
        self._lock = threading.Lock()  # guards every field below
        # Pods counted on nodes, by pod key, and per node with the node's summed usage.
        self._placed: dict[str, _Placed] = {}
        self._node_pods: dict[str, dict[str, nodefit.PodNeeds]] = {}
        self._node_used: dict[str, nodefit.Usage] = {}
        # The node filter's answers per pod shape (`_ShapeFit`), brought up to date by re-checking only the
        # nodes changed since: `_changes` logs the name of each node whose usage or object changed, change
        # number `_epoch` being the last (`_changes[i]` is change number `_changes_base + i + 1`).
        self._epoch = 0
        self._changes: list[str] = []
        self._changes_base = 0
        self._fits: dict[Hashable, _ShapeFit] = {}
        self._node_infos: tuple[nodefit.NodeInfo, ...] | None = None
        self._info_by_name: dict[str, nodefit.NodeInfo] = {}

    # --- Pods on nodes ------------------------------------------------------------------------

    def pod_seen(self, pod: schedplan.PodInfo, *, scheduler_name: str) -> None:
        """Count the pod as the pod cache shows it: on its node while it uses one, else not at all; a pod this
        scheduler assumed stays counted while the cache still shows it unbound. Idempotent."""
        with self._lock:
            placed = self._placed.get(pod.key)
            if pod.uses_node and pod.needs is not None:
                seen = _Placed(uid=pod.uid, needs=pod.needs, assumed=False)
                if placed != seen:
                    self._place(pod.key, seen)
            elif placed is not None and not (
                placed.assumed and placed.uid == pod.uid and pod.pending_for(scheduler_name)
            ):
                # Finished, or replaced by a pod of the same name.
                self._unplace(pod.key)

    def pod_gone(self, key: str) -> None:
        """The pod was deleted: it counts on no node. Idempotent."""
        with self._lock:
            self._unplace(key)

    def assumed(self, key: str, uid: str) -> bool:
        """Whether a decision assumed this pod (this uid) on a node that the cache does not show bound yet."""
        with self._lock:
            placed = self._placed.get(key)
        return placed is not None and placed.assumed and placed.uid == uid

    def node_of(self, key: str, uid: str) -> str | None:
        """The node this pod (this uid) counts on, bound or assumed; None when it counts on none."""
        with self._lock:
            placed = self._placed.get(key)
        return placed.needs.node_name if placed is not None and placed.uid == uid else None

    def assume(self, key: str, *, uid: str, needs: nodefit.PodNeeds) -> None:
        """Count the pod on `needs.node_name` before the cache shows it bound (a decision was made for it)."""
        with self._lock:
            self._place(key, _Placed(uid=uid, needs=needs, assumed=True))

    def unassume(self, key: str, uid: str) -> None:
        """Stop counting a pod its decision was taken back for, unless the cache has shown it bound meanwhile."""
        with self._lock:
            placed = self._placed.get(key)
            if placed is not None and placed.assumed and placed.uid == uid:
                self._unplace(key)

    def usage(self) -> dict[str, nodefit.Usage]:
        """Each node's summed usage now (a fresh dict)."""
        with self._lock:
            return dict(self._node_used)

    def _bump(self, node: str) -> None:
        """The node's usage or object changed: the node filter's answers for it are stale. Under `_lock`."""
        if len(self._changes) >= CHANGE_LOG_LIMIT:
            self._changes.clear()
            self._changes_base = self._epoch
        self._epoch += 1
        self._changes.append(node)

    def _place(self, key: str, placed: _Placed) -> None:
        """Count a pod on its node (replacing how it was counted before). Under `_lock`."""
        self._unplace(key)
        node = placed.needs.node_name
        self._bump(node)
        self._placed[key] = placed
        self._node_pods.setdefault(node, {})[key] = placed.needs
        self._node_used[node] = self._node_used.get(node, nodefit.EMPTY).plus(placed.needs)

    def _unplace(self, key: str) -> None:
        """Stop counting a pod on its node. Under `_lock`."""
        placed = self._placed.pop(key, None)
        if placed is None:
            return
        node = placed.needs.node_name
        self._bump(node)
        pods = self._node_pods.get(node, {})
        pods.pop(key, None)
        if pods:
            self._node_used[node] = nodefit.usage(pods.values())
        else:
            self._node_pods.pop(node, None)
            self._node_used.pop(node, None)

    # --- The node filter ----------------------------------------------------------------------

    def cluster(self) -> model_nodes.Cluster:
        """The nodes the filter reads (not those left out as invalid) and their labels, for topology domains."""
        states = [state for state in self._nodes.values() if state.info is not None]
        return model_nodes.Cluster(
            names=tuple(sorted(state.node.meta.name for state in states)),
            labels={state.node.meta.name: state.node.meta.labels for state in states},
            has_nodes=True,
        )

    def node_changed(self, name: str) -> None:
        """A node was added, changed or deleted: the set of nodes is read again, and the node's answers are stale."""
        with self._lock:
            self._bump(name)
            self._node_infos = None

    def filter(self, needs: nodefit.PodNeeds) -> tuple[Sequence[str], dict[str, str], tuple[nodefit.NodeInfo, ...]]:
        """`nodefit` over every node: the feasible names (in node order), the reasons of the rest (a fresh dict the
        caller may change), the nodes. Answers are remembered per pod shape and brought up to date by checking again
        only the nodes whose usage or object changed since (all of them when the nodes themselves changed). Usage
        counts the pods bound to each node and the pods this scheduler assumed that the cache still shows unbound."""
        shape = _shape(needs)
        with self._lock:
            infos = self._node_infos
            if infos is None:
                infos = self._node_infos = tuple(state.info for state in self._nodes.values() if state.info is not None)
                self._info_by_name = {info.name: info for info in infos}
            fit = self._fits.get(shape)
            if fit is None or fit.infos is not infos or fit.epoch < self._changes_base:
                if fit is None and (len(self._fits) + 1) * len(infos) > FIT_CACHE_LIMIT:
                    self._fits.clear()
                unfit: dict[str, str] = {}
                for info in infos:
                    reason = nodefit.fit(needs, info, self._node_used.get(info.name, nodefit.EMPTY))
                    if reason is not None:
                        unfit[info.name] = reason
                fit = self._fits[shape] = _ShapeFit(
                    infos=infos,
                    epoch=self._epoch,
                    unfit=unfit,
                    feasible=tuple(info.name for info in infos if info.name not in unfit),
                )
            elif fit.epoch != self._epoch:
                flipped = False
                for name in set(self._changes[fit.epoch - self._changes_base :]):
                    changed = self._info_by_name.get(name)
                    if changed is None:
                        continue  # Not a node the filter reads (gone, or left out as invalid).
                    reason = nodefit.fit(needs, changed, self._node_used.get(name, nodefit.EMPTY))
                    was = fit.unfit.get(name)
                    if reason is None:
                        fit.unfit.pop(name, None)
                    else:
                        fit.unfit[name] = reason
                    flipped = flipped or (was is None) != (reason is None)
                if flipped:
                    fit.feasible = tuple(info.name for info in infos if info.name not in fit.unfit)
                fit.epoch = self._epoch
            return fit.feasible, dict(fit.unfit), infos
