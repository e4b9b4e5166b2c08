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
    the end, the moments kept for the map (`frames`), and timings: `seconds` for the whole
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

    @property
    def pending(self) -> tuple[engine.ClaimOutcome, ...]:
        return tuple(o for o in self.claims if not o.allocated)


@dataclasses.dataclass(slots=True)
class _Work:
    """Something that waits for devices: a standalone claim, or a pod with its claims."""

    key: str  # "Kind namespace/name" of the arriving object
    claims: list[model.ResourceClaim]
    pod: model.Pod | None = None
    owned: tuple[str, ...] = ()  # claim keys made from the pod's templates
    problem: str | None = None


class _State:
    """The replay's bookkeeping around the allocator: what is held, pending and present."""

    def __init__(self, tr: trace.Trace, *, policy: config.Policy, retry: Retry, search_limit: int) -> None:
        cluster = tr.cluster
        self.retry = retry
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
        self.series = metrics.Series()
        self.samples: list[tuple[float, int]] = []
        self.actions: list[Action] = []
        # Claims present, by key, in arrival order: the claim (with its allocation when held).
        self.present: dict[str, model.ResourceClaim] = {}
        self.held: dict[str, str | None] = {}  # claim key -> node of its allocation
        self.reasons: dict[str, tuple[str, ...]] = {}
        self.pending: dict[str, _Work] = {}
        self.pods: dict[str, _Work] = {}
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
        if isinstance(value, model.ResourceClaim):
            self._arrive_claim(value)
            work = _Work(key=f"ResourceClaim {value.key}", claims=[value])
        else:
            work = self._pod_work(value)
            self.pods[work.key] = work
        waiting = sum(1 for c in work.claims if c.key not in self.held)
        if not self._try(work, at=event.at, retry=False):
            count = max(waiting, 1)
            first = self.first_rejection is None
            if first:
                self.first_rejection = self.measure(label="at first rejection")
            self.series.rejected(event.at, count=count)
            if self.retry is Retry.ON_DEPARTURE:
                self.pending[work.key] = work
            else:
                self.actions.append(Action(at=event.at, kind=ActionKind.DROP, work=work.key, claims=tuple(work.claims)))
            if self.keep_frames:
                self.refused.extend((c.key, self.reasons.get(c.key, ())) for c in work.claims if c.key not in self.held)
                if first:
                    self.frame(event.at, event=self.position, first_rejection=True)

    def _pod_work(self, pod: model.Pod) -> _Work:
        uid = claims.pod_uid(pod)
        namespace = pod.meta.namespace
        found: list[model.ResourceClaim] = []
        owned: list[str] = []
        problem = None
        for entry in pod.resource_claims:
            if entry.resource_claim_name is not None:
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
        done: list[model.ResourceClaim] = []
        for claim, allocation in zip(todo, outcome.allocations, strict=True):
            claim = dataclasses.replace(claim, allocation=allocation)
            self.present[claim.key] = claim
            self.held[claim.key] = outcome.node
            self.reasons.pop(claim.key, None)
            self.used += self._memory(allocation)
            done.append(claim)
        work.claims = [self.present[c.key] for c in work.claims]
        self.series.admitted(at, count=len(done))
        self.actions.append(
            Action(at=at, kind=ActionKind.ALLOCATE, work=work.key, claims=tuple(done), node=outcome.node, retry=retry)
        )
        return True

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
        work = self.pods.pop(f"Pod {event.key}", None)
        self.pending.pop(f"Pod {event.key}", None)
        for key in work.owned if work is not None else ():
            self._release(key, at=event.at)

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
        """Try every waiting work item once, in arrival order."""
        for key, work in list(self.pending.items()):
            if self._try(work, at=at, retry=True):
                del self.pending[key]

    # --- results -------------------------------------------------------------------------

    def frame(self, at: float, *, event: int, first_rejection: bool = False) -> None:
        """Keep the present moment for the map (see `htmlmap.Frame`); `event` counts from 0."""
        waiting = tuple(
            (c.key, self.reasons.get(c.key, ()))
            for work in self.pending.values()
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
            )
        )
        self.refused = []

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
                    reasons=() if allocated else self.reasons.get(key, ("not allocated: waiting",)),
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
) -> Result:
    """Replay the trace's events against one allocator and measure the outcome; keep `frames`
    moments for the map (see the module docstring). Deterministic; no I/O. Departures at one
    time form a batch: the pending work is retried once after it."""
    start = time.perf_counter()
    state = _State(tr, policy=policy, retry=retry, search_limit=search_limit)
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
