"""A thin, typed client for the API objects dractl reads and writes, over raw JSON.

What it does: builds the official client's `ApiClient` from a kubeconfig or the in-cluster
service account (config, auth, TLS and connection pooling are the `kubernetes` package's), then
sends requests itself: the server's version, get, list (paged), watch (a line-by-line event stream), create, update
(PUT with the body's resourceVersion as precondition), update of the status subresource, merge
patch, JSON patch, server-side apply and delete (with optional resourceVersion/uid
preconditions), and a protobuf GET and PUT for the one write that must keep stored bytes
(`finalizers`). Writes carry the field manager `dractl`. Non-2xx answers become `ApiError`
subclasses (`Conflict`, `NotFound`, `AlreadyExists`, `Gone`, `Invalid`, `Transient`); an
optional `on_error` hook hears of each call that failed (for metrics). `decode` turns one raw
object into a `dractl.model` value, or logs and skips it.

Retries (a bounded number, with jittered exponential backoff, at least the Retry-After the
server asked for) follow client-go: `may_retry` sends a request again only when that cannot do
a second time what the first did. Reads are retried on any transient failure; a write only when
it surely never reached the server (the connection was refused or never made) or the server
turned it away unread (429) or asked for a retry (Retry-After). A POST is never sent twice after
a broken connection or a 5xx: its first attempt may have created the object, and with
`generateName` a second would make another. Before each attempt an optional `RateLimiter`
(client-side QPS and burst, `ratelimit.TokenBucket`) may delay it, and an optional `WriteFence`
may refuse a write (`Fenced`, never retried): the leader's lease decides whether it may write.
The fence is asked before the write is prepared and again just before each piece of it (the
headers, the body) goes to the socket, through the connection classes `connect` installs in the
pool, so a process paused in between asks again when it goes on and sends nothing it may not.

What it must not do: use the generated models, hold a cache (see `informer`), retry an
answer that is not transient (a 409 goes back to the caller, who re-reads and decides), or let
urllib3 retry on its own (its retries would not follow these rules).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypedDict, Unpack

import kubernetes.client
import kubernetes.config
import msgspec
import tenacity
import urllib3
import urllib3.connection
import urllib3.exceptions

from dractl import model
from dractl.model import decode as model_decode

log = logging.getLogger(__name__)

FIELD_MANAGER = "dractl"
PROTOBUF = "application/vnd.kubernetes.protobuf"
DEFAULT_TIMEOUT = 30.0  # seconds, per request (watches use their own read timeout)
DEFAULT_ATTEMPTS = 5
MAX_RETRY_AFTER = 10.0  # seconds: the longest a retry waits for a server's Retry-After
_LIST_PAGE = 500
_READS = frozenset({"GET", "HEAD"})
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Connections kept per API server. The official client keeps 5 per CPU; a node agent on a small node serves a burst of
# prepares (the kubelet after a restart) while its watches hold connections, and each request that finds the pool
# full opens a connection of its own (a TLS handshake: about 8 ms on a busy 2-core machine) and then throws it away.
POOL_CONNECTIONS = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    """One API resource: where it lives and what it is called. `group` is "" for core/v1."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def with_kind(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`raw` with this resource's `apiVersion` and `kind` where it has none, so it decodes on its own.

        Fills in place and returns `raw`; a kind the object carries is kept. Idempotent.
        """
        raw.setdefault("apiVersion", self.api_version)
        raw.setdefault("kind", self.kind)
        return raw

    def path(self, *, namespace: str = "", name: str = "", subresource: str = "") -> str:
        """The URL path; an empty namespace on a namespaced resource means every namespace."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{urllib.parse.quote(namespace, safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(urllib.parse.quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
# PodGroups of the two APIs (`model.PodGroupApi`): Kubernetes' own, alpha in 1.36 and served only where the server's
# runtime config turns it on, and scheduler-plugins' coscheduling CRD, served only where it is installed.
POD_GROUPS = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup", namespaced=True)
COSCHEDULING_POD_GROUPS = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", namespaced=True)


# --- Errors --------------------------------------------------------------------------------


