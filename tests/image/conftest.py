"""Image test set-up: the container image built once per session by tools/build_image.py, and its root filesystem.

Building needs root and Debian's mmdebstrap and umoci (installed when missing, as root with apt);
elsewhere the tests skip with one line. A cold build takes minutes; later sessions reuse the cache
in ~/.cache/dractl/image for everything the changed sources do not touch.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator

import build_image
import pytest
from support import debian, prebuild

SKIP_ROOT = "needs root to build the container image (mmdebstrap, chroot and umoci make files of other users)"
SKIP_TOOLS = "needs Debian's mmdebstrap and umoci for the image tests: apt-get install -y mmdebstrap umoci (as root)"


@pytest.fixture(scope="session")
def image() -> build_image.Image:
    """The image of this tree, built or taken from the cache; skips with one line where it cannot be built."""
    if os.geteuid() != 0:
        pytest.skip(SKIP_ROOT)
    if not debian.ensure(["mmdebstrap", "umoci"], commands=list(build_image.TOOLS)):
        pytest.skip(SKIP_TOOLS)
    prebuild.wait()
    return build_image.build()


@pytest.fixture(scope="session")
def rootfs(image: build_image.Image) -> Iterator[pathlib.Path]:
    """The image's root filesystem, unpacked from the archive by umoci as a runtime would; removed after the session."""
    with tempfile.TemporaryDirectory(prefix="dractl-image-") as directory:
        layout, bundle = pathlib.Path(directory, "layout"), pathlib.Path(directory, "bundle")
        with tarfile.open(image.archive) as archive:
            archive.extractall(layout, filter="data")
        subprocess.run(
            ["umoci", "unpack", "--image", f"{layout}:{image.tag}", str(bundle)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        yield bundle / "rootfs"
