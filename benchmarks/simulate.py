"""End-to-end benchmark of `dractl simulate`: process start to exit, from YAML and from JSON.

Run from the repository root: `python benchmarks/simulate.py [--nodes 1000] [--repeat 3] [-o table]`.

What it measures: the wall time of `python -m dractl simulate -f FILE --timing` in a fresh
process (imports, reading and decoding the manifests, CEL, allocation and printing), for the
same cluster written once as multi-document YAML and once as one JSON `List`. The cluster is
`benchmarks/alloc.py`'s generator: K nodes with 8 GPUs each and 7*K claims (default K=1,000:
7,000 claims, about 7 MiB of YAML). Each figure is the fastest of `--repeat` runs (default 3),
since other work on a shared machine only ever slows a run down. It also prints the
allocation phase's claims/s from `--timing` and its ratio to the upstream Go allocator's
figure from the issue (about 150-200 claims/s at this size), the targets (under 1.5 s from
YAML, under 1 s from JSON on the 2-core reference machine) and the machine's load average,
which on a shared machine says how far the figures are from an idle one. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import alloc as generator  # noqa: E402  (benchmarks/alloc.py: the deterministic cluster generator)

UPSTREAM_CLAIMS_PER_S = (150.0, 200.0)  # the upstream figure for the allocation phase alone
TARGET_SECONDS = {"yaml": 1.5, "json": 1.0}
_TIMING = re.compile(r"claims_per_s=([0-9.]+)")


def write_inputs(directory: pathlib.Path, k: int) -> dict[str, pathlib.Path]:
    """The K-node cluster as `cluster.yaml` (multi-document) and `cluster.json` (a List)."""
    documents = generator.manifests(k)
    paths = {"yaml": directory / "cluster.yaml", "json": directory / "cluster.json"}
    paths["yaml"].write_text(
        yaml.dump_all(documents, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    )
    paths["json"].write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    return paths


def run_once(path: pathlib.Path, output: str) -> tuple[float, float | None, int]:
    """(wall seconds, allocation-phase claims/s or None, exit code) of one `dractl simulate` process."""
    command = [sys.executable, "-m", "dractl", "simulate", "-f", str(path), "--timing", "-o", output]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    match = _TIMING.search(completed.stderr)
    return seconds, float(match.group(1)) if match else None, completed.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="K, the number of nodes; 7*K claims (default: 1000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the fastest counts (default: 3)")
    parser.add_argument(
        "-o", "--output", default="table", help="dractl's output format: table, json or yaml (default: table)"
    )
    args = parser.parse_args()
    print(f"machine: {generator.machine()}")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory() as directory:
        paths = write_inputs(pathlib.Path(directory), args.nodes)
        claims = generator.CLAIMS_PER_NODE * args.nodes
        print(
            f"input: {args.nodes} nodes, {claims} claims; YAML {paths['yaml'].stat().st_size / 2**20:.1f} MiB, "
            f"JSON {paths['json'].stat().st_size / 2**20:.1f} MiB; output -o {args.output}; best of {args.repeat}"
        )
        print()
        header = (
            f"{'input':>6} {'seconds':>8} {'target':>7} {'alloc claims/s':>15} {'vs upstream 150-200':>20} {'exit':>5}"
        )
        print(header)
        print("-" * len(header))
        for kind in ("yaml", "json"):
            runs = [run_once(paths[kind], args.output) for _ in range(args.repeat)]
            seconds, _, code = min(runs, key=lambda run: run[0])
            rates = [rate for _, rate, _ in runs if rate is not None]
            rate = max(rates) if rates else None
            ratio = f"{rate / UPSTREAM_CLAIMS_PER_S[1]:.1f}x-{rate / UPSTREAM_CLAIMS_PER_S[0]:.1f}x" if rate else "-"
            shown = f"{rate:.0f}" if rate else "-"
            print(f"{kind:>6} {seconds:>8.2f} {TARGET_SECONDS[kind]:>7.1f} {shown:>15} {ratio:>20} {code:>5}")
    load = os.getloadavg()
    print()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
