"""Placement quality of first-fit and binpack on the issue's cluster and claim mix, and the replay's speed.

Run from the repository root: `python benchmarks/placement.py [--seeds 5] [--claims 400]`.

The cluster: 20 example nodes (8 A100 nodes with dynamic MIG and NVLink partitions, 8 H100 nodes
with NVLink partitions, 4 T4 nodes with 2 GPUs; 136 GPUs), run twice: under the generator's
names (a100-01.., h100-01.., t4-01.., so first-fit fills the A100s first) and renamed per seed
with names drawn from that seed (a shuffled name order), so a policy cannot lean on names. The
mix (`trace.MIXES["reference"]`): 1 GPU with a memory floor 40%, one MIG slice 30%, two MIG
slices of one parent 10%, 2 or 4 NVLink GPUs 15%, 8 GPUs 5%.

Per seed and policy it replays two traces made by `dractl simulate --generate`:
- fill: claims arrive and never leave (`departures=0`, `--retry never`): claims admitted before
  the first rejection, GPU memory stranded at that moment (free memory on partly used GPUs that
  no request shape of the mix can use), and claims admitted in all;
- churn: rounds of `--round` claims, 30% of the present claims departing at the start of each
  round (`departures=0.3`, `--retry on-departure`): rejections (claims refused on arrival) and
  claims admitted in all.
Then the ratios binpack / first-fit against the issue's targets (at least 25% more admitted
before the first rejection, at least 50% fewer rejections under churn, at most 5% of the GPU
memory stranded at the first rejection, never fewer claims admitted in all), and the wall time
of replaying a 10,000-event trace on 1,000 nodes (target: under 10 s) with the machine's load.
Prints figures; checks nothing against them.

Two references that need no allocator, to tell placement from capacity (`Capacity`):
- bound: the most claims any allocator could admit before the first rejection. Claim k can be
  admitted only if the first k claims together fit the cluster counted without fragmentation:
  whole-GPU requests on the GPUs that can serve one, MIG requests by their share of a
  partitionable GPU's memory slices, rounded up to whole GPUs, 8-GPU claims one node each.
  An upper bound: no placement does better, whatever the node names.
- fragmentation-free: the churn trace replayed (same retries) against that relaxed cluster, a
  packer that never fragments. Under overload it rejects more than the real policies, because
  every big claim it admits takes the room of several small ones: there, rejections measure
  capacity, not placement.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import fractions
import math
import os
import random
import statistics
import time
from collections.abc import Mapping

from dractl import config, model
from dractl.simulate import metrics, replay, trace

POLICIES = (config.Policy.FIRST_FIT, config.Policy.BINPACK)
TARGET_BEFORE_FIRST = 1.25
TARGET_REJECTIONS = 0.5
TARGET_STRANDED = 0.05
TARGET_SECONDS = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    """One seed's replays under one policy."""

    before_first: int
    stranded: float  # share of the cluster's GPU memory, at the first rejection
    fill_admitted: int
    churn_rejections: int
    churn_admitted: int


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """One seed's figures that need no allocator (see the module docstring)."""

    bound: int  # the most claims any allocator admits before the first rejection
    fluid_rejections: int  # rejections under churn of the fragmentation-free packer
    fluid_admitted: int


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """The cluster counted without fragmentation: the GPUs that can serve a whole-GPU request
    of the mix, how many of them carry MIG placements, the nodes with 8 or more of them, and each
    MIG profile's share of its GPU's memory slices."""

    whole: int
    partitionable: int
    eight_gpu_nodes: int
    share: Mapping[str, fractions.Fraction]

    def fits(self, whole: int, mig: fractions.Fraction, eight: int) -> bool:
        """Whether whole-GPU requests, MIG shares and 8-GPU claims of these totals fit at once."""
        partitioned = math.ceil(mig)
        return whole + partitioned <= self.whole and partitioned <= self.partitionable and eight <= self.eight_gpu_nodes


def _shapes(claim: model.ResourceClaim) -> tuple[metrics.RequestShape, ...]:
    shapes = trace.shapes_of(claim)
    if not shapes:
        raise ValueError(f"claim {claim.key} declares no request shapes ({trace.SHAPES})")
    return shapes


def capacity(tr: trace.Trace) -> Capacity:
    """The trace's cluster as `Capacity`, for the reference mix. A GPU serves one of its
    whole-GPU requests when it has their memory floor (1 GPU with a floor), an NVLink partition
    (2 or 4 GPUs in one partition) or 7 siblings on its node (8 GPUs). Only the reference mix's
    claim kinds ask for whole GPUs in just these ways, so no GPU left out could serve one (the
    T4s of the reference cluster serve none); a trace with other claim kinds is refused
    (ValueError)."""
    shapes = [s for a in trace.arrivals(tr) if isinstance(a.object, model.ResourceClaim) for s in _shapes(a.object)]
    kinds = {a.object.meta.labels.get("dractl.io/mix") for a in trace.arrivals(tr)}
    if not kinds <= {share.name for share in trace.MIXES["reference"]}:
        raise ValueError("the bound counts the reference mix's claim kinds only")
    floor = min((s.min_memory for s in shapes if s.kind == "gpu" and s.min_memory), default=0)
    gpus = metrics.inventory(tr.cluster.resource_slices, ())
    per_node = collections.Counter(g.node for g in gpus)
    whole = [g for g in gpus if g.memory >= floor or g.attributes.get("partition2") or per_node[g.node] >= 8]
    share: dict[str, fractions.Fraction] = {}
    for gpu in gpus:
        for p in gpu.placements:
            share.setdefault(p.profile, fractions.Fraction(p.size, gpu.slices))
    eight_nodes = collections.Counter(g.node for g in whole)
    return Capacity(
        whole=len(whole),
        partitionable=sum(1 for g in whole if g.placements),
        eight_gpu_nodes=sum(1 for n in eight_nodes.values() if n >= 8),
        share=share,
    )


