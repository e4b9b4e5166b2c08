"""Controller benchmark: pods/s from creation to binding, dractl's scheduler against kube-scheduler, measured fairly.

Run from the repository root, under nice on a shared machine:
`nice python benchmarks/controller.py [--quick] [--size NODES:PODS ...] [--rounds N] [--default-limits]`
(`--quick` with `--size`: those sizes, one round).

What one run is: a fresh local control plane (etcd + kube-apiserver 1.36.2 from ../shared/k8s, as the
tests start it) with kube-controller-manager and kube-scheduler (`ControlPlane.start_components`: the
resourceclaim controller on, node lifecycle off), N nodes (Ready, no kubelet) each publishing the
example DGX H100's slice (8 GPUs), one warm-up pod bound (so every cache is synced before the
clock starts), then P pods, each with one claim from a ResourceClaimTemplate for one GPU, created
by 8 threads. The clock runs from the first creation to the moment a watch sees the last pod
bound. kube-controller-manager makes every claim in both contenders; they differ in who schedules:

* `kube-scheduler`: pods with the default scheduler;
* `dractl`: pods with `schedulerName: dractl`, scheduled by `dractl controller` with its defaults
  (`--controllers scheduler`, 16 workers, binpack), kube-scheduler idle beside it;
* `dractl-defaults`: the same with dractl's client-side limits left at their defaults too, as users
  install it (`--kube-api-qps` and `--kube-api-burst` not given), beside kube-controller-manager at
  raised limits: what a user gets against kube-scheduler at raised limits, on the same box in one run.

The main figures run every client at raised limits: kube-controller-manager and kube-scheduler
with `--kube-api-qps 1000 --kube-api-burst 2000`, dractl with the same (but `dractl-defaults`).
`--default-limits` adds one run of kube-scheduler and dractl with every client at its default
(kube-controller-manager 20/30, kube-scheduler 50/100, dractl's), reported apart: there the claim
maker's limit bounds both sides. Contenders alternate (kube-scheduler, dractl, dractl-defaults,
kube-scheduler, ...), `--rounds` times each.

Per run it reports:
* pods/s, and where a pod's time goes: the p50/p90 of the steps a watch on pods and claims sees
  (created -> claim made -> claim recorded in the pod's status -> claim allocated -> pod bound);
* CPU milliseconds per pod of each process (dractl, kube-scheduler, kube-controller-manager,
  kube-apiserver, etcd; from /proc over the clocked window);
* API writes per pod from the API server's own `apiserver_request_total` (by verb, resource and
  subresource, before and after; the after is read once the write counts stop moving, so writes
  that trail the last binding, such as Events, count too). The scheduler's writes are those left
  once the benchmark's own pod creates and kube-controller-manager's claim creates and status
  applies (verb APPLY on pods/status) are taken out, and Leases (the control plane's own heartbeats);
* a check of the outcome: every pod bound, the claim each records allocated (on its node) and
  reserved for it, owned by it, no device given twice, no claim beyond the recorded ones. A run
  that fails a check says so in capitals and its row is marked; its figures do not count.

`--shared-nodes NODES:PODS` runs instead both schedulers at once on the same nodes (every other pod
for each; kube's components at raised limits, dractl at its defaults) and counts the devices given to
two claims, by the schedulers holding each and whose allocation was written first (the
resourceVersion of the event showing each claim's allocation): README's "two schedulers, one device".

Then the allocator's decision time per pod on a warm, half-full inventory (one `Allocator.allocate` of
a 1-GPU claim, in-process) at 500 and 5,000 nodes.

Targets (issue 14), printed with the figures, never asserted: dractl at least 2x kube-scheduler's
pods/s at 500 nodes and 3x at 2,000; dractl's CPU per pod at most a quarter of kube-scheduler's at
500 nodes; at most 4 scheduler writes per pod (finalizer, allocation, binding, and the `Scheduled` Event
kube-scheduler writes too; issue 14 set 3 before dractl wrote that Event).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import controlplane  # noqa: E402  (tests/controlplane.py: the same control plane the tests start)
import yaml  # noqa: E402  (the repository root must be on sys.path first)
from alloc import machine  # noqa: E402  (benchmarks/alloc.py)
from support import kube_objects  # noqa: E402  (tests/support/kube_objects.py: the API objects the tests create)

from dractl import alloc, model  # noqa: E402
from dractl.kube import client, informer  # noqa: E402
from dractl.model import decode  # noqa: E402

EXAMPLES = ROOT / "dractl" / "examples"
EXAMPLE_NODE = "dgx-h100-01"
NAMESPACE = "bench"
WARMUP_NAMESPACE = "warmup"
TEMPLATE = "one-gpu"
CREATORS = 8
RAISED_QPS = 1000  # kube's components get burst 2x this (controlplane.start_components), dractl too
SIZES = ((500, 2000), (2000, 2000))
QUICK_SIZE = (50, 200)
TARGET_RATIO = {500: 2.0, 2000: 3.0}
TARGET_CPU_SHARE = 0.25  # dractl's CPU per pod against kube-scheduler's, at 500 nodes
TARGET_WRITES = 4.0
TARGET_DECISION_MS = 1.0
PROCESS_ORDER = ("dractl", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
# Writes that are not the scheduler's: the benchmark's pod creates, kube-controller-manager's claim creates and
# status applies (resourceClaimStatuses), and the control plane's Lease heartbeats.
NOT_THE_SCHEDULERS = {("POST", "pods"), ("POST", "resourceclaims"), ("APPLY", "pods/status")}
BACKGROUND_RESOURCES = {"leases"}
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}


# --- What a run measures -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Contender:
    """Who schedules: `scheduler` is the pods' schedulerName; `raised` runs kube's components at raised limits, and
    dractl too unless `own_defaults` (dractl's limit flags left out, as a user installs it)."""

    name: str
    scheduler: str
    raised: bool
    own_defaults: bool = False

    @property
    def label(self) -> str:
        if self.own_defaults:
            return f"{self.name} (dractl at its default limits, kube's components raised)"
        return f"{self.name} ({'raised' if self.raised else 'default'} limits)"


KUBE_SCHEDULER = Contender("kube-scheduler", "default-scheduler", raised=True)
DRACTL = Contender("dractl", "dractl", raised=True)
DRACTL_DEFAULTS = Contender("dractl-defaults", "dractl", raised=True, own_defaults=True)


@dataclasses.dataclass
class Figures:
    contender: Contender
    round: int
    nodes: int
    pods: int
    bound: int
    seconds: float
    cpu_ms_per_pod: dict[str, float]
    writes: dict[tuple[str, str], float]  # (verb, resource[/subresource]) -> writes per pod, failed ones included
    failed_writes: dict[tuple[str, str, str], int]  # (verb, resource, code) -> count of 4xx/5xx answers
    steps: dict[str, tuple[float, float]]  # step -> (p50, p90) seconds
    problems: list[str]
    dractl_metrics: dict[str, float]

    @property
    def pods_per_second(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    @property
    def scheduler_writes(self) -> float:
        return sum(
            per_pod
            for (verb, resource), per_pod in self.writes.items()
            if (verb, resource) not in NOT_THE_SCHEDULERS and resource.split("/")[0] not in BACKGROUND_RESOURCES
        )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process used so far (its children not counted); 0 once it is gone."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Counter3 = collections.Counter[tuple[str, str, str]]
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def request_counts(plane: controlplane.ControlPlane) -> Counter3:
    """The API server's `apiserver_request_total`, summed by (verb, resource[/subresource], code)."""
    request = urllib.request.Request(f"{plane.url}/metrics")
    with urllib.request.urlopen(request, context=plane.ssl_context(), timeout=30) as answer:
        text = answer.read().decode()
    counts: Counter3 = collections.Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[(labels.get("verb", ""), resource, labels.get("code", ""))] += int(float(match["value"]))
    return counts


def writes_only(counts: Mapping[tuple[str, str, str], int]) -> Counter3:
    return collections.Counter({key: value for key, value in counts.items() if key[0] in WRITE_VERBS})


def settled_writes(plane: controlplane.ControlPlane, *, quiet: float = 2.0, limit: float = 20.0) -> Counter3:
    """The write counts once they stopped moving for `quiet` seconds (at most `limit` seconds of waiting)."""
    deadline = time.monotonic() + limit
    last = writes_only(request_counts(plane))
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = writes_only(request_counts(plane))
        if now == last:
            break
        last = now
    return last


# --- The cluster -----------------------------------------------------------------------------------


@functools.cache
def _example_text() -> str:
    [document] = [d for d in yaml.safe_load_all((EXAMPLES / f"21-{EXAMPLE_NODE}.yaml").read_text()) if d]
    return json.dumps(document)


def example_slice(node: str) -> dict[str, Any]:
    """The example DGX H100's slice as node `node` would publish it."""
    loaded: dict[str, Any] = json.loads(_example_text().replace(EXAMPLE_NODE, node))
    return loaded


def populate(api: client.Client, nodes: int) -> None:
    """Device classes, the namespaces with their template, and `nodes` Ready nodes with their slices."""
    for document in yaml.safe_load_all((EXAMPLES / "00-deviceclasses.yaml").read_text()):
        if document:
            api.create(client.DEVICE_CLASSES, document)
    for namespace in (NAMESPACE, WARMUP_NAMESPACE):
        kube_objects.make_namespace(api, namespace)
        api.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(TEMPLATE, namespace=namespace))
    allocatable = {"cpu": "128", "memory": "1Ti", "pods": "110"}

    def one(i: int) -> None:
        name = f"node-{i:05d}"
        api.create(
            client.NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            },
        )
        kube_objects.make_ready(api, name, allocatable=allocatable)
        api.create(client.RESOURCE_SLICES, example_slice(name))

    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(one, range(nodes)))


