"""The prepare benchmark still runs its real paths: a few rounds through a real kube-apiserver, nothing timed.

Benchmarks assert nothing on time and are not run by the suite otherwise; this one drives the node agent's
prepare path with the API claim source, so a change to that path (a new method the state calls) broke it once
without any test noticing.
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
