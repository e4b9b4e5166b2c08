"""`kube.client.WatchStream.close()` from another thread while the informer thread reads: the
reader wakes and ends quietly, and the response is closed by the reader, never under it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from dractl.kube import client


class _Response:
    """A urllib3 response whose `stream` blocks until `woken` is set (the test plays the socket
    shutdown's wake-up, so what `close()` did before it is checked without a race), and whose
    `close` pulls the file away as urllib3's does (a read after it fails with AttributeError)."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.woken = threading.Event()
        self.calls: list[str] = []
        self.fp: object | None = object()

    def stream(self, amount: int) -> Iterator[bytes]:
        yield b'{"type": "ADDED", "object": {"metadata": {"name": "a"}}}\n'
        self.reading.set()
        self.woken.wait(10)
        if self.fp is None:
            raise AttributeError("'NoneType' object has no attribute 'read'")

    def shutdown(self) -> None:
        self.calls.append("shutdown")

    def close(self) -> None:
        self.calls.append("close")
        self.fp = None
        self.woken.set()

    def release_conn(self) -> None:
        self.calls.append("release_conn")


def test_close_while_reading_wakes_the_reader_which_closes_the_response() -> None:
    """Guards: close() during a blocked read only shuts the socket down; the reader's iteration
    ends without an error and then closes the response (closing it under the read raised
    AttributeError in the informer thread: a thread exception at test teardown)."""
    response = _Response()
    stream = client.WatchStream(response)  # type: ignore[arg-type]
    seen: list[str] = []
    failures: list[BaseException] = []

    def read() -> None:
        try:
            seen.extend(event.object["metadata"]["name"] for event in stream)
        except BaseException as error:  # noqa: BLE001 - the test reports whatever the reader raised
            failures.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    assert response.reading.wait(10)
    stream.close()
    assert response.calls == ["shutdown"]  # nothing closed under the running read
    response.woken.set()  # the shut-down socket wakes the reader
    reader.join(10)
    assert not reader.is_alive() and failures == [] and seen == ["a"]
    assert response.calls[0] == "shutdown" and "close" in response.calls and "release_conn" not in response.calls


def test_close_before_reading_closes_at_once_and_iterates_nothing() -> None:
    """Guards: a stream closed before anyone iterates is closed there and then, and yields nothing."""
    response = _Response()
    stream = client.WatchStream(response)  # type: ignore[arg-type]
    stream.close()
    assert response.calls == ["shutdown", "close"]
    assert list(stream) == []


def test_close_after_the_stream_ended_leaves_the_released_connection_alone() -> None:
    """Guards: once a watch was read to its end, its connection is back in urllib3's pool: a later
    close() must not shut down a socket that now serves other requests."""
    response = _Response()
    response.woken.set()  # the stream ends by itself after its one event
    stream = client.WatchStream(response)  # type: ignore[arg-type]
    assert [event.object["metadata"]["name"] for event in stream] == ["a"]
    stream.close()
    assert response.calls == ["release_conn"]