def pod(name: str, scheduler: str, *, namespace: str = NAMESPACE) -> dict[str, Any]:
    return kube_objects.pod(
        name, namespace=namespace, claims=[kube_objects.from_template(TEMPLATE)], cpu="100m", schedulerName=scheduler
    )


@dataclasses.dataclass
class Started:
    """The contender's processes beyond etcd and kube-apiserver, by name, and how to stop them."""

    pids: dict[str, int]
    stop: Callable[[], None]
    dractl_metrics_port: int = 0


def start_contender(plane: controlplane.ControlPlane, contender: Contender) -> Started:
    components = plane.start_components(api_qps=RAISED_QPS if contender.raised else 0)
    pids = {process.name: process.popen.pid for process in components.processes}
    if contender.scheduler == "default-scheduler":
        return Started(pids, components.stop)
    [port] = controlplane.free_ports(1)
    raised = contender.raised and not contender.own_defaults
    limits = ["--kube-api-qps", str(RAISED_QPS), "--kube-api-burst", str(2 * RAISED_QPS)] if raised else []
    with open(plane.directory / "dractl-controller.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dractl",
                "controller",
                "--kubeconfig",
                str(plane.kubeconfig),
                *limits,
                "--no-leader-elect",
                "--metrics-port",
                str(port),
                "--health-port",
                "-1",
                "--log-format",
                "json",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop() -> None:
        controlplane.stop_process(process, grace=20.0)
        components.stop()

    return Started({**pids, "dractl": process.pid}, stop, dractl_metrics_port=port)


def dractl_metrics(port: int) -> dict[str, float]:
    """The dractl controller's own figures that say where its time went (0 where a metric is missing)."""
    wanted = {
        "dractl_controller_api_throttle_seconds_total": "throttled s",
        'dractl_scheduler_attempts_total{result="scheduled"}': "attempts scheduled",
        'dractl_scheduler_attempts_total{result="error"}': "attempts failed",
        'dractl_scheduler_scheduling_duration_seconds_sum{result="scheduled"}': "sync s (sum)",
        'dractl_scheduler_scheduling_duration_seconds_count{result="scheduled"}': "syncs",
    }
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = dict.fromkeys(wanted.values(), 0.0)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            found[wanted[name]] = float(value)
    return found


# --- Watching the race ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodSeen:
    uid: str
    node: str
    recorded: bool


@dataclasses.dataclass(frozen=True)
class ClaimSeen:
    owner: str
    allocated: bool
    name: str = ""
    version: str = ""


class Watch:
    """Informers on the benchmark namespace's pods and claims that note when each step was first seen."""

    def __init__(self, api: client.Client, pods: int) -> None:
        self.pods = pods
        self.first: dict[str, dict[str, float]] = collections.defaultdict(dict)  # step -> pod uid -> time
        self.created: dict[str, float] = {}  # pod name -> when its create returned
        self.uids: dict[str, str] = {}  # pod name -> uid
        self.bound = 0
        self.allocated_at: dict[str, int] = {}  # claim name -> resourceVersion of the event showing its allocation
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.pod_informer: informer.Informer[PodSeen] = informer.Informer(
            api,
            client.PODS,
            namespace=NAMESPACE,
            decode=self._pod,
            handlers=informer.Handlers(on_add=self._pod_seen, on_update=lambda _, new: self._pod_seen(new)),
        )
        self.claim_informer: informer.Informer[ClaimSeen] = informer.Informer(
            api,
            client.RESOURCE_CLAIMS,
            namespace=NAMESPACE,
            decode=self._claim,
            handlers=informer.Handlers(on_add=self._claim_seen, on_update=lambda _, new: self._claim_seen(new)),
        )

    @staticmethod
    def _pod(raw: dict[str, Any]) -> PodSeen:
        return PodSeen(
            uid=raw["metadata"]["uid"],
            node=raw["spec"].get("nodeName") or "",
            recorded=bool((raw.get("status") or {}).get("resourceClaimStatuses")),
        )

    @staticmethod
    def _claim(raw: dict[str, Any]) -> ClaimSeen:
        owners = raw["metadata"].get("ownerReferences") or [{}]
        return ClaimSeen(
            owner=owners[0].get("uid", ""),
            allocated=bool((raw.get("status") or {}).get("allocation")),
            name=raw["metadata"]["name"],
            version=raw["metadata"].get("resourceVersion", ""),
        )

    def _note(self, step: str, uid: str) -> bool:
        with self._lock:
            if uid in self.first[step]:
                return False
            self.first[step][uid] = time.monotonic()
            return True

    def _pod_seen(self, seen: PodSeen) -> None:
        if seen.recorded:
            self._note("recorded", seen.uid)
        if seen.node and self._note("bound", seen.uid):
            with self._lock:
                self.bound += 1
                if self.bound >= self.pods:
                    self.done.set()

    def _claim_seen(self, seen: ClaimSeen) -> None:
        self._note("claim made", seen.owner)
        with self._lock:
            if seen.allocated:
                self.allocated_at.setdefault(seen.name, int(seen.version or 0))
            else:
                self.allocated_at.pop(seen.name, None)
        if seen.allocated:
            self._note("allocated", seen.owner)

    @contextlib.contextmanager
    def running(self) -> Iterator[Watch]:
        self.pod_informer.start()
        self.claim_informer.start()
        try:
            if not (self.pod_informer.wait_synced(60) and self.claim_informer.wait_synced(60)):
                raise TimeoutError("the benchmark's own watches did not sync within 60 s")
            yield self
        finally:
            self.pod_informer.stop()
            self.claim_informer.stop()

    def last_bound(self) -> float:
        with self._lock:
            return max(self.first["bound"].values(), default=0.0)

    def steps(self) -> dict[str, tuple[float, float]]:
        """p50 and p90 seconds of each step, over the pods that completed it."""
        with self._lock:
            created = {self.uids[name]: at for name, at in self.created.items() if name in self.uids}
            chain = [("created", created)] + [(step, dict(self.first[step])) for step in STEPS]
        result: dict[str, tuple[float, float]] = {}
        for (before, since), (after, until) in zip(chain, chain[1:], strict=False):
            spans = sorted(until[uid] - since[uid] for uid in until.keys() & since.keys())
            result[f"{before} -> {after}"] = _percentiles(spans)
        spans = sorted(self.first["bound"][uid] - created[uid] for uid in self.first["bound"].keys() & created.keys())
        result["created -> bound"] = _percentiles(spans)
        return result


STEPS = ("claim made", "recorded", "allocated", "bound")


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return (0.0, 0.0)
    return (statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.9))])


