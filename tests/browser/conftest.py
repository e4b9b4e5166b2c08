"""Browser test set-up: Debian's headless Chromium, installed when missing (as root with apt), else skipped.

`chromium` is the session's browser; `render` opens a local HTML file in it (with an optional
`#fragment` in the address) with a fresh profile and returns the DOM after the page's scripts ran,
plus the browser's log, in which Chromium prints every console message as `INFO:CONSOLE`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import subprocess
from collections.abc import Callable

import pytest
from support import debian

SKIP = "needs Debian's chromium for the browser tests: apt-get install -y chromium (as root)"
# The flags this machine's Chromium needs (see the environment notes): no sandbox as root, no
# GPU, and none of the background connections a closed network refuses.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
_PAGE_SECONDS = 60


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's chromium; installs it when missing and running as root with apt."""
    found = shutil.which("chromium") if debian.ensure(["chromium"], commands=["chromium"]) else None
    if found is None:
        pytest.skip(SKIP)
    return found


@dataclasses.dataclass(frozen=True)
class Page:
    """What the browser made of a page: the DOM after its scripts ran, and its log."""

    dom: str
    log: str

    @property
    def console(self) -> list[str]:
        return [line for line in self.log.splitlines() if ":CONSOLE" in line]


@pytest.fixture
def render(chromium: str, tmp_path: pathlib.Path) -> Callable[..., Page]:
    """Open a local file in headless Chromium with a fresh profile; bounded by a timeout."""

    def run(page: pathlib.Path, fragment: str = "") -> Page:
        profile = tmp_path / f"profile-{page.stem}-{len(fragment)}"
        address = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
        argv = [chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", address]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_PAGE_SECONDS, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return Page(dom=done.stdout, log=done.stderr)

    return run
