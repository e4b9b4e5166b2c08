"""The scheduler's writes: a decision written to the API and the pod bound, or all of it taken back.

What it does: `Committer.commit` writes a `scheddecide.Decision`: per claim to allocate the
delete-protection finalizer, then `status.allocation` with the pod in `status.reservedFor`, each
with a resourceVersion precondition (the finalizer through `kube.finalizers`, which leaves the
claim's spec as stored); allocated claims get the pod added to `reservedFor`. Twice, after the
finalizers and after the allocations, it waits for the claim cache to deliver the last of those
writes (so every claim write made before it is held by the allocator) and asks the ledger whether
another scheduler's allocation holds one of the same devices (`Contested`). Then it binds the pod
(`pods/binding`) at the resourceVersion the decision was made from; if the pod changed since, it
reads it live and binds at that version only if it still records exactly the claims the decision
used (`PodChanged` otherwise). On any failure it takes back what was written (the pod's entry,
the allocation and the finalizer this attempt added), has the ledger give back the devices no
longer allocated in the API and the node filter stop counting the pod, and says on the pod which
step failed (`PodScheduled=False, SchedulerError` and a Warning Event). `commit_gang` does the
same for the pods of a gang: every pod's claims first, taken back for all when one fails, and
only then the bindings. It also writes what the
scheduler says about a pod otherwise: the Normal Event `Scheduled` once bound, and why a pod is
unschedulable (the condition and a Warning Event `FailedScheduling`, only when the message
changes); and it reads the claims whose rollback left their state unknown (`settle_doubts`).

What it must not do: decide (it writes what `scheddecide` decided, nothing else), keep state of
its own beyond its settings, or write anything but the claim fields the scheduler owns
(finalizer, allocation, reservedFor), the pod's `PodScheduled` condition, its Binding and Events
about it. No claim stays allocated for a pod that was not bound, and no pod is bound with a
claim it does not record.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import prometheus_client

from dractl import alloc, model
from dractl.controller import claims, scheddecide, schedfit, schedledger, schedplan
from dractl.kube import client as kube_client
from dractl.kube import events, finalizers, informer

log = logging.getLogger(__name__)

ROLLBACK_ATTEMPTS = 5
"""How often taking back one claim's writes is tried when the claim keeps changing underneath (409)."""
CONFIRM_TIMEOUT = 10.0
"""Seconds a decision waits for the claim cache to deliver its own claim writes (finalizers, then allocations); past
it the decision is taken back and the pod retried."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Attempt:
    """A claim this decision started writing: whether it allocated it and whether it added the finalizer."""

    claim: model.ResourceClaim
    allocated_here: bool
    finalizer_added: bool


@dataclasses.dataclass(slots=True)
class _Progress:
    """How far a decision's writes got: the claims it started writing, and the step at hand (for the message)."""

    attempts: list[_Attempt] = dataclasses.field(default_factory=list)
    step: str = ""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version(stored: Mapping[str, Any], fallback: str) -> str:
    return str((stored.get("metadata") or {}).get("resourceVersion") or fallback)


class Contested(Exception):
    """A claim this decision allocated holds a device (or counter) that another scheduler's allocation holds too,
    or the claim cache could not confirm in time that none does: the decision is taken back and the pod retried."""


class PodChanged(Exception):
    """The pod, read live when its Binding was refused, is not the one the decision was made for (another claim
    recorded, replaced, bound, being deleted): the decision is taken back and the pod retried."""


