"""The informer's bookkeeping over a scripted client: relist diffs, bookmarks, bad objects and failing handlers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import controlplane
import pytest

from dractl.kube import client, informer


def _obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class _BlockingStream:
    """A watch that stays open until closed, like a quiet server."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def __iter__(self) -> Iterator[client.WatchEvent]:
        self.closed.wait(30)
        return iter(())


class _Script:
    """Stands in for `client.Client`: each list and watch call takes the next scripted answer."""

    def __init__(self, lists: list[client.ListResult], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []
        self.open: _BlockingStream | None = None

    def list(self, resource: client.Resource, **_: str) -> client.ListResult:
        return self.lists.pop(0)

    def watch(self, resource: client.Resource, *, resource_version: str, **_: Any) -> Any:
        self.watched_from.append(resource_version)
        answer = self.watches.pop(0) if self.watches else None
        if answer is None:
            self.open = _BlockingStream()
            return self.open
        return answer


class _Stream:
    def __init__(self, events: list[client.WatchEvent], error: Exception | None) -> None:
        self.events, self.error = events, error

    def close(self) -> None:
        pass

    def __iter__(self) -> Iterator[client.WatchEvent]:
        yield from self.events
        if self.error is not None:
            raise self.error


def _decode(raw: dict[str, Any]) -> str | None:
    """Values are "name@version"; an object named `bad` does not decode."""
    meta = raw["metadata"]
    return None if meta["name"] == "bad" else f"{meta['name']}@{meta['resourceVersion']}"


def _run_until_quiet(one: informer.Informer[str], script: _Script) -> None:
    """Start `one`, wait until it has synced and opened the watch that stays quiet (the script's answers are used
    up), then stop it."""
    one.start()
    try:
        assert one.wait_synced(10)
        controlplane.wait_until(lambda: script.open is not None, what="the informer's watch after the scripted ones")
    finally:
        one.stop()


def test_relist_after_410_reports_only_the_difference_and_bad_objects_and_handler_errors_block_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Guards: a 410 relist gives one event per change (none for unchanged objects); bookmarks move the version;
    an undecodable object is left out; a handler that raises does not stop the informer."""
    script = _Script(
        lists=[
            client.ListResult((_obj("a", "1"), _obj("b", "1"), _obj("bad", "1")), "10"),
            client.ListResult((_obj("a", "2"), _obj("c", "3")), "20"),
        ],
        watches=[
            _Stream(
                [
                    client.WatchEvent("MODIFIED", _obj("a", "2")),
                    client.WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "12"}}),
                ],
                client.Gone(410, "Expired", "too old"),
            )
        ],
    )
    events: list[tuple[str, str]] = []

    def on_add(value: str) -> None:
        events.append(("add", value))
        if value.startswith("b@"):
            raise RuntimeError("a handler bug")

    handlers: informer.Handlers[str] = informer.Handlers(
        on_add=on_add,
        on_update=lambda old, new: events.append(("update", f"{old}->{new}")),
        on_delete=lambda value: events.append(("delete", value)),
    )
    one = informer.Informer(
        script,
        client.RESOURCE_CLAIMS,  # type: ignore[arg-type]
        decode=_decode,
        handlers=handlers,
    )
    _run_until_quiet(one, script)
    assert events == [("add", "a@1"), ("add", "b@1"), ("update", "a@1->a@2"), ("add", "c@3"), ("delete", "b@1")]
    assert one.store.values() == ["a@2", "c@3"]
    assert script.watched_from == ["10", "20"]
    assert one.lists == 2
    assert "an event handler failed" in caplog.text


def test_an_object_that_stops_decoding_is_removed_from_the_store() -> None:
    """Guards: a stored object whose update no longer decodes is deleted from the store (with a delete event)."""
    script = _Script(
        lists=[client.ListResult((_obj("x", "1"),), "5")],
        watches=[
            _Stream(
                [
                    client.WatchEvent(
                        "MODIFIED", {"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "6", "labels": {}}}
                    )
                ],
                None,
            )
        ],
    )
    deleted: list[str] = []

    def decode(raw: dict[str, Any]) -> str | None:
        return None if "labels" in raw["metadata"] else _decode(raw)

    one = informer.Informer(
        script,
        client.RESOURCE_CLAIMS,
        decode=decode,  # type: ignore[arg-type]
        handlers=informer.Handlers(on_delete=deleted.append),
    )
    _run_until_quiet(one, script)
    assert deleted == ["x@1"]
    assert one.store.keys() == []
    assert script.watched_from == ["5", "6"]  # a watch that ends normally resumes from the last version, no relist
    assert one.lists == 1


class _GatedStream:
    """A watch that sends its events once `gate` is set, then stays open until closed."""

    def __init__(self, events: list[client.WatchEvent]) -> None:
        self.events = events
        self.gate = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        self.gate.set()

    def __iter__(self) -> Iterator[client.WatchEvent]:
        self.gate.wait(30)
        if not self.closed.is_set():
            yield from self.events
        self.closed.wait(30)


def test_wait_past_returns_once_every_change_up_to_the_version_reached_the_store_and_handlers() -> None:
    """Guards: `wait_past` is true at once for a version the list covered, false after its timeout for one not yet
    delivered, true once the watch delivered that version (the handler has run by then), false at once when the
    informer is stopped; a version that is not an integer is a ValueError."""
    gated = _GatedStream([client.WatchEvent("MODIFIED", _obj("a", "15"))])
    script = _Script(lists=[client.ListResult((_obj("a", "1"),), "10")], watches=[gated])
    seen: list[str] = []
    one = informer.Informer(
        script,
        client.RESOURCE_CLAIMS,  # type: ignore[arg-type]
        decode=_decode,
        handlers=informer.Handlers(on_update=lambda _, new: seen.append(new)),
    )
    one.start()
    try:
        assert one.wait_synced(10)
        assert one.wait_past("10", timeout=0)
        assert not one.wait_past("15", timeout=0.05)
        gated.gate.set()
        assert one.wait_past("15", timeout=10)
        assert seen == ["a@15"]
        with pytest.raises(ValueError):
            one.wait_past("abc", timeout=0)
    finally:
        one.stop()
    started = time.monotonic()
    assert not one.wait_past("99", timeout=30)
    assert time.monotonic() - started < 10, "a stopped informer is not waited for"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        pytest.param({"metadata": {"name": "c", "namespace": "ns"}}, "ns/c", id="namespaced"),
        pytest.param({"metadata": {"name": "node-a"}}, "node-a", id="cluster-scoped"),
    ],
)
def test_keys(raw: dict[str, Any], key: str) -> None:
    """Guards: store keys are namespace/name, or name for cluster-scoped objects (client-go's key function)."""
    assert informer.key_of(raw) == key
