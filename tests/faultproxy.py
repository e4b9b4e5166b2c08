"""A fault-injecting HTTPS proxy in front of the real kube-apiserver, for tests.

What it does: listens on 127.0.0.1 with its own serving certificate (issued by the control
plane's test CA, so the same kubeconfig CA trusts it), forwards every request to the API
server with the admin client certificate over a few kept-alive connections (a watch gets one of
its own, cut when its client goes), streams watch responses line by line, records every
request, and injects faults by rule: an HTTP status (409 Conflict, 5xx, 429, with Retry-After
if asked) instead of the answer, an answer cut off after the server acted on the request, a 410
Gone ERROR event on a watch, a watch dropped mid-stream after N events, or added latency. A rule
matches by method and a regex searched in the request target (path and query) and fires
`count` times (None: forever).

What it must not do: change requests or answers it has no rule for, send a write twice (only a
GET or HEAD is sent again when a kept-alive connection breaks under it), or listen beyond
127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import os
import pathlib
import re
import select
import socket
import ssl
import sys
import threading
import time
from typing import Any

import controlplane

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}
_WATCH = re.compile(r"[?&]watch=true")
# Idle upstream connections kept for reuse; more requests at once open more, closed when done.
_IDLE_UPSTREAMS = 8
# Requests the server may receive twice with the same effect (RFC 9110 9.2.2 also lists PUT and DELETE, but a
# second PUT of the Kubernetes API gets a Conflict and a second DELETE a NotFound: their answers differ).
_REPLAYABLE = {"GET", "HEAD"}
# How long `stop` waits for the requests being handled to end, once it has cut their connections.
_STOP_TIMEOUT = 10.0


@dataclasses.dataclass(slots=True)
class Rule:
    """One fault: which requests it matches and what it does instead of (or to) the real answer.

    Exactly one action: `status` (answer with it and a Status body, and a Retry-After header when
    `retry_after` is set), `cut_answer` (forward the request, wait for the server's whole answer,
    then close the client's connection without a byte of it), `watch_gone` (answer a watch with an
    ERROR event carrying 410), `drop_after` (forward a watch, then cut the connection after that
    many events), or only `delay` (seconds added before forwarding; also combinable).
    """

    method: str = ""  # empty: any method
    path: str = ""  # regex searched in "path?query"; empty: any
    count: int | None = 1
    status: int = 0
    reason: str = ""
    retry_after: int | None = None
    cut_answer: bool = False
    watch_gone: bool = False
    drop_after: int | None = None
    delay: float = 0.0
    fired: int = 0

    def matches(self, method: str, target: str) -> bool:
        if self.count is not None and self.fired >= self.count:
            return False
        if self.method and self.method.upper() != method:
            return False
        return not self.path or re.search(self.path, target) is not None


def respond(
    status: int,
    *,
    method: str = "",
    path: str = "",
    count: int | None = 1,
    reason: str = "",
    retry_after: int | None = None,
) -> Rule:
    """Answer matching requests with `status` (e.g. 409, 429, 500, 503) and a Status body, not forwarding them; with
    `retry_after`, the answer carries `Retry-After: <seconds>` (as the API server's 429s do)."""
    return Rule(method=method, path=path, count=count, status=status, reason=reason, retry_after=retry_after)


def cut_answer(*, method: str = "", path: str = "", count: int | None = 1) -> Rule:
    """Forward matching requests and let the server act on them, then close the client's connection before a byte
    of the answer reaches it: the client cannot tell whether its request was carried out (a create whose answer is
    lost)."""
    return Rule(method=method, path=path, count=count, cut_answer=True)


def watch_gone(*, path: str = "", count: int | None = 1) -> Rule:
    """Answer matching watches with 200 and one ERROR event of code 410 (what a too-old resourceVersion gets)."""
    return Rule(
        method="GET", path=path + r".*[?&]watch=true" if path else r"[?&]watch=true", count=count, watch_gone=True
    )


def drop_watch(*, path: str = "", after: int = 0, count: int | None = 1) -> Rule:
    """Forward matching watches but close the connection abruptly after `after` events."""
    return Rule(
        method="GET", path=path + r".*[?&]watch=true" if path else r"[?&]watch=true", count=count, drop_after=after
    )


def latency(seconds: float, *, method: str = "", path: str = "", count: int | None = 1) -> Rule:
    """Delay matching requests by `seconds` before forwarding them."""
    return Rule(method=method, path=path, count=count, delay=seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request the proxy saw: when it arrived (`received`, time.monotonic() in the test process), the status
    the server (or the fault) gave and the fault applied (or "")."""

    method: str
    target: str
    status: int
    fault: str
    received: float

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")

    @property
    def is_watch(self) -> bool:
        return self.method == "GET" and _WATCH.search(self.target) is not None


class _Server(http.server.ThreadingHTTPServer):
    # Daemon threads, which `server_close` does not join: `FaultProxy.stop` waits for them itself, with a timeout.
    daemon_threads = True
    proxy: FaultProxy

    def process_request(self, request: Any, client_address: Any) -> None:
        # Counted here in the serving thread, before the handler's thread starts: once `shutdown` has returned, the
        # count can only fall.
        self.proxy._handler_started()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.proxy._handler_ended()  # Its thread did not start.
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.proxy._handler_ended()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connections the proxy cut on purpose (dropped watches) or that clients dropped end in
        # socket and TLS errors; those are expected. Anything else is a bug in the proxy: show it.
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle and delayed ACK cost ~40 ms per request
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.proxy._serving(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._served(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # The request log is `FaultProxy.requests`.

    def do_GET(self) -> None:
        self.server.proxy._handle(self)

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_GET


class FaultProxy:
    """The running proxy: `rules` to inject faults, `requests` to see what passed. Thread-safe."""

    def __init__(
        self, plane: controlplane.ControlPlane, server: _Server, *, kubeconfig: pathlib.Path, upstream_port: int
    ) -> None:
        self.plane = plane
        self._server = server
        self.kubeconfig = kubeconfig
        self._upstream_port = upstream_port
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._requests: list[Request] = []
        self._holding: list[tuple[str, str]] = []  # (method, target) of the requests latency rules hold now
        self._upstreams: set[http.client.HTTPSConnection] = set()  # every open one, idle or in use
        self._idle: list[http.client.HTTPSConnection] = []
        self._clients: set[socket.socket] = set()  # the connections of the clients being served
        self._stopped = threading.Event()  # set under `_lock`
        self._handlers = 0  # handler threads started and not ended yet
        self._handlers_ended = threading.Condition(self._lock)  # notified when `_handlers` falls to 0
        self._opened = 0
        self._upstream_context = plane.ssl_context()
        self._thread = threading.Thread(target=server.serve_forever, name="faultproxy", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @classmethod
    def start(cls, plane: controlplane.ControlPlane, *, upstream_port: int | None = None) -> FaultProxy:
        """Listen on a free 127.0.0.1 port; returns once accepting. Writes `<plane dir>/proxy-<port>.kubeconfig`.

        Requests go to `plane`'s API server, or to `upstream_port` on 127.0.0.1 when given (something that relays
        to it, for tests of the proxy itself: the server's certificate must still be valid for 127.0.0.1).
        """
        cert, key = plane.ca.issue("proxy", subject="/CN=dractl-fault-proxy", server=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.server_bind()
        server.server_activate()
        port = server.server_address[1]
        kubeconfig = controlplane.write_kubeconfig(
            plane.directory / f"proxy-{port}.kubeconfig",
            server=f"https://127.0.0.1:{port}",
            ca=plane.ca.cert,
            cert=plane.directory / "admin.crt",
            key=plane.directory / "admin.key",
        )
        proxy = cls(plane, server, kubeconfig=kubeconfig, upstream_port=upstream_port or plane.port)
        server.proxy = proxy
        proxy._thread.start()
        return proxy

    def stop(self) -> None:
        """Stop serving: stop listening, cut every client connection and every upstream connection in use, close
        the idle ones. A request held by a latency rule is not forwarded any more. Returns once no request is
        being handled; raises RuntimeError if one still is after 10 s (its thread is left running, as a daemon
        thread). Idempotent."""
        with self._lock:
            self._stopped.set()
            idle = list(self._idle)
            self._idle.clear()
            self._upstreams.difference_update(idle)
        self._server.shutdown()
        # No connection is accepted any more; one accepted meanwhile is cut by `_serving`.
        with self._lock:
            clients = list(self._clients)
            upstreams = list(self._upstreams)
        for sock in clients:
            _shutdown(sock)
        for connection in upstreams:
            _shutdown(connection.sock)
        for connection in idle:
            connection.close()
        with self._lock:
            self._handlers_ended.wait_for(lambda: self._handlers == 0, timeout=_STOP_TIMEOUT)
            handling = self._handlers
        self._server.server_close()
        self._thread.join(timeout=10)
        if handling:
            raise RuntimeError(f"the fault proxy still handles {handling} request(s) {_STOP_TIMEOUT:g} s after stop()")

    def add(self, *rules: Rule) -> None:
        """Add rules; the first matching rule with firings left applies to a request."""
        with self._lock:
            self._rules.extend(rules)

    def clear(self) -> None:
        """Forget rules and the request log."""
        with self._lock:
            self._rules.clear()
            self._requests.clear()

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    @property
    def opened_upstreams(self) -> int:
        """How many connections to the API server the proxy has opened so far."""
        with self._lock:
            return self._opened

    @property
    def busy_upstreams(self) -> int:
        """How many connections to the API server carry a request or watch right now."""
        with self._lock:
            return len(self._upstreams) - len(self._idle)

    @property
    def holding(self) -> list[tuple[str, str]]:
        """The (method, target) of each request a latency rule holds right now (received, not yet forwarded): its
        client is waiting for the answer."""
        with self._lock:
            return list(self._holding)

    def writes(self) -> list[Request]:
        """The write requests (POST, PUT, PATCH, DELETE) seen so far."""
        return [request for request in self.requests if request.is_write]

    # --- Serving -------------------------------------------------------------------------

    def _serving(self, client: socket.socket) -> None:
        """A handler starts serving `client`'s connection: remembered, so that `stop` can cut it (at once when the
        proxy has stopped already)."""
        with self._lock:
            if not self._stopped.is_set():
                self._clients.add(client)
                return
        _shutdown(client)

    def _served(self, client: socket.socket) -> None:
        with self._lock:
            self._clients.discard(client)

    def _handler_started(self) -> None:
        with self._lock:
            self._handlers += 1

    def _handler_ended(self) -> None:
        with self._lock:
            self._handlers -= 1
            if not self._handlers:
                self._handlers_ended.notify_all()

    def _take_rule(self, method: str, target: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.fired += 1
                    return rule
        return None

    def _record(self, handler: _Handler, status: int, fault: str, *, received: float) -> None:
        with self._lock:
            self._requests.append(Request(handler.command, handler.path, status, fault, received))

    def _handle(self, handler: _Handler) -> None:
        received = time.monotonic()
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        rule = self._take_rule(handler.command, handler.path)
        if rule is not None and rule.delay:
            held = (handler.command, handler.path)
            with self._lock:
                self._holding.append(held)
            try:
                self._stopped.wait(rule.delay)  # `stop` ends the delay; the request is then not forwarded.
            finally:
                with self._lock:
                    self._holding.remove(held)
        if rule is not None and rule.status:
            reason = rule.reason or _REASONS.get(rule.status, "Error")
            # Recorded before answering, so a client that got its answer always finds it in the log.
            self._record(handler, rule.status, f"status {rule.status}", received=received)
            headers = {} if rule.retry_after is None else {"Retry-After": str(rule.retry_after)}
            _send_json(
                handler,
                rule.status,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": rule.status,
                    "reason": reason,
                    "message": f"injected by the fault proxy: {rule.status} {reason}",
                },
                headers=headers,
            )
            return
        if rule is not None and rule.watch_gone:
            self._record(handler, 200, "watch gone", received=received)
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            event = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": "injected by the fault proxy: too old resource version",
                },
            }
            _send_chunk(handler, json.dumps(event).encode() + b"\n")
            _send_chunk(handler, b"")
            return
        self._forward(handler, body, rule, received=received)

    def _connect(self) -> http.client.HTTPSConnection:
        """A new upstream connection, connected. Raises ConnectionRefusedError once stopped: `_stopped` is checked
        after connecting, under the lock, so `stop` either finds the connection (with its socket) and cuts it or
        the connection is never used."""
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self._upstream_port, context=self._upstream_context, timeout=600
        )
        try:
            connection.connect()
            with self._lock:
                if not self._stopped.is_set():
                    self._upstreams.add(connection)
                    self._opened += 1
                    return connection
            raise ConnectionRefusedError("the fault proxy is stopped")
        except BaseException:
            connection.close()
            raise

    def _take_idle(self) -> http.client.HTTPSConnection | None:
        """A pooled connection the server has not closed, or None. Those it closed are dropped on the way."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                connection = self._idle.pop()
            if not _readable(connection.sock):
                return connection
            # An idle HTTP/1.1 connection receives nothing: readable means the server closed it (its idle timeout).
            self._release(connection, reusable=False)

    def _release(self, connection: http.client.HTTPSConnection, *, reusable: bool) -> None:
        """Keep `connection` for the next request when `reusable` and there is room, else close it."""
        with self._lock:
            if reusable and not self._stopped.is_set() and len(self._idle) < _IDLE_UPSTREAMS:
                self._idle.append(connection)
                return
            self._upstreams.discard(connection)
        connection.close()

    def _send(
        self, handler: _Handler, body: bytes | None, *, watch: bool
    ) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        """Send the request upstream and read the answer's head: a watch on a connection of its own, anything
        else on an idle kept-alive one (or a new one). A failure closes the connection and is raised, with one
        exception: a GET or HEAD that fails on a kept-alive connection goes on to the next one (a new one once no
        idle one is left). The server may close a kept-alive connection just as a request goes out, and whether it
        received the request then cannot be known, so only requests it may receive twice are sent again (as Go's
        http.Transport does)."""
        headers = {key: value for key, value in handler.headers.items() if key.lower() not in _HOP_BY_HOP}
        replayable = handler.command in _REPLAYABLE
        while True:
            connection = None if watch else self._take_idle()
            reused = connection is not None
            connection = connection or self._connect()
            try:
                connection.request(handler.command, handler.path, body=body, headers=headers)
                return connection, connection.getresponse()
            except BaseException as error:
                self._release(connection, reusable=False)
                if not (reused and replayable and isinstance(error, (OSError, http.client.HTTPException))):
                    raise

    def _forward(self, handler: _Handler, body: bytes | None, rule: Rule | None, *, received: float) -> None:
        watch = _WATCH.search(handler.path) is not None
        try:
            upstream, response = self._send(handler, body, watch=watch)
        except (OSError, http.client.HTTPException):
            handler.close_connection = True
            return
        held: http.client.HTTPSConnection | None = upstream
        try:
            if rule is not None and rule.cut_answer:
                response.read()  # The whole answer: the server has acted on the request.
                held = None
                self._release(upstream, reusable=not response.will_close)
                self._record(handler, response.status, "cut answer", received=received)
                handler.close_connection = True
                _shutdown(handler.connection)
                return
            is_stream = watch and response.getheader("Transfer-Encoding", "").lower() == "chunked"
            handler.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    handler.send_header(key, value)
            if not is_stream:
                data = response.read()
                # Back to the pool before the client has its answer: its next request finds it there.
                held = None
                self._release(upstream, reusable=not watch and not response.will_close)
                self._record(handler, response.status, "delay" if rule is not None else "", received=received)
                # A HEAD answer has no body but the Content-Length a GET's would have: passed on as it came.
                length = response.getheader("Content-Length") if handler.command == "HEAD" else str(len(data))
                if length is not None:
                    handler.send_header("Content-Length", length)
                handler.end_headers()
                handler.wfile.write(data)
                return
            self._record(
                handler,
                response.status,
                "drop watch"
                if rule is not None and rule.drop_after is not None
                else ("delay" if rule is not None else ""),
                received=received,
            )
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            with _ClientWatch(handler.connection, upstream):
                events = 0
                while True:
                    if rule is not None and rule.drop_after is not None and events >= rule.drop_after:
                        # Cut the client's connection without the final chunk, as a broken network would.
                        handler.close_connection = True
                        _shutdown(handler.connection)
                        return
                    line = response.readline()
                    if not line:
                        _send_chunk(handler, b"")
                        return
                    _send_chunk(handler, line)
                    events += 1
        except (OSError, http.client.HTTPException):
            handler.close_connection = True
        finally:
            if held is not None:
                self._release(held, reusable=False)


class _ClientWatch:
    """While a watch streams, cut its upstream connection as soon as the client goes (closes its connection).

    Else the proxy would notice only when the next event fails to reach the client, and the API
    server would keep serving a watch nobody reads. A client sends nothing while it reads a
    stream, so its socket turning readable means it closed. The context's exit ends the thread.
    """

    def __init__(self, client: socket.socket, upstream: http.client.HTTPSConnection) -> None:
        self._client = client
        self._upstream = upstream
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="faultproxy-watch", daemon=True)

    def __enter__(self) -> _ClientWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        os.write(self._wake_write, b"x")
        self._thread.join()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _run(self) -> None:
        # poll, not select: select fails for descriptors >= 1024, which a busy test process may reach.
        poller = select.poll()
        try:
            poller.register(self._client, select.POLLIN)
            poller.register(self._wake_read, select.POLLIN)
            woken = any(fd == self._wake_read for fd, _ in poller.poll())
        except (OSError, ValueError):
            woken = False  # The client socket is already closed.
        if not woken:
            _shutdown(self._upstream.sock)


def _send_json(
    handler: _Handler, status: int, document: dict[str, Any], *, headers: dict[str, str] | None = None
) -> None:
    data = json.dumps(document).encode()
    handler.send_response(status)
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _send_chunk(handler: _Handler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _readable(sock: socket.socket | None) -> bool:
    """Whether `sock` has something to read (or is closed) right now, without waiting."""
    if sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
    except ValueError:
        return True  # Closed: no descriptor any more.
    return bool(poller.poll(0))


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # Already closed.
