"""Container images for the real-node suite, made here without a registry: one-layer OCI image archives.

What it does: packs files into an OCI image layout archive (`oci-layout`, `index.json`, the manifest,
config and one uncompressed layer under `blobs/sha256/`) that `ctr images import` reads, with the
image's full name in the index's `io.containerd.image.name` annotation. It makes the two images every
real node needs: the pod sandbox's pause program (pause.c beside this file, `gcc -static`) and a
workload image with Debian's `busybox-static` (`sh`, `env`, `sleep`, `cat`, ... as symlinks to it).
Archives are byte-for-byte reproducible (fixed mtimes, owners and order).

What it must not do: download anything. A missing compiler or busybox raises `Unavailable` with one
line saying what to install; `install_busybox` installs Debian's package as root, as the browser
tests install chromium.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

import build_image
from support import debian

HERE = pathlib.Path(__file__).resolve().parent
# containerd's default sandbox image name (and the tests' own pod image, tests/support/kube_objects.py).
PAUSE = "registry.k8s.io/pause:3.10"
BUSYBOX = "docker.io/library/busybox:1.35"
BUSYBOX_BINARY = pathlib.Path("/bin/busybox")
BUSYBOX_SKIP = "needs Debian's busybox-static for the workload image: apt-get install -y busybox-static (as root)"


class Unavailable(Exception):
    """What an image needs is not on this machine; str() is one line saying what to install."""


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    """An OCI archive `ctr images import` takes, holding the image `name` (a full reference)."""

    name: str
    archive: pathlib.Path


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One file of a layer: `data` for a regular file, else `link` (a symlink target); a directory when neither."""

    path: str
    mode: int = 0o755
    data: bytes | None = None
    link: str | None = None


def _layer(entries: Sequence[Entry]) -> bytes:
    """An uncompressed tar layer with fixed owners and mtimes, in the given order. Pure."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mode = entry.mode
            info.mtime = 0
            if entry.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buffer.getvalue()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _json(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def pack(name: str, entries: Sequence[Entry], *, config: Mapping[str, Any], into: pathlib.Path) -> Image:
    """Write the OCI archive of a one-layer image `name` (`registry/repo:tag`) to `into`; `config` is the image
    config's `config` (Entrypoint, Cmd, Env, ...). Idempotent: the same input gives the same bytes."""
    layer = _layer(entries)
    image_config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": dict(config),
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(image_config),
                "size": len(image_config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer), "size": len(layer)}
            ],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )
    files = [("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", index)]
    files += [(f"blobs/sha256/{_digest(blob)[7:]}", blob) for blob in (layer, image_config, manifest)]
    into.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(into, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, blob in files:
            info = tarfile.TarInfo(path)
            info.size = len(blob)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(blob))
    return Image(name, into)


def archived(archive: pathlib.Path) -> Image:
    """The image in an OCI archive, named by its index's `io.containerd.image.name` annotation. Raises ValueError
    naming the archive and the field when it has no such name."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        index = json.loads(member.read()) if member is not None else {}
    names = [m.get("annotations", {}).get("io.containerd.image.name") for m in index.get("manifests") or ()]
    if not names or not names[0]:
        raise ValueError(f"{archive}: index.json manifests[0].annotations: no io.containerd.image.name")
    return Image(str(names[0]), archive)


def dractl() -> Image:
    """dractl's own image: the OCI archive `$DRACTL_E2E_IMAGE` names when set (e.g. built elsewhere), else built
    without Docker by tools/build_image.py (cached by content under ~/.cache/dractl/image), its tools (Debian's
    mmdebstrap and umoci) installed as root when missing. Raises `Unavailable` when they cannot be had; a
    failing build raises the builder's error."""
    given = os.environ.get("DRACTL_E2E_IMAGE")
    if given:
        return archived(pathlib.Path(given))
    if os.geteuid() != 0:
        raise Unavailable("tools/build_image.py needs root (mmdebstrap, chroot and umoci make files of other users)")
    if not debian.ensure(["mmdebstrap", "umoci"], commands=list(build_image.TOOLS)):
        raise Unavailable(
            "tools/build_image.py needs Debian's mmdebstrap and umoci: apt-get install -y mmdebstrap umoci"
        )
    built = build_image.build(report=lambda line: None)
    return Image(built.name, built.archive)


def pause(directory: pathlib.Path) -> Image:
    """The pause image (`PAUSE`): pause.c compiled statically in `directory`. Raises `Unavailable` without gcc."""
    compiler = shutil.which("gcc")
    if compiler is None:
        raise Unavailable("needs gcc and the static C library to build the pause image: apt-get install -y gcc")
    binary = directory / "pause"
    built = subprocess.run(
        [compiler, "-static", "-Os", "-o", str(binary), str(HERE / "pause.c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if built.returncode != 0:
        raise Unavailable(f"gcc -static cannot build the pause image: {built.stderr.strip().splitlines()[-1:]}")
    entries = [Entry("pause", data=binary.read_bytes())]
    return pack(PAUSE, entries, config={"Entrypoint": ["/pause"]}, into=directory / "pause.oci.tar")


def install_busybox() -> None:
    """Debian's busybox-static, installed when missing and we are root; failures are left to `busybox`."""
    debian.ensure(["busybox-static"], commands=[str(BUSYBOX_BINARY)])


def busybox(directory: pathlib.Path) -> Image:
    """The workload image (`BUSYBOX`): Debian's static busybox with a symlink per applet under /bin, PATH set.
    Raises `Unavailable` when busybox-static is not installed."""
    if not BUSYBOX_BINARY.is_file():
        raise Unavailable(BUSYBOX_SKIP)
    listed = subprocess.run(
        [str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True, timeout=30, check=False
    ).stdout.split()
    if "sh" not in listed:
        raise Unavailable(f"{BUSYBOX_BINARY} is not a static busybox with sh: {BUSYBOX_SKIP}")
    entries = [Entry("bin"), Entry("bin/busybox", data=BUSYBOX_BINARY.read_bytes()), Entry("tmp", mode=0o1777)]
    entries += [Entry(f"bin/{applet}", mode=0o777, link="busybox") for applet in sorted(listed) if applet != "busybox"]
    config = {"Cmd": ["sh"], "Env": ["PATH=/bin"]}
    return pack(BUSYBOX, entries, config=config, into=directory / "busybox.oci.tar")
