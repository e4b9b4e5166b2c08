"""Fixtures of the end-to-end suites: the real-node images, the timings report, logs attached to failures.

The real-node suite (modules test_realnode_*.py, marker `realnode`) starts its clusters itself, one
per module (e2e/realcluster.py); it skips with one line where a real node cannot start here. The
kind suite (test_kind.py, marker `e2e`) skips with one line without a Docker engine and kind. Long
scenarios carry the marker `long` and are deselected by default (`-m long` runs them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import controlplane
import node_images
import pytest
import realcluster
import realnode
from support import prebuild

_TIMINGS = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    """The session's list of timings."""
    config.stash[_TIMINGS] = []


@pytest.fixture(scope="session")
def real_images(tmp_path_factory: pytest.TempPathFactory) -> list[node_images.Image]:
    """The pause and busybox images every real node imports (busybox-static installed as root when missing);
    skips with one line when they cannot be made here."""
    directory = tmp_path_factory.mktemp("images")
    node_images.install_busybox()
    try:
        return [node_images.pause(directory), node_images.busybox(directory)]
    except node_images.Unavailable as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def dractl_image() -> node_images.Image:
    """dractl's own image, built here without Docker by tools/build_image.py (cached under ~/.cache/dractl/image;
    the first build takes minutes, and starts in the background when collection ends); skips with one line where
    the builder's tools cannot be had."""
    prebuild.wait()
    try:
        return node_images.dractl()
    except node_images.Unavailable as missing:
        pytest.skip(f"cannot build dractl's image here: {missing}")


@pytest.fixture(scope="session")
def timings(pytestconfig: pytest.Config) -> Callable[[str, float], None]:
    """`timings(what, seconds)` records a duration the session prints at its end ("real-node timings")."""

    def record(what: str, seconds: float) -> None:
        pytestconfig.stash[_TIMINGS].append(f"{what}: {seconds:.1f} s")

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_TIMINGS, [])
    if lines:
        terminalreporter.section("real-node timings (this machine, as loaded now)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test (or fixture) gets the `failure_report()` of each fixture value that has one (a cluster: its
    daemons' and pods' logs) as a section of its report."""
    report: pytest.TestReport = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            failure_report = getattr(value, "failure_report", None)
            if callable(failure_report):
                try:
                    text = str(failure_report())
                except Exception as error:  # A failure report must not fail on its logs.
                    text = f"(logs unavailable: {error!r})"
                report.sections.append((f"logs of {name}", text))
    return report


@pytest.fixture(scope="module")
def start_cluster(real_images: list[node_images.Image]) -> Iterator[Callable[..., realcluster.RealCluster]]:
    """`start_cluster({"gpu-a100": labels}, preload=[...])`: a real cluster for the module, stopped after its last
    test; the module skips with one line where a real node cannot start here (not root, no binaries, no cgroups)."""
    with contextlib.ExitStack() as stack:

        def start(
            nodes: Mapping[str, Mapping[str, str]], *, preload: Sequence[node_images.Image] = ()
        ) -> realcluster.RealCluster:
            try:
                return stack.enter_context(realcluster.running(nodes, preload=[*real_images, *preload]))
            except (realnode.Unavailable, controlplane.Unavailable) as missing:
                pytest.skip(f"no real node here: {missing}")

        yield start
