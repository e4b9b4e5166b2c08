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
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import random
import statistics
import time

from dractl import config
from dractl.simulate import replay, trace

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


def measure(seed: int, *, claims: int, round_size: int, shuffle: bool) -> dict[config.Policy, Figures]:
    fill = trace.generate(f"mix=reference,seed={seed},claims={claims},departures=0")
    churn = trace.generate(f"mix=reference,seed={seed},claims={claims * 3},round={round_size},departures=0.3")
    if shuffle:
        fill, churn = renamed(fill, seed=seed), renamed(churn, seed=seed)
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


def report(rows: list[dict[config.Policy, Figures]]) -> None:
    """The ratios binpack / first-fit over the seeds, against the issue's targets."""
    ff, bp = config.Policy.FIRST_FIT, config.Policy.BINPACK
    before = [_ratio(r[bp].before_first, r[ff].before_first) for r in rows]
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
        header = f"{'seed':>4}  {'policy':<9} {'before 1st rej':>14} {'stranded':>9} {'fill admitted':>13}"
        print(header + f" {'churn rejections':>16} {'churn admitted':>14}")
        rows: list[dict[config.Policy, Figures]] = []
        for seed in range(1, args.seeds + 1):
            figures = measure(seed, claims=args.claims, round_size=args.round, shuffle=shuffle)
            rows.append(figures)
            for policy, f in figures.items():
                print(
                    f"{seed:>4}  {policy.value:<9} {f.before_first:>14} {f.stranded:>9.1%} {f.fill_admitted:>13}"
                    f" {f.churn_rejections:>16} {f.churn_admitted:>14}"
                )
        report(rows)
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