def race(api: client.Client, watch: Watch, *, schedulers: Sequence[str], timeout: float) -> float:
    """Create the pods (pod i for `schedulers[i % len(schedulers)]`) and wait until all are bound (or `timeout`);
    seconds from the first create to the last binding seen (to the timeout when not all were bound)."""
    started = time.monotonic()

    def create(i: int) -> None:
        name = f"p-{i:05d}"
        stored = api.create(client.PODS, pod(name, schedulers[i % len(schedulers)]))
        with watch._lock:
            watch.created[name] = time.monotonic()
            watch.uids[name] = stored["metadata"]["uid"]

    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        creating = [pool.submit(create, i) for i in range(watch.pods)]
        finished = watch.done.wait(timeout)
        for future in creating:
            future.result()
    end = watch.last_bound() if finished else time.monotonic()
    return end - started


def warm_up(api: client.Client, scheduler: str) -> None:
    """One pod of `scheduler` bound in the warm-up namespace: every process of the contender has its caches."""
    name = f"warm-up-{scheduler}"
    api.create(client.PODS, pod(name, scheduler, namespace=WARMUP_NAMESPACE))
    controlplane.wait_until(
        lambda: api.get(client.PODS, name, namespace=WARMUP_NAMESPACE)["spec"].get("nodeName"),
        what=f"the warm-up pod of {scheduler} is bound",
        timeout=180,
        interval=0.2,
    )


