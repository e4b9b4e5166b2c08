"""What every long-running dractl process shares: logging set-up, probe and metrics endpoints, signals.

What it does: routes structlog (and, on request, the standard library's `logging`, which the
`kube` and `controller` layers use) to one stream as JSON lines or console lines
(`configure_logging`, `capture_stdlib_logging`); serves GET on fixed paths from a tiny threaded
HTTP server (`HttpEndpoint`, with `metrics_page` for Prometheus); and turns SIGTERM/SIGINT
into a callback (`install_signal_handlers`, `restore_signal_handlers`). `dractl node-agent` and
`dractl controller` use these, so both processes log, probe and stop the same way.

What it must not do: know about any mode (no import of `node`, `controller`, `kube` or the
allocator), read flags or the environment, or decide what a probe answers: the routes are the
caller's.
"""

from __future__ import annotations

import http.server
import logging
import signal
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TextIO, TypeVar

import prometheus_client
import structlog

from dractl import config

Answer = tuple[int, str, str]
"""What a route answers: HTTP status, content type, body."""

Route = Callable[[], Answer]

TEXT = "text/plain; charset=utf-8"


# --- logging ---------------------------------------------------------------------------------------


def _output(log_format: config.LogFormat | None, stream: TextIO | None) -> tuple[TextIO, list[Any]]:
    """The stream (stderr when None) and the processors that end every log chain on it: the traceback as a field
    and the JSON renderer, or the console renderer (the format `None` picks console for a terminal)."""
    out = stream if stream is not None else sys.stderr
    if log_format is config.LogFormat.JSON or (log_format is None and not out.isatty()):
        return out, [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    return out, [structlog.dev.ConsoleRenderer(colors=out.isatty())]


def configure_logging(log_format: config.LogFormat | None, *, stream: TextIO | None = None) -> None:
    """Route structlog to `stream` (stderr): JSON lines, or console lines for a terminal.

    `None` picks console when the stream is a terminal and JSON otherwise (in the cluster).
    May be called again; the last call wins.
    """
    out, ending = _output(log_format, stream)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *ending,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


class _StdlibHandler(logging.Handler):
    """The handler `capture_stdlib_logging` installs (its own class, so it is found and removed exactly).

    It writes each formatted record through structlog's logger for the stream, which holds
    structlog's lock for that stream while it writes the line and its newline: a record from
    another thread can never land between a structlog line and its newline (two JSON objects on
    one line, which no log collector reads).
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._out = structlog.PrintLogger(stream)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._out.msg(self.format(record))
        except Exception:  # noqa: BLE001 (logging's rule: a record that cannot be written never raises)
            self.handleError(record)


def capture_stdlib_logging(log_format: config.LogFormat | None, *, stream: TextIO | None = None) -> Callable[[], None]:
    """Send records of the standard library's `logging` (INFO and up) to `stream` in the same format as structlog.

    Each record becomes one line with `event` (the formatted message), `level`, `logger` and
    `timestamp`, plus the traceback when there is one. Returns a function that undoes exactly
    this call (removes the handler, restores the root level); calling it twice is harmless.
    """
    out, ending = _output(log_format, stream)
    pre_chain: list[Any] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = _StdlibHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *ending],
            foreign_pre_chain=pre_chain,
        )
    )
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def undo() -> None:
        if handler in root.handlers:
            root.removeHandler(handler)
            root.setLevel(previous_level)

    return undo


# --- HTTP endpoints -----------------------------------------------------------------------------------


class HttpEndpoint:
    """A tiny threaded HTTP server answering GET on fixed paths with (status, content type, body) callbacks.

    Port 0 binds an ephemeral port (`port` tells which). Raises OSError when the port is taken.
    Routes are called from the server's threads, one per request. `stop()` is idempotent.
    """

    def __init__(self, *, port: int, routes: Mapping[str, Route], name: str, host: str = "0.0.0.0") -> None:
        handler = _handler_for(routes)
        server_class = _ThreadingHTTPServer6 if ":" in host else http.server.ThreadingHTTPServer
        self._server = server_class((host, port), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"dractl-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


class _ThreadingHTTPServer6(http.server.ThreadingHTTPServer):
    """The same server on an IPv6 address (the standard one binds IPv4 only)."""

    address_family = socket.AF_INET6


def _handler_for(routes: Mapping[str, Route]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                status, content_type, body = 404, TEXT, "not found\n"
            else:
                status, content_type, body = route()
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            # Probes every few seconds would flood the log; failures are logged by the route.
            return

    return Handler


def standard_collectors(registry: prometheus_client.CollectorRegistry) -> None:
    """Add the `process_*`, `python_gc_*` and `python_info` metrics to `registry`; once per registry."""
    prometheus_client.ProcessCollector(registry=registry)
    prometheus_client.PlatformCollector(registry=registry)
    prometheus_client.GCCollector(registry=registry)


def metrics_page(registry: prometheus_client.CollectorRegistry) -> Answer:
    """The registry in Prometheus' text format."""
    return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest(registry).decode()


# --- signals ---------------------------------------------------------------------------------------


def install_signal_handlers(on_signal: Callable[[], None]) -> dict[int, Any]:
    """Call `on_signal` on SIGTERM and SIGINT; returns the previous handlers for `restore_signal_handlers`.

    Only the main thread can handle signals: elsewhere nothing is installed (and {} returned),
    and the caller's own stop event ends the process instead. `on_signal` runs on the main
    thread between bytecodes, so it must only set events.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, lambda signum, frame: on_signal())
    return previous


def restore_signal_handlers(previous: Mapping[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


_M = TypeVar("_M")
_PER_REGISTRY: weakref.WeakKeyDictionary[prometheus_client.CollectorRegistry, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)
_PER_REGISTRY_LOCK = threading.Lock()


def metrics_once(registry: prometheus_client.CollectorRegistry, name: str, build: Callable[[], _M]) -> _M:
    """The metrics set `name` on `registry`, built by `build()` the first time. A controller made again on the
    same registry (leadership lost and regained) reuses its metrics instead of failing on a duplicate
    registration."""
    with _PER_REGISTRY_LOCK:
        sets = _PER_REGISTRY.setdefault(registry, {})
        if name not in sets:
            sets[name] = build()
        found: _M = sets[name]
        return found
