"""End-to-end benchmark of `dractl simulate`: process start to exit, from YAML and from JSON.

Run from the repository root:
`python benchmarks/simulate.py [--nodes 1000] [--repeat 5] [-o table] [--no-bytecode-cache]`.

What it measures: the wall time of `python -m dractl simulate -f FILE --timing` in a fresh
process (interpreter start, imports, reading and decoding the manifests, CEL, allocation,
printing and exit), for the same cluster written once as multi-document YAML and once as one
JSON `List`. The cluster is `benchmarks/alloc.py`'s generator: K nodes with 8 GPUs each and
7*K claims (default K=1,000: 7,000 claims, about 7 MiB of YAML). Each figure is the fastest
of `--repeat` runs (default 5), since other work on a shared machine only ever slows a run
down, with the CPU seconds of the same run and the `--timing` phase lines of the fastest run
(start-up, decode, validate, index, allocate, output). It also prints the allocation phase's
claims/s and its ratio to the upstream Go allocator's figure from the issue (about 150-200
claims/s at this size), the targets (under 1.5 s from YAML, under 1 s from JSON on the 2-core
reference machine) and the machine's load average, which on a shared machine says how far
the figures are from an idle one. Asserts nothing.

Bytecode: an installed dractl runs from compiled bytecode (pip compiles it at install time).
By default the runs get the same, cached in a temporary `PYTHONPYCACHEPREFIX` after one
warm-up run, even where `PYTHONDONTWRITEBYTECODE` is set (as on the development machines);
`--no-bytecode-cache` keeps the environment as it is, so that a run without bytecode
compiles every module again (about 0.1 s more).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import resource
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


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One `dractl simulate` process: wall and CPU seconds, exit code, and its `--timing` lines."""

    seconds: float
    cpu: float
    code: int
    timing: list[str]

    @property
    def rate(self) -> float | None:
        """The allocation phase's claims/s, or None when the run printed none."""
        match = next((m for m in map(_TIMING.search, self.timing) if m), None)
        return float(match.group(1)) if match else None


def environment(pycache: pathlib.Path | None) -> dict[str, str]:
    """The child's environment: the repository on the path, and bytecode cached under
    `pycache` (None: the environment's own setting)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def run_once(path: pathlib.Path, output: str, env: dict[str, str]) -> Run:
    """One `dractl simulate` process, timed from the parent: fork to exit."""
    command = [sys.executable, "-m", "dractl", "simulate", "-f", str(path), "--timing", "-o", output]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    timing = [line for line in completed.stderr.splitlines() if line.startswith("timing: ")]
    return Run(seconds=seconds, cpu=cpu, code=completed.returncode, timing=timing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="K, the number of nodes; 7*K claims (default: 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the fastest counts (default: 5)")
    parser.add_argument(
        "-o", "--output", default="table", help="dractl's output format: table, json or yaml (default: table)"
    )
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="keep the environment's bytecode setting (default: cache bytecode in a temporary directory)",
    )
    args = parser.parse_args()
    print(f"machine: {generator.machine()}")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory() as directory:
        paths = write_inputs(pathlib.Path(directory), args.nodes)
        env = environment(None if args.no_bytecode_cache else pathlib.Path(directory) / "pycache")
        claims = generator.CLAIMS_PER_NODE * args.nodes
        bytecode = "as the environment has it" if args.no_bytecode_cache else "cached (one warm-up run)"
        print(
            f"input: {args.nodes} nodes, {claims} claims; YAML {paths['yaml'].stat().st_size / 2**20:.1f} MiB, "
            f"JSON {paths['json'].stat().st_size / 2**20:.1f} MiB; output -o {args.output}; best of {args.repeat}; "
            f"bytecode {bytecode}"
        )
        if not args.no_bytecode_cache:
            run_once(paths["json"], args.output, env)
        print()
        header = (
            f"{'input':>6} {'seconds':>8} {'cpu s':>6} {'target':>7} {'alloc claims/s':>15} "
            f"{'vs upstream 150-200':>20} {'exit':>5}"
        )
        print(header)
        print("-" * len(header))
        fastest: dict[str, Run] = {}
        for kind in ("yaml", "json"):
            runs = [run_once(paths[kind], args.output, env) for _ in range(args.repeat)]
            best = fastest[kind] = min(runs, key=lambda run: run.seconds)
            rates = [run.rate for run in runs if run.rate is not None]
            rate = max(rates) if rates else None
            ratio = f"{rate / UPSTREAM_CLAIMS_PER_S[1]:.1f}x-{rate / UPSTREAM_CLAIMS_PER_S[0]:.1f}x" if rate else "-"
            shown = f"{rate:.0f}" if rate else "-"
            print(
                f"{kind:>6} {best.seconds:>8.2f} {best.cpu:>6.2f} {TARGET_SECONDS[kind]:>7.1f} {shown:>15} "
                f"{ratio:>20} {best.code:>5}"
            )
        for kind, best in fastest.items():
            print()
            print(f"--timing of the fastest {kind} run:")
            print("".join(f"  {line}\n" for line in best.timing), end="")
    load = os.getloadavg()
    print()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
