"""Trace replay for `dractl simulate --trace`: one long-lived allocator over a timeline of arrivals and departures.

What it does: takes a validated `trace.Trace` and replays its events in order against one
`alloc.Allocator` built from the trace's cluster, which keeps its state for the whole trace.
Claims of the cluster (`spec.cluster.objects`) with an allocation hold it from the start (checked
like `simulate -f` input); those without arrive before the first event, in input order. An
arriving ResourceClaim is allocated on its own; an arriving Pod gets the claims of its
templates (named as the resourceclaim controller names them) and has its unallocated claims
allocated jointly on one node, where its already allocated claims are usable. A departure
releases exactly what the claim held (`Allocator.release`); a departing Pod releases the claims
made from its templates, while a claim it names keeps its allocation until it departs itself.
What could not be allocated waits in a queue, in arrival order, and is retried after every
departure (`Retry.ON_DEPARTURE`, as a scheduler retries pending pods; departures at the same
time are one batch, retried once) or dropped (`Retry.NEVER`). After every event the share of
GPU memory allocated is sampled, so utilisation is weighted by time.

Gangs: a PodGroup (either API; in `spec.cluster.objects`, present from the start, or arriving)
gathers the pods that join it as they arrive. Once it and at least its minCount member pods are
present, they are placed as one decision (`gang.plan`: all or nothing, in one domain of its
topology key, the smallest domain of `topology_levels` first); until then they wait, which is no
rejection. A gang that does not fit is refused as one (one REJECT action for `PodGroup ns/name`
with the gang's line, its claims counted as rejected once) and waits for a departure (or is
dropped with `Retry.NEVER`). A pod joining a gang that runs is placed on its own in the gang's
domain. A gang stops running when its last placed pod departs (pods still to come gather anew);
a v1alpha2 PodGroup's own claims (`spec.resourceClaims`, shared by the pods whose entry repeats
it) are made when it arrives and released when it departs. `metrics.TimeMetrics.gangs` counts
gangs admitted and refused (None for a trace without PodGroups).

Metrics: `metrics.Series` counts admitted claims (at arrival or on a retry), rejections (each
claim once, when it is first refused), and admitted before the first rejection. Stranded
memory is judged against every request shape the trace has asked for so far (the claims'
`dractl.io/shapes` annotation, see `trace.shapes_of`): the pending and recently seen shapes.
The cluster is measured at the first rejection and at the end. With `frames`, the replay also
keeps that many moments for the map's overview (`htmlmap.Frame`: after evenly spaced events,
the last one included, and right after the first rejection): what was held, waiting and refused.

`run` is the CLI's entry for `--trace`, `--generate`, `--compare` and `--html`: it reads the
trace file, prints the report and writes the map. `replay` itself reads and writes nothing,
prints nothing, evaluates no CEL and does not import the Cython core (only `alloc` does); it is
deterministic: the same trace and policy give the same allocations, also with a fresh allocator.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from dractl import alloc, config, model
from dractl import gang as gang_module
from dractl.model import placement
from dractl.simulate import claims, engine, htmlmap, metrics, report, timing, trace

if TYPE_CHECKING:
    import rich.console

Retry = config.Retry
MAP_FRAMES = 24  # moments of the trace the map's overview shows (plus the first rejection)
# `Result.metrics` would shadow the module inside the class body.
_Metrics = metrics.Metrics


class ActionKind(enum.Enum):
    """What one step of the replay did; the value is how logs spell it."""

    ALLOCATE = "allocate"
    REJECT = "reject"
    RELEASE = "release"
    DROP = "drop"


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    """One change of the allocator's state (or a refusal), in replay order.

    `claims` are the claims of the step: for ALLOCATE with their new `allocation`, for RELEASE
    as they were held, for REJECT and DROP as they arrived. `node` is the node an allocation
    landed on (None: usable everywhere, or no allocation). `retry` says the step retried
    pending work after a departure. `reasons` are the allocator's for a REJECT."""

    at: float
    kind: ActionKind
    work: str
    claims: tuple[model.ResourceClaim, ...]
    node: str | None = None
    retry: bool = False
    reasons: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One policy's replay: the metrics at the end (with the time series) and at the first
    rejection (None when nothing was rejected), every claim present at the end (allocated or
    pending, with reasons, in arrival order), every step (`actions`), the allocations present at
    the end, the moments kept for the map (`frames`), the PodGroup of each held claim of a gang's pod
    (`gangs`: claim key, group "namespace/name"), and timings: `seconds` for the whole
    replay, `index_seconds` for building the allocator."""

    policy: config.Policy
    retry: Retry
    events: int
    metrics: _Metrics
    at_first_rejection: _Metrics | None
    claims: tuple[engine.ClaimOutcome, ...]
    held: tuple[model.ResourceClaim, ...]
    actions: tuple[Action, ...]
    seconds: float
    index_seconds: float
    frames: tuple[htmlmap.Frame, ...] = ()
    gangs: tuple[tuple[str, str], ...] = ()

    @property
    def pending(self) -> tuple[engine.ClaimOutcome, ...]:
        return tuple(o for o in self.claims if not o.allocated)


@dataclasses.dataclass(slots=True)
class _Work:
    """Something that waits for devices: a standalone claim, a pod with its claims, or a gang (`gang` its
    PodGroup's key; `claims` then the unallocated claims of its member pods)."""

    key: str  # "Kind namespace/name" of the arriving object
    claims: list[model.ResourceClaim]
    pod: model.Pod | None = None
    owned: tuple[str, ...] = ()  # claim keys made from the pod's templates
    problem: str | None = None
    gang: str | None = None


def _group_key(group: tuple[str, model.PodGroupApi]) -> str:
    """How `_State.members` names a PodGroup: its "namespace/name" and API (pods join through one API)."""
    key, api = group
    return f"{key} {api.value}"


def _joins(pod: model.Pod) -> str | None:
    """The `_group_key` of the PodGroup the pod joins, or None."""
    ref = pod.pod_group
    return None if ref is None else _group_key((f"{pod.meta.namespace}/{ref.name}", ref.api))


@dataclasses.dataclass(slots=True)
class _Gang:
    """A PodGroup present in the replay: its own claims (entry -> claim key; `owned`: those made from its
    templates, released when it departs), the work that stands for it while it waits, and, once it runs, the
    nodes of its domain and the member pods placed there (it runs while one of them is present)."""

    group: model.PodGroup
    claims: dict[model.PodResourceClaim, str]
    owned: tuple[str, ...]
    work: _Work
    domain: tuple[str, ...] | None = None
    placed: set[str] = dataclasses.field(default_factory=set)
    refused: bool = False  # refused since it last gathered its minimum: counted once


class _State:
    """The replay's bookkeeping around the allocator: what is held, pending and present."""

    def __init__(
        self, tr: trace.Trace, *, policy: config.Policy, retry: Retry, search_limit: int, levels: Sequence[str]
    ) -> None:
        cluster = tr.cluster
        self.retry = retry
        self.levels = tuple(levels)
        self.slices = cluster.resource_slices
        self.nodes = placement.known_nodes(cluster)
        self.templates = {(t.meta.namespace, t.meta.name): t for t in cluster.resource_claim_templates}
        given = tuple(c for c in cluster.resource_claims if c.allocation is not None)
        self.allocator = alloc.Allocator(
            alloc.Snapshot(
                device_classes=cluster.device_classes,
                resource_slices=cluster.resource_slices,
                nodes=cluster.nodes,
                allocated_claims=given,
                # A trace is input a person wrote, like `simulate -f`: conflicting allocations hold nothing.
                check_allocated=True,
            ),
            policy=policy,
            search_limit=search_limit,
        )
        self.memory = metrics.device_memory(cluster.resource_slices)
        # Counts here; (time, bytes allocated) samples become a utilisation series at the end,
        # when the final measurement gives the cluster's GPU memory (one measurement, not two).
        with_gangs = bool(cluster.pod_groups) or any(
            isinstance(e, trace.Arrival) and isinstance(e.object, model.PodGroup) for e in tr.events
        )
        self.series = metrics.Series(gangs=with_gangs)
        self.samples: list[tuple[float, int]] = []
        self.actions: list[Action] = []
        # Claims present, by key, in arrival order: the claim (with its allocation when held).
        self.present: dict[str, model.ResourceClaim] = {}
        self.held: dict[str, str | None] = {}  # claim key -> node of its allocation
        self.reasons: dict[str, tuple[str, ...]] = {}
        self.pending: dict[str, _Work] = {}
        self.pods: dict[str, _Work] = {}
        # PodGroups present by "namespace/name", and the member pods present of each group by its key, in arrival
        # order, whether the group has arrived or not.
        self.gangs: dict[str, _Gang] = {}
        self.members: dict[str, dict[str, None]] = {}
        self.gang_of: dict[str, str] = {}  # claim key -> the PodGroup of the pod (or group) it was made for
        self.shapes: dict[metrics.RequestShape, None] = {}
        self.used = 0
        self.first_rejection: metrics.Metrics | None = None
        self.frames: list[htmlmap.Frame] = []
        self.refused: list[tuple[str, tuple[str, ...]]] = []  # since the last frame kept
        self.keep_frames = False
        self.events = 0  # in the trace, and the one being replayed (from 0), for the frames
        self.position = 0
        for claim in given:
            self._arrive_claim(claim)
            rejections = self.allocator.rejected.get(claim.key, ())
            if rejections or claim.allocation is None:
                self.reasons[claim.key] = tuple(r.message for r in rejections)
            else:
                self.held[claim.key] = None
                self.used += self._memory(claim.allocation)

    def _arrive_claim(self, claim: model.ResourceClaim) -> None:
        self.present[claim.key] = claim
        for shape in trace.shapes_of(claim):
            self.shapes.setdefault(shape, None)

    def _memory(self, allocation: model.AllocationResult) -> int:
        return sum(self.memory.get((r.driver, r.pool, r.device), 0) for r in allocation.results if not r.admin_access)

    def sample(self, at: float) -> None:
        self.samples.append((at, self.used))

    def time_metrics(self, total: int) -> metrics.TimeMetrics:
        """The counts, with utilisation over time as a share of `total` bytes."""
        utilisation = metrics.Series()
        for at, used in self.samples:
            utilisation.sample(at, used=used, total=total)
        shares = utilisation.result()
        return dataclasses.replace(self.series.result(), utilisation=shares.utilisation, points=shares.points)

    # --- arrivals ------------------------------------------------------------------------

    def arrive(self, event: trace.Arrival) -> None:
        value = event.object
        if isinstance(value, model.PodGroup):
            self._arrive_group(value, at=event.at)
            return
        if isinstance(value, model.ResourceClaim):
            self._arrive_claim(value)
            work = _Work(key=f"ResourceClaim {value.key}", claims=[value])
        else:
            work = self._pod_work(value)
            self.pods[work.key] = work
            joins = _joins(value)
            if joins is not None:
                self.members.setdefault(joins, {})[work.key] = None
                gang = self._gang_of_pod(value)
                if gang is None:
                    self._hold_back(work, joins)
                    return
                if gang.domain is None:
                    # A gang refused already waits for departures, as pending pods do; one still gathering is
                    # tried once it has its minimum.
                    if not gang.refused:
                        self._try_gang(gang, at=event.at, retry=False)
                    return
        waiting = sum(1 for c in work.claims if c.key not in self.held)
        if not self._try(work, at=event.at, retry=False):
            self._refuse(work, at=event.at, count=max(waiting, 1))

    def _refuse(self, work: _Work, *, at: float, count: int) -> None:
        """Count the work's claims refused: it waits for a departure, or is dropped."""
        first = self.first_rejection is None
        if first:
            self.first_rejection = self.measure(label="at first rejection")
        self.series.rejected(at, count=count)
        if self.retry is Retry.ON_DEPARTURE:
            self.pending[work.key] = work
        else:
            self.actions.append(Action(at=at, kind=ActionKind.DROP, work=work.key, claims=tuple(work.claims)))
            if work.gang is not None:
                self._drop_members(work.gang)
        if self.keep_frames:
            self.refused.extend((c.key, self.reasons_of(c.key)) for c in work.claims if c.key not in self.held)
            if first:
                self.frame(at, event=self.position, first_rejection=True)

    # --- gangs ---------------------------------------------------------------------------

    def _arrive_group(self, group: model.PodGroup, *, at: float) -> None:
        """A PodGroup arrives: its own claims are made, the pods that came before it now use them, and the gang is
        tried once it has its minimum of pods."""
        owned: list[str] = []
        claims_of: dict[model.PodResourceClaim, str] = {}
        as_pod = model.Pod(meta=group.meta)
        for entry in group.resource_claims:
            if entry.resource_claim_name is not None:
                claims_of[entry] = f"{group.meta.namespace}/{entry.resource_claim_name}"
                continue
            template = self.templates.get((group.meta.namespace, entry.resource_claim_template_name or ""))
            if template is None:  # the trace's validation rules this out
                continue
            name = claims.free_claim_name(as_pod, entry.name, taken=self.present)
            claim = claims.claim_for_group(template, group=group, pod_claim_name=entry.name, name=name)
            self._arrive_claim(claim)
            self.gang_of[claim.key] = group.key
            claims_of[entry] = claim.key
            owned.append(claim.key)
        work = _Work(key=f"PodGroup {group.key}", claims=[], gang=group.key)
        gang = self.gangs[group.key] = _Gang(group=group, claims=claims_of, owned=tuple(owned), work=work)
        joins = (group.key, group.api)
        for key in self.members.get(_group_key(joins), {}):
            member = self.pods[key]
            assert member.pod is not None
            held = [c.key for c in member.claims if c.key in self.held]
            if held:
                # A pod placed while an earlier PodGroup of this name was present runs on: the gang runs where it
                # does (the domain of the group's topology key that holds its node).
                gang.placed.add(key)
                gang.domain = self._domain_of(group, self.held[held[0]])
                continue
            # Resolved again: an entry that repeats one of the group's claims now stands for that claim.
            for claim_key in member.owned:
                self.present.pop(claim_key, None)
                self.reasons.pop(claim_key, None)
            again = self._pod_work(member.pod)
            member.claims, member.owned, member.problem = again.claims, again.owned, again.problem
        if gang.domain is None:
            if self.members.get(_group_key(joins)):
                self._try_gang(gang, at=at, retry=False)
            return
        # The gang runs: the pods that waited for it join it one by one, in its domain.
        for work in self._member_works(gang):
            if work.key not in gang.placed:
                waiting = sum(1 for c in work.claims if c.key not in self.held)
                if not self._try(work, at=at, retry=False):
                    self._refuse(work, at=at, count=max(waiting, 1))

    def _domain_of(self, group: model.PodGroup, node: str | None) -> tuple[str, ...]:
        """The nodes of the domain of the group's topology key that holds `node` (every node without a key, or
        where the node is not known)."""
        key = group.topology_key
        value = self.nodes.labels_of(node).get(key) if key and node is not None else None
        if value is None and key == gang_module.HOSTNAME_LABEL:
            value = node
        return gang_module.domain_nodes(self.nodes, f"{key}={value}" if value is not None else None)

    def _gang_of_pod(self, pod: model.Pod) -> _Gang | None:
        """The present PodGroup the pod joins, of the API it joins through."""
        ref = pod.pod_group
        if ref is None:
            return None
        gang = self.gangs.get(f"{pod.meta.namespace}/{ref.name}")
        return gang if gang is not None and gang.group.api is ref.api else None

    def _hold_back(self, work: _Work, joins: str) -> None:
        """A pod whose PodGroup has not arrived waits for it, as a scheduler holds it; that is no rejection."""
        assert work.pod is not None and work.pod.pod_group is not None
        ref = work.pod.pod_group
        reason = (
            f"not allocated: pod {work.key.partition(' ')[2]} joins PodGroup {joins.partition(' ')[0]} "
            f"({ref.api.value}), which has not arrived: it waits for its PodGroup"
        )
        for claim in work.claims:
            if claim.key not in self.held:
                self.reasons[claim.key] = (reason,)

    def _member_works(self, gang: _Gang) -> list[_Work]:
        return [self.pods[key] for key in self.members.get(_group_key((gang.group.key, gang.group.api)), {})]

    def _try_gang(self, gang: _Gang, *, at: float, retry: bool) -> bool:
        """Place a gang that does not run yet: all or nothing (`gang.plan`) once at least its minimum of member
        pods is present; until then its pods wait, which is no rejection. True when it runs (or needs nothing)."""
        group = gang.group
        # Checked before the members are gathered: a gang of many pods arriving one by one costs a constant per
        # arrival while it gathers (its pods' reasons are `_gathering`'s, made when they are shown).
        if self._gathering(gang) is not None:
            gang.refused = False
            self.pending.pop(gang.work.key, None)
            return False
        works = self._member_works(gang)
        for work in works:
            work.claims = [self.present[c.key] for c in work.claims if c.key in self.present]
        gang.work.claims = [c for work in works for c in work.claims if c.key not in self.held]
        members = []
        for work in works:
            assert work.pod is not None
            allocated = {c.key: c.allocation for c in work.claims if c.key in self.held and c.allocation is not None}
            where = placement.candidates(work.pod, allocated=allocated, cluster=self.nodes)
            problem = work.problem or where.problem
            pending = tuple(c for c in work.claims if c.key not in self.held)
            members.append(gang_module.Member(key=work.key, claims=pending, nodes=where.nodes, problem=problem))
        decision = gang_module.plan(self.allocator, group, members=members, cluster=self.nodes, levels=self.levels)
        if not decision.ok:
            for left in decision.left:
                for claim in self.pods[left.key].claims:
                    if claim.key not in self.held:
                        self.reasons[claim.key] = left.reasons
            if not retry:
                self.actions.append(
                    Action(
                        at=at,
                        kind=ActionKind.REJECT,
                        work=gang.work.key,
                        claims=tuple(gang.work.claims),
                        reasons=(decision.reason or "",),
                    )
                )
            if not gang.refused:
                gang.refused = True
                self.series.gang(at, admitted=False)
                self._refuse(gang.work, at=at, count=max(len(gang.work.claims), 1))
            return False
        gang.refused = False
        gang.domain = gang_module.domain_nodes(self.nodes, decision.domain)
        self.pending.pop(gang.work.key, None)
        self.series.gang(at, admitted=True)
        for member in decision.placed:
            work = self.pods[member.key]
            gang.placed.add(work.key)
            allocations = dict((claim.key, allocation) for claim, allocation in member.allocations)
            self._record(
                work,
                [c for c in work.claims if c.key in allocations],
                allocations,
                node=member.node,
                at=at,
                retry=retry,
            )
        for left in decision.left:
            work = self.pods[left.key]
            todo = [c for c in work.claims if c.key not in self.held]
            self._reject(work, todo, at=at, retry=retry, reasons=left.reasons)
            self._refuse(work, at=at, count=max(len(todo), 1))
        return True

    def _drop_members(self, key: str) -> None:
        """Under `Retry.NEVER`, the members of a refused gang are not tried again; pods still to come gather anew."""
        gang = self.gangs[key]
        gang.refused = False
        self.members.pop(_group_key((gang.group.key, gang.group.api)), None)

    def _gathering(self, gang: _Gang) -> str | None:
        """Why the gang's pods wait while it has fewer member pods than its minimum; None once it has them (or
        runs)."""
        if gang.domain is not None:
            return None
        count = len(self.members.get(_group_key((gang.group.key, gang.group.api)), {}))
        need = gang.group.min_count or 1
        if count >= need:
            return None
        return f"not allocated: {gang_module.describe(gang.group)}: {count} of {need} member pods have arrived"

    def reasons_of(self, key: str) -> tuple[str, ...]:
        """Why the claim `key` is not allocated now: a gathering gang's line for a claim of its pods, else the last
        attempt's reasons."""
        group = self.gang_of.get(key)
        gang = self.gangs.get(group) if group is not None else None
        line = self._gathering(gang) if gang is not None else None
        return (line,) if line is not None else self.reasons.get(key, ())

    def _pod_work(self, pod: model.Pod) -> _Work:
        uid = claims.pod_uid(pod)
        namespace = pod.meta.namespace
        found: list[model.ResourceClaim] = []
        owned: list[str] = []
        problem = None
        gang = self._gang_of_pod(pod)
        for entry in pod.resource_claims:
            # An entry that repeats one of its PodGroup's claims exactly stands for the group's claim.
            shared = gang.claims.get(entry) if gang is not None else None
            if shared is not None:
                claim = self.present.get(shared)
                if claim is None:
                    problem = f"ResourceClaim {shared} of the pod's PodGroup is not present"
                    continue
            elif entry.resource_claim_name is not None:
                claim = self.present.get(f"{namespace}/{entry.resource_claim_name}")
                if claim is None:
                    problem = f"ResourceClaim {namespace}/{entry.resource_claim_name} is not present"
                    continue
            else:
                template = self.templates.get((namespace, entry.resource_claim_template_name or ""))
                if template is None:  # the trace's validation rules this out
                    problem = f"ResourceClaimTemplate {namespace}/{entry.resource_claim_template_name} does not exist"
                    continue
                name = claims.free_claim_name(pod, entry.name, taken=self.present)
                claim = claims.claim_from_template(template, pod=pod, uid=uid, pod_claim_name=entry.name, name=name)
                self._arrive_claim(claim)
                owned.append(claim.key)
            if all(c.key != claim.key for c in found):
                found.append(claim)
        if pod.pod_group is not None:
            for claim in found:
                self.gang_of[claim.key] = f"{namespace}/{pod.pod_group.name}"
        return _Work(key=f"Pod {namespace}/{pod.meta.name}", claims=found, pod=pod, owned=tuple(owned), problem=problem)

    def _try(self, work: _Work, *, at: float, retry: bool) -> bool:
        """Allocate the work's unallocated claims; record the step either way."""
        # A named claim may have departed while its pod waited.
        work.claims = [self.present[c.key] for c in work.claims if c.key in self.present]
        todo = [c for c in work.claims if c.key not in self.held]
        problem = work.problem
        nodes: tuple[str, ...] | None = None
        if work.pod is not None and problem is None:
            allocated = {c.key: c.allocation for c in work.claims if c.key in self.held and c.allocation is not None}
            where = placement.candidates(work.pod, allocated=allocated, cluster=self.nodes)
            problem, nodes = where.problem, where.nodes
            gang = self._gang_of_pod(work.pod)
            if problem is None and gang is not None and gang.domain is not None:
                # A pod joining a gang that runs goes where the gang runs.
                domain = set(gang.domain)
                nodes = tuple(n for n in (nodes if nodes is not None else gang.domain) if n in domain)
                if not nodes:
                    problem = f"no node of the domain of {gang_module.describe(gang.group)} is one the pod may use"
        if problem is not None:
            self._reject(work, todo, at=at, retry=retry, reasons=(f"not allocated: {problem}",))
            return False
        if not todo:
            return True
        outcome = self.allocator.allocate(todo, nodes=nodes)
        if outcome.allocations is None:
            texts = tuple(f"{r.request}: {r.message}" if r.request else r.message for r in outcome.reasons)
            self._reject(work, todo, at=at, retry=retry, reasons=texts)
            return False
        allocations = {claim.key: allocation for claim, allocation in zip(todo, outcome.allocations, strict=True)}
        self._record(work, todo, allocations, node=outcome.node, at=at, retry=retry)
        if work.pod is not None and (gang := self._gang_of_pod(work.pod)) is not None:
            gang.placed.add(work.key)
        return True

    def _record(
        self,
        work: _Work,
        todo: Sequence[model.ResourceClaim],
        allocations: dict[str, model.AllocationResult],
        *,
        node: str | None,
        at: float,
        retry: bool,
    ) -> None:
        """The allocator made (and holds) `allocations` for the work's claims `todo`, on `node`."""
        done: list[model.ResourceClaim] = []
        for claim in todo:
            allocation = allocations[claim.key]
            claim = dataclasses.replace(claim, allocation=allocation)
            self.present[claim.key] = claim
            self.held[claim.key] = node
            self.reasons.pop(claim.key, None)
            self.used += self._memory(allocation)
            done.append(claim)
        work.claims = [self.present[c.key] for c in work.claims]
        self.series.admitted(at, count=len(done))
        self.actions.append(
            Action(at=at, kind=ActionKind.ALLOCATE, work=work.key, claims=tuple(done), node=node, retry=retry)
        )

    def _reject(
        self, work: _Work, todo: Sequence[model.ResourceClaim], *, at: float, retry: bool, reasons: tuple[str, ...]
    ) -> None:
        for claim in todo:
            self.reasons[claim.key] = reasons
        if not retry:
            self.actions.append(
                Action(at=at, kind=ActionKind.REJECT, work=work.key, claims=tuple(todo), reasons=reasons)
            )

    # --- departures ----------------------------------------------------------------------

    def depart(self, event: trace.Departure) -> None:
        if event.kind == "ResourceClaim":
            self.pending.pop(f"ResourceClaim {event.key}", None)
            self._release(event.key, at=event.at)
            return
        if event.kind == "PodGroup":
            gang = self.gangs.pop(event.key, None)
            if gang is not None:
                # The group ends: the claims made for it go with it; its pods stay until they depart themselves.
                self.pending.pop(gang.work.key, None)
                for key in gang.owned:
                    self._release(key, at=event.at)
                group_key = _group_key((gang.group.key, gang.group.api))
                for key in self.members.get(group_key, {}):
                    if key not in gang.placed:
                        self.pending.pop(key, None)
                        self._hold_back(self.pods[key], group_key)
            return
        work = self.pods.pop(f"Pod {event.key}", None)
        self.pending.pop(f"Pod {event.key}", None)
        for key in work.owned if work is not None else ():
            self._release(key, at=event.at)
        pod = work.pod if work is not None else None
        joins = _joins(pod) if pod is not None else None
        if work is None or pod is None or joins is None:
            return
        self.members.get(joins, {}).pop(work.key, None)
        gang = self._gang_of_pod(pod)
        if gang is not None:
            gang.placed.discard(work.key)
            if not gang.placed and gang.domain is not None:
                # The gang's last placed pod left: the gang departed, and pods still to come gather anew.
                gang.domain = None
            if gang.domain is None and self.members.get(joins):
                self.pending.setdefault(gang.work.key, gang.work)

    def _release(self, key: str, *, at: float) -> None:
        claim = self.present.pop(key, None)
        self.reasons.pop(key, None)
        if claim is None or key not in self.held:
            return
        del self.held[key]
        released = self.allocator.release(alloc.claim_id(claim))
        if released and claim.allocation is not None:
            self.used -= self._memory(claim.allocation)
        self.actions.append(Action(at=at, kind=ActionKind.RELEASE, work=f"ResourceClaim {key}", claims=(claim,)))

    def retry_pending(self, at: float) -> None:
        """Try every waiting work item once, in arrival order; a gang as one."""
        for key, work in list(self.pending.items()):
            member_of = self._gang_of_pod(work.pod) if work.pod is not None else None
            if member_of is not None and member_of.domain is None:
                # Its gang stopped running while it waited: the gang's own work places it with the others.
                self.pending.pop(key, None)
                self.pending.setdefault(member_of.work.key, member_of.work)
            elif work.gang is not None:
                gang = self.gangs.get(work.gang)
                if gang is None or gang.domain is not None:
                    self.pending.pop(key, None)
                elif self._try_gang(gang, at=at, retry=True):
                    self.pending.pop(key, None)
            elif self._try(work, at=at, retry=True):
                del self.pending[key]

    # --- results -------------------------------------------------------------------------

    def frame(self, at: float, *, event: int, first_rejection: bool = False) -> None:
        """Keep the present moment for the map (see `htmlmap.Frame`); `event` counts from 0."""
        gathering = [g.work for g in self.gangs.values() if g.domain is None and g.work.key not in self.pending]
        for work in gathering:
            work.claims = [c for member in self._member_works(self.gangs[work.gang or ""]) for c in member.claims]
        waiting = tuple(
            (c.key, self.reasons_of(c.key))
            for work in (*self.pending.values(), *gathering)
            for c in work.claims
            if c.key not in self.held
        )
        self.frames.append(
            htmlmap.Frame(
                at=at,
                event=event + 1,
                events=self.events,
                claims=self.held_claims(),
                shapes=tuple(self.shapes),
                waiting=waiting,
                refused=tuple(self.refused),
                first_rejection=first_rejection,
                gangs=self.gangs_held(),
            )
        )
        self.refused = []

    def gangs_held(self) -> tuple[tuple[str, str], ...]:
        """The held claims of gangs' pods (and groups): (claim key, PodGroup "namespace/name")."""
        return tuple((key, self.gang_of[key]) for key in self.present if key in self.held and key in self.gang_of)

    def held_claims(self) -> tuple[model.ResourceClaim, ...]:
        return tuple(c for key, c in self.present.items() if key in self.held and c.allocation is not None)

    def measure(self, *, label: str, time_metrics: metrics.TimeMetrics | None = None) -> metrics.Metrics:
        return metrics.measure(
            self.slices, self.held_claims(), shapes=tuple(self.shapes), label=label, time=time_metrics
        )

    def outcomes(self) -> tuple[engine.ClaimOutcome, ...]:
        check = engine.PrepareCheck(self.slices)
        out = []
        for key, claim in self.present.items():
            allocated = key in self.held
            out.append(
                engine.ClaimOutcome(
                    namespace=claim.meta.namespace,
                    name=claim.meta.name,
                    claim=claim,
                    node=self.held.get(key),
                    reasons=() if allocated else self.reasons_of(key) or ("not allocated: waiting",),
                    status=engine.Status.ALLOCATED if allocated else engine.Status.NOT_ALLOCATED,
                    warnings=check.warnings(claim, allocated=allocated),
                )
            )
        return tuple(out)


def replay(
    tr: trace.Trace,
    *,
    policy: config.Policy = config.Policy.BINPACK,
    retry: Retry = Retry.ON_DEPARTURE,
    search_limit: int = config.DEFAULT_SEARCH_LIMIT,
    frames: int = 0,
    topology_levels: Sequence[str] = (),
) -> Result:
    """Replay the trace's events against one allocator and measure the outcome; keep `frames`
    moments for the map (see the module docstring). Deterministic; no I/O. Departures at one
    time form a batch: the pending work is retried once after it."""
    start = time.perf_counter()
    state = _State(tr, policy=policy, retry=retry, search_limit=search_limit, levels=topology_levels)
    indexed = time.perf_counter()
    events = tr.events
    state.events = len(events)
    state.keep_frames = frames > 0
    keep = {round(k * (len(events) - 1) / max(frames - 1, 1)) for k in range(frames)} if events else set()
    start_at = events[0].at if events else 0.0
    state.sample(start_at)
    # Unallocated claims of the cluster arrive first, in input order, as `simulate -f` allocates them.
    for index, claim in enumerate(tr.cluster.resource_claims):
        if claim.allocation is None:
            state.arrive(trace.Arrival(at=start_at, object=claim, index=-1 - index))
    # So do the cluster's PodGroups, present from the start like its claims.
    for index, group in enumerate(tr.cluster.pod_groups):
        state.arrive(trace.Arrival(at=start_at, object=group, index=-1 - index))
    for i, event in enumerate(events):
        state.position = i
        if isinstance(event, trace.Arrival):
            state.arrive(event)
        else:
            state.depart(event)
            following = events[i + 1] if i + 1 < len(events) else None
            batch_ends = not (isinstance(following, trace.Departure) and following.at == event.at)
            if batch_ends and state.pending:
                state.retry_pending(event.at)
        state.sample(event.at)
        if i in keep:
            state.frame(event.at, event=i)
    final = state.measure(label=policy.value)
    final = dataclasses.replace(final, time=state.time_metrics(final.cluster.memory))
    return Result(
        policy=policy,
        retry=retry,
        events=len(events),
        metrics=final,
        at_first_rejection=state.first_rejection,
        claims=state.outcomes(),
        held=state.held_claims(),
        actions=tuple(state.actions),
        seconds=time.perf_counter() - start,
        index_seconds=indexed - start,
        frames=tuple(state.frames),
        gangs=state.gangs_held(),
    )


# --- the command -------------------------------------------------------------------------------


def run(settings: config.Simulate, *, out: TextIO, err: TextIO) -> int:
    """`dractl simulate` with `--trace`, `--generate`, `--compare` or `--html`; returns the exit code.

    0 when the trace was replayed (or generated), whatever was rejected; 1 when a flag, the
    trace file or the generator spec is invalid (one line per problem on `err`, naming the
    file, the event and the field) or the map cannot be written. Opaque configs the node agent
    would refuse are a `warning:` line each on `err` (`engine.unpreparable`), and the claims
    present at the end that have one carry its warning in every format.
    """
    problem = _flag_problem(settings)
    if problem is not None:
        print(f"dractl simulate: {problem}", file=err)
        return 1
    if settings.generate is not None:
        try:
            spec = trace.parse_spec(settings.generate)
        except ValueError as error:
            print(f"dractl simulate: {error}", file=err)
            return 1
        trace.write_generated(spec, out, as_json=settings.output is config.OutputFormat.JSON)
        return 0
    assert settings.trace is not None  # `_flag_problem` guarantees it
    timer = timing.Timer() if settings.timing else None
    try:
        return _replay_and_report(settings, settings.trace, out=out, err=err, timer=timer)
    finally:
        if timer is not None:
            timer.close(err)


def _flag_problem(settings: config.Simulate) -> str | None:
    """The first combination of flags that makes no sense, as one message."""
    if settings.generate is not None:
        if settings.trace is not None or settings.paths:
            return "--generate prints a trace: it takes neither --trace nor -f (replay the printed trace with --trace)"
        if settings.compare or settings.html is not None:
            return "--generate prints a trace: replay it with --trace FILE (or --trace -) to --compare or write --html"
        return None
    if settings.trace is None:
        return "--compare, --html and --retry replay a trace: give --trace FILE (see --generate)"
    if settings.paths:
        return "--trace replays the trace's own cluster: put manifests in its spec.cluster.objects instead of -f"
    if settings.compare and settings.output is config.OutputFormat.YAML:
        return "-o yaml prints one policy's claims: use -o table or -o json with --compare"
    return None


def _cluster_objects(tr: trace.Trace) -> model.Objects:
    """The cluster plus every arriving claim, for the checks `simulate -f` makes (selectors, opaque configs)."""
    arriving = tuple(e.object for e in tr.events if isinstance(e, trace.Arrival))
    return dataclasses.replace(
        tr.cluster,
        resource_claims=(
            *tr.cluster.resource_claims,
            *(o for o in arriving if isinstance(o, model.ResourceClaim)),
        ),
    )


def _replay_and_report(
    settings: config.Simulate, path: pathlib.Path, *, out: TextIO, err: TextIO, timer: timing.Timer | None
) -> int:
    try:
        tr = trace.load(path)
    except trace.TraceError as error:
        for line in error.problems:
            print(line, file=err)
        return 1
    objects = _cluster_objects(tr)
    invalid = engine.refused(objects)
    if invalid:
        for line in invalid:
            print(line, file=err)
        return 1
    for warning in engine.unpreparable(objects):
        print(f"warning: {warning}", file=err)
    if timer is not None:
        timer.phase("load", events=len(tr.events))
    policies = settings.compare or (settings.policy,)
    results = []
    for policy in policies:
        result = replay(
            tr,
            policy=policy,
            retry=settings.retry,
            search_limit=settings.search_limit,
            frames=MAP_FRAMES if settings.html is not None else 0,
            topology_levels=settings.topology_levels,
        )
        results.append(result)
        if timer is not None:
            timer.phase(f"replay-{policy.value}", events=result.events, index_seconds=f"{result.index_seconds:.3f}")
    if settings.html is not None:
        # With --compare, the map shows the run of --policy when it is compared, else the first.
        shown = next((r for r in results if r.policy is settings.policy), results[0])
        page = htmlmap.render(
            tr.cluster.resource_slices,
            shown.held,
            series=shown.metrics.time,
            frames=shown.frames,
            title=f"dractl allocation map: trace {tr.name or tr.file}, policy {shown.policy.value}",
            gangs=shown.gangs,
        )
        try:
            settings.html.write_text(page, encoding="utf-8")
        except OSError as error:
            print(f"dractl simulate: --html {settings.html}: cannot write: {error.strerror or error}", file=err)
            return 1
    if settings.output is config.OutputFormat.JSON:
        _write_json(tr, results, out=out)
    elif settings.output is config.OutputFormat.YAML:
        only = results[0]
        report.write_yaml(
            engine.Result(claims=only.claims, attempted=0, index_seconds=0.0, allocate_seconds=0.0), out=out, err=err
        )
    else:
        _write_table(tr, results, out=out)
    if timer is not None:
        timer.phase("output", format=settings.output.value)
    return 0


def _summary(result: Result) -> dict[str, Any]:
    return {
        "policy": result.policy.value,
        "retry": result.retry.value,
        "events": result.events,
        "seconds": round(result.seconds, 6),
        "metrics": metrics.as_dict(result.metrics),
        "atFirstRejection": None
        if result.at_first_rejection is None
        else metrics.as_dict(result.at_first_rejection)["cluster"],
        "claims": [report.claim_entry(o) for o in result.claims],
    }


def _write_json(tr: trace.Trace, results: Sequence[Result], *, out: TextIO) -> None:
    """`{"trace": ..., "runs": [...]}`: per policy its metrics (`metrics.as_dict`), the cluster
    at the first rejection, and every claim present at the end as `simulate -o json` shows it."""
    document = {"trace": {"name": tr.name, "file": tr.file}, "runs": [_summary(r) for r in results]}
    report.write_json_document(document, out=out)


_SHOWN = 20  # claims listed per kind of trouble under the trace's table


def _write_table(tr: trace.Trace, results: Sequence[Result], *, out: TextIO) -> None:
    """Per node GPUs and memory at the end (the first policy's), then every policy's cluster
    metrics side by side, then the claims still waiting and those present at the end that the
    node agent will refuse to prepare (the first few of each, with the reason or warning)."""
    import rich.text  # imported here: rich takes about 50 ms to import

    console = report.new_console(out)
    first = results[0]
    console.print(
        rich.text.Text(
            f"Trace {tr.name or tr.file}: {first.events} events, retry {first.retry.value}; "
            f"GPUs and memory at the end (policy {first.policy.value})"
        )
    )
    console.print(metrics.node_table(first.metrics))
    sets = [r.metrics for r in results]
    at_first = [r.at_first_rejection for r in results]
    console.print(metrics.compare_table(sets))
    if any(m is not None for m in at_first):
        stranded = ", ".join(f"{r.policy.value} {_stranded_text(m)}" for r, m in zip(results, at_first, strict=True))
        console.print(rich.text.Text(f"memory stranded at the first rejection: {stranded}"))
    for result in results:
        state = "waiting" if result.retry is Retry.ON_DEPARTURE else "dropped"
        pending = [(o, o.reasons[0] if o.reasons else "not allocated") for o in result.pending]
        _write_claims(console, f"not allocated at the end ({state}) under {result.policy.value}", pending)
        warned = [(o, f"warning: {o.warnings[0]}") for o in result.claims if o.warnings]
        _write_claims(console, f"the node agent will refuse to prepare, under {result.policy.value}", warned)


def _write_claims(console: rich.console.Console, what: str, claims: Sequence[tuple[engine.ClaimOutcome, str]]) -> None:
    """`N claims <what>:` and the first few claims, each with its line; nothing when there are none."""
    import rich.text  # imported here: rich takes about 50 ms to import

    if not claims:
        return
    console.print(rich.text.Text(f"{len(claims)} claims {what}:"))
    for outcome, line in claims[:_SHOWN]:
        console.print(rich.text.Text(f"  {outcome.namespace}/{outcome.name}: {line}"))
    if len(claims) > _SHOWN:
        console.print(rich.text.Text(f"  ... and {len(claims) - _SHOWN} more (-o json lists them all)"))


def _stranded_text(found: metrics.Metrics | None) -> str:
    if found is None:
        return "- (no rejection)"
    c = found.cluster
    share = c.memory_stranded / c.memory if c.memory else 0.0
    return f"{c.memory_stranded / 2**30:.1f}Gi ({share:.1%})"
