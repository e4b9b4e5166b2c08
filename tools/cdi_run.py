"""Run a command in a root filesystem the way a container runtime would with a CDI device: `cdi_run.py SPEC DEVICE
ROOTFS -- COMMAND...`.

For tools/gpu_check.sh, on a machine with a GPU and as root. It applies the spec's containerEdits (spec-level,
then the named device's) to ROOTFS inside a private mount namespace: each mount is bind-mounted at its
containerPath (read-only when its options say `ro`), each device node is bound from the host at its path, /proc
and /sys are mounted, and COMMAND runs chrooted with exactly the spec's environment (plus a standard PATH). Hooks
are not run (the check uses the LD_LIBRARY_PATH form); a spec with hooks is refused, naming them. Nothing of this
outlives the command: the mount namespace ends with it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import yaml

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _edits(spec: dict, device: str) -> dict:  # type: ignore[type-arg]
    chosen = [d for d in spec.get("devices", []) if d.get("name") == device]
    if not chosen:
        raise SystemExit(f"cdi_run: no device {device!r} in the spec (has {[d.get('name') for d in spec['devices']]})")
    merged: dict = {"env": [], "mounts": [], "deviceNodes": [], "hooks": []}  # type: ignore[type-arg]
    for edits in (spec.get("containerEdits") or {}, chosen[0].get("containerEdits") or {}):
        for key in merged:
            merged[key] += edits.get(key) or []
    return merged


def _target(rootfs: pathlib.Path, container_path: str, *, directory: bool) -> pathlib.Path:
    target = rootfs / container_path.lstrip("/")
    if directory:
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    return target


def _bind(source: str, target: pathlib.Path, *, read_only: bool) -> None:
    subprocess.run(["mount", "--bind", source, str(target)], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv[: argv.index("--")]) != 3:
        raise SystemExit(__doc__.splitlines()[0])
    spec_path, device, rootfs_text = argv[: argv.index("--")]
    command = argv[argv.index("--") + 1 :]
    if os.environ.get("CDI_RUN_INSIDE") != "1":
        # Re-run in a private mount namespace, so every mount below ends with the command.
        inner = ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv]
        return subprocess.run(inner, env={**os.environ, "CDI_RUN_INSIDE": "1"}, check=False).returncode
    text = pathlib.Path(spec_path).read_text()
    spec = json.loads(text) if spec_path.endswith(".json") else yaml.safe_load(text)
    edits = _edits(spec, device)
    if edits["hooks"]:
        raise SystemExit(f"cdi_run: the spec has hooks this check cannot run: {edits['hooks']}")
    rootfs = pathlib.Path(rootfs_text).resolve()
    for name in ("proc", "sys", "dev", "tmp"):
        (rootfs / name).mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
    _bind("/sys", rootfs / "sys", read_only=True)
    for node in edits["deviceNodes"]:
        host = node.get("hostPath") or node["path"]
        _bind(host, _target(rootfs, node["path"], directory=False), read_only=False)
    for mount in edits["mounts"]:
        source = mount["hostPath"]
        target = _target(rootfs, mount["containerPath"], directory=os.path.isdir(source))
        _bind(source, target, read_only="ro" in mount.get("options", []))
    env = dict(item.split("=", 1) for item in edits["env"])
    env.setdefault("PATH", _PATH)
    print(f"cdi_run: {len(edits['mounts'])} mounts, {len(edits['deviceNodes'])} device nodes, env {sorted(env)}")
    sys.stdout.flush()
    return subprocess.run(["chroot", str(rootfs), *command], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
