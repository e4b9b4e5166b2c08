"""On a machine with an NVIDIA GPU (tools/gpu_check.sh runs it): the node agent on real NVML, a claim prepared and
unprepared through its DRA socket as the kubelet does, the claim's CDI spec run in a root filesystem that has no
driver, and an MPS control daemon in a tmpfs of its own.

`python3 tools/gpu_agent_check.py --out DIR --rootfs DIR`. Writes DIR/spec.yaml (the claim's spec),
DIR/container.txt (what ran in the root) and DIR/agent-check.json (every result); exits 0 when all passed. The
claims come from an in-memory source and slices go nowhere (no API server on that machine); everything else is
the agent as it runs on a node. It changes no MIG or compute mode and resets nothing: the claim is a whole GPU
with no sharing config.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import kubelet  # noqa: E402
from support.state_inputs import Claims, claim, result  # noqa: E402

from dractl import config  # noqa: E402
from dractl.node import agent, sharing  # noqa: E402

UID = "6a5b4c3d-0000-4000-8000-0000000000c1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--rootfs", type=pathlib.Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-", dir="/tmp"))
    results: dict[str, object] = {}
    ok = True
    settings = kubelet.agent_settings(work, work, node_name="gpu-check", device_source=config.DeviceSource.NVML)
    claims = Claims()
    node = agent.Agent(settings, claims=claims, publisher=kubelet.Slices())
    node.start()
    try:
        whole = [d for s in node.slices for d in s.devices if d.name.startswith("gpu-") and "-mig-" not in d.name]
        device = whole[0]
        uuid = str(device.attributes["uuid"].scalar)
        results["device"] = {"name": device.name, "uuid": uuid}
        ref = claims.put(claim("gpu-check", UID, [result(device.name, pool="gpu-check")]))
        started = time.perf_counter()
        error = kubelet.prepare(node.sockets.dra, ref)[UID].error
        results["prepare_ms"] = round((time.perf_counter() - started) * 1000, 1)
        results["prepare_error"] = error
        ok &= error == ""
        spec_file = settings.cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.yaml"
        if spec_file.exists():
            shutil.copy(spec_file, args.out / "spec.yaml")
            image = work / "image"
            shutil.copytree(args.rootfs, image, symlinks=True)
            ran = subprocess.run(
                [sys.executable, str(ROOT / "tools/cdi_run.py"), str(spec_file), f"{UID}-{device.name}"]
                + [str(image), "--", "/bin/sh", "-c", "nvidia-smi -L && cuda-query"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            (args.out / "container.txt").write_text(ran.stdout + ran.stderr)
            seen = ran.returncode == 0 and uuid in ran.stdout and "64 MiB allocated and freed" in ran.stdout
            results["container"] = {"rc": ran.returncode, "gpu_listed_and_usable": seen}
            ok &= seen
        error = kubelet.unprepare(node.sockets.dra, ref)[UID].error
        results["unprepare_error"] = error
        results["spec_removed"] = not spec_file.exists()
        ok &= error == "" and not spec_file.exists()
    finally:
        node.stop()
    mps = sharing.NvidiaMps(root=work / "mps")
    try:
        mps.start(sharing.MpsSettings(daemon_id="gpu-check", uuids=(uuid,)))
        running = mps.running("gpu-check")
        shm_mounted = (work / "mps/gpu-check/shm").is_mount()
        mps.stop("gpu-check")
        results["mps"] = {"running": running, "own_tmpfs": shm_mounted, "stopped": not mps.running("gpu-check")}
        ok &= running and shm_mounted
    except OSError as err:
        results["mps"] = {"error": str(err)}
        ok = False
    finally:
        mps.stop("gpu-check")  # idempotent; never leave the daemon or its tmpfs behind
    results["passed"] = ok
    (args.out / "agent-check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
