"""List+watch informers: a thread-safe cache of one resource kept current, with event callbacks.

What it does: lists the resource, then watches from the list's resourceVersion with bookmarks;
a watch that ends normally (the server's timeout) is resumed from the last resourceVersion seen;
a 410 Gone or a broken watch leads to a relist whose result is diffed against the store, so
changes and deletions made while the watch was down become exactly one add, update or delete
each (an object whose resourceVersion did not change gives no event). Objects are decoded by a
caller-given function (usually `client.decode`); one that does not decode is left out of the
store (and deleted from it if it was there). `has_synced()` is true once the first list is in.
`wait_past(version)` waits until every change up to a resourceVersion has been delivered: a watch
sends one resource's changes in the order the store made them, so a caller that wrote an object
at `version` then knows every write of that resource made before its own.

What it must not do: call handlers under its lock (handlers may read the store), let a handler's
exception stop the watch (it is logged), or write to the API. Handlers should only enqueue keys
(see `workqueue`); objects in the store are shared and must not be changed.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from dractl.kube import client as kube_client

log = logging.getLogger(__name__)

T = TypeVar("T")


def key_of(raw: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKeyFunc). Pure."""
    meta = raw.get("metadata") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


def _resource_version(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("resourceVersion") or "")


@dataclasses.dataclass(frozen=True, slots=True)
class Handlers(Generic[T]):
    """Callbacks; each is called from the informer's thread, outside its lock."""

    on_add: Callable[[T], None] | None = None
    on_update: Callable[[T, T], None] | None = None
    on_delete: Callable[[T], None] | None = None


class Store(Generic[T]):
    """Objects by key (`namespace/name` or `name`), with the resourceVersion each was stored at. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[str, T]] = {}

    def get(self, key: str) -> T | None:
        with self._lock:
            entry = self._items.get(key)
            return None if entry is None else entry[1]

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._items)

    def values(self) -> list[T]:
        """Every object, in key order."""
        with self._lock:
            return [self._items[key][1] for key in sorted(self._items)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _put(self, key: str, version: str, value: T) -> tuple[str, T] | None:
        with self._lock:
            old = self._items.get(key)
            self._items[key] = (version, value)
            return old

    def _pop(self, key: str) -> tuple[str, T] | None:
        with self._lock:
            return self._items.pop(key, None)

    def _version(self, key: str) -> str | None:
        with self._lock:
            entry = self._items.get(key)
            return None if entry is None else entry[0]

    def _snapshot(self) -> dict[str, tuple[str, T]]:
        with self._lock:
            return dict(self._items)


class Informer(Generic[T]):
    """One resource (optionally one namespace, label and field selector) kept in a `Store` by a thread.

    `start()` runs the loop in a daemon thread, `stop()` ends it (closing an open watch) and
    joins it. `run()` is the loop itself, for callers with their own thread.
    """

    def __init__(
        self,
        client: kube_client.Client,
        resource: kube_client.Resource,
        *,
        decode: Callable[[dict[str, Any]], T | None],
        handlers: Handlers[T] | None = None,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: int = 300,
        max_backoff: float = 30.0,
    ) -> None:
        self.client = client
        self.resource = resource
        self.store: Store[T] = Store()
        self._decode = decode
        self._handlers: Handlers[T] = handlers or Handlers()
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._stream: kube_client.WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._progress = threading.Condition()  # notified whenever `resource_version` moves
        self.resource_version = ""  # the last version delivered: every change up to it is in the store
        self._watch_events = 0
        self.lists = 0  # how many times the informer listed (1 + relists), for tests and metrics

    def has_synced(self) -> bool:
        """True once the first list has been applied to the store."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def wait_past(self, version: str, *, timeout: float) -> bool:
        """Wait until every change up to resourceVersion `version` has been delivered (stored, handlers called):
        True then, False after `timeout` seconds or once stopped. Versions are compared as integers, as etcd-backed
        API servers give them (the API's contract calls them opaque); ValueError when `version` is not one."""
        wanted = int(version)
        deadline = time.monotonic() + timeout
        with self._progress:
            while not self._stopped.is_set():
                if self.resource_version.isdigit() and int(self.resource_version) >= wanted:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._progress.wait(left)
            return False

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.resource.plural}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop and join its thread. Idempotent."""
        self._stopped.set()
        with self._progress:
            self._progress.notify_all()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """List, then watch until stopped; relist after 410 or a broken watch, backing off on repeated failures."""
        need_list = True
        failures = 0
        while not self._stopped.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch()
                failures = 0
            except (kube_client.ApiError, OSError) as error:
                if self._stopped.is_set():
                    return
                if self._watch_events:
                    failures = 0  # The watch worked for a while: this is a new failure, not a repeated one.
                failures += 1
                need_list = True
                # The first 410 relists at once (client-go's behaviour); anything repeated backs off.
                delay = (
                    0.0
                    if failures == 1 and isinstance(error, kube_client.Gone)
                    else min(self._max_backoff, 0.1 * 2 ** min(failures, 10)) * random.uniform(0.5, 1.0)
                )
                log.warning("%s: %s; relisting in %.1fs", self.resource.plural, error, delay)
                self._stopped.wait(delay)

    def _list(self) -> None:
        result = self.client.list(
            self.resource,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
        )
        self.lists += 1
        seen: set[str] = set()
        previous = self.store._snapshot()
        for raw in result.items:
            key = key_of(raw)
            seen.add(key)
            old = previous.get(key)
            version = _resource_version(raw)
            if old is not None and old[0] == version:
                continue  # Unchanged since we last saw it: no event.
            self._apply(key, raw)
        for key in previous.keys() - seen:
            self._delete(key)
        self._delivered(result.resource_version)
        self._synced.set()

    def _watch(self) -> None:
        stream = self.client.watch(
            self.resource,
            resource_version=self.resource_version,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=self._watch_timeout,
        )
        self._watch_events = 0
        with self._lock:
            self._stream = stream
        if self._stopped.is_set():
            stream.close()
        try:
            for event in stream:
                self._watch_events += 1
                version = _resource_version(event.object)
                if event.type == "BOOKMARK":
                    self._delivered(version or self.resource_version)
                    continue
                key = key_of(event.object)
                if event.type == "DELETED":
                    self._delete(key)
                elif event.type in ("ADDED", "MODIFIED"):
                    self._apply(key, event.object)
                self._delivered(version or self.resource_version)
        finally:
            with self._lock:
                self._stream = None

    def _delivered(self, version: str) -> None:
        """Every change up to `version` is in the store and was handed to the handlers: wake `wait_past`."""
        with self._progress:
            self.resource_version = version
            self._progress.notify_all()

    def _apply(self, key: str, raw: dict[str, Any]) -> None:
        value = self._decode(raw)
        if value is None:
            self._delete(key)  # It no longer decodes: consumers must not act on a stale copy.
            return
        old = self.store._put(key, _resource_version(raw), value)
        if old is None:
            self._call(self._handlers.on_add, value)
        else:
            self._call(self._handlers.on_update, old[1], value)

    def _delete(self, key: str) -> None:
        old = self.store._pop(key)
        if old is not None:
            self._call(self._handlers.on_delete, old[1])

    def _call(self, handler: Callable[..., None] | None, *args: T) -> None:
        if handler is None:
            return
        try:
            handler(*args)
        except Exception:
            log.exception("%s: an event handler failed", self.resource.plural)
