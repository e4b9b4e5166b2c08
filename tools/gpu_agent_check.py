"""On a machine with an NVIDIA GPU (tools/gpu_check.sh runs it): the node agent on real NVML, a claim prepared and
unprepared through its DRA socket as the kubelet does, the claim's CDI spec run in a root filesystem that has no
driver, and an MPS control daemon in a tmpfs of its own with a CUDA program run through it.

`python3 tools/gpu_agent_check.py --out DIR --rootfs DIR`. The driver root is where NVML's library was loaded
from (see driver_root). Writes DIR/spec.yaml (the claim's spec), DIR/container.txt (what ran in the root) and
DIR/agent-check.json (every result); exits 0 when all passed. The claims come from an in-memory source and
slices go nowhere (no API server on that machine); everything else is the agent as it runs on a node. It changes
no MIG or compute mode and resets nothing: the claim is a whole GPU with no sharing config.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import kubelet  # noqa: E402
from support.state_inputs import Claims, claim, result  # noqa: E402

from dractl import config  # noqa: E402
from dractl.node import agent, driverfiles, nvml, sharing  # noqa: E402

UID = "6a5b4c3d-0000-4000-8000-0000000000c1"


def driver_root() -> tuple[pathlib.Path, str]:
    """The driver root of the driver NVML runs, as --driver-root would name it: `/` when NVML's library is in one
    of the host's standard library directories (a driver installed on the host), else the directory above the
    one it was loaded from (GKE's layout, and driver images mounted at /usr/local/nvidia: `<root>/lib64`,
    `<root>/bin`)."""
    nvml.NvmlBackend()  # loads libnvidia-ml as the agent does
    maps = pathlib.Path("/proc/self/maps").read_text().split()
    loaded = next(pathlib.Path(word) for word in maps if "/libnvidia-ml.so" in word).resolve()
    if str(loaded.parent) in driverfiles.library_dirs(platform.machine()):
        return pathlib.Path("/"), f"NVML was loaded from {loaded}"
    return loaded.parent.parent, f"NVML was loaded from {loaded}"


def check_agent(args: argparse.Namespace, work: pathlib.Path, results: dict[str, object]) -> bool:
    """Prepare and unprepare a whole GPU through the agent's DRA socket; run its spec in the driverless root."""
    root, why = driver_root()
    results["driver_root"] = {"path": str(root), "why": why}
    settings = kubelet.agent_settings(
        work, work, node_name="gpu-check", device_source=config.DeviceSource.NVML, driver_root=root
    )
    claims = Claims()
    node = agent.Agent(settings, claims=claims, publisher=kubelet.Slices())
    node.start()
    ok = True
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
                + [str(image), "--", "/bin/sh", "-c", "nvidia-smi -L; echo nvidia-smi exit $?; cuda-query"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            (args.out / "container.txt").write_text(ran.stdout + ran.stderr)
            listed = uuid in ran.stdout and "nvidia-smi exit 0" in ran.stdout
            usable = ran.returncode == 0 and "64 MiB allocated and freed" in ran.stdout
            results["container"] = {"rc": ran.returncode, "nvidia_smi_lists_it": listed, "cuda_uses_it": usable}
            ok &= listed and usable
        error = kubelet.unprepare(node.sockets.dra, ref)[UID].error
        results["unprepare_error"] = error
        results["spec_removed"] = not spec_file.exists()
        return ok and error == "" and not spec_file.exists()
    finally:
        node.stop()


def _running(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie (that machine's init does not reap them)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def check_mps(work: pathlib.Path, rootfs: pathlib.Path, results: dict[str, object]) -> bool:
    """An MPS control daemon for the first GPU in a tmpfs of its own, as a shared claim gets it (the compute mode
    is left alone): started, answering, a CUDA program run through it with that tmpfs as its /dev/shm (as the
    claim's container has it), the daemon's server seen, then stopped with nothing left; then a daemon whose control
    socket is removed (it runs on, silent) must be ended by stop() through its pid file."""
    uuid = nvml.NvmlBackend().gpus()[0].uuid
    mps = sharing.NvidiaMps(root=work / "mps")
    pipe, shm = work / "mps/gpu-check/pipe", work / "mps/gpu-check/shm"
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(work / "mps/gpu-check/log"),
    }
    try:
        started = time.perf_counter()
        mps.start(sharing.MpsSettings(daemon_id="gpu-check", uuids=(uuid,)))
        answered_ms = round((time.perf_counter() - started) * 1000, 1)
        client = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c"]
            + [
                'mount --bind "$1" /dev/shm && exec "$2"',
                "mps-client",
                str(shm),
                str(rootfs / "usr/local/bin/cuda-query"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        servers = subprocess.run(
            ["nvidia-cuda-mps-control"],
            input="get_server_list\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.split()
        own_tmpfs = shm.is_mount()
        mps.stop("gpu-check")
        stopped = not (work / "mps/gpu-check").exists() and not mps.running("gpu-check")
        # A daemon that runs on but no longer answers (its control socket gone) must not outlive stop().
        mps.start(sharing.MpsSettings(daemon_id="gpu-check", uuids=(uuid,)))
        silent = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
        (pipe / "control").unlink()
        mps.stop("gpu-check")
        deadline = time.monotonic() + 10
        while _running(silent) and time.monotonic() < deadline:
            time.sleep(0.05)
        silent_ended = not _running(silent)
        results["mps"] = {
            "answered_ms": answered_ms,
            "own_tmpfs": own_tmpfs,
            "client_rc": client.returncode,
            "client_output": (client.stdout + client.stderr).strip()[-400:],
            "servers": servers,
            "stopped": stopped,
            "silent_daemon_ended": silent_ended,
        }
        return client.returncode == 0 and bool(servers) and own_tmpfs and stopped and silent_ended
    finally:
        mps.stop("gpu-check")  # idempotent; never leave the daemon or its tmpfs behind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--rootfs", type=pathlib.Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-", dir="/tmp"))
    results: dict[str, object] = {}
    ok = True
    for name, part in (
        ("agent", lambda: check_agent(args, work, results)),
        ("mps", lambda: check_mps(work, args.rootfs, results)),
    ):
        try:  # each part runs and reports even when the other fails: one run on a lent GPU must say everything
            ok &= part()
        except Exception:  # recorded in full, and the check fails
            results[f"{name}_error"] = traceback.format_exc()
            ok = False
    results["passed"] = ok
    (args.out / "agent-check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
