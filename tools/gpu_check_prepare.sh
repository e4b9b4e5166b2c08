#!/usr/bin/env bash
# Prepare, on this machine (Debian, root, with the package registries), what tools/gpu_check.sh needs on a lent
# GPU machine that reaches no registry: .gpu-check/ (git-ignored; carry it) with
#   rootfs/  a minimal root filesystem with no NVIDIA driver: Debian's busybox-static and libc6 (an ordinary
#            image has a C library; nothing else) and /usr/local/bin/cuda-query (tools/cuda_query.c);
#   wheels/  dractl's runtime dependencies and theirs, for CPython 3.12 x86-64;
#   debs/    libyaml, whose headers the Cython build needs.
# Usage: tools/gpu_check_prepare.sh                 (then run tools/gpu_check.sh there, carrying .gpu-check)
#        tools/gpu_check_prepare.sh --rootfs-only DIR  (just the root filesystem, into DIR; the suite's
#                                                       container test uses it with the fake driver root)
set -euo pipefail
cd "$(dirname "$0")/.."

rootfs() {  # rootfs DIR: busybox-static + libc6 + cuda-query, and an empty loader cache of its own
    local dir=$1 debs
    debs=$(mktemp -d) && chmod 755 "$debs"
    (cd "$debs" && apt-get download -qq busybox-static libc6)
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dir"; done
    rm -rf "$debs"
    mkdir -p "$dir/bin" "$dir/usr/local/bin" "$dir/etc"
    for applet in sh ls cat env echo; do ln -sf busybox "$dir/bin/$applet"; done
    gcc -O2 -Wall -Wextra -o "$dir/usr/local/bin/cuda-query" tools/cuda_query.c -ldl
    # The driver's libraries must come from the CDI spec alone, never from the root's own cache.
    : > "$dir/etc/ld.so.cache"
    # Nothing here converts character sets or reads documentation: 9 MiB less to carry.
    rm -rf "$dir/usr/lib/x86_64-linux-gnu/gconv" "$dir/usr/share"
}

if [ "${1:-}" = "--rootfs-only" ]; then
    [ -n "${2:-}" ] || { echo "usage: $0 --rootfs-only DIR" >&2; exit 2; }
    [ -n "$(ls /var/lib/apt/lists 2>/dev/null | grep -v lock)" ] || apt-get update -qq
    mkdir -p "$2" && rootfs "$2"
    exit 0
fi
out=.gpu-check
rm -rf "$out" && mkdir -p "$out/rootfs" "$out/wheels" "$out/debs"
apt-get update -qq
rootfs "$out/rootfs"
(cd "$out/debs" && apt-get download -qq libyaml-dev libyaml-0-2)
# dractl's runtime dependencies with everything they need, as wheels for CPython 3.12 x86-64: the GPU machine's
# own packages are of unknown versions (kubernetes alone needs pydantic, aiohttp-retry and a recent urllib3).
python3 - "$out/wheels" <<'PY'
import subprocess, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
platforms = [f"--platform={p}" for p in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                         "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
                                         "manylinux1_x86_64")]
subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
                "--implementation", "cp", *platforms, "-d", sys.argv[1], *deps], check=True)
PY
du -sh "$out" "$out"/*