def _need(claim: model.ResourceClaim, cap: Capacity) -> tuple[int, fractions.Fraction, int]:
    """(whole GPUs, MIG share, 8-GPU claims) one claim of the mix asks for."""
    shapes = _shapes(claim)
    whole = sum(1 for s in shapes if s.kind == "gpu")
    mig = sum((cap.share[s.profile or ""] for s in shapes if s.kind == "mig"), fractions.Fraction(0))
    return whole, mig, int(whole >= 8)


def reference(fill: trace.Trace, churn: trace.Trace) -> Reference:
    """The bound on the fill trace and the fragmentation-free packer's replay of the churn trace
    (arrivals admitted when they fit, departures at one time as a batch, then the waiting
    claims retried in arrival order, as `replay` does)."""
    cap = capacity(fill)
    churn_cap = capacity(churn)
    used = (0, fractions.Fraction(0), 0)
    bound = 0
    for arrival in trace.arrivals(fill):
        assert isinstance(arrival.object, model.ResourceClaim)
        total = tuple(u + n for u, n in zip(used, _need(arrival.object, cap), strict=True))
        if not cap.fits(*total):
            break
        used, bound = total, bound + 1
    held: dict[str, tuple[int, fractions.Fraction, int]] = {}
    waiting: dict[str, tuple[int, fractions.Fraction, int]] = {}
    rejections = admitted = 0
    used = (0, fractions.Fraction(0), 0)

    def admit(key: str, need: tuple[int, fractions.Fraction, int]) -> bool:
        nonlocal admitted, used
        total = tuple(u + n for u, n in zip(used, need, strict=True))
        if not churn_cap.fits(*total):
            return False
        held[key], used, admitted = need, total, admitted + 1
        return True

    events = churn.events
    for i, event in enumerate(events):
        if isinstance(event, trace.Arrival):
            assert isinstance(event.object, model.ResourceClaim)
            need = _need(event.object, churn_cap)
            if not admit(event.key, need):
                rejections += 1
                waiting[event.key] = need
            continue
        gone = held.pop(event.key, None)
        if gone is not None:
            used = tuple(u - n for u, n in zip(used, gone, strict=True))
        waiting.pop(event.key, None)
        following = events[i + 1] if i + 1 < len(events) else None
        if not (isinstance(following, trace.Departure) and following.at == event.at):
            for key, need in list(waiting.items()):
                if admit(key, need):
                    del waiting[key]
    return Reference(bound=bound, fluid_rejections=rejections, fluid_admitted=admitted)


def renamed(tr: trace.Trace, *, seed: int) -> trace.Trace:
    """The trace with its nodes renamed by names drawn from `seed` (a shuffled name order)."""
    rng = random.Random(f"names-{seed}")
    document = copy.deepcopy(dict(tr.document))
    examples = document["spec"]["cluster"]["examples"]
    names = set()
    while len(names) < len(examples):
        names.add(f"node-{rng.randrange(16**6):06x}")
    shuffled = sorted(names)  # sorted first: a set's order changes with the interpreter's hash seed
    rng.shuffle(shuffled)
    for example, name in zip(examples, shuffled, strict=True):
        example["node"] = name
    return trace.parse(document, file=f"{tr.file} renamed by seed {seed}")


def traces(seed: int, *, claims: int, round_size: int, shuffle: bool) -> tuple[trace.Trace, trace.Trace]:
    """The seed's fill and churn traces, with shuffled node names when `shuffle`."""
    fill = trace.generate(f"mix=reference,seed={seed},claims={claims},departures=0")
    churn = trace.generate(f"mix=reference,seed={seed},claims={claims * 3},round={round_size},departures=0.3")
    if shuffle:
        fill, churn = renamed(fill, seed=seed), renamed(churn, seed=seed)
    return fill, churn


def measure(fill: trace.Trace, churn: trace.Trace) -> dict[config.Policy, Figures]:
    out: dict[config.Policy, Figures] = {}
    for policy in POLICIES:
        filled = replay.replay(fill, policy=policy, retry=config.Retry.NEVER)
        churned = replay.replay(churn, policy=policy, retry=config.Retry.ON_DEPARTURE)
        first = filled.at_first_rejection
        stranded = first.cluster.memory_stranded / first.cluster.memory if first and first.cluster.memory else 0.0
        assert filled.metrics.time is not None and churned.metrics.time is not None
        out[policy] = Figures(
            before_first=filled.metrics.time.admitted_before_first_rejection,
            stranded=stranded,
            fill_admitted=filled.metrics.time.admitted,
            churn_rejections=churned.metrics.time.rejections,
            churn_admitted=churned.metrics.time.admitted,
        )
    return out


