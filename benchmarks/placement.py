"""Placement quality of first-fit and binpack against the exact optimum and under churn, and the replay's speed.

Run from the repository root: `python benchmarks/placement.py [--seeds 5] [--round 30]` (the
exact optimum needs the benchmark extra: `pip install -e '.[bench]'`).

The cluster: 20 example nodes (8 A100 nodes with dynamic MIG and NVLink partitions, 8 H100 nodes
with NVLink partitions, 4 T4 nodes with 2 GPUs; 136 GPUs). Two claim streams (`trace.MIXES`):
`reference` (1 GPU with at least 40Gi 40%, one MIG slice 30%, two MIG slices of one parent 10%,
2 or 4 NVLink GPUs of any model 15%, 8 GPUs 5%) and `h100-nvlink` (the same, but the memory floor
is drawn from 8Gi to 70Gi, so 8Gi claims fit a T4, and the NVLink claims select H100s only).
Three namings of the same nodes, so that a policy cannot lean on names: `generated` (a100-01..,
h100-01.., t4-01..: first-fit fills the A100s first), `h100-first` (node-01.. with the H100
nodes first, then A100, then T4) and `shuffled` (names drawn per seed, in a shuffled order).

Fill (`departures=0`, `--retry never`, 200 claims): the claims admitted before the first
rejection, against the exact optimum (`optimum.py`: the most any allocator could admit before
its first rejection, an integer program solved by CBC, cached in ~/.cache/dractl/optimum by a
hash of the trace; it does not depend on the names, so it is solved once per stream and seed),
and the GPU memory stranded at that moment. Target: binpack admits at least 95% of the optimum
on every seed of both streams under every naming.

Churn (`--round` claims a minute, 30% of the present claims departing at the start of each
minute, `--retry on-departure`, 1,200 claims): what is offered and what is admitted, in
GPU-hours (a whole GPU counts 1, a MIG device its share of its GPU's memory slices; a claim
offers from its arrival to its departure, and is admitted from its allocation, on arrival or
on a retry, to its departure); the offered load (offered GPU-hours over the cluster's GPUs
times the trace's duration). The default, 30 claims a minute, is the issue's "about 85% load";
counted this way it offers 76-78% of all 136 GPUs (81-83% of the 128 80 GB ones); `--round 33`
offers 84% of all. Counted per policy:
- refusals: claims refused on arrival (each claim once, however often it is retried);
- placement-caused refusals: refusals that a repack would have admitted. The witness: a fresh
  allocator (binpack, then first-fit if binpack fails) given every claim held at that moment
  plus the refused one, biggest first (GPU-hours per hour, then arrival order), admits them all.
  A refusal without such a witness may still be placement-caused: the figure is a lower bound;
- 8-GPU claims refused on arrival, as a share of the 8-GPU claims that arrived;
- whole nodes free: the 8-GPU nodes with every GPU free, averaged over the trace's time.
Targets, on the shuffled names: binpack's admitted GPU-hours at least first-fit's minus 0.5% on
every seed and at least 95.5% of the offered over the seeds; placement-caused refusals at most
half of first-fit's; at most 30% of the 8-GPU claims refused on arrival; on average at least 2
whole nodes free. Generated names are printed beside them.

Speed: the wall time of replaying a 10,000-event trace on 1,000 nodes (target: under 10 s),
with the machine's load. Prints figures and whether each target is met; asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import fractions
import os
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import optimum  # benchmarks/optimum.py, beside this file

from dractl import alloc, config, model
from dractl.simulate import metrics, replay, trace

POLICIES = (config.Policy.FIRST_FIT, config.Policy.BINPACK)
MIXES = ("reference", "h100-nvlink")
NAMINGS = ("generated", "h100-first", "shuffled")
FILL_CLAIMS = 200
CHURN_CLAIMS = 1200
DEPARTURES = 0.3
TARGET_OF_OPTIMUM = 0.95
TARGET_HOURS_VS_FIRST_FIT = 0.995
TARGET_HOURS_OF_OFFERED = 0.955
TARGET_PLACEMENT_REFUSALS = 0.5
TARGET_EIGHT_REFUSED = 0.30
TARGET_WHOLE_NODES = 2.0
TARGET_SECONDS = 10.0
EIGHT = "eight-gpus"  # the claim kind (label `dractl.io/mix`) that asks for 8 GPUs on one node


# --- namings -------------------------------------------------------------------------------------


def _with_names(tr: trace.Trace, names: Sequence[str], *, why: str) -> trace.Trace:
    document = copy.deepcopy(dict(tr.document))
    examples = document["spec"]["cluster"]["examples"]
    if len(names) != len(examples):
        raise ValueError(f"{tr.file}: {len(names)} names for {len(examples)} example nodes")
    for example, name in zip(examples, names, strict=True):
        example["node"] = name
    return trace.parse(document, file=f"{tr.file} {why}")


def named(tr: trace.Trace, naming: str, *, seed: int) -> trace.Trace:
    """The trace with its nodes named by `naming` (one of `NAMINGS`)."""
    examples = tr.document["spec"]["cluster"]["examples"]
    if naming == "generated":
        return tr
    if naming == "h100-first":
        rank = {trace.EXAMPLE_NODES[k]: i for i, k in enumerate(("h100", "a100", "t4"))}
        order = sorted(range(len(examples)), key=lambda i: (rank.get(examples[i]["file"], len(rank)), i))
        names = [""] * len(examples)
        for position, i in enumerate(order):
            names[i] = f"node-{position + 1:02d}"
        return _with_names(tr, names, why="with the H100 nodes named first")
    if naming == "shuffled":
        rng = random.Random(f"names-{seed}")
        drawn: set[str] = set()
        while len(drawn) < len(examples):
            drawn.add(f"node-{rng.randrange(16**6):06x}")
        shuffled = sorted(drawn)  # sorted first: a set's order changes with the interpreter's hash seed
        rng.shuffle(shuffled)
        return _with_names(tr, shuffled, why=f"renamed by seed {seed}")
    raise ValueError(f"naming {naming!r} is unknown (one of {', '.join(NAMINGS)})")


# --- GPU shares ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Gpus:
    """Where each device of the cluster lies: (pool, device) -> (node, GPU, the share of the GPU
    it takes: 1 for a full GPU, a MIG device its memory slices over the GPU's), each MIG profile's
    share, the nodes with 8 GPUs or more, and the GPUs in all."""

    devices: Mapping[tuple[str, str], tuple[str, str, fractions.Fraction]]
    profiles: Mapping[str, fractions.Fraction]
    big_nodes: frozenset[str]
    count: int

    @classmethod
    def of(cls, tr: trace.Trace) -> Gpus:
        devices: dict[tuple[str, str], tuple[str, str, fractions.Fraction]] = {}
        profiles: dict[str, fractions.Fraction] = {}
        per_node: dict[str, int] = {}
        gpus = metrics.inventory(tr.cluster.resource_slices, ())
        for gpu in gpus:
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
            devices[(gpu.pool, gpu.device)] = (gpu.node, gpu.key, fractions.Fraction(1))
            for p in gpu.placements:
                if not gpu.slices:
                    raise ValueError(f"GPU {gpu.key}: MIG device {p.device} but no memory slices")
                devices[(gpu.pool, p.device)] = (gpu.node, gpu.key, fractions.Fraction(p.size, gpu.slices))
                profiles.setdefault(p.profile, fractions.Fraction(p.size, gpu.slices))
        return cls(devices, profiles, frozenset(n for n, c in per_node.items() if c >= 8), len(gpus))

    def share(self, claim: model.ResourceClaim) -> fractions.Fraction:
        """The GPUs' worth an allocated claim holds."""
        if claim.allocation is None:
            raise ValueError(f"claim {claim.key} holds no allocation")
        return sum((self.devices[(r.pool, r.device)][2] for r in claim.allocation.results), fractions.Fraction(0))

    def asked(self, claim: model.ResourceClaim) -> fractions.Fraction:
        """The GPUs' worth a claim asks for, from its request shapes."""
        found = trace.shapes_of(claim)
        if not found:
            raise ValueError(f"claim {claim.key} declares no request shapes ({trace.SHAPES})")
        unknown = sorted({s.profile or "" for s in found if s.kind == "mig"} - self.profiles.keys())
        if unknown:
            raise ValueError(f"claim {claim.key}: no GPU of the cluster offers MIG profile {unknown[0]!r}")
        return sum(
            (self.profiles[s.profile or ""] if s.kind == "mig" else fractions.Fraction(1) for s in found),
            fractions.Fraction(0),
        )


# --- fill ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Fill:
    """One fill replay: claims admitted before the first rejection, the share of the cluster's
    GPU memory stranded at that moment, and claims admitted in all."""

    before_first: int
    stranded: float
    admitted: int


def fill(tr: trace.Trace, policy: config.Policy) -> Fill:
    result = replay.replay(tr, policy=policy, retry=config.Retry.NEVER)
    first = result.at_first_rejection
    stranded = first.cluster.memory_stranded / first.cluster.memory if first and first.cluster.memory else 0.0
    if result.metrics.time is None:
        raise ValueError(f"{tr.file}: the replay measured no time series")
    return Fill(result.metrics.time.admitted_before_first_rejection, stranded, result.metrics.time.admitted)


# --- churn ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Churn:
    """One churn replay (see the module docstring): GPU-hours offered and admitted, the offered
    load, refusals on arrival and how many of them were placement-caused, 8-GPU claims that
    arrived and were refused on arrival, and the whole 8-GPU nodes free on average."""

    offered: float
    admitted: float
    load: float
    refusals: int
    placement_refusals: int
    eight: int
    eight_refused: int
    whole_free: float


def churn(tr: trace.Trace, policy: config.Policy, *, gpus: Gpus) -> Churn:
    """Replay the churn trace under `policy` and count (see `Churn`)."""
    result = replay.replay(tr, policy=policy, retry=config.Retry.ON_DEPARTURE)
    events = tr.events
    start, end = events[0].at, events[-1].at
    arrived: dict[str, float] = {}
    asked: dict[str, fractions.Fraction] = {}
    offered = 0.0
    for event in events:
        if isinstance(event, trace.Arrival):
            assert isinstance(event.object, model.ResourceClaim)
            arrived[event.key] = event.at
            asked[event.key] = gpus.asked(event.object)
        elif event.key in arrived:
            offered += float(asked[event.key]) * (event.at - arrived.pop(event.key))
    offered += sum(float(asked[key]) * (end - at) for key, at in arrived.items())
    held: dict[str, model.ResourceClaim] = {}
    since: dict[str, float] = {}
    busy: dict[str, int] = {}  # GPU key -> devices held on it
    node_busy: dict[str, int] = dict.fromkeys(gpus.big_nodes, 0)  # GPUs of the node with a holder
    repacker = Repacker(tr, size=lambda c: asked[c.key])
    admitted = whole_time = 0.0
    last = start
    refusals = placement = eight = eight_refused = 0
    for action in result.actions:
        whole_time += sum(1 for n in node_busy.values() if n == 0) * (action.at - last)
        last = action.at
        for claim in action.claims:
            key = claim.key
            if action.kind is replay.ActionKind.ALLOCATE:
                held[key], since[key] = claim, action.at
                _count(claim, gpus, busy, node_busy, +1)
            elif action.kind is replay.ActionKind.RELEASE:
                admitted += float(gpus.share(claim)) * (action.at - since.pop(key))
                del held[key]
                _count(claim, gpus, busy, node_busy, -1)
            elif action.kind is replay.ActionKind.REJECT:
                refusals += 1
                placement += repacker.admits([*held.values()], claim)
        is_eight = action.kind in (replay.ActionKind.ALLOCATE, replay.ActionKind.REJECT) and not action.retry
        for claim in action.claims if is_eight else ():
            if claim.meta.labels.get("dractl.io/mix") == EIGHT:
                eight += 1
                eight_refused += action.kind is replay.ActionKind.REJECT
    whole_time += sum(1 for n in node_busy.values() if n == 0) * (end - last)
    admitted += sum(float(gpus.share(c)) * (end - since[key]) for key, c in held.items())
    duration = max(end - start, 1e-9)
    return Churn(
        offered=offered / 3600,
        admitted=admitted / 3600,
        load=offered / (gpus.count * duration),
        refusals=refusals,
        placement_refusals=placement,
        eight=eight,
        eight_refused=eight_refused,
        whole_free=whole_time / duration,
    )


def _count(claim: model.ResourceClaim, gpus: Gpus, busy: dict[str, int], node_busy: dict[str, int], sign: int) -> None:
    """Add (1) or remove (-1) the claim's devices from the busy GPUs and nodes."""
    assert claim.allocation is not None
    for r in claim.allocation.results:
        node, gpu, _ = gpus.devices[(r.pool, r.device)]
        before = busy.get(gpu, 0)
        busy[gpu] = before + sign
        if node in node_busy and (before == 0) != (busy[gpu] == 0):
            node_busy[node] += sign


class Repacker:
    """The witness that a refusal was caused by placement: allocators (binpack, then first-fit)
    on the trace's cluster that, given every claim held at that moment plus the refused one,
    biggest first, admit them all. Each allocator is empty between calls (everything it admits
    is released again), so it is as good as a fresh one for this purpose: any allocation it
    finds is a valid repack."""

    def __init__(self, tr: trace.Trace, *, size: Callable[[model.ResourceClaim], fractions.Fraction]) -> None:
        cluster = tr.cluster
        snapshot = alloc.Snapshot(
            device_classes=cluster.device_classes,
            resource_slices=cluster.resource_slices,
            nodes=cluster.nodes,
            allocated_claims=(),
        )
        policies = (config.Policy.BINPACK, config.Policy.FIRST_FIT)
        self._allocators = [alloc.Allocator(snapshot, policy=p) for p in policies]
        self._size = size

    def admits(self, held: Sequence[model.ResourceClaim], refused: model.ResourceClaim) -> bool:
        order = [dataclasses.replace(c, allocation=None) for c in held] + [refused]
        order.sort(key=lambda c: -self._size(c))  # stable: arrival order among equals
        for allocator in self._allocators:
            admitted = []
            for claim in order:
                if allocator.allocate([claim]).allocations is None:
                    break
                admitted.append(claim)
            for claim in admitted:
                allocator.release(alloc.claim_id(claim))
            if len(admitted) == len(order):
                return True
        return False


# --- traces and the report -----------------------------------------------------------------------


def traces(mix: str, seed: int, *, round_size: int) -> tuple[trace.Trace, trace.Trace]:
    """The seed's fill and churn traces of a stream, with generated names."""
    fill_trace = trace.generate(f"mix={mix},seed={seed},claims={FILL_CLAIMS},departures=0")
    churn_trace = trace.generate(
        f"mix={mix},seed={seed},claims={CHURN_CLAIMS},round={round_size},departures={DEPARTURES}"
    )
    return fill_trace, churn_trace


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report_fill(mix: str, seeds: Sequence[int], *, time_limit: float) -> bool:
    """Per naming and seed: first-fit, binpack and the optimum before the first rejection."""
    print(f"\n== {mix}: fill ({FILL_CLAIMS} claims, no departures), admitted before the first rejection")
    best: dict[int, optimum.Optimum] = {}
    fills: dict[int, trace.Trace] = {}
    for seed in seeds:
        fills[seed] = traces(mix, seed, round_size=1)[0]
        start = time.perf_counter()
        best[seed] = optimum.cached(fills[seed], time_limit=time_limit)
        took = time.perf_counter() - start
        proof = "proven" if best[seed].proven else f"best found, bound {best[seed].bound}"
        print(f"  seed {seed}: optimum {best[seed].value} ({proof}; {took:.1f} s, 0 when cached)")
    header = f"  {'naming':<11} {'seed':>4} {'first-fit':>9} {'binpack':>8} {'optimum':>8} {'binpack/opt':>11}"
    print(header + f" {'stranded':>9}")
    worst = 1.0
    for naming in NAMINGS:
        for seed in seeds:
            tr = named(fills[seed], naming, seed=seed)
            ff, bp = fill(tr, config.Policy.FIRST_FIT), fill(tr, config.Policy.BINPACK)
            share = bp.before_first / best[seed].value if best[seed].value else 1.0
            worst = min(worst, share)
            print(
                f"  {naming:<11} {seed:>4} {ff.before_first:>9} {bp.before_first:>8} {best[seed].value:>8}"
                f" {share:>11.1%} {bp.stranded:>9.1%}"
            )
    ok = worst >= TARGET_OF_OPTIMUM
    print(f"  binpack reaches at least {worst:.1%} of the optimum (target >= {TARGET_OF_OPTIMUM:.0%}: {_met(ok)})")
    return ok


def report_churn(mix: str, seeds: Sequence[int], *, round_size: int) -> bool:
    """Per naming and seed: the churn figures of both policies, then the targets on shuffled names."""
    print(f"\n== {mix}: churn ({CHURN_CLAIMS} claims, {round_size} a minute, {DEPARTURES:.0%} departing each minute)")
    header = f"  {'naming':<10} {'seed':>4} {'policy':<9} {'load':>5} {'offered':>8} {'admitted':>8} {'of offered':>10}"
    print(header + f" {'refused':>7} {'by placement':>12} {'8-GPU refused':>13} {'whole free':>10}")
    ok = True
    for naming in ("shuffled", "generated"):
        rows: dict[config.Policy, list[Churn]] = {p: [] for p in POLICIES}
        for seed in seeds:
            tr = named(traces(mix, seed, round_size=round_size)[1], naming, seed=seed)
            gpus = Gpus.of(tr)
            for policy in POLICIES:
                c = churn(tr, policy, gpus=gpus)
                rows[policy].append(c)
                print(
                    f"  {naming:<10} {seed:>4} {policy.value:<9} {c.load:>5.0%} {c.offered:>8.1f} {c.admitted:>8.1f}"
                    f" {c.admitted / c.offered:>10.1%} {c.refusals:>7} {c.placement_refusals:>12}"
                    f" {c.eight_refused:>6}/{c.eight:<6} {c.whole_free:>10.2f}"
                )
        ff, bp = rows[config.Policy.FIRST_FIT], rows[config.Policy.BINPACK]
        vs = [b.admitted / f.admitted for b, f in zip(bp, ff, strict=True)]
        of_offered = sum(b.admitted for b in bp) / sum(b.offered for b in bp)
        placed = (sum(b.placement_refusals for b in bp), sum(f.placement_refusals for f in ff))
        eight = sum(b.eight_refused for b in bp) / max(sum(b.eight for b in bp), 1)
        whole = statistics.mean(b.whole_free for b in bp)
        checks = [
            (
                f"admitted GPU-hours binpack / first-fit: min {min(vs):.2%}",
                min(vs) >= TARGET_HOURS_VS_FIRST_FIT,
                f">= {TARGET_HOURS_VS_FIRST_FIT:.1%} on every seed",
            ),
            (
                f"binpack admits {of_offered:.1%} of the offered GPU-hours",
                of_offered >= TARGET_HOURS_OF_OFFERED,
                f">= {TARGET_HOURS_OF_OFFERED:.1%}",
            ),
            (
                f"placement-caused refusals binpack {placed[0]}, first-fit {placed[1]}",
                placed[0] <= TARGET_PLACEMENT_REFUSALS * placed[1],
                f"<= {TARGET_PLACEMENT_REFUSALS:.0%} of first-fit's",
            ),
            (
                f"8-GPU claims refused on arrival under binpack: {eight:.0%}",
                eight <= TARGET_EIGHT_REFUSED,
                f"<= {TARGET_EIGHT_REFUSED:.0%}",
            ),
            (
                f"whole 8-GPU nodes free on average under binpack: {whole:.2f}",
                whole >= TARGET_WHOLE_NODES,
                f">= {TARGET_WHOLE_NODES:.0f}",
            ),
        ]
        print(f"  {naming} names:")
        for text, met, target in checks:
            print(f"    {text} (target {target}: {_met(met) if naming == 'shuffled' else 'for shuffled names'})")
            if naming == "shuffled":
                ok = ok and met
    return ok


def speed(*, nodes: int, events: int) -> tuple[int, float, float]:
    """(events, seconds to generate and load, seconds to replay under binpack) on `nodes` nodes."""
    a100, h100 = nodes * 2 // 5, nodes * 2 // 5
    t4 = nodes - a100 - h100
    # About two events per claim once departures balance arrivals.
    start = time.perf_counter()
    tr = trace.generate(f"mix=reference,seed=1,claims={events // 2 + 100},a100={a100},h100={h100},t4={t4}")
    loaded = time.perf_counter() - start
    result = replay.replay(tr, policy=config.Policy.BINPACK)
    return len(tr.events), loaded, result.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default: 5)")
    parser.add_argument("--round", type=int, default=30, help="claims a minute under churn (default: 30)")
    parser.add_argument("--mix", choices=MIXES, action="append", help="a stream (default: both)")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per optimum (default: 600)")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of the speed run (default: 1000)")
    parser.add_argument("--events", type=int, default=10_000, help="events of the speed run (default: 10000)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    print("cluster: 8x A100 (dynamic MIG, NVLink), 8x H100 (NVLink), 4x T4 (2 GPUs each): 136 GPUs")
    seeds = range(1, args.seeds + 1)
    met: dict[str, bool] = {}
    for mix in args.mix or MIXES:
        met[f"{mix} fill"] = report_fill(mix, seeds, time_limit=args.time_limit)
        met[f"{mix} churn"] = report_churn(mix, seeds, round_size=args.round)
    events, loaded, seconds = speed(nodes=args.nodes, events=args.events)
    print(
        f"\nreplay of {events} events on {args.nodes} nodes (binpack): {seconds:.2f} s "
        f"(target < {TARGET_SECONDS:.0f} s: {_met(seconds < TARGET_SECONDS)}); "
        f"generating and loading the trace: {loaded:.2f} s"
    )
    print("targets: " + ", ".join(f"{name} {_met(ok)}" for name, ok in met.items()))
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")


if __name__ == "__main__":
    main()
