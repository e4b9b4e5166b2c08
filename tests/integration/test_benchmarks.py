"""The prepare and controller benchmarks still run their real paths at a tiny size, nothing timed.

Benchmarks assert nothing on time and are not run by the suite otherwise; the prepare benchmark drives the node
agent's prepare path with the API claim source, so a change to that path (a new method the state calls) broke it
once without any test noticing; the controller benchmark races the schedulers and checks every run's answers.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import controlplane
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_prepare_benchmark_runs_every_shape_with_the_live_claim_get() -> None:
    """Guards: `benchmarks/prepare.py --rounds 2` exits 0 and prints a row for every claim shape with the live
    ResourceClaim GET (its own kube-apiserver), in memory, the GET alone and the start-up to a real API server."""
    try:
        controlplane.find_binaries()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    completed = subprocess.run(
        [sys.executable, "benchmarks/prepare.py", "--rounds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = completed.stdout.splitlines()
    for shape in ("1 full GPU", "8 full GPUs", "1 dynamic MIG device (1g.10gb)"):
        for source in ("with the live claim GET", "claims in memory"):
            assert any(row.startswith(f"{shape}, {source}") for row in rows), (shape, source, completed.stdout)
    assert any(row.startswith("the claim GET alone") for row in rows), completed.stdout
    assert "published to a real kube-apiserver" in completed.stdout, completed.stdout


def _controller_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    """`benchmarks/controller.py --quick ARGS`, run to its end and required to exit 0; skips without kube's binaries."""
    try:
        controlplane.find_binaries(controlplane.REQUIRED + controlplane.OPTIONAL)
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    completed = subprocess.run(
        [sys.executable, "benchmarks/controller.py", "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


@pytest.mark.timeout(600)
def test_the_controller_benchmark_races_dractl_at_its_defaults_against_kube_scheduler_and_checks_each_run() -> None:
    """Guards: `benchmarks/controller.py --quick --size 3:6` exits 0 with a passed check for kube-scheduler at raised
    limits, dractl at raised limits and dractl at its own default limits, each on a control plane of its own in one
    run, and prints each dractl run's ratio to kube-scheduler."""
    completed = _controller_benchmark("--size", "3:6")
    runs = [line.strip() for line in completed.stdout.splitlines() if line.strip().startswith("run ")]
    labels = (
        "kube-scheduler (raised limits)",
        "dractl (raised limits)",
        "dractl-defaults (dractl at its default limits, kube's components raised)",
    )
    assert len(runs) == len(labels), completed.stdout
    for run, label in zip(runs, labels, strict=True):
        assert f": {label}: 6/6 bound in " in run and "check ok" in run, (label, completed.stdout)
    assert "CHECK FAILED" not in completed.stdout, completed.stdout
    for name in ("dractl", "dractl-defaults"):
        assert f"\n{name} / kube-scheduler pods/s: " in completed.stdout, completed.stdout


@pytest.mark.timeout(600)
def test_the_shared_nodes_race_counts_the_devices_given_twice_by_holders_and_first_writer() -> None:
    """Guards: `benchmarks/controller.py --shared-nodes 3:12` runs kube-scheduler and dractl at once on the same
    nodes and exits 0, every pod bound, with the count of devices given to two claims and the check's other
    findings (none)."""
    completed = _controller_benchmark("--shared-nodes", "3:12")
    assert "  12/12 bound in " in completed.stdout, completed.stdout
    assert "  devices given to two claims or more: " in completed.stdout, completed.stdout
    assert "CHECK FAILED" not in completed.stdout, completed.stdout