class ApiError(Exception):
    """A request the API server refused or could not answer. `status` is the HTTP code (0: no answer).

    `reason` is the Status object's reason (`Conflict`, `NotFound`, `AlreadyExists`, `Expired`,
    `Invalid`, ...) and `message` its message; str() reads `<status> <reason>: <message>`.
    `retry_after` is the seconds the answer's Retry-After header asked for (None: none).
    """

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"{status} {reason}: {message}")


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409 Conflict: the resourceVersion precondition failed; re-read and decide again."""


class AlreadyExists(ApiError):
    """409 AlreadyExists: a create found an object of that name."""


class Gone(ApiError):
    """410: the resourceVersion is too old for a watch or a list continuation; relist."""


class Invalid(ApiError):
    """422: the object failed validation; the message names the fields."""


class Transient(ApiError):
    """5xx, 429 or a broken connection, still failing after the retries `may_retry` allowed.

    `unsent` is True when the request surely never reached the server (the connection was
    refused or could not be made); otherwise the server may have acted on it.
    """

    def __init__(
        self, status: int, reason: str, message: str, *, retry_after: float | None = None, unsent: bool = False
    ) -> None:
        super().__init__(status, reason, message, retry_after=retry_after)
        self.unsent = unsent


class Fenced(ApiError):
    """A write refused before it was sent (status 0, reason `Fenced`): this process may not write any more,
    because the leader Lease it writes under was lost or not renewed in time. Never retried."""


class BadAnswer(ApiError):
    """A 2xx answer that is not what was asked for: not JSON (an HTML page from a proxy in between), JSON nested too
    deeply or with a number of more than `MAX_NUMBER_DIGITS` digits, not an object, or a List where one object was
    asked for. `status` is the answer's, reason `BadAnswer`, the message names the request. Never retried: the same
    server would answer the same."""


class WriteFence(Protocol):
    """Decides, just before each write is sent, whether this process may still write (`leader.Fence`)."""

    def check(self, what: str) -> None:
        """Return when the write may be sent; raise `Fenced` otherwise. `what` names it (`PATCH /api/v1/...`)."""
        ...


class RateLimiter(Protocol):
    """Client-side rate limiting (`ratelimit.TokenBucket`): `wait()` returns when the next request may go out."""

    def wait(self) -> None: ...


def error_from_status(status: int, body: bytes | str, *, retry_after: float | None = None) -> ApiError:
    """The `ApiError` subclass for an HTTP status and its (Status object) body. Pure."""
    reason, message = "", ""
    try:
        document = json.loads(body) if body else {}
    except ValueError:
        document = {}
    if isinstance(document, dict) and document.get("kind") == "Status":
        reason = str(document.get("reason") or "")
        message = str(document.get("message") or "")
    else:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        # One line, whatever the body (an HTML error page of a proxy in between has many).
        message = " ".join(text.split())[:500]
    if status == 404:
        return NotFound(status, reason or "NotFound", message, retry_after=retry_after)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(status, reason, message, retry_after=retry_after)
        return Conflict(status, reason or "Conflict", message, retry_after=retry_after)
    if status == 410:
        return Gone(status, reason or "Gone", message, retry_after=retry_after)
    if status == 422:
        return Invalid(status, reason or "Invalid", message, retry_after=retry_after)
    if status >= 500 or status == 429:
        return Transient(status, reason or "ServerError", message, retry_after=retry_after)
    return ApiError(status, reason or "Error", message, retry_after=retry_after)


def retry_after_seconds(header: str | None) -> float | None:
    """A Retry-After header's delay in seconds (the API server sends whole seconds), or None when absent or not a
    number of seconds (an HTTP date is not honoured: the backoff applies). Pure."""
    if header is None:
        return None
    try:
        seconds = float(header.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def may_retry(method: str, error: BaseException) -> bool:
    """Whether a request that failed with `error` may be sent again, as client-go decides. Pure.

    Only `Transient` failures, and of those: a read (GET, HEAD) always; any request that surely
    never reached the server (`unsent`); any request answered 429 (API Priority and Fairness or
    the in-flight limit turned it away before acting on it). A PUT, PATCH or DELETE answered 5xx
    with Retry-After too: the server asks for it, and a repeat of a write it did carry out is
    refused by its resourceVersion precondition or finds the work done. Never a POST after a 5xx
    or a broken connection (the first may have created the object; a second create with
    generateName would make another, a second Binding would be refused although the first
    landed), nor any write after a broken connection or a 5xx without Retry-After.
    """
    if not isinstance(error, Transient):
        return False
    if error.unsent or method in _READS or error.status == 429:
        return True
    return error.status >= 500 and error.retry_after is not None and method != "POST"


# --- Construction --------------------------------------------------------------------------


def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    field_manager: str = FIELD_MANAGER,
    attempts: int = DEFAULT_ATTEMPTS,
    limiter: RateLimiter | None = None,
) -> Client:
    """A client from `kubeconfig`, else in-cluster when running in a pod, else `$KUBECONFIG`/`~/.kube/config`.

    Reads the kubeconfig (and certificates it names); no request is sent. Every kubeconfig file is first read by
    dractl's bounded YAML reader (`_check_kubeconfig`), so a file the official loader would choke on (an alias bomb,
    deep nesting, not a mapping) is one `KubeconfigError` line; a server that is not an http(s) URL is one too, since
    no retry can reach it. `limiter` (None: no client-side limit) paces every request of the client. Keeps up to
    `POOL_CONNECTIONS` connections alive for reuse.
    """
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        if kubeconfig is not None:
            _check_kubeconfig(os.fspath(kubeconfig))
        else:
            for path in _default_kubeconfigs():
                try:
                    _check_kubeconfig(path)
                except KubeconfigError as error:
                    raise KubeconfigError(f"{path}: {error}") from None
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=None if kubeconfig is None else os.fspath(kubeconfig),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    _check_server(configuration.host)
    # urllib3 would otherwise retry on its own (a connection error three times, a PUT or DELETE after a reset):
    # every retry is `Client._request`'s, by `may_retry`.
    configuration.retries = False
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, POOL_CONNECTIONS)
    api_client = kubernetes.client.ApiClient(configuration)
    pools = api_client.rest_client.pool_manager
    if type(pools) in (urllib3.PoolManager, urllib3.ProxyManager):  # A SOCKS proxy keeps its own connections.
        pools.pool_classes_by_scheme = {"http": _FencedHTTPConnectionPool, "https": _FencedHTTPSConnectionPool}
    return Client(api_client, field_manager=field_manager, attempts=attempts, limiter=limiter)


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be used: missing, unreadable, not YAML (or beyond the reader's bounds), not a mapping,
    or naming a server that is not an http(s) URL."""