# --- The check ---------------------------------------------------------------------------------------


def _devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [(r["driver"], r["pool"], r["device"]) for r in (allocation.get("devices") or {}).get("results") or ()]


def _allocated_node(claim: Mapping[str, Any]) -> str:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                return str((field.get("values") or [""])[0])
    return ""


def check(
    pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]], all_claims: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What is wrong with the outcome (empty: nothing): every pod bound, the claim it records allocated on its node,
    reserved for it alone and owned by it; no claim beyond the recorded ones; no device in two claims anywhere.
    Pure."""
    problems: list[str] = []
    by_name = {claim["metadata"]["name"]: claim for claim in claims}
    recorded: set[str] = set()
    for item in pods:
        name, uid = item["metadata"]["name"], item["metadata"]["uid"]
        node = item["spec"].get("nodeName") or ""
        statuses = (item.get("status") or {}).get("resourceClaimStatuses") or []
        if not node:
            problems.append(f"pod {name} is not bound")
            continue
        if len(statuses) != 1 or not statuses[0].get("resourceClaimName"):
            problems.append(f"pod {name} is bound to {node} but records {statuses!r}")
            continue
        claim_name = statuses[0]["resourceClaimName"]
        recorded.add(claim_name)
        claim = by_name.get(claim_name)
        if claim is None:
            problems.append(f"pod {name} records claim {claim_name}, which does not exist")
            continue
        reserved = [entry.get("uid") for entry in (claim.get("status") or {}).get("reservedFor") or ()]
        owners = [ref.get("uid") for ref in claim["metadata"].get("ownerReferences") or ()]
        if len(_devices(claim)) != 1:
            problems.append(f"pod {name}'s claim {claim_name} holds {_devices(claim)!r}, not one GPU")
        elif _allocated_node(claim) != node:
            problems.append(
                f"pod {name} is bound to {node} but its claim {claim_name} is allocated on {_allocated_node(claim)!r}"
            )
        if reserved != [uid]:
            problems.append(f"pod {name}'s claim {claim_name} is reserved for {reserved!r}, not the pod alone")
        if owners != [uid]:
            problems.append(f"pod {name}'s claim {claim_name} is owned by {owners!r}")
    extra = sorted(set(by_name) - recorded)
    if extra:
        problems.append(f"{len(extra)} claims no pod records: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    seen: dict[tuple[str, str, str], str] = {}
    for claim in all_claims:
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        for device in _devices(claim):
            if device in seen:
                problems.append(f"device {'/'.join(device)} is allocated to both {seen[device]} and {key}")
            seen[device] = key
    return problems


# --- One run --------------------------------------------------------------------------------------------


def run(contender: Contender, *, round: int, nodes: int, pods: int, timeout: float) -> Figures:
    with controlplane.running() as plane:
        api = client.connect(plane.kubeconfig)
        try:
            populate(api, nodes)
            started = start_contender(plane, contender)
            try:
                warm_up(api, contender.scheduler)
                pids = {process.name: process.popen.pid for process in plane.processes} | started.pids
                watch = Watch(api, pods)
                with watch.running():
                    writes_before = settled_writes(plane)
                    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    seconds = race(api, watch, schedulers=[contender.scheduler], timeout=timeout)
                    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
                    writes_after = settled_writes(plane)
                    steps = watch.steps()
                    bound = watch.bound
                metrics = dractl_metrics(started.dractl_metrics_port) if started.dractl_metrics_port else {}
                problems = check(
                    api.list(client.PODS, namespace=NAMESPACE).items,
                    api.list(client.RESOURCE_CLAIMS, namespace=NAMESPACE).items,
                    api.list(client.RESOURCE_CLAIMS).items,
                )
            finally:
                started.stop()
        finally:
            api.close()
    delta = writes_after - writes_before
    writes: collections.Counter[tuple[str, str]] = collections.Counter()
    failed: dict[tuple[str, str, str], int] = {}
    for (verb, resource, code), count in delta.items():
        writes[(verb, resource)] += count
        if not code.startswith("2"):
            failed[(verb, resource, code)] = count
    return Figures(
        contender=contender,
        round=round,
        nodes=nodes,
        pods=pods,
        bound=bound,
        seconds=seconds,
        cpu_ms_per_pod={name: used / max(bound, 1) * 1000 for name, used in cpu.items()},
        writes={key: count / pods for key, count in writes.items()},
        failed_writes=failed,
        steps=steps,
        problems=problems,
        dractl_metrics=metrics,
    )


@dataclasses.dataclass
class Shared:
    """A race of both schedulers at once on shared nodes: `doubles` per device given to two claims, the schedulers
    holding it and the one whose allocation was written first (by the resourceVersion of the event that showed it)."""

    nodes: int
    pods: int
    bound: int
    seconds: float
    doubles: list[tuple[str, str, str]]  # (device, the schedulers holding it, the one that wrote first)
    problems: list[str]  # what the check finds besides devices given twice
    dractl_metrics: dict[str, float]


def shared_race(*, nodes: int, pods: int, timeout: float) -> Shared:
    """Both schedulers at once on the same nodes: every other pod for kube-scheduler (raised limits, as
    kube-controller-manager), the others for dractl at its defaults; then the devices given to two claims."""
    with controlplane.running() as plane:
        api = client.connect(plane.kubeconfig)
        try:
            populate(api, nodes)
            started = start_contender(plane, DRACTL_DEFAULTS)
            try:
                warm_up(api, KUBE_SCHEDULER.scheduler)
                warm_up(api, DRACTL_DEFAULTS.scheduler)
                watch = Watch(api, pods)
                with watch.running():
                    seconds = race(
                        api, watch, schedulers=[KUBE_SCHEDULER.scheduler, DRACTL_DEFAULTS.scheduler], timeout=timeout
                    )
                    bound = watch.bound
                    allocated_at = dict(watch.allocated_at)
                metrics = dractl_metrics(started.dractl_metrics_port)
                items = api.list(client.PODS, namespace=NAMESPACE).items
                claims = api.list(client.RESOURCE_CLAIMS, namespace=NAMESPACE).items
                problems = [p for p in check(items, claims, claims) if " is allocated to both " not in p]
            finally:
                started.stop()
        finally:
            api.close()
    scheduler_of = {item["metadata"]["uid"]: item["spec"].get("schedulerName", "") for item in items}
    holders: dict[tuple[str, str, str], list[Mapping[str, Any]]] = collections.defaultdict(list)
    for claim in claims:
        for device in _devices(claim):
            holders[device].append(claim)

    def scheduler(claim: Mapping[str, Any]) -> str:
        return scheduler_of.get((claim["metadata"].get("ownerReferences") or [{}])[0].get("uid", ""), "?")

    doubles: list[tuple[str, str, str]] = []
    for device, held in sorted(holders.items()):
        if len(held) < 2:
            continue
        first = min(held, key=lambda claim: allocated_at.get(claim["metadata"]["name"], 0))
        doubles.append(("/".join(device), " + ".join(sorted(scheduler(claim) for claim in held)), scheduler(first)))
    return Shared(
        nodes=nodes,
        pods=pods,
        bound=bound,
        seconds=seconds,
        doubles=doubles,
        problems=problems,
        dractl_metrics=metrics,
    )


def report_shared(shared: Shared) -> None:
    kinds = collections.Counter((holders, writer) for _, holders, writer in shared.doubles)
    print(
        f"  {shared.bound}/{shared.pods} bound in {shared.seconds:.1f} s, "
        f"{shared.bound / shared.seconds if shared.seconds else 0.0:.1f} pods/s; {load()}"
    )
    print(f"  devices given to two claims or more: {len(shared.doubles)}")
    for (holders, writer), count in sorted(kinds.items()):
        print(f"    held by {holders}, {writer} wrote first: {count}")
    for device, holders, writer in shared.doubles[:10]:
        print(f"    e.g. {device}: {holders}, {writer} wrote first")
    for problem in shared.problems[:20]:
        print(f"    CHECK FAILED: {problem}")
    print("  dractl: " + ", ".join(f"{name} {value:g}" for name, value in shared.dractl_metrics.items()))
    sys.stdout.flush()


# --- Reporting ---------------------------------------------------------------------------------------------


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def report_run(figures: Figures, index: int) -> None:
    ok = "ok" if not figures.problems else "FAILED"
    print(
        f"  run {index}: {figures.contender.label}: {figures.bound}/{figures.pods} bound in {figures.seconds:.1f} s, "
        f"{figures.pods_per_second:.1f} pods/s, check {ok}; {load()}"
    )
    for problem in figures.problems[:20]:
        print(f"    CHECK FAILED: {problem}")
    if len(figures.problems) > 20:
        print(f"    CHECK FAILED: ... and {len(figures.problems) - 20} more")
    cpu = ", ".join(
        f"{name} {figures.cpu_ms_per_pod[name]:.1f}" for name in PROCESS_ORDER if name in figures.cpu_ms_per_pod
    )
    print(f"    CPU ms per pod: {cpu}; all {sum(figures.cpu_ms_per_pod.values()):.1f}")
    steps = ", ".join(f"{step} {p50:.2f}/{p90:.2f}" for step, (p50, p90) in figures.steps.items())
    print(f"    steps p50/p90 s: {steps}")
    writes = ", ".join(
        f"{verb} {resource} {per_pod:.2f}" for (verb, resource), per_pod in sorted(figures.writes.items())
    )
    print(f"    API writes per pod: {writes}; the scheduler's: {figures.scheduler_writes:.2f}")
    if figures.failed_writes:
        failed = ", ".join(
            f"{verb} {resource} {code}: {n}" for (verb, resource, code), n in figures.failed_writes.items()
        )
        print(f"    refused or failed writes: {failed}")
    if figures.dractl_metrics:
        print("    dractl: " + ", ".join(f"{name} {value:g}" for name, value in figures.dractl_metrics.items()))
    sys.stdout.flush()


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _table(runs: Sequence[Figures]) -> None:
    """One row per contender: means over its runs (pods/s with each run's figure), CPU ms per pod per process."""
    by: dict[str, list[Figures]] = collections.defaultdict(list)
    for figures in runs:
        by[figures.contender.name].append(figures)
    names = "".join(f" {name:>11}" for name in ("dractl", "kube-sched", "kube-cm", "apiserver", "etcd", "all"))
    header = f"{'contender':<15} {'runs':>4} {'pods/s':>7} {'each run':<18}{names} {'writes':>7} {'p50 s':>6}"
    print(header)
    print(f"{'':<47}{'CPU ms per pod':^72} {'sched':>7} {'bound':>6}")
    print("-" * len(header))
    for name, group in by.items():
        cpu = [_mean([f.cpu_ms_per_pod.get(process, 0.0) for f in group]) for process in PROCESS_ORDER]
        each = ", ".join(f"{f.pods_per_second:.1f}" for f in group)
        print(
            f"{name:<15} {len(group):>4} {_mean([f.pods_per_second for f in group]):>7.1f} {each:<18}"
            + "".join(f" {value:>11.1f}" for value in cpu)
            + f" {_mean([sum(f.cpu_ms_per_pod.values()) for f in group]):>11.1f}"
            f" {_mean([f.scheduler_writes for f in group]):>7.2f}"
            f" {_mean([f.steps['created -> bound'][0] for f in group]):>6.1f}"
        )


def summarize(nodes: int, pods: int, runs: Sequence[Figures]) -> None:
    """The tables of one size (raised limits, then default limits): means over the runs that passed the check, the
    ratio of each round, and the targets."""
    print(f"\n{nodes} nodes x 8 GPUs, {pods} pods: the runs that passed the check")
    failed = [f for f in runs if f.problems]
    if failed:
        print(f"CHECK FAILED in {len(failed)} run(s), left out: " + "; ".join(f.contender.label for f in failed))
    passed = [f for f in runs if not f.problems]
    for raised in (True, False):
        chosen = [f for f in passed if f.contender.raised is raised]
        if not chosen:
            continue
        if raised:
            print(
                f"\nevery client at raised limits ({RAISED_QPS} QPS, burst {2 * RAISED_QPS}), "
                "but dractl in dractl-defaults (its default limits):"
            )
        else:
            print("\nevery client at its default limits:")
        _table(chosen)
        kube = [f for f in chosen if f.contender.scheduler == "default-scheduler"]
        if not kube:
            continue
        for name in dict.fromkeys(f.contender.name for f in chosen if f.contender.scheduler != "default-scheduler"):
            ours = [f for f in chosen if f.contender.name == name]
            ratio = _mean([f.pods_per_second for f in ours]) / max(_mean([f.pods_per_second for f in kube]), 1e-9)
            rounds = ", ".join(
                f"{m.pods_per_second / k.pods_per_second:.2f}"
                for k in kube
                for m in ours
                if m.round == k.round and k.pods_per_second
            )
            print(f"{name} / kube-scheduler pods/s: {ratio:.2f}x (each round: {rounds})")
        mine = [f for f in chosen if f.contender.name == DRACTL.name]
        if not (raised and mine):
            continue
        ratio = _mean([f.pods_per_second for f in mine]) / max(_mean([f.pods_per_second for f in kube]), 1e-9)
        target = TARGET_RATIO.get(nodes)
        if target is not None:
            print(f"target: at least {target:g}x kube-scheduler's pods/s at {nodes} nodes: {ratio:.2f}x")
        share = _mean([f.cpu_ms_per_pod.get("dractl", 0.0) for f in mine]) / max(
            _mean([f.cpu_ms_per_pod.get("kube-scheduler", 0.0) for f in kube]), 1e-9
        )
        if nodes == 500:
            print(f"target: dractl's CPU per pod at most {TARGET_CPU_SHARE:g}x kube-scheduler's: {share:.2f}x")
        else:
            print(f"dractl's CPU per pod against kube-scheduler's at {nodes} nodes: {share:.2f}x")
        writes = _mean([f.scheduler_writes for f in mine])
        print(f"target: at most {TARGET_WRITES:g} scheduler writes per pod: dractl {writes:.2f}")
    sys.stdout.flush()


def decision_ms(nodes: int, *, samples: int = 2000) -> float:
    """Mean milliseconds of one 1-GPU `allocate` on a warm, half-full inventory of `nodes` nodes."""
    documents: list[Any] = [d for d in yaml.safe_load_all((EXAMPLES / "00-deviceclasses.yaml").read_text()) if d]
    documents += [example_slice(f"node-{i:05d}") for i in range(nodes)]
    objects = decode.load_documents(documents, file="bench")
    allocator = alloc.Allocator(
        alloc.Snapshot(device_classes=objects.device_classes, resource_slices=objects.resource_slices)
    )
    spec = model.ResourceClaimSpec(
        requests=(
            model.DeviceRequest(name="gpu", exactly=model.ExactDeviceRequest(device_class_name="gpu.nvidia.com")),
        )
    )

    def claim(i: int) -> model.ResourceClaim:
        return model.ResourceClaim(meta=model.ObjectMeta(name=f"c{i}", namespace=NAMESPACE, uid=f"u{i}"), spec=spec)

    half = nodes * 4
    for i in range(half):  # warm: half the GPUs held, every cache filled
        assert allocator.allocate([claim(i)]).ok
    started = time.perf_counter()
    for i in range(half, half + samples):
        allocator.allocate([claim(i)])
        allocator.release(f"u{i}")
    return (time.perf_counter() - started) / samples * 1000


def size(text: str) -> tuple[int, int]:
    nodes, _, pods = text.partition(":")
    return int(nodes), int(pods)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        type=size,
        action="append",
        metavar="NODES:PODS",
        help="cluster and burst size, repeatable (default: 500:2000 and 2000:2000)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"one round, of --size or else {QUICK_SIZE[0]}:{QUICK_SIZE[1]}, and the decision time at 500 nodes only",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs per contender and size, alternating (default: 2)")
    parser.add_argument(
        "--default-limits", action="store_true", help="add one run per contender with every client at its defaults"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each run's pods get (default: 900)")
    parser.add_argument(
        "--shared-nodes",
        type=size,
        action="append",
        metavar="NODES:PODS",
        help="instead of the race, both schedulers at once on shared nodes, every other pod each: devices given twice",
    )
    parser.add_argument(
        "--only",
        choices=(KUBE_SCHEDULER.name, DRACTL.name, DRACTL_DEFAULTS.name),
        help="run one contender (for profiling)",
    )
    args = parser.parse_args()
    sizes = args.size or ([QUICK_SIZE] if args.quick else list(SIZES))
    rounds = 1 if args.quick else args.rounds
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {load()}")
    contenders = [KUBE_SCHEDULER, DRACTL, DRACTL_DEFAULTS]
    if args.only:
        contenders = [c for c in contenders if c.name == args.only]
    shared = args.shared_nodes or []
    try:
        controlplane.find_binaries(controlplane.REQUIRED + controlplane.OPTIONAL)
    except controlplane.Unavailable as missing:
        print(f"skipping the control-plane race: {missing}")
        sizes, shared = [], []
    if shared:
        for nodes, pods in shared:
            print(
                f"\n== shared nodes: {nodes} nodes x 8 GPUs, {pods} pods, every other one for kube-scheduler (raised "
                "limits) and dractl (its defaults), both at once =="
            )
            report_shared(shared_race(nodes=nodes, pods=pods, timeout=args.timeout))
        return
    for nodes, pods in sizes:
        print(f"\n== {nodes} nodes x 8 GPUs, {pods} pods, one GPU each from a ResourceClaimTemplate ==")
        schedule = [(n, c) for n in range(rounds) for c in contenders]
        if args.default_limits:
            schedule += [(rounds, dataclasses.replace(c, raised=False)) for c in contenders if not c.own_defaults]
        runs: list[Figures] = []
        for index, (number, contender) in enumerate(schedule, 1):
            figures = run(contender, round=number, nodes=nodes, pods=pods, timeout=args.timeout)
            report_run(figures, index)
            runs.append(figures)
        summarize(nodes, pods, runs)
    print()
    for nodes in (500,) if args.quick else (500, 5000):
        print(
            f"allocator decision, warm inventory of {nodes} nodes: {decision_ms(nodes):.3f} ms per pod "
            f"(target under {TARGET_DECISION_MS:g} ms at 500 nodes)"
        )


if __name__ == "__main__":
    main()
