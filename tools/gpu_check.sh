#!/usr/bin/env bash
# The repeatable check on a real NVIDIA GPU (issue 13), for a machine lent through the library's device tool.
#
#   here:  tools/gpu_check_prepare.sh            # builds .gpu-check/ (root filesystem, wheels, libyaml)
#   there: tools/gpu_check.sh                    # device tool: run with carry [".gpu-check"], writes $OUT
#
# Steps, each logged to <step>.log and packed with machine.txt, the claim's spec.yaml, container.txt and
# agent-check.json into $OUT/gpu-check.tar.gz at the end (the device tool brings back at most 8 files): build the
# Cython extensions; `dractl discover --device-source nvml` (static and dynamic MIG); the NvmlBackend contract
# suite and the NVML translation tests; then tools/gpu_agent_check.py: the node agent on real NVML, a whole-GPU
# claim prepared and unprepared over its DRA socket, its CDI spec applied to the driverless root (busybox + libc)
# where `nvidia-smi -L` and a CUDA device query must see and use the GPU, and an MPS control daemon in its own
# tmpfs that the device query must run through. It changes no MIG or compute mode and resets nothing. Exit
# codes: 0 all passed, 1 a step failed, 2 not prepared, 3 no GPU here (one line).
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L fails): nothing was checked"
    exit 3
fi
if [ ! -d .gpu-check/rootfs ] || [ ! -d .gpu-check/wheels ]; then
    echo "gpu_check: .gpu-check/ is missing: run tools/gpu_check_prepare.sh where the registries are, and carry it"
    exit 2
fi
out=${OUT:-/tmp/gpu-check-out}
mkdir -p "$out"
logs=$(mktemp -d /tmp/gpu-check-logs.XXXXXX)
trap 'tar -C "$logs" -czf "$out/gpu-check.tar.gz" . && cp -f "$logs/agent-check.json" "$out/" 2>/dev/null' EXIT
failed=0
step() {
    local name=$1
    shift
    if "$@" >"$logs/$name.log" 2>&1; then
        echo "ok    $name"
    else
        echo "FAIL  $name (exit $?; $name.log ends:)"
        tail -25 "$logs/$name.log"
        failed=1
    fi
}

# dractl's runtime dependencies that the machine lacks or has too old go first on the path; libyaml's headers
# come from Debian's packages for the Cython build.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dractl-site \
    .gpu-check/wheels/*.whl || { echo "gpu_check: installing the carried wheels failed"; exit 1; }
export PYTHONPATH="/tmp/dractl-site:$PWD" PYTHONUNBUFFERED=1
mkdir -p /tmp/dractl-yaml
for deb in .gpu-check/debs/*.deb; do dpkg-deb -x "$deb" /tmp/dractl-yaml; done
yaml_lib=$(dirname "$(find /tmp/dractl-yaml -name 'libyaml-0.so.2*' | head -1)")
# The machine's own LD_LIBRARY_PATH stays after it: it may be how NVML finds the driver there.
export CFLAGS="-I/tmp/dractl-yaml/usr/include" LDFLAGS="-L$yaml_lib"
export LD_LIBRARY_PATH="$yaml_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
    nvidia-smi; nvidia-smi -q -d MIG,COMPUTE; python3 --version; uname -a
    echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    command -v nvidia-smi nvidia-cuda-mps-control nvidia-cdi-hook nvidia-ctk
    ldconfig -p | grep -E 'libcuda|libnvidia'
    ls -la /usr/local/nvidia /usr/local/nvidia/* | head -40
} >"$logs/machine.txt" 2>&1
step build python3 setup.py build_ext --inplace -q
step discover python3 -m dractl discover --device-source nvml --node-name gpu-check
step discover-dynamic python3 -m dractl discover --device-source nvml --node-name gpu-check --mig-mode dynamic
step contract python3 -m pytest -q -p no:cacheprovider tests/unit/node/test_backend_contract.py \
    tests/unit/node/test_nvml.py tests/unit/node/test_driverfiles.py
step agent python3 tools/gpu_agent_check.py --out "$logs" --rootfs .gpu-check/rootfs
cat "$logs/agent-check.json" 2>/dev/null
[ "$failed" = 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: a step failed"
exit "$failed"