class Committer:
    """Writes decisions and what the scheduler says about pods. Thread-safe: commits of different pods run in
    parallel; one pod is committed by one thread at a time.

    Constructor:
    - `client`: the API client; `recorder`: where Events go.
    - `claim_cache`: the claim informer, whose cache `commit` waits for (`wait_past`).
    - `ledger`, `fit`: told when a decision is written or taken back.
    - `contested`: counts decisions taken back by `_confirm`.
    - `scheduler_name`: whose pods it reads back when saying why an attempt failed.
    - `confirm_timeout`: seconds a decision waits for the claim cache to deliver its own claim writes (`_confirm`).
    """

    def __init__(
        self,
        client: kube_client.Client,
        *,
        recorder: events.Recorder,
        claim_cache: informer.Informer[model.ResourceClaim],
        ledger: schedledger.Ledger,
        fit: schedfit.NodeFit,
        contested: prometheus_client.Counter,
        scheduler_name: str,
        confirm_timeout: float = CONFIRM_TIMEOUT,
    ) -> None:
        self._client = client
        self._recorder = recorder
        self._claim_cache = claim_cache
        self._ledger = ledger
        self._fit = fit
        self._contested = contested
        self._scheduler_name = scheduler_name
        self.confirm_timeout = confirm_timeout

    def scheduled(self, pod: schedplan.PodInfo, node: str) -> None:
        """Say on the pod that it is bound to `node` (kube-scheduler's Normal Event `Scheduled`)."""
        ref = events.ObjectRef.of(pod.state.pod.meta, api_version="v1", kind="Pod")
        self._recorder.event(
            ref, type=events.NORMAL, reason=schedplan.SCHEDULED, message=schedplan.scheduled_message(pod, node)
        )

    def unschedulable(self, pod: schedplan.PodInfo, message: str) -> None:
        """Say on the pod why it is not scheduled (`PodScheduled=False, Unschedulable` and a Warning Event), only
        when the message changed. Raises `ApiError` when the condition cannot be written."""
        patch = schedplan.condition_patch(pod, message, now=_now())
        if patch is not None:
            self._client.patch(kube_client.PODS, pod.name, namespace=pod.namespace, subresource="status", patch=patch)
            self._warn(pod, message)
            log.info("pod %s is unschedulable: %s", pod.key, message)

    def commit(self, pod: schedplan.PodInfo, decision: scheddecide.Decision) -> None:
        """Write the decision: the finalizer of each claim to allocate, then (`_confirm`: no allocation written
        before them holds the same devices) their allocations, reservations, then (`_confirm` again, for allocations
        written meanwhile) the binding, which the API server accepts only while the pod records the claims the
        decision used (`_bind`).

        On any failure everything written is taken back (`_roll_back`), the pod's `PodScheduled` condition and a
        Warning Event say which step failed and why, and the error is raised.
        """
        progress = _Progress()
        try:
            self._write(pod, decision, progress)
            progress.step = f"binding to node {decision.node}"
            self._bind(pod, decision.node)
        except Exception as error:
            self._roll_back(pod, decision, progress.attempts)
            self._report_failure(pod, f"scheduling on node {decision.node} failed while {progress.step}: {error}")
            raise
        finally:
            self._ledger.end(claim for claim, _ in decision.allocate)

    def commit_gang(
        self, placed: Sequence[tuple[schedplan.PodInfo, scheddecide.Decision]], *, gang: str
    ) -> list[schedplan.PodInfo]:
        """Write a gang's decisions all or none, then bind its pods; the pods bound come back.

        First every pod's claim writes (as `commit`, each confirmed), so that no pod of the gang is bound before
        every placed pod has its devices written: when one of them fails, every pod's writes are taken back, each
        pod says which step of which pod failed, and the error is raised. Then the bindings: a pod whose binding
        fails has its own writes taken back and says why (it joins the gang, which has its places, on a later
        sync), and the first such error is raised once the others are bound. The ledger keeps every claim of the
        gang in flight until all of that is done, so no other decision is given their devices meanwhile.
        """
        written: list[tuple[schedplan.PodInfo, scheddecide.Decision, _Progress]] = []
        try:
            try:
                for pod, decision in placed:
                    written.append((pod, decision, _Progress()))
                    self._write(pod, decision, written[-1][2])
            except Exception as error:
                failed, _, progress = written[-1]
                message = f"{gang}: pod {failed.key} failed while {progress.step}: {error}; no pod of it is bound"
                started = {pod.key: progress.attempts for pod, _, progress in written}
                for pod, decision in reversed(placed):  # those not started give back their devices too
                    self._roll_back(pod, decision, started.get(pod.key, []))
                for pod, _ in placed:
                    self._report_failure(pod, message)
                raise
            bound: list[schedplan.PodInfo] = []
            first: Exception | None = None
            for pod, decision, progress in written:
                try:
                    self._bind(pod, decision.node)
                    bound.append(pod)
                except Exception as error:  # noqa: BLE001 (the others are bound all the same; the first is raised)
                    self._roll_back(pod, decision, progress.attempts)
                    self._report_failure(pod, f"{gang}: binding to node {decision.node} failed: {error}")
                    first = first or error
            if first is not None:
                raise first
            return bound
        finally:
            self._ledger.end(claim for _, decision in placed for claim, _ in decision.allocate)

    def _write(self, pod: schedplan.PodInfo, decision: scheddecide.Decision, progress: _Progress) -> None:
        """The claim writes of a decision (finalizers, `_confirm`, allocations and reservations, `_confirm`), each
        started one recorded in `progress.attempts` and the step at hand in `progress.step`. Raises on a failure;
        the caller takes back what `progress` records."""
        attempts = progress.attempts
        checking = "checking that no other scheduler allocated the same devices first"
        written = ""  # the resourceVersion of the last claim write
        versions: list[str] = []
        for claim, _ in decision.allocate:
            added = schedplan.needs_finalizer(claim)
            attempts.append(_Attempt(claim, allocated_here=True, finalizer_added=added))
            version = claim.meta.resource_version
            if added:
                progress.step = f"adding the finalizer to ResourceClaim {claim.key}"
                if schedplan.finalizer_by_patch(claim):
                    stored = finalizers.add_with_patch(
                        self._client,
                        kube_client.RESOURCE_CLAIMS,
                        claim.meta.name,
                        namespace=claim.meta.namespace,
                        resource_version=version,
                        finalizers=claim.meta.finalizers,
                        add=claims.DELETE_PROTECTION_FINALIZER,
                    )
                else:
                    stored = finalizers.change(
                        self._client,
                        kube_client.RESOURCE_CLAIMS,
                        claim.meta.name,
                        namespace=claim.meta.namespace,
                        resource_version=version,
                        add=claims.DELETE_PROTECTION_FINALIZER,
                    )
                if stored is None:  # Someone else added it meanwhile: it is not ours to take back.
                    attempts[-1] = _Attempt(claim, allocated_here=True, finalizer_added=False)
                else:
                    version = written = _version(stored, version)
            versions.append(version)
        if written:
            # An overlap with what was written before the finalizers is found before any allocation is written:
            # taking back an allocation of a device kube-scheduler holds too makes kube-scheduler forget that
            # device (it tracks allocated devices as a set), and it may then give the device a third time.
            progress.step = checking
            self._confirm(decision, written=written)
        for (claim, allocation), version in zip(decision.allocate, versions, strict=True):
            progress.step = f"writing the allocation of ResourceClaim {claim.key}"
            stored = self._client.patch(
                kube_client.RESOURCE_CLAIMS,
                claim.meta.name,
                namespace=claim.meta.namespace,
                subresource="status",
                patch=schedplan.allocation_patch(claim, allocation, pod, resource_version=version),
            )
            written = _version(stored, "")
        for claim in decision.reserve:
            attempts.append(_Attempt(claim, allocated_here=False, finalizer_added=False))
            progress.step = f"reserving ResourceClaim {claim.key}"
            self._client.patch(
                kube_client.RESOURCE_CLAIMS,
                claim.meta.name,
                namespace=claim.meta.namespace,
                subresource="status",
                patch=schedplan.reservation_patch(claim, pod),
            )
        if decision.allocate:
            progress.step = checking
            self._confirm(decision, written=written)

    def _confirm(self, decision: scheddecide.Decision, *, written: str) -> None:
        """Make sure no other scheduler gave away a device of the decision before its allocations were written.

        Waits (at most `confirm_timeout`) until the claim cache has delivered every claim write up to `written`, the
        resourceVersion of the decision's last claim write (its finalizers, then its allocations): a watch delivers
        a resource's writes in the store's order, so every allocation written before it is then held by the
        allocator (`_claim_changed`), which tells whether one overlaps what the decision's claims hold. Raises
        `Contested` when one does (whichever was written first: kube-scheduler never takes its allocation back, so
        dractl's goes), or when the cache did not catch up in time. A version that is not an integer (the API's
        contract calls them opaque; etcd-backed servers give integers) cannot be ordered: then only what the cache
        holds already is checked.
        """
        if written.isdigit() and not self._claim_cache.wait_past(written, timeout=self.confirm_timeout):
            self._contested.inc()
            raise Contested(
                f"the claim cache did not show the write at resourceVersion {written} within "
                f"{self.confirm_timeout:g}s, so another scheduler's allocation written before it may hold its devices"
            )
        for claim, _ in decision.allocate:
            problem = self._ledger.contested(claim)
            if problem is not None:
                self._contested.inc()
                raise Contested(f"ResourceClaim {claim.key}: {problem} (allocated by another scheduler)")

    def _bind(self, pod: schedplan.PodInfo, node: str) -> None:
        """Bind the pod at the resourceVersion the decision was made from, so the API server refuses the Binding if
        the pod changed since (a claim recorded anew by kube-controller-manager, for one): no extra read when
        nothing changed. When the Binding is refused, the pod is read live: bound to `node` already (a Binding whose
        answer was lost), done; refused as a conflict (the pod changed), the Binding is sent once more at the live
        version if the pod is still the same, unbound, not being deleted and records exactly the claims the
        decision used, else `PodChanged` is raised. Raises `ApiError` otherwise."""
        version = pod.state.pod.meta.resource_version
        for retry in (False, True):
            try:
                self._client.create(
                    kube_client.PODS,
                    schedplan.binding(pod, node, resource_version=version),
                    namespace=pod.namespace,
                    name=pod.name,
                    subresource="binding",
                )
                return
            except kube_client.ApiError as error:
                try:
                    live = self._client.get(kube_client.PODS, pod.name, namespace=pod.namespace)
                except kube_client.ApiError:
                    live = {}
                meta, spec = live.get("metadata") or {}, live.get("spec") or {}
                if meta.get("uid") == pod.uid and spec.get("nodeName") == node:
                    return
                if retry or not live or not isinstance(error, kube_client.Conflict):
                    raise
                problem = schedplan.changed_since(pod.state, claims.decode_pod(live))
                if problem is not None:
                    raise PodChanged(problem) from error
                version = str(meta.get("resourceVersion") or "")

    def _roll_back(self, pod: schedplan.PodInfo, decision: scheddecide.Decision, attempts: Sequence[_Attempt]) -> None:
        """Take back the claim writes of a failed decision and give back the devices no longer allocated in the API.

        A claim whose allocation could not be taken back keeps its hold (the API still says its
        devices are used); the claim lifecycle controller or a later sync of the pod resolves it.
        """
        still_allocated: set[str] = set()
        for attempt in reversed(attempts):
            if not self._undo(pod, attempt) and attempt.allocated_here:
                still_allocated.add(alloc.claim_id(attempt.claim))
        self._ledger.taken_back((claim for claim, _ in decision.allocate), still_allocated=still_allocated)
        self._fit.unassume(pod.key, pod.uid)

    def settle_doubts(self, resolved: Sequence[model.ResourceClaim]) -> None:
        """Read the claims whose rollback left their state unknown and make the allocator match the API
        (`Ledger.settle`)."""
        for claim in self._ledger.doubtful(resolved):
            try:
                raw = self._client.get(kube_client.RESOURCE_CLAIMS, claim.meta.name, namespace=claim.meta.namespace)
            except kube_client.NotFound:
                raw = None
            except kube_client.ApiError as error:
                log.info("ResourceClaim %s: still cannot read it: %s", claim.key, error)
                continue
            live = None
            if raw is not None:
                decoded = kube_client.decode(raw)
                live = decoded if isinstance(decoded, model.ResourceClaim) else None
            self._ledger.settle(claim, live=live, exists=raw is not None)

    def _undo(self, pod: schedplan.PodInfo, attempt: _Attempt) -> bool:
        """Take back one claim's writes, from the claim as it is now. True when the claim holds no allocation made
        for this pod any more (undone, never written, or gone); False when it may still."""
        claim = attempt.claim
        for _ in range(ROLLBACK_ATTEMPTS):
            try:
                raw = self._client.get(kube_client.RESOURCE_CLAIMS, claim.meta.name, namespace=claim.meta.namespace)
            except kube_client.NotFound:
                return True
            except kube_client.ApiError as error:
                log.error("ResourceClaim %s: could not read it to take back pod %s: %s", claim.key, pod.key, error)
                return False
            live = kube_client.decode(raw)
            if not isinstance(live, model.ResourceClaim):
                log.error("ResourceClaim %s: it no longer decodes; pod %s's writes stay", claim.key, pod.key)
                return False
            if live.meta.uid != claim.meta.uid:
                return True  # The claim written to is gone; one made again under its name holds nothing of ours.
            plan = schedplan.undo(
                live, pod.uid, allocated_here=attempt.allocated_here, finalizer_added=attempt.finalizer_added
            )
            version = live.meta.resource_version
            try:
                if plan.status is not None:
                    stored = self._client.patch(
                        kube_client.RESOURCE_CLAIMS,
                        claim.meta.name,
                        namespace=claim.meta.namespace,
                        subresource="status",
                        patch={"metadata": {"resourceVersion": version}, "status": plan.status},
                    )
                    version = _version(stored, version)
            except kube_client.Conflict:
                continue  # Changed underneath: read it again and decide again.
            except kube_client.ApiError as error:
                log.error("ResourceClaim %s: could not take back pod %s: %s", claim.key, pod.key, error)
                return False
            if plan.remove_finalizer:
                try:
                    finalizers.change(
                        self._client,
                        kube_client.RESOURCE_CLAIMS,
                        claim.meta.name,
                        namespace=claim.meta.namespace,
                        resource_version=version,
                        remove=claims.DELETE_PROTECTION_FINALIZER,
                    )
                except kube_client.ApiError as error:
                    # The finalizer alone blocks nothing but deletion, and the claim controller removes it then.
                    log.warning("ResourceClaim %s: could not remove the finalizer again: %s", claim.key, error)
            return live.allocation is None or plan.deallocates
        log.error("ResourceClaim %s: it kept changing while pod %s's writes were taken back", claim.key, pod.key)
        return False

    def _report_failure(self, pod: schedplan.PodInfo, message: str) -> None:
        """Say on the pod why this attempt failed: `PodScheduled=False, SchedulerError` and a Warning Event, replacing
        what an earlier attempt said. The condition is written at the cached pod's version, else (409: the pod
        changed, as it often has when an attempt fails) once more at the version a live read gives. Never raises:
        the attempt's own error is what the loop retries on."""
        self._warn(pod, message)
        current = pod
        for _ in range(2):
            patch = schedplan.condition_patch(current, message, now=_now(), reason=schedplan.SCHEDULER_ERROR)
            if patch is None:
                return
            try:
                self._client.patch(
                    kube_client.PODS, pod.name, namespace=pod.namespace, subresource="status", patch=patch
                )
                return
            except kube_client.Conflict:
                try:
                    raw = self._client.get(kube_client.PODS, pod.name, namespace=pod.namespace)
                except kube_client.ApiError as error:
                    log.info("pod %s: could not read it to say why scheduling failed: %s", pod.key, error)
                    return
                live = schedplan.decode_pod(raw, scheduler_name=self._scheduler_name)
                if live is None or live.uid != pod.uid or live.node_name:
                    return  # Replaced or bound meanwhile: nothing to say on it.
                current = live
            except kube_client.ApiError as error:
                log.info("pod %s: could not write why scheduling failed: %s", pod.key, error)
                return
        log.info("pod %s: it kept changing while the scheduler wrote why scheduling failed", pod.key)

    def _warn(self, pod: schedplan.PodInfo, message: str) -> None:
        ref = events.ObjectRef.of(pod.state.pod.meta, api_version="v1", kind="Pod")
        self._recorder.event(ref, type=events.WARNING, reason=schedplan.FAILED_SCHEDULING, message=message)
