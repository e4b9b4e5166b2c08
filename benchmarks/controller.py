"""Controller benchmark: pods/s from creation to binding, dractl against kube-scheduler, same pods.

Run from the repository root: `python benchmarks/controller.py [--nodes 500] [--pods 4000] [--quick]`.

What it measures, in one run:
1. Per contender, on a fresh local control plane (etcd + kube-apiserver 1.36.2 from
   ../shared/k8s, as the tests start it): N nodes (Ready, no kubelet) each publishing the
   example DGX H100's slice (8 GPUs), then P pods each with a ResourceClaimTemplate for one GPU
   (`gpu.nvidia.com`), created by 8 threads. The clock runs from the first pod creation to the
   moment every pod is bound (polled once a second, so figures are good to about a second).
   Contenders: kube-controller-manager + kube-scheduler (pods with the default scheduler), and
   `dractl controller --controllers claims,scheduler` with 1 and with 4 workers (pods with
   `schedulerName: dractl`). Also the CPU seconds per pod the control plane spent (kube-apiserver
   + etcd + the contender's processes, from /proc).
2. The allocator's decision time per pod on a warm inventory of 500 and 5,000 such nodes: one
   `Allocator.allocate` of a 1-GPU claim, in-process, averaged (each claim is released again so
   the inventory stays at about half full).
Targets (issue 7): at least 2x kube-scheduler's pods/s; under 1 ms per decision at 500 nodes.
It prints figures and ratios and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
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
from dractl.kube import client  # noqa: E402
from dractl.model import decode  # noqa: E402

EXAMPLES = ROOT / "dractl" / "examples"
EXAMPLE_NODE = "dgx-h100-01"
NAMESPACE = "bench"
CREATORS = 8
TARGET_RATIO = 2.0
TARGET_DECISION_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Figures:
    contender: str
    pods: int
    bound: int
    seconds: float
    cpu_seconds: float

    @property
    def pods_per_second(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time the processes used so far (their children not counted)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


@functools.cache
def _example_text() -> str:
    [document] = [d for d in yaml.safe_load_all((EXAMPLES / f"21-{EXAMPLE_NODE}.yaml").read_text()) if d]
    return json.dumps(document)


def example_slice(node: str) -> dict[str, Any]:
    """The example DGX H100's slice as node `node` would publish it."""
    loaded: dict[str, Any] = json.loads(_example_text().replace(EXAMPLE_NODE, node))
    return loaded


def populate(api: client.Client, nodes: int) -> None:
    """Device classes, the namespace and template, and `nodes` Ready nodes with their slices."""
    for document in yaml.safe_load_all((EXAMPLES / "00-deviceclasses.yaml").read_text()):
        if document:
            api.create(client.DEVICE_CLASSES, document)
    kube_objects.make_namespace(api, NAMESPACE)
    api.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("one-gpu", namespace=NAMESPACE))
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


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return kube_objects.pod(
        name, namespace=NAMESPACE, claims=[kube_objects.from_template("one-gpu")], cpu="100m", schedulerName=scheduler
    )


def bound(api: client.Client) -> int:
    return len(api.list(client.PODS, namespace=NAMESPACE, field_selector="spec.nodeName!=").items)


def race(api: client.Client, *, pods: int, scheduler: str, timeout: float) -> tuple[int, float]:
    """Create the pods and wait until all are bound (or `timeout`); (bound, seconds)."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        creating = [pool.submit(api.create, client.PODS, pod(f"p-{i:05d}", scheduler)) for i in range(pods)]
        done = 0
        while time.monotonic() - started < timeout:
            time.sleep(1.0)
            done = bound(api)
            if done == pods:
                break
        for future in creating:
            future.result()
    return done, time.monotonic() - started


def contender(
    name: str,
    *,
    nodes: int,
    pods: int,
    scheduler: str,
    start: Callable[[controlplane.ControlPlane], list[int]],
    stop: Callable[[], None],
    timeout: float,
) -> Figures:
    with controlplane.running() as plane:
        api = client.connect(plane.kubeconfig)
        populate(api, nodes)
        pids = [p.popen.pid for p in plane.processes] + start(plane)
        before = cpu_seconds(pids)
        try:
            done, seconds = race(api, pods=pods, scheduler=scheduler, timeout=timeout)
            used = cpu_seconds(pids) - before
        finally:
            stop()
        return Figures(name, pods, done, seconds, used)


def kube_side(nodes: int, pods: int, timeout: float) -> Figures:
    components: list[controlplane.Components] = []

    def start(plane: controlplane.ControlPlane) -> list[int]:
        components.append(plane.start_components())
        return [p.popen.pid for p in components[0].processes]

    return contender(
        "kube-scheduler + kube-controller-manager",
        nodes=nodes,
        pods=pods,
        scheduler="default-scheduler",
        start=start,
        stop=lambda: components[0].stop() if components else None,
        timeout=timeout,
    )


def dractl_side(nodes: int, pods: int, workers: int, timeout: float) -> Figures:
    processes: list[subprocess.Popen[bytes]] = []

    def start(plane: controlplane.ControlPlane) -> list[int]:
        log = open(plane.directory / "dractl-controller.log", "wb")  # noqa: SIM115 - closed with the plane's dir
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dractl",
                "controller",
                "--kubeconfig",
                str(plane.kubeconfig),
                "--controllers",
                "claims,scheduler",
                "--workers",
                str(workers),
                "--no-leader-elect",
                "--metrics-port",
                "-1",
                "--health-port",
                "-1",
                "--log-format",
                "json",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes.append(process)
        return [process.pid]

    def stop() -> None:
        for process in processes:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    return contender(
        f"dractl controller, {workers} worker{'s' if workers > 1 else ''}",
        nodes=nodes,
        pods=pods,
        scheduler="dractl",
        start=start,
        stop=stop,
        timeout=timeout,
    )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="50 nodes, 400 pods, decisions at 500 nodes only")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each contender gets (default: 900)")
    args = parser.parse_args()
    nodes, pods = (50, 400) if args.quick else (args.nodes, args.pods)
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {nodes} nodes x 8 GPUs, {pods} pods")
    print()
    try:
        controlplane.find_binaries(controlplane.REQUIRED + controlplane.OPTIONAL)
    except controlplane.Unavailable as missing:
        print(f"skipping the control-plane race: {missing}")
        rows: list[Figures] = []
    else:
        rows = [kube_side(nodes, pods, args.timeout)]
        rows += [dractl_side(nodes, pods, workers, args.timeout) for workers in (1, 4)]
    if rows:
        header = f"{'contender':<42} {'bound':>11} {'seconds':>8} {'pods/s':>8} {'ratio':>7} {'CPU s/pod':>10}"
        print(header)
        print("-" * len(header))
        base = rows[0].pods_per_second
        for row in rows:
            ratio = row.pods_per_second / base if base else 0.0
            print(
                f"{row.contender:<42} {row.bound:>5}/{row.pods:<5} {row.seconds:>8.1f} {row.pods_per_second:>8.1f} "
                f"{ratio:>6.2f}x {row.cpu_seconds / max(row.bound, 1) * 1000:>8.1f}ms"
            )
        print(f"target: dractl at least {TARGET_RATIO:g}x kube-scheduler's pods/s")
        print()
    for size in (500,) if args.quick else (500, 5000):
        print(
            f"allocator decision, warm inventory of {size} nodes: {decision_ms(size):.3f} ms per pod "
            f"(target under {TARGET_DECISION_MS:g} ms at 500 nodes)"
        )


if __name__ == "__main__":
    main()
