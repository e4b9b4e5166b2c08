"""The image tools/build_image.py builds: its config, dractl running in it, what it leaves out, its cache.

Marked `image`: a cold build takes minutes (docs/image.md); `-m 'not image'` leaves
these tests out. dractl runs from the image's root filesystem chrooted in private namespaces, as
the image's user, with the image's environment, the way a container runtime would start it.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import build_image
import pytest

import dractl

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPILERS = ("gcc", "cc", "c++", "cpp", "x86_64-linux-gnu-gcc-12", "ld", "as", "cython", "pip", "pip3")
BUILD_PACKAGES = ("gcc", "gcc-12", "cpp", "binutils", "libc6-dev", "python3-dev", "libpython3.11-dev", "libyaml-dev")


def _config(image: build_image.Image) -> dict[str, Any]:
    _, _, config = build_image.read_image(image.archive)
    inner: dict[str, Any] = config["config"]
    return inner


def _run_in_image(image: build_image.Image, rootfs: pathlib.Path, argv: list[str]) -> str:
    """stdout of argv run in the image's root as the image's user with the image's environment; fails on exit != 0."""
    config = _config(image)
    env = dict(variable.split("=", 1) for variable in config["Env"])
    command = build_image.chroot_argv(rootfs, argv, env=env, user=config["User"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv} in the image exited {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def test_config_is_the_dockerfiles(image: build_image.Image) -> None:
    """Guards: the archive names the image for containerd and carries the Dockerfile's user, entrypoint, env, labels."""
    index, manifest, config = build_image.read_image(image.archive)
    recipe = build_image.read_recipe(
        (ROOT / "Dockerfile").read_text(), build_args={"VERSION": dractl.__version__, "SOURCE_DATE_EPOCH": "0"}
    )
    assert image.name == f"docker.io/library/dractl:{dractl.__version__}"
    assert index["manifests"][0]["annotations"] == {
        "io.containerd.image.name": image.name,
        "org.opencontainers.image.ref.name": dractl.__version__,
    }
    assert (config["os"], config["architecture"], config["created"]) == ("linux", "amd64", "1970-01-01T00:00:00Z")
    assert config["config"] == {
        "User": "10001:10001",
        "Entrypoint": ["/opt/dractl/bin/dractl"],
        "Env": list(recipe.config.env),
        "Labels": dict(recipe.config.labels),
    }
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == dractl.__version__
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"] * 2


def test_dractl_version_runs_in_the_image(image: build_image.Image, rootfs: pathlib.Path) -> None:
    """Guards: the entrypoint starts dractl as the non-root image user and it reports the source's version."""
    entrypoint = _config(image)["Entrypoint"]
    assert _run_in_image(image, rootfs, [*entrypoint, "--version"]) == f"dractl {dractl.__version__}\n"


def test_discover_with_fake_gpus_in_the_image_matches_the_source(
    image: build_image.Image, rootfs: pathlib.Path
) -> None:
    """Guards: `dractl discover --device-source fake` in the image prints exactly what the source prints."""
    arguments = ["discover", "--device-source", "fake", "--fake-profile", "a100-80gb-x8", "--mig-mode", "dynamic"]
    arguments += ["--node-name", "image-test", "-o", "json"]
    in_image = _run_in_image(image, rootfs, ["dractl", *arguments])
    here = subprocess.run(
        [sys.executable, "-m", "dractl", *arguments], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert '"kind": "ResourceSlice"' in in_image
    assert in_image == here


def test_compiled_core_and_libyaml_load_in_the_image(image: build_image.Image, rootfs: pathlib.Path) -> None:
    """Guards: the Cython allocator and the libyaml decoder were compiled in the builder and load in the runtime."""
    code = "import dractl._alloc, dractl.model.decode._fastyaml as y, yaml; print(y.__file__, yaml.__with_libyaml__)"
    printed = _run_in_image(image, rootfs, ["python3", "-c", code])
    assert printed.startswith("/opt/dractl/lib/python3.11/site-packages/dractl/model/decode/_fastyaml.cpython-311")
    assert printed.endswith(" True\n")


def test_runtime_holds_no_compiler_and_has_the_controller_user(rootfs: pathlib.Path) -> None:
    """Guards: no compiler, headers or build packages reach the image; the controller's user exists, without a login."""
    assert [name for name in COMPILERS if (rootfs / "usr/bin" / name).exists()] == []
    assert not (rootfs / "opt/dractl/bin/pip").exists()
    assert list((rootfs / "usr/include").rglob("*.h")) == []
    status = (rootfs / "var/lib/dpkg/status").read_text()
    installed = {block.split("\n", 1)[0].removeprefix("Package: ") for block in status.split("\n\n") if block}
    assert {"python3", "libyaml-0-2"} <= installed
    assert installed.isdisjoint(BUILD_PACKAGES)
    passwd = (rootfs / "etc/passwd").read_text().splitlines()
    assert "dractl:x:10001:10001::/nonexistent:/usr/sbin/nologin" in passwd


def test_unchanged_inputs_come_from_the_cache(image: build_image.Image) -> None:
    """Guards: building again with nothing changed makes nothing and returns the same archive."""
    again = build_image.build()
    assert (again.archive, again.digest, again.made) == (image.archive, image.digest, ())


def test_another_tag_reuses_every_layer(image: build_image.Image) -> None:
    """Guards: an image under a new tag (e.g. for an upgrade test) is the same manifest, only the archive is new."""
    retagged = build_image.build(tag="dractl:retag-test")
    assert (retagged.name, retagged.tag, retagged.digest) == (
        "docker.io/library/dractl:retag-test",
        "retag-test",
        image.digest,
    )
    assert retagged.made in ((), ("archives",))


def test_assembling_the_layers_again_gives_the_same_digest(image: build_image.Image) -> None:
    """Guards: umoci's layers and config from the same roots are byte-identical (the reproducible part of the build)."""
    again = build_image.build(rebuild="image")
    assert again.made == ("layouts", "archives")
    assert again.digest == image.digest
