"""dractl's container image, built in the background from the moment a session knows it will need it.

A cold build (tools/build_image.py) takes two to three minutes of one core. The tests that need the image run
last (`image_last`), and the build starts when collection ends (`start`), so it overlaps the rest of the suite
instead of adding to it. It runs niced, so the tests keep the machine first. The fixtures that need the image call
`wait` and then build it themselves, which takes the archive from the cache; a failed background build costs
only time, since the fixture's own build reports the error.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Sequence

import build_image
import pytest

from support import debian

_STOP_SECONDS = 60

_background: subprocess.Popen[bytes] | None = None


def needs_image(item: pytest.Item) -> bool:
    """Whether the test uses, directly or through another fixture, a fixture that builds dractl's image:
    tests/image's `image`, and the real-node e2e's `dractl_image` unless $DRACTL_E2E_IMAGE names a built one."""
    builders = {"image"} if os.environ.get("DRACTL_E2E_IMAGE") else {"image", "dractl_image"}
    return not builders.isdisjoint(getattr(item, "fixturenames", ()))


def image_last(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: every test that needs the image after every other, each group in its order."""
    items.sort(key=needs_image)


def start(items: Sequence[pytest.Item]) -> None:
    """Start building the image in the background when a test will need it and this machine can build it (root,
    mmdebstrap and umoci, installed when missing as the fixtures do); otherwise leave it to the fixtures, which
    skip with their one line. Its output goes to the cache's logs."""
    global _background
    if _background is not None or not any(needs_image(item) for item in items) or os.geteuid() != 0:
        return
    if not debian.ensure(["mmdebstrap", "umoci"], commands=list(build_image.TOOLS)):
        return
    logs = build_image.default_cache() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "background.log").open("wb") as log:
        _background = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, str(pathlib.Path(build_image.__file__))],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait() -> None:
    """Wait for the background build, if one was started, to end."""
    if _background is not None:
        _background.wait()


def stop() -> None:
    """End a background build the session no longer needs (a run stopped early): its group gets SIGTERM, and
    the next build removes what it left unfinished."""
    global _background
    if _background is None:
        return
    if _background.poll() is None:
        os.killpg(_background.pid, signal.SIGTERM)
        try:
            _background.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(_background.pid, signal.SIGKILL)
            _background.wait()
    _background = None
