"""dractl's GPU-aware scheduler: picks node and devices together for pods with `schedulerName: dractl`.

What it does: watches Pods, Nodes, ResourceSlices, DeviceClasses and ResourceClaims through
informers and feeds one work queue with the keys (`namespace/name`) of unbound pods of this
scheduler; per pod (`sync_pod`) it resolves the claims (every claim must exist, named directly
or made from a template and recorded in `pod.status.resourceClaimStatuses`; otherwise the pod
waits, and is queued again when the claim it waits for changes, or the pod itself when its
record is missing), has the planner decide, has the decision written, and counts the outcome.
This module is the shell that wires the parts, each of which owns its state and its lock:

- `schedqueue.Pending`: which pods are unschedulable, refused or waiting, and which go back on
  the queue when slices, classes, nodes, claims or bound pods change;
- `schedfit.NodeFit`: the pods counted on each node and the node filter's remembered answers;
- `schedledger.Inventory` and `schedledger.Ledger`: the one long-lived `alloc.Allocator`, kept
  in step with the API: the slices, classes and nodes (`update`, before a decision when they
  changed), and every claim the API shows allocated, by dractl or by kube-scheduler (`hold`;
  `release` when it is deallocated or deleted), so nothing is given twice;
- `scheddecide.Planner`: filter, allocate and assume, one decision at a time, returning
  `Decision | Refusal | Wait`;
- `schedcommit.Committer`: the claim writes, the confirmation against the claim cache, the
  Binding, the Events and the pod's `PodScheduled` condition, and the rollback.

A pod that joins a PodGroup (either API, watched where the server serves it: `served_pod_group_apis`)
is scheduled with its gang (`_sync_gang`): once the group exists and `minCount` of its pods are
ready, the planner places every pending pod of it at once (`decide_gang`) and the committer writes
every pod's claims before binding any (`commit_gang`), all or none; one gang is decided and written
at a time (the gang lock, taken before the planner's). A refused gang says its one line on each of
its pods.

A pod no node can take gets `PodScheduled=False` (reason `Unschedulable`, kube-scheduler's
node summary plus the allocator's explanation per claim) and a Warning Event
`FailedScheduling`, written only when the message changes; it is retried when slices,
classes or nodes change, when a claim is deallocated or deleted or a claim it uses changes,
when a bound pod goes away, and every five minutes. A pod asking for what dractl cannot check (nodefit's
`unsupported`) or that cannot be read is reported the same way and not retried until it changes.
A failed attempt is retried with backoff after the committer took back what it wrote.

Invariants that span the parts: a `Decision` leaves its claims in flight in the ledger and its
pod assumed in `NodeFit` until the commit ends them (written: the cache then shows the claims
allocated and the pod bound; failed: the ledger releases what the API no longer shows and
`NodeFit` stops counting the pod); a pod assumed on a node is not decided again (`sync_pod`
returns) until the pod cache shows it. No part calls another while holding its own lock, except
the planner, whose lock (one decision at a time) is held while it calls the ledger and `NodeFit`,
and the gang lock, held while a gang is decided and written (any other part's lock may be taken
under it, none is held when it is taken): the order is gang -> planner -> ledger | node fit ->
allocator | caches, and inventory -> allocator | caches (the allocator's and the caches' locks
are leaves): no two are ever taken the other way. Decisions are serialized; the API writes of
different pods run in parallel (a gang's pods are written by the one sync that decided them).

What it must not do: touch pods of other schedulers; write anything itself (the committer
writes, and only the claim fields the scheduler owns, the pod's `PodScheduled` condition, its
Binding and Events about it); schedule before the claims already allocated in the API are held
(`start` waits for the informers first); or release devices whose allocation is still in the API.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import prometheus_client

from dractl import alloc, daemon, gang, model
from dractl.controller import loop, nodefit, schedcommit, scheddecide, schedfit, schedledger, schedplan, schedqueue
from dractl.kube import client as kube_client
from dractl.kube import events, informer, workqueue
from dractl.model import decode

log = logging.getLogger(__name__)

UNSCHEDULABLE_RETRY = 300.0
"""Seconds after which an unschedulable pod is tried again even if nothing it watches changed (kube-scheduler's
podMaxInUnschedulablePodsDuration)."""
WAIT_RETRY = 1.0
"""Seconds before a pod waiting for a claim that another decision is writing is tried again."""
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# --- Decoding and views --------------------------------------------------------------------


def decode_node(raw: Mapping[str, Any]) -> schedfit.NodeState | None:
    """One raw node as a `NodeState`, or None when the model refuses it (logged by the kube layer). Pure apart from
    logging."""
    value = kube_client.decode(raw)
    if not isinstance(value, model.Node):
        return None
    # Only what the allocator reads (name and labels): a status heartbeat then leaves the node
    # equal, so the allocator's inventory is not rebuilt for it.
    node = model.Node(meta=model.ObjectMeta(name=value.meta.name, labels=value.meta.labels))
    try:
        return schedfit.NodeState(node=node, info=nodefit.NodeInfo.from_raw(raw))
    except nodefit.Invalid as error:
        log.warning("node %s is left out of scheduling: %s", value.meta.name, error)
        return schedfit.NodeState(node=node, invalid=str(error))


def _decode_slice(raw: Mapping[str, Any]) -> model.ResourceSlice | None:
    value = kube_client.decode(raw)
    return value if isinstance(value, model.ResourceSlice) else None


def _decode_class(raw: Mapping[str, Any]) -> model.DeviceClass | None:
    value = kube_client.decode(raw)
    return value if isinstance(value, model.DeviceClass) else None


def served_pod_group_apis(client: kube_client.Client) -> tuple[model.PodGroupApi, ...]:
    """The PodGroup APIs the server serves (discovery: Kubernetes' alpha API where its runtime config turns it on,
    scheduler-plugins' CRD where it is installed). Raises `ApiError` when discovery fails. Read-only."""
    served = (
        (model.PodGroupApi.WORKLOAD, client.serves(kube_client.POD_GROUPS)),
        (model.PodGroupApi.COSCHEDULING, client.serves(kube_client.COSCHEDULING_POD_GROUPS)),
    )
    return tuple(api for api, yes in served if yes)


def decode_pod_group(raw: Mapping[str, Any]) -> model.PodGroup | str:
    """One raw PodGroup, or every problem the model finds with it as one line (fields named). Pure."""
    try:
        groups = decode.load_documents([dict(raw)], file="api").pod_groups
    except decode.DecodeError as error:
        return "; ".join(error.problems)
    return groups[0] if groups else f"PodGroup {informer.key_of(raw)} is not one of a PodGroup API dractl reads"


class _ClaimView(Mapping[str, model.ResourceClaim]):
    """One namespace's claims by name, read through from the claim cache (no copy per decision)."""

    def __init__(self, store: informer.Store[model.ResourceClaim], namespace: str) -> None:
        self._store = store
        self._namespace = namespace

    def __getitem__(self, name: str) -> model.ResourceClaim:
        found = self._store.get(f"{self._namespace}/{name}")
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        prefix = f"{self._namespace}/"
        return (key[len(prefix) :] for key in self._store.keys() if key.startswith(prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


# --- Metrics -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Metrics:
    attempts: prometheus_client.Counter
    latency: prometheus_client.Histogram
    claims_allocated: prometheus_client.Counter
    contested: prometheus_client.Counter
    unschedulable: prometheus_client.Gauge
    depth: prometheus_client.Gauge


def _metrics_for(registry: prometheus_client.CollectorRegistry) -> _Metrics:
    return daemon.metrics_once(registry, "scheduler", lambda: _build_metrics(registry))


def _build_metrics(registry: prometheus_client.CollectorRegistry) -> _Metrics:
    return _Metrics(
        attempts=prometheus_client.Counter(
            "dractl_scheduler_attempts",
            "Scheduling attempts by result: scheduled, unschedulable, error.",
            ["result"],
            registry=registry,
        ),
        latency=prometheus_client.Histogram(
            "dractl_scheduler_scheduling_duration_seconds",
            "Seconds from taking a pod off the queue to its binding (or its refusal), by result.",
            ["result"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        claims_allocated=prometheus_client.Counter(
            "dractl_scheduler_claims_allocated",
            "ResourceClaims the scheduler allocated for pods it bound.",
            registry=registry,
        ),
        contested=prometheus_client.Counter(
            "dractl_scheduler_contested",
            "Decisions taken back before their binding because another scheduler's allocation of the same devices "
            "was written first, or because the claim cache could not confirm in time that none was.",
            registry=registry,
        ),
        unschedulable=prometheus_client.Gauge(
            "dractl_scheduler_unschedulable_pods",
            "Pods of this scheduler that no node can take now (or that it refuses), waiting for a change.",
            registry=registry,
        ),
        depth=prometheus_client.Gauge(
            "dractl_scheduler_queue_depth",
            "Pod keys waiting in the scheduler's work queue.",
            registry=registry,
        ),
    )


def _failed(key: str, error: Exception) -> None:
    """Log a scheduling attempt that raised; the loop retries the pod with backoff."""
    if isinstance(error, (kube_client.ApiError, schedcommit.PodChanged, schedcommit.Contested)):
        log.info("pod %s: %s; retrying with backoff", key, error)
    else:
        log.exception("pod %s: scheduling failed; retrying with backoff", key)


# --- The scheduler -------------------------------------------------------------------------


class Scheduler:
    """The scheduler. `start()` runs it in daemon threads; `stop()` ends them (once: make a new one per leadership).

    Constructor:
    - `client`: the API client (every request goes through it).
    - `registry`: the prometheus registry for its metrics (a private one when None):
      `dractl_scheduler_attempts_total{result}`, `dractl_scheduler_scheduling_duration_seconds{result}`,
      `dractl_scheduler_claims_allocated_total`, `dractl_scheduler_contested_total`,
      `dractl_scheduler_unschedulable_pods`,
      `dractl_scheduler_queue_depth`.
    - `recorder`: where Events go (an `events.Recorder` on `client` when None): `Scheduled` on a pod it bound,
      `FailedScheduling` on one it could not.
    - `scheduler_name`: the `spec.schedulerName` of the pods it schedules.
    - `policy`: the allocation policy of the allocator it makes (ignored when `allocator` is given).
    - `workers`: worker threads (a pod is never handled by two at once; decisions are serialized).
    - `namespace`: watch the pods of one namespace only ("" = all); then only that namespace's
      pods count toward node usage (for tests and single-tenant clusters). Claims, nodes and
      slices are always watched cluster-wide: every allocated claim uses devices.
    - `queue`: the work queue (a fresh one when None; tests inject one with their own backoff).
    - `allocator`: the allocator (a fresh `alloc.Allocator` when None).
    - `sync_timeout`: seconds `start()` waits for the informers' first lists.
    - `confirm_timeout`: seconds a decision waits for the claim cache to deliver its own claim writes (`_confirm`).
    - `pod_group_apis`: the PodGroup APIs to watch (`served_pod_group_apis`: those the server serves); a pod that
      joins a PodGroup is scheduled with the rest of its gang (`_sync_gang`).
    - `topology_levels`: node label keys, widest first, whose smallest domain that holds a gang whole it goes to.

    `sync(key)` and `sync_pod(namespace, name)` may be called directly (tests do) once
    `open_ledger()` ran; one pod should be synced by one thread at a time (the queue ensures it).
    """

    def __init__(
        self,
        client: kube_client.Client,
        *,
        registry: prometheus_client.CollectorRegistry | None = None,
        recorder: events.Recorder | None = None,
        scheduler_name: str = "dractl",
        policy: alloc.Policy = alloc.Policy.BINPACK,
        workers: int = 2,
        namespace: str = "",
        queue: workqueue.WorkQueue | None = None,
        allocator: schedledger.AllocatorService | None = None,
        sync_timeout: float = 60.0,
        confirm_timeout: float = schedcommit.CONFIRM_TIMEOUT,
        pod_group_apis: Sequence[model.PodGroupApi] = (),
        topology_levels: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.scheduler_name = scheduler_name
        self.sync_timeout = sync_timeout
        self.recorder = recorder if recorder is not None else events.Recorder(client)
        # Not `queue or ...`: an empty queue has length 0 and is falsy.
        self.queue = queue if queue is not None else workqueue.WorkQueue()
        self.registry = prometheus_client.CollectorRegistry() if registry is None else registry
        self.metrics = _metrics_for(self.registry)
        self.allocator: schedledger.AllocatorService = (
            allocator
            if allocator is not None
            else alloc.Allocator(alloc.Snapshot(device_classes=(), resource_slices=()), policy=policy)
        )
        self._ledger = schedledger.Ledger(self.allocator)
        self._pending = schedqueue.Pending(self.queue)
        self.metrics.depth.set_function(lambda: float(len(self.queue)))
        self.metrics.unschedulable.set_function(lambda: float(self._pending.count()))

        self.pods: informer.Informer[schedplan.PodInfo] = informer.Informer(
            client,
            kube_client.PODS,
            decode=lambda raw: schedplan.decode_pod(raw, scheduler_name=scheduler_name),
            namespace=namespace,
            handlers=informer.Handlers(
                on_add=lambda new: self._pod_changed(None, new),
                on_update=self._pod_changed,
                on_delete=self._pod_deleted,
            ),
        )
        self.claims: informer.Informer[model.ResourceClaim] = informer.Informer(
            client,
            kube_client.RESOURCE_CLAIMS,
            decode=self._decode_claim,
            handlers=informer.Handlers(
                on_add=lambda new: self._claim_changed(None, new),
                on_update=self._claim_changed,
                on_delete=self._claim_deleted,
            ),
        )
        inventory: informer.Handlers[Any] = informer.Handlers(
            on_add=self._inventory_changed,
            on_update=lambda _, new: self._inventory_changed(new),
            on_delete=self._inventory_changed,
        )
        self.nodes: informer.Informer[schedfit.NodeState] = informer.Informer(
            client,
            kube_client.NODES,
            decode=decode_node,
            handlers=informer.Handlers(
                on_add=self._node_changed,
                on_update=lambda old, new: None if old == new else self._node_changed(new),
                on_delete=self._node_changed,
            ),
        )
        self._fit = schedfit.NodeFit(self.nodes.store)
        self.slices: informer.Informer[model.ResourceSlice] = informer.Informer(
            client, kube_client.RESOURCE_SLICES, decode=_decode_slice, handlers=inventory
        )
        self.classes: informer.Informer[model.DeviceClass] = informer.Informer(
            client, kube_client.DEVICE_CLASSES, decode=_decode_class, handlers=inventory
        )
        self._inventory = schedledger.Inventory(
            self.allocator, classes=self.classes.store, slices=self.slices.store, nodes=self.nodes.store
        )
        group_handlers: informer.Handlers[model.PodGroup] = informer.Handlers(
            on_add=self._group_changed,
            on_update=lambda _, new: self._group_changed(new),
            on_delete=self._group_deleted,
        )
        self.pod_groups: dict[model.PodGroupApi, informer.Informer[model.PodGroup]] = {}
        if model.PodGroupApi.WORKLOAD in pod_group_apis:
            self.pod_groups[model.PodGroupApi.WORKLOAD] = informer.Informer(
                client, kube_client.POD_GROUPS, decode=self._decode_group, namespace=namespace, handlers=group_handlers
            )
        if model.PodGroupApi.COSCHEDULING in pod_group_apis:
            self.pod_groups[model.PodGroupApi.COSCHEDULING] = informer.Informer(
                client,
                kube_client.COSCHEDULING_POD_GROUPS,
                decode=self._decode_group,
                namespace=namespace,
                handlers=group_handlers,
            )
        # One gang decided and written at a time, so that two syncs of its pods never place it twice; the planner's
        # lock (one decision at a time) is taken under it.
        self._gang_lock = threading.Lock()
        self._gang_refused_since: dict[str, float] = {}  # PodGroup uid -> when its gang was first refused
        self._bad_groups: dict[str, str] = {}  # "<apiVersion> <namespace>/<name>" -> why the model refuses it
        self._planner = scheddecide.Planner(
            allocator=self.allocator, ledger=self._ledger, fit=self._fit, levels=topology_levels
        )
        self._committer = schedcommit.Committer(
            client,
            recorder=self.recorder,
            claim_cache=self.claims,
            ledger=self._ledger,
            fit=self._fit,
            contested=self.metrics.contested,
            scheduler_name=scheduler_name,
            confirm_timeout=confirm_timeout,
        )
        self._loop = loop.Loop(
            name="the scheduler",
            thread_name="scheduler",
            queue=self.queue,
            informers=(self.classes, self.slices, self.nodes, self.claims, *self.pod_groups.values(), self.pods),
            sync=self.sync,
            failed=_failed,
            workers=workers,
        )

    # --- Running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the informers, wait for their first lists (up to `sync_timeout`), hold every claim the API shows
        allocated, then start the workers.

        Raises TimeoutError when the informers do not sync in time (they are stopped again).
        """
        self._loop.start_informers(self.sync_timeout)
        self.open_ledger()
        self._loop.start_workers()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._loop.wait_synced(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking pods, let the workers finish the pod in hand, stop the informers. Idempotent."""
        self._loop.stop(timeout)

    def open_ledger(self) -> None:
        """Give the allocator the current inventory and hold every allocated claim in the cache; from now on claim
        events reach the allocator. Idempotent. `start()` calls it before the first pod is scheduled."""
        self._inventory.refresh()
        self._ledger.open(self.claims.store.values())

    # --- Event handlers: they tell the parts, which enqueue keys and keep the ledger ------------

    def _pod_changed(self, old: schedplan.PodInfo | None, pod: schedplan.PodInfo) -> None:
        if pod.pending_for(self.scheduler_name):
            if old is None or schedplan.scheduling_changed(old, pod):
                self.queue.add(pod.key)
        else:
            self._pending.forget(pod.key)
        self._fit.pod_seen(pod, scheduler_name=self.scheduler_name)
        if old is not None and old.uses_node and not pod.uses_node:
            self._pending.requeue_unschedulable()  # A pod finished: its node has room again.

    def _pod_deleted(self, pod: schedplan.PodInfo) -> None:
        self._pending.forget(pod.key)
        self._fit.pod_gone(pod.key)
        if pod.uses_node:
            self._pending.requeue_unschedulable()

    def _decode_claim(self, raw: dict[str, Any]) -> model.ResourceClaim | None:
        """The claim, or None when the model refuses it; the reason is kept so a pod using it is told why."""
        value = kube_client.decode(raw)
        key = informer.key_of(raw)
        if isinstance(value, model.ResourceClaim):
            self._pending.claim_readable(key)
            return value
        try:
            kube_client.decode(raw, strict=True)
        except kube_client.BadObject as error:
            self._pending.claim_refused(key, str(error))
            self._pending.requeue_users(key, name=key.partition("/")[2], pods=self.pods.store)
        return None

    def _claim_changed(self, old: model.ResourceClaim | None, claim: model.ResourceClaim) -> None:
        freed = self._ledger.claim_changed(old, claim)
        self._pending.requeue_users(claim.key, name=claim.meta.name, pods=self.pods.store)
        if freed:
            self._pending.requeue_unschedulable()

    def _claim_deleted(self, claim: model.ResourceClaim) -> None:
        self._pending.claim_readable(claim.key)
        self._ledger.claim_deleted(claim)
        self._pending.requeue_users(claim.key, name=claim.meta.name, pods=self.pods.store)
        if claim.allocation is not None:
            self._pending.requeue_unschedulable()

    def _node_changed(self, state: schedfit.NodeState) -> None:
        self._fit.node_changed(state.node.meta.name)
        self._inventory_changed(state)

    def _decode_group(self, raw: dict[str, Any]) -> model.PodGroup | None:
        """The PodGroup, or None when the model refuses it: the reason is kept so that its pods are told why, and
        they are decided again."""
        decoded = decode_pod_group(raw)
        key = informer.key_of(raw)
        where = f"{raw.get('apiVersion')} {key}"
        if isinstance(decoded, model.PodGroup):
            self._bad_groups.pop(where, None)
            return decoded
        log.warning("PodGroup %s (%s) is left out of scheduling: %s", key, raw.get("apiVersion"), decoded)
        self._bad_groups[where] = decoded
        namespace, _, name = key.partition("/")
        for pod in self.pods.store.values():
            ref = pod.state.pod.pod_group
            if (
                ref is not None
                and ref.name == name
                and pod.namespace == namespace
                and ref.api.value == raw.get("apiVersion")
            ):
                self.queue.add(pod.key)
        return None

    def _group_changed(self, group: model.PodGroup) -> None:
        """A PodGroup appeared or changed: its pending pods are decided again."""
        for pod in self._members(group):
            if pod.pending_for(self.scheduler_name):
                self.queue.add(pod.key)

    def _group_deleted(self, group: model.PodGroup) -> None:
        """A PodGroup went: its pending pods now wait for it (they say so), and its refusals are forgotten."""
        self._gang_refused_since.pop(group.meta.uid, None)
        self._group_changed(group)

    def _members(self, group: model.PodGroup) -> list[schedplan.PodInfo]:
        """The pods of the cache that join `group` (by its API), in key order."""
        ref = model.PodGroupRef(name=group.meta.name, api=group.api)
        prefix = f"{group.meta.namespace}/"
        return sorted(
            (pod for pod in self.pods.store.values() if pod.key.startswith(prefix) and pod.state.pod.pod_group == ref),
            key=lambda pod: pod.key,
        )

    def _inventory_changed(self, _: object) -> None:
        self._inventory.changed()
        self._pending.requeue_unschedulable()

    # --- Syncs ------------------------------------------------------------------------------

    def sync(self, key: str) -> None:
        """Schedule the pod `namespace/name` if it is pending. Raises (`ApiError`) to have it retried with backoff."""
        namespace, _, name = key.partition("/")
        self.sync_pod(namespace, name)

    def sync_pod(self, namespace: str, name: str) -> None:
        """Schedule one pod: resolve its claims, decide node and devices, write claims, bind; or report why not.

        Idempotent: a pod already bound (or assumed bound), of another scheduler, or gone is
        left alone, and a pod refused again for the same reason gets no write. Raises
        `ApiError` when a write failed (after taking back what was written).
        """
        key = f"{namespace}/{name}"
        pod = self.pods.store.get(key)
        if pod is None or not pod.pending_for(self.scheduler_name):
            self._pending.forget(key)
            return
        if self._fit.assumed(key, pod.uid):
            return  # Bound by an earlier sync; the cache has not seen it yet.
        started = time.monotonic()
        refusal = schedplan.unsupported_message(pod)
        if refusal is not None:
            self._refuse(pod, scheddecide.Refusal(refusal, retry=False), started=started)
            return
        if pod.state.pod.pod_group is not None:
            self._sync_gang(pod, pod.state.pod.pod_group, started=started)
            return
        resolved = self._resolve(pod)
        if resolved.problem is not None:
            self._refuse(pod, scheddecide.Refusal(resolved.problem), started=started)
            return
        if resolved.waiting is not None:
            self._wait(pod, scheddecide.Wait(resolved.waiting, claim=resolved.claim))
            return
        self._committer.settle_doubts(resolved.claims)
        self._inventory.refresh()
        decided = self._planner.decide(pod, resolved.claims)
        if isinstance(decided, scheddecide.Wait):
            self._wait(pod, decided)
            self.queue.add_after(key, WAIT_RETRY)
            return
        if isinstance(decided, scheddecide.Refusal):
            self._refuse(pod, decided, started=started)
            return
        try:
            self._committer.commit(pod, decided)
        except Exception:
            self.metrics.attempts.labels(result="error").inc()
            raise
        self._pending.forget(key)
        self._committer.scheduled(pod, decided.node)
        self.metrics.attempts.labels(result="scheduled").inc()
        self.metrics.latency.labels(result="scheduled").observe(time.monotonic() - started)
        self.metrics.claims_allocated.inc(len(decided.allocate))
        log.info(
            "bound pod %s to node %s (%d claim(s) allocated, %d reserved)",
            key,
            decided.node,
            len(decided.allocate),
            len(decided.reserve),
        )

    def _resolve(self, pod: schedplan.PodInfo) -> schedplan.Resolved:
        bad = self._pending.bad_claims(pod.namespace)
        return schedplan.resolve_claims(pod, _ClaimView(self.claims.store, pod.namespace), bad=bad)

    def _sync_gang(self, pod: schedplan.PodInfo, ref: model.PodGroupRef, *, started: float) -> None:
        """Schedule the pending pods of the PodGroup `pod` joins, as one decision (`Planner.decide_gang`), written all
        or none (`Committer.commit_gang`); or say on each of them why not (the gang's one line).

        The gang is decided once at least `minCount` of its pods are ready (they exist, their claims exist); pods
        that join a gang already running go to its domain. A refused gang is retried as an unschedulable pod is; a
        scheduler-plugins gang refused for longer than its `scheduleTimeoutSeconds` says so on its pods, and is
        still retried. Raises `ApiError` when a write failed (after taking back what was written)."""
        name = f"PodGroup {pod.namespace}/{ref.name} ({ref.api.value})"
        groups = self.pod_groups.get(ref.api)
        if groups is None:
            problem = f"pod {pod.key} joins {name}, an API the server did not serve when this scheduler started"
            self._refuse(pod, scheddecide.Refusal(problem, retry=False), started=started)
            return
        group = groups.store.get(f"{pod.namespace}/{ref.name}")
        bad = self._bad_groups.get(f"{ref.api.value} {pod.namespace}/{ref.name}")
        if group is None and bad is not None:
            self._refuse(pod, scheddecide.Refusal(f"{name} is invalid: {bad}"), started=started)
            return
        if group is None:
            refusal = scheddecide.Refusal(f"waiting for {name} to exist (the pods of a gang wait for their PodGroup)")
            self._refuse(pod, refusal, started=started)
            return
        with self._gang_lock:
            candidates: list[scheddecide.Candidate] = []
            running: list[str] = []
            for member in self._members(group):
                node = member.node_name if member.uses_node else self._fit.node_of(member.key, member.uid)
                if node:
                    running.append(node)
                elif member.pending_for(self.scheduler_name):
                    candidate = self._candidate(member)
                    if candidate is not None:
                        candidates.append(candidate)
            if all(candidate.pod.key != pod.key for candidate in candidates):
                return  # Placed with its gang meanwhile, or waiting for a claim (`_candidate` said so).
            self._committer.settle_doubts([claim for candidate in candidates for claim in candidate.claims])
            self._inventory.refresh()
            decided = self._planner.decide_gang(group, candidates, running=running)
            if isinstance(decided, scheddecide.Wait):
                for candidate in candidates:
                    self._wait(candidate.pod, decided)
                self.queue.add_after(pod.key, WAIT_RETRY)
                return
            if isinstance(decided, scheddecide.Refusal):
                refusal = self._timed_out(group, decided)
                for candidate in candidates:
                    self._refuse(candidate.pod, refusal, started=started)
                return
            self._gang_refused_since.pop(group.meta.uid, None)
            try:
                bound = self._committer.commit_gang(decided.placed, gang=gang.describe(group))
            except Exception:
                self.metrics.attempts.labels(result="error").inc()
                raise
            finally:
                for left, message in decided.left:
                    self._refuse(left, scheddecide.Refusal(message), started=started)
        decisions = {placed.key: decision for placed, decision in decided.placed}
        for member in bound:
            decision = decisions[member.key]
            self._pending.forget(member.key)
            self._committer.scheduled(member, decision.node)
            self.metrics.attempts.labels(result="scheduled").inc()
            self.metrics.latency.labels(result="scheduled").observe(time.monotonic() - started)
            self.metrics.claims_allocated.inc(len(decision.allocate))
        log.info(
            "bound %d pod(s) of %s in %s",
            len(bound),
            gang.describe(group),
            decided.domain or "the cluster",
        )

    def _candidate(self, pod: schedplan.PodInfo) -> scheddecide.Candidate | None:
        """A pending member of a gang as the planner takes it, or None when it waits for a claim (told so)."""
        refusal = schedplan.unsupported_message(pod)
        if refusal is not None:
            return scheddecide.Candidate(pod=pod, problem=refusal)
        resolved = self._resolve(pod)
        if resolved.waiting is not None:
            self._wait(pod, scheddecide.Wait(resolved.waiting, claim=resolved.claim))
            return None
        return scheddecide.Candidate(pod=pod, claims=resolved.claims, problem=resolved.problem)

    def _timed_out(self, group: model.PodGroup, refusal: scheddecide.Refusal) -> scheddecide.Refusal:
        """The refusal of a gang, saying so once it has waited longer than its `scheduleTimeoutSeconds`."""
        now = time.monotonic()
        since = self._gang_refused_since.setdefault(group.meta.uid, now)
        timeout = group.schedule_timeout_seconds
        if timeout is None or now - since < timeout:
            return refusal
        return dataclasses.replace(
            refusal, message=f"{refusal.message} (unschedulable past its scheduleTimeoutSeconds {timeout}; retried)"
        )

    # --- Outcomes ---------------------------------------------------------------------------

    def _refuse(self, pod: schedplan.PodInfo, refusal: scheddecide.Refusal, *, started: float) -> None:
        """Report on the pod why it is not scheduled (condition and Event, only when the message changed)."""
        self._pending.refuse(pod.key, retry=refusal.retry)
        self.metrics.attempts.labels(result="unschedulable").inc()
        self.metrics.latency.labels(result="unschedulable").observe(time.monotonic() - started)
        self._committer.unschedulable(pod, refusal.message)
        if refusal.retry:
            self.queue.add_after(pod.key, UNSCHEDULABLE_RETRY)

    def _wait(self, pod: schedplan.PodInfo, wait: scheddecide.Wait) -> None:
        self._pending.wait(pod.key, claim=wait.claim)
        log.debug("pod %s: %s", pod.key, wait.reason)