def _default_kubeconfigs() -> list[str]:
    """The files the official loader reads without a kubeconfig given: those of `$KUBECONFIG` (as it was when the
    `kubernetes` package was imported, as the loader reads it) that exist, else `~/.kube/config` when it exists."""
    location = kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    separator = kubernetes.config.kube_config.ENV_KUBECONFIG_PATH_SEPARATOR
    paths = (os.path.expanduser(path) for path in str(location).split(separator) if path)
    return [path for path in paths if os.path.exists(path)]


def _check_kubeconfig(path: str) -> None:
    """Raise `KubeconfigError` with one plain line for a kubeconfig the official loader would fail on unclearly (it
    said "No configuration found" for a missing file, and raised Python's own TypeError for YAML that is not a
    mapping) or without bound (its YAML reader expands an alias bomb: 4 GiB for a billion laughs). Reads the file with
    dractl's bounded reader, as client-go reads YAML; the loader reads it again once it passed."""
    try:
        data = model_decode.load_config(path)
    except model_decode.ConfigError as error:
        raise KubeconfigError(f"not a kubeconfig: {error}" if error.readable else str(error)) from None
    if not isinstance(data, dict):
        found = "nothing" if data is None else f"a {type(data).__name__}"
        raise KubeconfigError(f"not a kubeconfig: a mapping with clusters, users and contexts is expected, got {found}")


def _check_server(host: object) -> None:
    """Raise `KubeconfigError` when the server the configuration names is not an http(s) URL with a host (`not a url`,
    an empty `server:`): that is a configuration error, which waiting or retrying cannot mend."""
    try:
        url = urllib3.util.parse_url(str(host or ""))
    except urllib3.exceptions.LocationParseError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise KubeconfigError(f"the cluster's server {host!r} is not a URL such as https://HOST:PORT")


# --- The fence at the socket ------------------------------------------------------------------

_sending = threading.local()
"""Per thread: `fence` and `what` of the write the thread is sending now (`fence` None: none, or unfenced)."""


def _check_sending() -> None:
    """Ask the fence of the write this thread is sending, if any; raises `Fenced`."""
    fence: WriteFence | None = getattr(_sending, "fence", None)
    if fence is not None:
        fence.check(str(_sending.what))


class _FencedHTTPConnection(urllib3.connection.HTTPConnection):
    """An HTTP connection that asks the fence before each piece of a fenced write goes to the socket."""

    def send(self, data: Any) -> None:
        _check_sending()
        super().send(data)


class _FencedHTTPSConnection(urllib3.connection.HTTPSConnection):
    """An HTTPS connection that asks the fence before each piece of a fenced write goes to the socket."""

    def send(self, data: Any) -> None:
        _check_sending()
        super().send(data)


class _FencedHTTPConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _FencedHTTPConnection


class _FencedHTTPSConnectionPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _FencedHTTPSConnection


@dataclasses.dataclass(frozen=True, slots=True)
class ListResult:
    """The items of a list (raw dicts) and the list's resourceVersion, to watch from."""

    items: tuple[dict[str, Any], ...]
    resource_version: str


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class ServerVersion:
    """The Kubernetes version whose API a server serves: its emulated version when it runs with
    `--emulated-version`, else its binary's. `git_version` is the binary's (`v1.36.2`), for messages."""

    major: int
    minor: int
    git_version: str = dataclasses.field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK, with the raw object."""

    type: str
    object: dict[str, Any]


ErrorHook = Callable[[str, Resource, ApiError], None]
"""Told of every call that failed: the verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`),
the resource and the error, once per call (after the retries)."""


class _Payload(TypedDict, total=False):
    """What a request carries besides its method and path; a key left out takes `Client._send`'s default."""

    query: Sequence[tuple[str, str]]
    body: Any
    content_type: str
    accept: str


class PatchType(enum.Enum):
    MERGE = "application/merge-patch+json"
    JSON = "application/json-patch+json"
    APPLY = "application/apply-patch+yaml"


# Failures to open a connection: the request was never sent (urllib3's NewConnectionError is a ConnectTimeoutError).
_NOT_CONNECTED = (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)
# Everything else a request or its answer can fail with on the way: the server may have received the request.
_BROKEN = (urllib3.exceptions.HTTPError, OSError)


class WatchStream:
    """An open watch: iterate for `WatchEvent`s; `close()` (from any thread) ends the iteration.

    The iteration raises `Gone` when the server says the resourceVersion is too old (an ERROR
    event with code 410), another `ApiError` for other ERROR events, and `Transient` when the
    connection breaks mid-stream. It ends normally when the server closes the watch
    (timeoutSeconds) or after `close()`.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._lock = threading.Lock()
        self._closed = False
        self._state = _IDLE

    def close(self) -> None:
        """Stop the stream; safe to call twice and from another thread (a blocked reader wakes up).

        While another thread reads, only the socket is shut down: that wakes the reader, whose
        iteration then releases the response itself. Closing the response under a running read
        would pull its file object away mid-chunk (urllib3 then fails with an AttributeError).
        Once the iteration has ended, the response is the reader's (or back in the pool)."""
        with self._lock:
            self._closed = True
            state = self._state
        if state == _READING:
            self._quietly(self._response.shutdown)
        elif state == _IDLE:
            self._abort()

    def _abort(self) -> None:
        self._quietly(self._response.shutdown)
        self._quietly(self._response.close)

    @staticmethod
    def _quietly(step: Callable[[], object]) -> None:
        try:
            step()
        except (OSError, ValueError, RuntimeError, urllib3.exceptions.HTTPError):
            pass  # Already released or being torn down: nothing left to stop.

    def __iter__(self) -> Iterator[WatchEvent]:
        with self._lock:
            if self._closed or self._state != _IDLE:
                return
            self._state = _READING
        buffer = b""
        completed = False
        try:
            for chunk in self._response.stream(1 << 16):
                # One split per chunk, not one per line: a chunk holds many events.
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _watch_event(line)
            if buffer.strip():
                yield _watch_event(buffer)
            completed = True
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            if not self._closed:
                raise Transient(0, "WatchBroken", f"the watch connection broke: {error}") from error
        finally:
            with self._lock:
                self._state = _DONE
                closed = self._closed
            if completed and not closed:
                self._response.release_conn()  # Read to the end: the connection can serve again.
            else:
                self._abort()


# WatchStream's states: not iterated yet, a thread iterating, iteration over (response released).
_IDLE, _READING, _DONE = "idle", "reading", "done"


# The longest number an answer may hold: far beyond any number of the API (64 bits take 20 digits), far below where
# converting one costs noticeable time.
MAX_NUMBER_DIGITS = 100


class _LongNumber(ValueError):
    """A number of more than `MAX_NUMBER_DIGITS` digits in an answer."""


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise _LongNumber(f"a number of {len(text)} digits")
    return int(text)


def _loads(data: bytes, *, what: str) -> Any:
    """The JSON document in `data` (the answer to `what`, a request or a watch): msgspec's C decoder reads the API
    server's objects several times faster than json's; where it refuses (numbers beyond 64 bits, malformed text,
    deep nesting), json.loads decides, so both read alike. Raises `BadAnswer` naming `what` for an answer that is not
    JSON, is nested deeper than the decoders recurse, or holds a number of more than `MAX_NUMBER_DIGITS` digits."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        pass
    try:
        return json.loads(data, parse_int=_bounded_int)
    except RecursionError:
        problem = "JSON nested too deeply to read"
    except _LongNumber as error:
        problem = f"JSON with {error} (at most {MAX_NUMBER_DIGITS})"
    except ValueError:
        problem = f"not JSON: it begins {data[:60].decode(errors='replace')!r}"
    raise BadAnswer(200, "BadAnswer", f"{what}: the answer is {problem}")


def _watch_event(line: bytes) -> WatchEvent:
    document = _loads(line, what="a watch event")
    kind, obj = document.get("type"), document.get("object")
    if kind == "ERROR":
        code = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
        raise error_from_status(code, json.dumps(obj))
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise Transient(0, "BadWatchEvent", f"a watch event without type or object: {line[:200]!r}")
    return WatchEvent(kind, obj)


class Client:
    """Requests to one API server as raw JSON. Thread-safe (urllib3's pool is); no cache.

    Every method raises `ApiError` (or a subclass) for an answer it cannot use; a failure
    `may_retry` allows is tried up to `attempts` times in all, waiting between tries (jittered
    exponential backoff, at least the Retry-After asked for, up to `MAX_RETRY_AFTER`, through
    `sleep`). A create of a named object repeated after a 429 whose first try did land answers
    `AlreadyExists`: callers that create treat that as "someone (maybe we) created it" and read
    it. Each attempt first waits for `limiter` (when given); each write attempt is then checked by
    `fence` (when given) and refused with `Fenced` when it says no. `on_error` hears of each call
    that raises `ApiError` (metrics); errors raised while a watch streams are the reader's business.
    """

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        field_manager: str = FIELD_MANAGER,
        attempts: int = DEFAULT_ATTEMPTS,
        timeout: float = DEFAULT_TIMEOUT,
        on_error: ErrorHook | None = None,
        limiter: RateLimiter | None = None,
        fence: WriteFence | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api_client = api_client
        self.field_manager = field_manager
        self.attempts = attempts
        self.timeout = timeout
        self.on_error = on_error
        self.limiter = limiter
        self.fence = fence
        self.sleep = sleep

    @property
    def host(self) -> str:
        host: str = self.api_client.configuration.host
        return host

    def close(self) -> None:
        """Release the connection pool. Idempotent."""
        self.api_client.close()  # type: ignore[no-untyped-call]

    # --- Transport -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _reported(self, verb: str, resource: Resource) -> Iterator[None]:
        """Tell `on_error` of an `ApiError` raised inside, then let it go on."""
        try:
            yield
        except ApiError as error:
            if self.on_error is not None:
                self.on_error(verb, resource, error)
            raise

    def _send(
        self,
        method: str,
        path: str,
        *,
        timeout: float | tuple[float, float] | None = None,
        **payload: Unpack[_Payload],
    ) -> urllib3.BaseHTTPResponse:
        """One request, no retry. Returns the open response (2xx) or raises the mapped `ApiError`.

        Waits for the rate limiter first; a write is then checked by the fence, and again before
        each piece of it goes to the socket (with the connections `connect` installs). A request
        that could not connect raises `Transient` with `unsent`; one whose connection broke later,
        `Transient`.
        """
        headers = {"Accept": payload.get("accept", "application/json")}
        body = payload.get("body")
        if body is not None:
            headers["Content-Type"] = payload.get("content_type", "application/json")
        # The official client builds the URL, the default headers and the credentials (a token its hook
        # refreshes); the body is encoded here (as its REST layer encodes it) and the request sent on its pool
        # directly: its generic layers walk every body recursively, a fifth of a request's CPU in this process.
        _, url, headers, _, _ = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(payload.get("query", ())) or None,
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        if self.limiter is not None:
            self.limiter.wait()
        fence = self.fence if method in _WRITES else None
        what = f"{method} {path}"
        if fence is not None:
            fence.check(what)  # Refused before any connection is taken.
        _sending.fence, _sending.what = fence, what
        limit = timeout or self.timeout
        try:
            response: urllib3.BaseHTTPResponse = self.api_client.rest_client.pool_manager.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(connect=limit[0], read=limit[1])
                if isinstance(limit, tuple)
                else urllib3.Timeout(total=limit),
                preload_content=False,
            )
        except urllib3.exceptions.SSLError as error:  # A TLS failure (an HTTPError too: caught first).
            raise Transient(0, "TransportError", f"{method} {path}: {error}") from error
        except _NOT_CONNECTED as error:
            raise Transient(0, "ConnectionFailed", f"{method} {path}: {error}", unsent=True) from error
        except _BROKEN as error:
            raise Transient(0, "ConnectionFailed", f"{method} {path}: {error}") from error
        finally:
            _sending.fence = None
        if not 200 <= response.status < 300:
            try:
                data = _read(response, method, path)
            finally:
                response.release_conn()
            raise error_from_status(
                response.status, data, retry_after=retry_after_seconds(response.headers.get("Retry-After"))
            )
        return response

    def _request(self, method: str, path: str, **payload: Unpack[_Payload]) -> dict[str, Any]:
        """One request, sent again while `may_retry` allows and attempts are left; the decoded JSON answer."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=_wait,
            retry=tenacity.retry_if_exception(lambda error: may_retry(method, error)),
            sleep=self.sleep,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return _json(self._raw(method, path, **payload), what=f"{method} {path}")
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    def _write_query(self, *, dry_run: bool = False, force: bool = False) -> list[tuple[str, str]]:
        query = [("fieldManager", self.field_manager)]
        if force:
            query.append(("force", "true"))
        if dry_run:
            query.append(("dryRun", "All"))
        return query

    # --- Reads ---------------------------------------------------------------------------

    def get(self, resource: Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        """The object as raw JSON, with `apiVersion` and `kind` as `list` gives its items (so it decodes on its own).
        Raises `NotFound`. Read-only."""
        path = resource.path(namespace=namespace, name=name)
        with self._reported("get", resource):
            document = self._request("GET", path)
            # A single GET carries its kind, but an old server might not: `decode` needs it. Another kind (a List, a
            # Status) is not the object asked for.
            kind = document.get("kind")
            if kind not in (None, "", resource.kind):
                raise BadAnswer(
                    200,
                    "BadAnswer",
                    f"GET {path}: the answer is {_shown_kind(kind)} where one {resource.kind} was asked for",
                )
            return resource.with_kind(document)

    def server_version(self) -> ServerVersion:
        """GET /version: the version whose API the server serves (see `ServerVersion`). Read-only.

        Raises `ApiError` when the server does not answer, `BadObject` when the answer names no
        version (`minor` may carry a `+`, as distribution builds write it).
        """
        document = self._request("GET", "/version")
        major = document.get("emulationMajor") or document.get("major")
        minor = document.get("emulationMinor") or document.get("minor")
        try:
            return ServerVersion(
                major=int(str(major).rstrip("+")),
                minor=int(str(minor).rstrip("+")),
                git_version=str(document.get("gitVersion") or ""),
            )
        except ValueError:
            raise BadObject(f"the API server's /version names no version: major {major!r}, minor {minor!r}") from None

    def serves(self, resource: Resource) -> bool:
        """Whether the server serves `resource` (discovery: GET /apis/<group>/<version>, or /api/v1, lists it); an
        alpha API turned off or a CustomResourceDefinition not installed answers 404 there. Raises `ApiError`
        otherwise. Read-only; every client may read discovery (system:discovery)."""
        path = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
        try:
            document = self._request("GET", path)
        except NotFound:
            return False
        listed = document.get("resources")
        return isinstance(listed, list) and any(
            isinstance(entry, dict) and entry.get("name") == resource.plural for entry in listed
        )

    def list(
        self, resource: Resource, *, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> ListResult:
        """Every matching object (pages of 500 followed to the end) and the list's resourceVersion. Read-only."""
        items: list[dict[str, Any]] = []
        token = ""
        with self._reported("list", resource):
            while True:
                query = [("limit", str(_LIST_PAGE))]
                if label_selector:
                    query.append(("labelSelector", label_selector))
                if field_selector:
                    query.append(("fieldSelector", field_selector))
                if token:
                    query.append(("continue", token))
                path = resource.path(namespace=namespace)
                document = self._request("GET", path, query=query)
                page = document.get("items") or []
                metadata = document.get("metadata") or {}
                if not isinstance(page, list) or not all(isinstance(item, dict) for item in page):
                    raise BadAnswer(200, "BadAnswer", f"GET {path}: the answer's items are not a list of objects")
                if not isinstance(metadata, dict):
                    raise BadAnswer(200, "BadAnswer", f"GET {path}: the answer's metadata is not an object")
                # A list's items carry no kind; add it so each item decodes on its own.
                items.extend(resource.with_kind(item) for item in page)
                token = str(metadata.get("continue") or "")
                if not token:
                    return ListResult(tuple(items), str(metadata.get("resourceVersion") or ""))

    def read_log(self, namespace: str, name: str, *, container: str = "") -> str:
        """A container's log (the pod's `log` subresource, served by its node's kubelet) as text; the pod's only
        container when `container` is empty. Raises `NotFound`, or `ApiError` (400) while the container has not
        started. Read-only; not retried (the caller polls)."""
        query = [("container", container)] if container else []
        path = PODS.path(namespace=namespace, name=name, subresource="log")
        with self._reported("get", PODS):
            return self._raw("GET", path, query=query).decode(errors="replace")

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> WatchStream:
        """Open a watch from `resource_version`; the server ends it after `timeout_seconds`.

        Raises `Gone` at once if the server refuses the version with a 410 answer. Not retried:
        the informer decides what a failed watch means.
        """
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_seconds))]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        with self._reported("watch", resource):
            response = self._send(
                "GET", resource.path(namespace=namespace), query=query, timeout=(self.timeout, timeout_seconds + 30.0)
            )
        return WatchStream(response)

    # --- Writes --------------------------------------------------------------------------

    def create(
        self,
        resource: Resource,
        body: Mapping[str, Any],
        *,
        namespace: str = "",
        dry_run: bool = False,
        name: str = "",
        subresource: str = "",
    ) -> dict[str, Any]:
        """Create; returns the stored object. With `name` and `subresource`, POST to that object's
        subresource (a pod's `binding`). Raises `AlreadyExists`, `Invalid`. Not idempotent."""
        namespace = namespace or str((body.get("metadata") or {}).get("namespace") or "")
        with self._reported("create", resource):
            return self._request(
                "POST",
                resource.path(namespace=namespace, name=name, subresource=subresource),
                body=dict(body),
                query=self._write_query(dry_run=dry_run),
            )

    def update(self, resource: Resource, body: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        """Replace (PUT) the object named in `body`; `metadata.resourceVersion` in it is the precondition.

        Raises `Conflict` when the stored object changed since that version. Only for objects
        dractl owns entirely (Leases, its own slices): never PUT an object read through a model.
        """
        metadata = body.get("metadata") or {}
        if not metadata.get("resourceVersion"):
            raise ValueError(
                f"update of {resource.kind} {metadata.get('name')}: "
                "metadata.resourceVersion is required as precondition"
            )
        path = resource.path(
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            subresource=subresource,
        )
        with self._reported("update", resource):
            return self._request("PUT", path, body=dict(body), query=self._write_query())

    def update_status(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """`update` of the status subresource (only `status` is written), with the same precondition."""
        return self.update(resource, body, subresource="status")

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str = "",
        type: PatchType = PatchType.MERGE,
        subresource: str = "",
        force: bool = False,
    ) -> dict[str, Any]:
        """Patch; returns the stored object.

        A merge patch carrying `metadata.resourceVersion` (and a JSON patch with a `test` op on it)
        fails with `Conflict` when the object changed. `PatchType.APPLY` is server-side apply
        with field manager `dractl`; `force` takes over conflicting fields.
        """
        body: Any = list(patch) if type is PatchType.JSON else dict(patch)  # type: ignore[arg-type]
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        with self._reported("patch", resource):
            return self._request(
                "PATCH",
                path,
                body=body,
                content_type=type.value,
                query=self._write_query(force=force and type is PatchType.APPLY),
            )

    def get_protobuf(self, resource: Resource, name: str, *, namespace: str = "") -> bytes:
        """The object in the API server's protobuf encoding (`finalizers` reads it): every byte of it as stored,
        where JSON would re-encode opaque fields. Raises `NotFound`. Read-only; not retried (callers' syncs are)."""
        with self._reported("get", resource):
            return self._raw("GET", resource.path(namespace=namespace, name=name), accept=PROTOBUF)

    def update_protobuf(self, resource: Resource, name: str, body: bytes, *, namespace: str = "") -> dict[str, Any]:
        """Replace (PUT) the object with `body`, a protobuf-encoded object whose metadata.resourceVersion is the
        precondition (`Conflict` when it changed); returns the stored object as JSON. For a write that must leave
        every other stored byte as it is (see `finalizers`). Not retried."""
        path = resource.path(namespace=namespace, name=name)
        with self._reported("update", resource):
            return _json(
                self._raw("PUT", path, body=body, content_type=PROTOBUF, query=self._write_query()), what=f"PUT {path}"
            )

    def _raw(self, method: str, path: str, **payload: Unpack[_Payload]) -> bytes:
        """One attempt of a request, no retry: the answer's bytes (its connection back in the pool). A connection
        that breaks, before or while the answer is read, raises `Transient`."""
        response = self._send(method, path, **payload)
        try:
            return _read(response, method, path)
        finally:
            response.release_conn()

    def delete(
        self, resource: Resource, name: str, *, namespace: str = "", resource_version: str = "", uid: str = ""
    ) -> None:
        """Delete, with optional preconditions (`Conflict` if they fail). Raises `NotFound` if already gone."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        preconditions = {key: value for key, value in (("resourceVersion", resource_version), ("uid", uid)) if value}
        if preconditions:
            body["preconditions"] = preconditions
        with self._reported("delete", resource):
            self._request("DELETE", resource.path(namespace=namespace, name=name), body=body)

    # --- Typed reads ---------------------------------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> model.ResourceClaim:
        """The claim as a model value. Raises `NotFound`, or `BadObject` when it does not decode."""
        claim = decode(self.get(RESOURCE_CLAIMS, name, namespace=namespace), strict=True)
        assert isinstance(claim, model.ResourceClaim)
        return claim

    def list_resource_slices(
        self, *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[tuple[model.ResourceSlice, ...], str]:
        """Matching slices as model values (undecodable ones logged and skipped) and the list's resourceVersion."""
        result = self.list(RESOURCE_SLICES, label_selector=label_selector, field_selector=field_selector)
        slices = tuple(value for value in map(decode, result.items) if isinstance(value, model.ResourceSlice))
        return slices, result.resource_version


_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 2.0
_BACKOFF_JITTER_S = 0.05


def _wait(state: tenacity.RetryCallState) -> float:
    """The wait before the next attempt: 50 ms doubling per attempt up to 2 s, plus up to 50 ms of jitter, or the
    Retry-After asked for when longer (at most `MAX_RETRY_AFTER`). Computed here rather than with tenacity's
    jittered wait, whose parameters changed names within the versions pyproject.toml allows."""
    exponent: int = min(max(state.attempt_number - 1, 0), 16)
    backoff: float = min(_BACKOFF_FIRST_S * 2.0**exponent, _BACKOFF_MAX_S) + random.uniform(0, _BACKOFF_JITTER_S)
    error = state.outcome.exception() if state.outcome is not None else None
    if isinstance(error, ApiError) and error.retry_after is not None:
        return max(backoff, min(error.retry_after, MAX_RETRY_AFTER))
    return backoff


def _json(data: bytes, *, what: str) -> dict[str, Any]:
    """The JSON object answered to `what` (a request); an empty answer is {}. Raises `BadAnswer` for an answer that
    is not a JSON object."""
    document = _loads(data, what=what) if data else {}
    if not isinstance(document, dict):
        raise BadAnswer(200, "BadAnswer", f"{what}: the answer is JSON but not an object: {_kind(document)}")
    return document


def _shown_kind(kind: object) -> str:
    """A kind an answer names, for messages: `a List`, `a Status`, or what the kind field held."""
    return f"a {kind}" if isinstance(kind, str) else f"kind {str(kind)[:60]!r}"


def _kind(value: object) -> str:
    """What a decoded JSON value is, in words, for messages."""
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "nothing" if value is None else type(value).__name__
    )


def _read(response: urllib3.BaseHTTPResponse, method: str, path: str) -> bytes:
    """The answer's body; a connection that breaks while it is read is `Transient` (the request did reach the
    server)."""
    try:
        return response.read()
    except _BROKEN as error:
        raise Transient(0, "ConnectionFailed", f"{method} {path}: the answer broke off: {error}") from error


# --- Decoding ------------------------------------------------------------------------------


class BadObject(ValueError):
    """An object from the API server that the model refuses; str() names it and the fields."""


_MODEL_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "DeviceClass", "ResourceClaimTemplate", "Pod", "Node"})


def decode(raw: Mapping[str, Any], *, strict: bool = False) -> model.Decoded | None:
    """One raw API object (with apiVersion and kind) as a model value.

    An object the model refuses is logged with its kind and name and skipped (None), so one bad
    object never blocks the rest; with `strict` it raises `BadObject` instead. Kinds the model
    does not have (Lease, Event, ...) give None. Pure apart from logging.
    """
    kind = str(raw.get("kind") or "")
    if kind not in _MODEL_KINDS:
        return None
    meta = raw.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
    try:
        return model_decode.load_object(raw, source="api")
    except model_decode.DecodeError as error:
        if strict:
            raise BadObject(str(error)) from error
        log.warning("skipping %s %s: it does not decode: %s", kind, name, error)
        return None
