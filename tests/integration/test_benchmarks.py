"""The prepare, controller and gang benchmarks still run their real paths at a tiny size, nothing timed.

Benchmarks assert nothing on time and are not run by the suite otherwise; the prepare benchmark drives the node
agent's prepare path with the API claim source, so a change to that path (a new method the state calls) broke it
once without any test noticing; the controller and gang benchmarks race the schedulers and check every run's answers.
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


@pytest.mark.timeout(600)
def test_the_gang_benchmark_races_dractl_against_kube_scheduler_on_racked_gangs_and_checks_each_run() -> None:
    """Guards: `benchmarks/gang.py --size 8:2:2` exits 0 with a passed check (claims allocated and reserved for their
    pods, no device twice, each gang whole in one rack or not at all) for kube-scheduler with its gang and topology
    plugins and for dractl, each on a control plane of its own in one run, and prints dractl's ratio."""
    try:
        controlplane.find_binaries(controlplane.REQUIRED + controlplane.OPTIONAL)
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    completed = subprocess.run(
        [sys.executable, "benchmarks/gang.py", "--size", "8:2:2", "--settle", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    runs = [line.strip() for line in completed.stdout.splitlines() if line.strip().startswith("run ")]
    assert len(runs) == 2, completed.stdout
    for run, name in zip(runs, ("kube-scheduler", "dractl"), strict=True):
        assert f": {name} (raised limits): " in run and "check ok" in run, (name, completed.stdout)
    assert "CHECK FAILED" not in completed.stdout, completed.stdout
    assert "\ndractl / kube-scheduler gangs/s: " in completed.stdout, completed.stdout


def test_the_gang_benchmarks_check_names_a_partial_gang_a_gang_across_racks_and_a_device_given_twice() -> None:
    """Guards: the gang benchmark's check is not blind: a gang with 1 of 2 pods bound, a gang across two racks, a
    device in two claims and the claim of an unbound pod holding a device each give their line."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gang

    def pod(name: str, gang_name: str, node: str) -> dict[str, object]:
        status = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]} if node else {}
        return {
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "schedulingGroup": {"podGroupName": gang_name}},
            "status": status,
        }

    def claim(owner: str, node: str, device: str) -> dict[str, object]:
        selector = {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        }
        return {
            "metadata": {"name": f"{owner}-gpu", "namespace": "bench", "ownerReferences": [{"uid": f"uid-{owner}"}]},
            "status": {
                "allocation": {
                    "devices": {"results": [{"driver": "gpu.nvidia.com", "pool": node, "device": device}]},
                    "nodeSelector": selector,
                },
                "reservedFor": [{"uid": f"uid-{owner}"}] if owner != "a-01" else [],
            },
        }

    gangs = [gang.Gang("a", 2, 1), gang.Gang("b", 2, 1)]
    racks = {"n1": "rack-000", "n2": "rack-001"}
    pods = [pod("a-00", "a", "n1"), pod("a-01", "a", ""), pod("b-00", "b", "n1"), pod("b-01", "b", "n2")]
    claims = [claim("a-00", "n1", "gpu-0"), claim("a-01", "n1", "gpu-1"), claim("b-00", "n1", "gpu-0")]
    claims.append(claim("b-01", "n2", "gpu-0"))
    problems = gang.check(gangs=gangs, racks=racks, pods=pods, claims=claims, all_claims=claims)
    assert problems == [
        "pod a-01 is not bound but its claim a-01-gpu holds devices",
        "gang a is partial: 1 of 2 pods bound",
        "gang b spans racks rack-000, rack-001",
        "device gpu.nvidia.com/n1/gpu-0 is allocated to both bench/a-00-gpu and bench/b-00-gpu",
    ]
    assert gang.outside_rack(racks, pods) == 1
