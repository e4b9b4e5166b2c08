"""Allocator benchmark: claims per second over K nodes with 8 GPUs each and 7*K claims.

Run from the repository root: `python benchmarks/alloc.py [--quick]`.

What it measures: the phase `dractl simulate --timing` reports (from decoded objects to
results: building the allocator, CEL compiled and evaluated, through the last allocation),
for K=100 and K=1000 under both policies, and the peak resident memory of a process that
decodes and allocates K=5000 (measured in a child process, so earlier runs do not count).
The cluster is generated deterministically: each node has 8 GPUs of one model with the
NVIDIA driver's attributes; most claims ask for one GPU with a memory floor (a handful of
distinct thresholds), some for two GPUs with the same productName (matchAttribute), some
for `firstAvailable` (one large GPU, or else two medium ones). Claims are standalone and
allocated in order, like `dractl simulate` does; each figure is the fastest of `--repeat`
runs (default 3), since other work on a shared machine only ever slows a run down. It prints a table with the figures,
the ratio to the upstream Go allocator driven the same way (issue 2: about 2,000 claims/s at
K=100 and 150 at K=1000 on the 2-core reference machine) and this machine's description.
It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import resource
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dractl import alloc, model  # noqa: E402  (the repository root must be on sys.path first)
from dractl.model import decode  # noqa: E402
from dractl.simulate import engine  # noqa: E402

GPUS_PER_NODE = 8
CLAIMS_PER_NODE = 7
DRIVER = "gpu.nvidia.com"
# The upstream Go allocator driven the same way (first fit over nodes in name order), from issue 2.
UPSTREAM_CLAIMS_PER_S = {100: 2_000.0, 1000: 150.0}
# Issue 2's targets on the 2-core reference machine.
TARGET_CLAIMS_PER_S = {alloc.Policy.FIRST_FIT: 10_000.0, alloc.Policy.BINPACK: 5_000.0}
TARGET_PEAK_MB = 400.0

# (productName, architecture, cudaComputeCapability, memory): the models a node may carry.
MODELS = [
    ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "81920Mi"),
    ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40960Mi"),
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi"),
    ("NVIDIA L40S", "Ada Lovelace", "8.9.0", "46068Mi"),
    ("NVIDIA A10", "Ampere", "8.6.0", "23028Mi"),
    ("Tesla T4", "Turing", "7.5.0", "15360Mi"),
]
THRESHOLDS = ["8Gi", "16Gi", "20Gi", "40Gi", "44Gi", "80Gi"]


def _memory_at_least(threshold: str) -> dict[str, Any]:
    return {"cel": {"expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{threshold}")) >= 0'}}


def manifests(k: int, *, seed: int = 2) -> list[dict[str, Any]]:
    """The benchmark cluster and claims as API objects (dicts), deterministic for (k, seed)."""
    rng = random.Random(seed)
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
                        }
                    }
                ]
            },
        }
    ]
    for n in range(k):
        node = f"node-{n:05d}"
        product, architecture, cc, memory = MODELS[rng.randrange(len(MODELS))]
        devices = [
            {
                "name": f"gpu-{g}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": f"GPU-{n:08x}-{g:04x}-4000-8000-{rng.getrandbits(48):012x}"},
                    "productName": {"string": product},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": architecture},
                    "cudaComputeCapability": {"version": cc},
                    "driverVersion": {"version": "580.126.20"},
                    "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 * (g + 1):02x}:00.0"},
                    "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 * (g // 2 * 2 + 1):02x}"},
                },
                "capacity": {"memory": {"value": memory}},
            }
            for g in range(GPUS_PER_NODE)
        ]
        documents.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}-gpus"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "nodeName": node,
                    "devices": devices,
                },
            }
        )
    for c in range(CLAIMS_PER_NODE * k):
        kind = rng.random()
        if kind < 0.8:
            spec: dict[str, Any] = {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": DRIVER, "selectors": [_memory_at_least(rng.choice(THRESHOLDS))]},
                    }
                ]
            }
        elif kind < 0.9:
            spec = {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 2}}],
                "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/productName"}],
            }
        else:
            spec = {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "large", "deviceClassName": DRIVER, "selectors": [_memory_at_least("80Gi")]},
                            {
                                "name": "two-medium",
                                "deviceClassName": DRIVER,
                                "count": 2,
                                "selectors": [_memory_at_least("40Gi")],
                            },
                        ],
                    }
                ]
            }
        documents.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{c:06d}", "namespace": "bench"},
                "spec": {"devices": spec},
            }
        )
    return documents


def cluster(k: int) -> model.Objects:
    return decode.load_documents(manifests(k), file=f"bench-k{k}")


def throughput(objects: model.Objects, policy: alloc.Policy, *, repeat: int = 1) -> engine.Result:
    """The fastest of `repeat` timed simulations (the `--timing` phase) over decoded objects;
    each builds a fresh allocator, so every run allocates the same claims from scratch."""
    runs = [engine.simulate(objects, policy=policy, search_limit=1_000_000) for _ in range(repeat)]
    return min(runs, key=lambda result: result.seconds)


def _peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM belongs to the process image, while
    ru_maxrss survives exec and so may report the parent's peak; it is only the fallback."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def peak_memory(k: int) -> dict[str, float]:
    """Peak RSS of a fresh process that decodes the K-node cluster and allocates it (binpack)."""
    completed = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(k)], capture_output=True, text=True, check=True, timeout=3600
    )
    figures: dict[str, float] = json.loads(completed.stdout)
    return figures


def _memory_child(k: int) -> None:
    before = _peak_rss_mb()
    objects = cluster(k)
    decoded = _peak_rss_mb()
    result = throughput(objects, alloc.Policy.BINPACK)
    print(
        json.dumps(
            {
                "start_mb": before,
                "decoded_mb": decoded,
                "peak_mb": _peak_rss_mb(),
                "claims_per_s": result.claims_per_second,
            }
        )
    )


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"nproc={cores}, CPU: {cpu}, Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.machine()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K=100 only and peak memory at K=500 (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure; the fastest counts (default: 3)")
    parser.add_argument("--memory-child", type=int, metavar="K", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child is not None:
        _memory_child(args.memory_child)
        return
    sizes = [100] if args.quick else [100, 1000]
    memory_k = 500 if args.quick else 5000
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; claims/s is the fastest of {args.repeat} runs")
    print()
    header = (
        f"{'K':>6} {'claims':>7} {'policy':>9} {'allocated':>9} {'seconds':>8} {'claims/s':>10} {'upstream':>9} "
        f"{'ratio':>7} {'target':>7}"
    )
    print(header)
    print("-" * len(header))
    for k in sizes:
        objects = cluster(k)
        for policy in (alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK):
            result = throughput(objects, policy, repeat=args.repeat)
            allocated = sum(1 for outcome in result.claims if outcome.allocated)
            upstream = UPSTREAM_CLAIMS_PER_S.get(k)
            ratio = f"{result.claims_per_second / upstream:6.1f}x" if upstream else "-"
            print(
                f"{k:>6} {len(result.claims):>7} {policy.value:>9} {allocated:>9} {result.seconds:>8.3f} "
                f"{result.claims_per_second:>10.0f} {upstream or 0:>9.0f} {ratio:>7} "
                f"{TARGET_CLAIMS_PER_S[policy]:>7.0f}"
            )
    figures = peak_memory(memory_k)
    print()
    print(
        f"peak memory at K={memory_k} ({CLAIMS_PER_NODE * memory_k} claims, binpack): {figures['peak_mb']:.0f} MB RSS "
        f"(interpreter and imports {figures['start_mb']:.0f} MB, after decoding {figures['decoded_mb']:.0f} MB; "
        f"target < {TARGET_PEAK_MB:.0f} MB); claims/s in that run: {figures['claims_per_s']:.0f}"
    )


if __name__ == "__main__":
    main()
