"""Gang benchmark: gangs (PodGroups with a rack topology key) placed by dractl's scheduler against kube-scheduler 1.36.

Run from the repository root, under nice on a shared machine:
`nice python benchmarks/gang.py [--quick] [--size NODES:RACKS:GANGS] [--seed N] [--settle S]`
(default 500:25:60, issue 23's; `--quick`: 40:4:8).

What one run is: a fresh local control plane (etcd + kube-apiserver 1.36.2, as the tests start it, serving
`scheduling.k8s.io/v1alpha2`) with kube-controller-manager and kube-scheduler (`ControlPlane.start_components`: the
gates GenericWorkload, GangScheduling, TopologyAwareWorkloadScheduling and DRAWorkloadResourceClaims on for every
component, so kube-scheduler's gang and topology plugins run), N nodes (Ready, no kubelet) each publishing the example
DGX H100's slice (8 GPUs), in R racks of consecutive nodes labelled `dractl.io/rack`, and one warm-up pod bound (every
cache synced before the clock starts). Then G gangs are created at once by 8 threads: each a PodGroup
(`gang: {minCount: its size}`, topology key `dractl.io/rack`) and its pods, each pod with one claim from a
ResourceClaimTemplate for its gang's GPUs per pod. The gangs are drawn from `--seed`: 4-16 pods of 1-8 GPUs each, the
pod count lowered where a rack is too small to hold the gang when empty (never at the default size: a rack of 20 nodes
holds any). kube-controller-manager makes every claim in both runs; they differ in who schedules: kube-scheduler (the
pods' default scheduler), or `dractl controller` with its defaults (pods with `schedulerName: dractl`), kube-scheduler
idle beside it. Every client runs at raised limits (1000 QPS, burst 2000). The two runs alternate, kube-scheduler first.

The clock runs from the first creation to the moment a watch sees the last pod of the last whole gang bound. A run ends
when every gang is bound whole, or once no pod was bound for `--settle` seconds (the gangs left do not fit), or at
`--timeout`.

Per run it prints: gangs bound whole, gangs/s (whole gangs over the time to the last gang bound), that time, partial
gangs (a gang with some but fewer than minCount pods bound; polled from the watch every 0.25 s while the run goes, and
how long the longest one stayed so: bindings of one gang are separate writes, so a gang is partial for a moment while it
is bound), pods outside their gang's rack, and GPUs in use at the end; then dractl's gangs/s over kube-scheduler's.

Each run is checked (a run that fails says CHECK FAILED and its figures do not count): every bound pod's claim
allocated on its node, reserved for it and owned by it, holding its gang's GPUs per pod; no device in two claims; no
claim of an unbound pod holding a device; every gang whole in one rack or not bound at all.

Targets (issue 23), printed, never asserted: dractl at least 3x kube-scheduler's gangs/s; 0 partial gangs at the end
and 0 rack violations; where not all gangs fit, dractl's GPUs in use at least kube-scheduler's.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import random
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import controller  # benchmarks/controller.py (it puts tests/ on sys.path): the contenders and claim checks it shares
import controlplane  # tests/controlplane.py: the same control plane the tests start
import yaml
from support import kube_objects  # tests/support/kube_objects.py: the API objects the tests create

from dractl.kube import client, informer

NAMESPACE = "bench"
RACK_LABEL = "dractl.io/rack"
GPUS_PER_NODE = 8
DEFAULT_SIZE = (500, 25, 60)
QUICK_SIZE = (40, 4, 8)
TARGET_RATIO = 3.0
POLL = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class Gang:
    name: str
    pods: int
    gpus: int  # per pod

    def pod_names(self) -> list[str]:
        return [f"{self.name}-{index:02d}" for index in range(self.pods)]


def draw_gangs(*, nodes: int, racks: int, gangs: int, seed: int) -> list[Gang]:
    """`gangs` gangs of 4-16 pods x 1-8 GPUs from `seed`, each made to fit an empty rack (pods lowered where the
    smallest rack cannot hold them). Pure."""
    rng = random.Random(seed)
    smallest = nodes // racks
    drawn = []
    for index in range(gangs):
        pods, gpus = rng.randint(4, 16), rng.randint(1, 8)
        drawn.append(Gang(f"gang-{index:03d}", min(pods, smallest * (GPUS_PER_NODE // gpus)), gpus))
    return drawn


def rack_of(index: int, *, nodes: int, racks: int) -> str:
    """The rack of node `index`: consecutive nodes share one, racks as even as the counts allow. Pure."""
    return f"rack-{index * racks // nodes:03d}"


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def populate(api: client.Client, *, nodes: int, racks: int) -> dict[str, str]:
    """Device classes, the namespaces with their templates, and the racked nodes with their slices; node -> rack."""
    for document in yaml.safe_load_all((controller.EXAMPLES / "00-deviceclasses.yaml").read_text()):
        if document:
            api.create(client.DEVICE_CLASSES, document)
    kube_objects.make_namespace(api, NAMESPACE)
    for gpus in range(1, GPUS_PER_NODE + 1):
        spec = kube_objects.claim_spec(count=gpus)
        api.create(
            client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(f"gpus-{gpus}", namespace=NAMESPACE, spec=spec)
        )
    kube_objects.make_namespace(api, controller.WARMUP_NAMESPACE)
    api.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        kube_objects.template(controller.TEMPLATE, namespace=controller.WARMUP_NAMESPACE),
    )
    allocatable = {"cpu": "128", "memory": "1Ti", "pods": "110"}
    placed = {node_name(i): rack_of(i, nodes=nodes, racks=racks) for i in range(nodes)}

    def one(name: str) -> None:
        labels = {"kubernetes.io/hostname": name, RACK_LABEL: placed[name]}
        api.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
        kube_objects.make_ready(api, name, allocatable=allocatable)
        api.create(client.RESOURCE_SLICES, controller.example_slice(name))

    with concurrent.futures.ThreadPoolExecutor(controller.CREATORS) as pool:
        list(pool.map(one, placed))
    return placed


def pod_group(gang: Gang) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": gang.name, "namespace": NAMESPACE},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": gang.pods}},
            "schedulingConstraints": {"topology": [{"key": RACK_LABEL}]},
        },
    }


def member(name: str, gang: Gang, scheduler: str) -> dict[str, Any]:
    return kube_objects.pod(
        name,
        namespace=NAMESPACE,
        claims=[kube_objects.from_template(f"gpus-{gang.gpus}")],
        cpu="100m",
        schedulerName=scheduler,
        schedulingGroup={"podGroupName": gang.name},
    )


# --- Watching the run ------------------------------------------------------------------------------------


class Watch:
    """An informer on the benchmark's pods noting when each was first seen bound, and a poller counting the gangs
    partial (some but fewer than minCount pods bound) at each poll."""

    def __init__(self, api: client.Client, gangs: Sequence[Gang]) -> None:
        self.gangs = list(gangs)
        self.gang_of = {pod: gang.name for gang in gangs for pod in gang.pod_names()}
        self.bound_at: dict[str, float] = {}  # pod name -> when first seen bound
        self.seen_partial: set[str] = set()  # gangs partial at some poll
        self.most_partial = 0  # the most gangs partial at one poll
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.pods: informer.Informer[tuple[str, str]] = informer.Informer(
            api,
            client.PODS,
            namespace=NAMESPACE,
            decode=lambda raw: (raw["metadata"]["name"], raw["spec"].get("nodeName") or ""),
            handlers=informer.Handlers(on_add=self._seen, on_update=lambda _, new: self._seen(new)),
        )

    def _seen(self, seen: tuple[str, str]) -> None:
        name, node = seen
        with self._lock:
            if node and name in self.gang_of and name not in self.bound_at:
                self.bound_at[name] = time.monotonic()
                if len(self.bound_at) == len(self.gang_of):
                    self.done.set()

    def bound_per_gang(self) -> dict[str, int]:
        with self._lock:
            counts = collections.Counter(self.gang_of[name] for name in self.bound_at)
        return {gang.name: counts.get(gang.name, 0) for gang in self.gangs}

    def _poll(self) -> None:
        sizes = {gang.name: gang.pods for gang in self.gangs}
        while not self._stop.wait(POLL):
            partial = [name for name, bound in self.bound_per_gang().items() if 0 < bound < sizes[name]]
            self.seen_partial.update(partial)
            self.most_partial = max(self.most_partial, len(partial))

    def last_bound(self) -> float:
        with self._lock:
            return max(self.bound_at.values(), default=0.0)

    def longest_partial(self, end: float) -> float:
        """The longest a gang stayed partial: from its first pod bound to its last (to `end` while still partial)."""
        with self._lock:
            times: dict[str, list[float]] = collections.defaultdict(list)
            for name, at in self.bound_at.items():
                times[self.gang_of[name]].append(at)
        sizes = {gang.name: gang.pods for gang in self.gangs}
        return max(
            ((max(at) if len(at) == sizes[name] else end) - min(at) for name, at in times.items()),
            default=0.0,
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[Watch]:
        self.pods.start()
        poller = threading.Thread(target=self._poll, name="partial-gangs", daemon=True)
        try:
            if not self.pods.wait_synced(60):
                raise TimeoutError("the benchmark's own watch did not sync within 60 s")
            poller.start()
            yield self
        finally:
            self._stop.set()
            if poller.is_alive():
                poller.join()
            self.pods.stop()


def race(api: client.Client, watch: Watch, *, scheduler: str, settle: float, timeout: float) -> tuple[float, float]:
    """Create every gang (its PodGroup, then its pods) at once and wait until all are bound, or no pod was bound for
    `settle` seconds, or `timeout`; (seconds from the first create to the last pod bound, the run's end) in monotonic
    time as the first."""
    started = time.monotonic()

    def create(gang: Gang) -> None:
        api.create(client.POD_GROUPS, pod_group(gang))
        for name in gang.pod_names():
            api.create(client.PODS, member(name, gang, scheduler))

    with concurrent.futures.ThreadPoolExecutor(controller.CREATORS) as pool:
        creating = [pool.submit(create, gang) for gang in watch.gangs]
        deadline = started + timeout
        while not watch.done.wait(1.0):
            now = time.monotonic()
            quiet_since = max(watch.last_bound(), started)
            if now >= deadline or (all(f.done() for f in creating) and now - quiet_since >= settle):
                break
        for future in creating:
            future.result()
    return watch.last_bound() - started if watch.bound_at else 0.0, time.monotonic()


# --- The check -------------------------------------------------------------------------------------------


def check(
    *,
    gangs: Sequence[Gang],
    racks: Mapping[str, str],
    pods: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    all_claims: Sequence[Mapping[str, Any]],
) -> list[str]:
    """What is wrong with the outcome (empty: nothing): every bound pod's claim allocated on its node, reserved for it
    alone, owned by it and holding its gang's GPUs per pod; no claim of an unbound pod holding a device; no device in
    two claims; every gang whole in one rack or not bound at all. Pure."""
    problems: list[str] = []
    by_name = {claim["metadata"]["name"]: claim for claim in claims}
    by_owner = {ref.get("uid"): claim for claim in claims for ref in claim["metadata"].get("ownerReferences") or ()}
    gpus = {name: gang.gpus for gang in gangs for name in gang.pod_names()}
    nodes_of: dict[str, list[str]] = collections.defaultdict(list)  # gang -> nodes of its bound pods
    for item in pods:
        name, uid = item["metadata"]["name"], item["metadata"]["uid"]
        node = item["spec"].get("nodeName") or ""
        gang = ((item["spec"].get("schedulingGroup") or {}).get("podGroupName")) or ""
        if not node:
            claim = by_owner.get(uid)
            if claim is not None and controller._devices(claim):
                problems.append(f"pod {name} is not bound but its claim {claim['metadata']['name']} holds devices")
            continue
        nodes_of[gang].append(node)
        statuses = (item.get("status") or {}).get("resourceClaimStatuses") or []
        if len(statuses) != 1 or not statuses[0].get("resourceClaimName"):
            problems.append(f"pod {name} is bound to {node} but records {statuses!r}")
            continue
        claim_name = statuses[0]["resourceClaimName"]
        found = by_name.get(claim_name)
        if found is None:
            problems.append(f"pod {name} records claim {claim_name}, which does not exist")
            continue
        reserved = [entry.get("uid") for entry in (found.get("status") or {}).get("reservedFor") or ()]
        owners = [ref.get("uid") for ref in found["metadata"].get("ownerReferences") or ()]
        held = controller._devices(found)
        if len(held) != gpus.get(name, -1):
            problems.append(f"pod {name}'s claim {claim_name} holds {len(held)} devices, not {gpus.get(name)}")
        elif controller._allocated_node(found) != node:
            problems.append(
                f"pod {name} is bound to {node} but its claim {claim_name} is allocated on "
                f"{controller._allocated_node(found)!r}"
            )
        if reserved != [uid]:
            problems.append(f"pod {name}'s claim {claim_name} is reserved for {reserved!r}, not the pod alone")
        if owners != [uid]:
            problems.append(f"pod {name}'s claim {claim_name} is owned by {owners!r}")
    for gang in gangs:
        bound = nodes_of.get(gang.name, [])
        if bound and len(bound) != gang.pods:
            problems.append(f"gang {gang.name} is partial: {len(bound)} of {gang.pods} pods bound")
        spread = sorted({racks.get(node, "?") for node in bound})
        if len(spread) > 1:
            problems.append(f"gang {gang.name} spans racks {', '.join(spread)}")
    seen: dict[tuple[str, str, str], str] = {}
    for claim in all_claims:
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        for device in controller._devices(claim):
            if device in seen:
                problems.append(f"device {'/'.join(device)} is allocated to both {seen[device]} and {key}")
            seen[device] = key
    return problems


def outside_rack(racks: Mapping[str, str], pods: Sequence[Mapping[str, Any]]) -> int:
    """Bound pods not in their gang's rack (the rack most of the gang's bound pods are in). Pure."""
    by_gang: dict[str, list[str]] = collections.defaultdict(list)
    for item in pods:
        node = item["spec"].get("nodeName") or ""
        if node:
            by_gang[(item["spec"].get("schedulingGroup") or {}).get("podGroupName") or ""].append(racks.get(node, "?"))
    return sum(len(placed) - collections.Counter(placed).most_common(1)[0][1] for placed in by_gang.values())


# --- One run ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    contender: str
    gangs: int
    whole: int  # gangs bound whole
    pods_bound: int
    seconds: float  # to the last pod of the last gang bound
    seen_partial: int  # gangs partial at some poll
    most_partial: int  # the most partial at one poll
    longest_partial: float  # seconds
    partial_at_end: int
    outside: int  # pods outside their gang's rack
    gpus_in_use: int
    gpus: int  # in the cluster
    problems: list[str]

    @property
    def gangs_per_second(self) -> float:
        return self.whole / self.seconds if self.seconds else 0.0


def run(
    contender: controller.Contender, *, nodes: int, racks: int, gangs: Sequence[Gang], settle: float, timeout: float
) -> Figures:
    """One run on a control plane of its own: the cluster, the contender, the warm-up, the race, then the figures and
    the check of what the API server holds at the end."""
    with controlplane.running() as plane:
        api = client.connect(plane.kubeconfig)
        try:
            placed = populate(api, nodes=nodes, racks=racks)
            started = controller.start_contender(plane, contender)
            try:
                controller.warm_up(api, contender.scheduler)
                watch = Watch(api, gangs)
                with watch.running():
                    seconds, end = race(api, watch, scheduler=contender.scheduler, settle=settle, timeout=timeout)
                    longest = watch.longest_partial(end)
                items = api.list(client.PODS, namespace=NAMESPACE).items
                claims = api.list(client.RESOURCE_CLAIMS, namespace=NAMESPACE).items
                all_claims = api.list(client.RESOURCE_CLAIMS).items
            finally:
                started.stop()
        finally:
            api.close()
    bound = collections.Counter(
        (item["spec"].get("schedulingGroup") or {}).get("podGroupName")
        for item in items
        if item["spec"].get("nodeName")
    )
    return Figures(
        contender=contender.name,
        gangs=len(gangs),
        whole=sum(1 for gang in gangs if bound.get(gang.name, 0) == gang.pods),
        pods_bound=sum(bound.values()),
        seconds=seconds,
        seen_partial=len(watch.seen_partial),
        most_partial=watch.most_partial,
        longest_partial=longest,
        partial_at_end=sum(1 for gang in gangs if 0 < bound.get(gang.name, 0) < gang.pods),
        outside=outside_rack(placed, items),
        gpus_in_use=sum(len(controller._devices(claim)) for claim in claims),
        gpus=nodes * GPUS_PER_NODE,
        problems=check(gangs=gangs, racks=placed, pods=items, claims=claims, all_claims=all_claims),
    )


def report(figures: Figures, index: int) -> None:
    ok = "ok" if not figures.problems else "FAILED"
    print(
        f"  run {index}: {figures.contender} (raised limits): {figures.whole}/{figures.gangs} gangs bound whole "
        f"({figures.pods_bound} pods), last gang bound at {figures.seconds:.1f} s, {figures.gangs_per_second:.2f} "
        f"gangs/s, check {ok}; {controller.load()}"
    )
    print(
        f"    partial gangs: {figures.seen_partial} seen at a poll every {POLL:g} s (at most {figures.most_partial} "
        f"at once, the longest {figures.longest_partial:.2f} s), {figures.partial_at_end} at the end; pods outside "
        f"their gang's rack: {figures.outside}; GPUs in use at the end: {figures.gpus_in_use}/{figures.gpus}"
    )
    for problem in figures.problems[:20]:
        print(f"    CHECK FAILED: {problem}")
    if len(figures.problems) > 20:
        print(f"    CHECK FAILED: ... and {len(figures.problems) - 20} more")
    sys.stdout.flush()


def summarize(runs: Sequence[Figures]) -> None:
    by = {figures.contender: figures for figures in runs if not figures.problems}
    failed = [figures.contender for figures in runs if figures.problems]
    if failed:
        print(f"CHECK FAILED in {', '.join(failed)}: left out")
    kube, ours = by.get(controller.KUBE_SCHEDULER.name), by.get(controller.DRACTL.name)
    if kube is None or ours is None:
        return
    if kube.gangs_per_second:
        ratio = f"{ours.gangs_per_second / kube.gangs_per_second:.2f}x"
    else:
        ratio = "no ratio: kube-scheduler bound no gang whole"
    print(f"dractl / kube-scheduler gangs/s: {ratio} (target: at least {TARGET_RATIO:g}x)")
    print(
        f"target: 0 partial gangs at the end and 0 pods outside their rack: dractl {ours.partial_at_end} and "
        f"{ours.outside}, kube-scheduler {kube.partial_at_end} and {kube.outside}"
    )
    print(
        f"target: dractl's GPUs in use at least kube-scheduler's where not all gangs fit: dractl {ours.gpus_in_use}, "
        f"kube-scheduler {kube.gpus_in_use}"
    )
    sys.stdout.flush()


def size(text: str) -> tuple[int, int, int]:
    parts = text.split(":")
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"--size {text!r}: want NODES:RACKS:GANGS, three positive integers")
    nodes, racks, gangs = (int(part) for part in parts)
    if racks > nodes or nodes // racks < 4:
        raise argparse.ArgumentTypeError(f"--size {text!r}: each rack needs 4 nodes at least (a gang has 4 pods)")
    return nodes, racks, gangs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=size, metavar="NODES:RACKS:GANGS", help="cluster and gangs (default: 500:25:60)")
    parser.add_argument(
        "--quick", action="store_true", help=f"a small run: {':'.join(map(str, QUICK_SIZE))} unless --size is given"
    )
    parser.add_argument("--seed", type=int, default=23, help="the seed the gangs are drawn from (default: 23)")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="end a run once no pod was bound for this long (default: 30 s)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each run gets at most (default: 900)")
    args = parser.parse_args()
    nodes, racks, count = args.size or (QUICK_SIZE if args.quick else DEFAULT_SIZE)
    gangs = draw_gangs(nodes=nodes, racks=racks, gangs=count, seed=args.seed)
    print(f"machine: {controller.machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {controller.load()}")
    try:
        controlplane.find_binaries(controlplane.REQUIRED + controlplane.OPTIONAL)
    except controlplane.Unavailable as missing:
        print(f"skipping the gang race: {missing}")
        return
    gpus = sum(gang.pods * gang.gpus for gang in gangs)
    print(
        f"\n== {nodes} nodes x {GPUS_PER_NODE} GPUs in {racks} racks ({RACK_LABEL}), {count} gangs of "
        f"{sum(gang.pods for gang in gangs)} pods asking {gpus} GPUs (seed {args.seed}), created at once =="
    )
    runs = []
    for index, contender in enumerate((controller.KUBE_SCHEDULER, controller.DRACTL), 1):
        figures = run(contender, nodes=nodes, racks=racks, gangs=gangs, settle=args.settle, timeout=args.timeout)
        report(figures, index)
        runs.append(figures)
    summarize(runs)


if __name__ == "__main__":
    main()