def _ratio(new: float, old: float) -> float:
    return new / old if old else float("inf") if new else 1.0


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


def report(rows: list[dict[config.Policy, Figures]], references: list[Reference]) -> None:
    """The ratios binpack / first-fit over the seeds, against the issue's targets and the bound."""
    ff, bp = config.Policy.FIRST_FIT, config.Policy.BINPACK
    before = [_ratio(r[bp].before_first, r[ff].before_first) for r in rows]
    reachable = [_ratio(ref.bound, r[ff].before_first) for r, ref in zip(rows, references, strict=True)]
    of_bound = [_ratio(r[bp].before_first, ref.bound) for r, ref in zip(rows, references, strict=True)]
    rejections = [_ratio(r[bp].churn_rejections, r[ff].churn_rejections) for r in rows]
    stranded = max(r[bp].stranded for r in rows)
    never_worse = all(
        r[bp].fill_admitted >= r[ff].fill_admitted and r[bp].churn_admitted >= r[ff].churn_admitted for r in rows
    )
    print(
        f"  admitted before the first rejection, binpack / first-fit: min {min(before):.2f}, "
        f"mean {statistics.mean(before):.2f} (target >= {TARGET_BEFORE_FIRST:.2f} on every seed: "
        f"{'met' if min(before) >= TARGET_BEFORE_FIRST else 'NOT met'})"
    )
    print(
        f"  the most any allocator could reach, bound / first-fit: {', '.join(f'{r:.2f}' for r in reachable)} "
        f"(target reachable on {sum(r >= TARGET_BEFORE_FIRST for r in reachable)} of {len(rows)} seeds); "
        f"binpack reaches {min(of_bound):.0%}-{max(of_bound):.0%} of the bound"
    )
    print(
        f"  rejections under churn, binpack / first-fit: max {max(rejections):.2f}, "
        f"mean {statistics.mean(rejections):.2f} (target <= {TARGET_REJECTIONS:.2f} on every seed: "
        f"{'met' if max(rejections) <= TARGET_REJECTIONS else 'NOT met'})"
    )
    print(
        f"  memory stranded at the first rejection under binpack: at most {stranded:.1%} "
        f"(target <= {TARGET_STRANDED:.0%}: {'met' if stranded <= TARGET_STRANDED else 'NOT met'})"
    )
    print(f"  binpack admits at least as many claims in all on every seed and trace: {'yes' if never_worse else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default: 5)")
    parser.add_argument("--claims", type=int, default=400, help="claims of the fill trace; churn has 3x (default: 400)")
    parser.add_argument("--round", type=int, default=30, help="claims per round under churn (default: 30)")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of the speed run (default: 1000)")
    parser.add_argument("--events", type=int, default=10_000, help="events of the speed run (default: 10000)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    print("cluster: 8x A100 (dynamic MIG, NVLink), 8x H100 (NVLink), 4x T4 (2 GPUs each): 136 GPUs")
    for shuffle in (False, True):
        names = "shuffled per seed" if shuffle else "as generated (a100-01.., h100-01.., t4-01..)"
        print(f"\nnode names {names}")
        header = f"{'seed':>4}  {'policy':<18} {'before 1st rej':>14} {'stranded':>9} {'fill admitted':>13}"
        print(header + f" {'churn rejections':>16} {'churn admitted':>14}")
        rows: list[dict[config.Policy, Figures]] = []
        references: list[Reference] = []
        for seed in range(1, args.seeds + 1):
            fill, churn = traces(seed, claims=args.claims, round_size=args.round, shuffle=shuffle)
            figures = measure(fill, churn)
            rows.append(figures)
            references.append(reference(fill, churn))
            for policy, f in figures.items():
                print(
                    f"{seed:>4}  {policy.value:<18} {f.before_first:>14} {f.stranded:>9.1%} {f.fill_admitted:>13}"
                    f" {f.churn_rejections:>16} {f.churn_admitted:>14}"
                )
            ref = references[-1]
            print(
                f"{seed:>4}  {'bound / frag-free':<18} {ref.bound:>14} {'-':>9} {'-':>13}"
                f" {ref.fluid_rejections:>16} {ref.fluid_admitted:>14}"
            )
        report(rows, references)
    events, loaded, seconds = speed(nodes=args.nodes, events=args.events)
    print(
        f"\nreplay of {events} events on {args.nodes} nodes (binpack): {seconds:.2f} s "
        f"(target < {TARGET_SECONDS:.0f} s: {'met' if seconds < TARGET_SECONDS else 'NOT met'}); "
        f"generating and loading the trace: {loaded:.2f} s"
    )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")


if __name__ == "__main__":
    main()
