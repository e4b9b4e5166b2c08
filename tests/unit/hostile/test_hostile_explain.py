"""`dractl explain` against a server whose answers are hostile: an HTML page, JSON nested too deeply, a number of
thousands of digits, a List where one object was asked for, an answer trickled a byte at a time, or silence.

Each is one line naming the server and the object, exit 1, within `--timeout`. The server here is a fault injector of
a few lines that answers every request the same way (not a fake API server: nothing here behaves like one).
"""

from __future__ import annotations

import collections.abc
import pathlib
import socket
import socketserver
import threading

import controlplane
import pytest
from click.testing import CliRunner

from dractl import cli

pytestmark = pytest.mark.timeout(60)

CLAIM = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"


class Injector:
    """A local HTTP server answering every request with `answer` (raw bytes after the request was read); `trickle`
    sends it a byte every 0.2 s, `silent` reads the request and answers nothing, until the server stops."""

    def __init__(self) -> None:
        self.answer = b""
        self.trickle = False
        self.silent = False
        self.stopping = threading.Event()
        injector = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                connection: socket.socket = self.request
                received = b""
                while b"\r\n\r\n" not in received:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    received += chunk
                if injector.silent:
                    injector.stopping.wait()
                    return
                if not injector.trickle:
                    connection.sendall(injector.answer)
                    return
                for byte in injector.answer:
                    if injector.stopping.wait(0.2):
                        return
                    connection.sendall(bytes([byte]))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="injector", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def respond(self, body: bytes, *, status: str = "200 OK", content_type: str = "application/json") -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        self.answer = head.encode() + body

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def injector() -> collections.abc.Iterator[Injector]:
    """An injector, stopped after the test; then the thread an explain left waiting on it (past its --timeout) is
    waited for, so that it cannot write into a later test's output."""
    server = Injector()
    try:
        yield server
    finally:
        server.stop()
        controlplane.wait_until(
            lambda: not any(thread.name == "dractl-explain" for thread in threading.enumerate()),
            what="the explain thread left waiting on the injector ended",
            timeout=30,
        )


def _explain(injector: Injector, tmp_path: pathlib.Path, *args: str) -> tuple[int, str, str]:
    kubeconfig = controlplane.write_kubeconfig(tmp_path / "kubeconfig", server=injector.url, token="t")
    result = CliRunner().invoke(
        cli.main, ["explain", "claim", "ns/c", "--kubeconfig", str(kubeconfig), *args], catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body>Your proxy says hello</body></html>\n"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (HTML, f"the answer is not JSON: it begins {HTML[:60].decode()!r}"),
        (b"[" * 100_000 + b"]" * 100_000, "the answer is JSON nested too deeply to read"),
        (
            b'{"kind": "ResourceClaim", "metadata": {"name": "c", "generation": ' + b"9" * 5000 + b"}}",
            "the answer is JSON with a number of 5000 digits (at most 100)",
        ),
        (
            b'{"kind": "List", "apiVersion": "v1", "items": [{"metadata": {"name": "c"}}]}',
            "the answer is a List where one ResourceClaim was asked for",
        ),
        (b'["a", "b"]', "the answer is JSON but not an object: a list"),
    ],
    ids=["html-page", "deeply-nested", "5000-digits", "a-list", "not-an-object"],
)
def test_an_answer_dractl_cannot_read_is_one_line_naming_the_server_and_object(
    body: bytes, problem: str, injector: Injector, tmp_path: pathlib.Path
) -> None:
    """Guards: a 200 whose body is an HTML page (a proxy's sign-in page), JSON nested 100,000 deep, a 5000-digit
    number, or a List (or any non-object) where one claim was asked for is one line naming the server, the object and
    what is wrong with the answer, exit 1 (each was a traceback)."""
    injector.respond(body)
    code, out, err = _explain(injector, tmp_path)
    assert (code, out) == (1, "")
    assert err == (
        f"dractl explain: the API server {injector.url} gave an answer dractl cannot read to get ResourceClaim ns/c: "
        f"GET {CLAIM}: {problem}\n"
    )


def test_an_html_error_page_is_one_line(injector: Injector, tmp_path: pathlib.Path) -> None:
    """Guards: a 403 whose body is a multi-line HTML page (a proxy in between) is one line naming the server and the
    object, with the page's text on that line."""
    injector.respond(HTML, status="403 Forbidden", content_type="text/html")
    code, out, err = _explain(injector, tmp_path)
    assert (code, out) == (1, "")
    assert err == (
        f"dractl explain: the API server {injector.url} refuses to get ResourceClaim ns/c: 403 Error: "
        f"{' '.join(HTML.decode().split())}\n"
    )


@pytest.mark.parametrize("how", ["trickle", "silent"])
def test_a_server_that_trickles_or_stays_silent_ends_within_the_timeout(
    how: str, injector: Injector, tmp_path: pathlib.Path
) -> None:
    """Guards the overall deadline: a server that sends its answer a byte every 0.2 s (each read succeeds, so no
    per-request timeout fires; it held explain over 60 s) or answers nothing (91 s: three tries of 30 s) ends the run
    at `--timeout` with one line naming the server and what was being read, exit 1."""
    injector.respond(b'{"kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"}}' + b" " * 10_000)
    injector.trickle = how == "trickle"
    injector.silent = how == "silent"
    code, out, err = _explain(injector, tmp_path, "--timeout", "2")
    assert (code, out) == (1, "")
    assert err == (
        f"dractl explain: no complete answer from the API server {injector.url} to get ResourceClaim ns/c within "
        "--timeout 2 s\n"
    )


def test_the_timeout_comes_from_its_environment_variable(injector: Injector, tmp_path: pathlib.Path) -> None:
    """Guards: DRACTL_TIMEOUT sets --timeout, as every flag's DRACTL_ variable does."""
    injector.silent = True
    kubeconfig = controlplane.write_kubeconfig(tmp_path / "kubeconfig", server=injector.url, token="t")
    result = CliRunner().invoke(
        cli.main,
        ["explain", "pod", "ns/p", "--kubeconfig", str(kubeconfig)],
        env={"DRACTL_TIMEOUT": "1.5"},
        catch_exceptions=False,
    )
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"dractl explain: no complete answer from the API server {injector.url} to get Pod ns/p within "
        "--timeout 1.5 s\n"
    )
