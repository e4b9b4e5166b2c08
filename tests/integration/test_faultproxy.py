"""The fault proxy forwards faithfully and injects exactly the faults its rules name (409, 5xx, 429 with Retry-After,
cut answers, 410, drops, delay)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import controlplane
import faultproxy
import pytest
from support import kube_objects

from dractl.kube import client

pytestmark = pytest.mark.timeout(120)


class _Relay:
    """A TCP relay on 127.0.0.1 to the API server: the network between the proxy and the server, for a test to
    break. TLS passes through it untouched (the server's certificate is for 127.0.0.1 too).

    `close_all()` closes every relayed connection, as the server closing its idle connections would;
    `lose_next_answer()` lets the next request through but cuts its connection instead of passing the answer on,
    as a connection breaking after the server acted on the request would.
    """

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._lose_answer = False
        self._threads = [threading.Thread(target=self._accept, name="relay", daemon=True)]
        self._threads[0].start()

    def close_all(self) -> None:
        """Close every relayed connection (each side gets end of stream)."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def lose_next_answer(self) -> None:
        """The next bytes the server sends on any connection are dropped and that connection closed."""
        with self._lock:
            self._lose_answer = True

    def stop(self) -> None:
        """Stop accepting, close every connection and join the relay's threads."""
        _shut(self._listener)  # Wakes the accept.
        self._listener.close()
        self.close_all()
        for thread in self._threads:
            thread.join(timeout=10)
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return  # Stopped.
            far = socket.create_connection(("127.0.0.1", self._target_port))
            with self._lock:
                self._sockets += [near, far]
            for source, sink, answers in ((near, far, False), (far, near, True)):
                thread = threading.Thread(target=self._pump, args=(source, sink, answers), name="relay", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        """Copy `source` to `sink` until either ends; then close both ways of the connection."""
        try:
            while data := source.recv(65536):
                if answers:
                    with self._lock:
                        lose, self._lose_answer = self._lose_answer, False
                    if lose:
                        break
                sink.sendall(data)
        except OSError:
            pass  # The other pump or close_all() shut the connection.
        _shut(source)
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # Not connected any more.


@contextlib.contextmanager
def _cut_off() -> Iterator[None]:
    """Expect the block to fail as a caller without retries does when the proxy cuts its connection instead of
    answering. A timeout is a hang, not a cut, and fails the test (in 3.11 TimeoutError is an OSError)."""
    try:
        yield
    except TimeoutError:
        raise
    except (OSError, http.client.HTTPException):
        return
    pytest.fail("the connection was answered, not cut")


@pytest.fixture
def relay(control_plane: controlplane.ControlPlane) -> Iterator[_Relay]:
    """A relay to the session's API server, stopped after the test."""
    started = _Relay(control_plane.port)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def relayed_proxy(control_plane: controlplane.ControlPlane, relay: _Relay) -> Iterator[faultproxy.FaultProxy]:
    """A fault proxy whose upstream connections go through `relay`."""
    proxy = faultproxy.FaultProxy.start(control_plane, upstream_port=relay.port)
    try:
        yield proxy
    finally:
        proxy.stop()


def _connection(proxy: faultproxy.FaultProxy) -> http.client.HTTPSConnection:
    """A plain http.client connection to the proxy: it never sends a request twice."""
    return http.client.HTTPSConnection("127.0.0.1", proxy.port, context=proxy.plane.ssl_context(), timeout=30)


def _request(
    proxy: faultproxy.FaultProxy, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """One request on a connection of its own; the status and the JSON answer."""
    connection = _connection(proxy)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _head(connection: http.client.HTTPSConnection) -> tuple[int, str | None]:
    """A HEAD of /readyz on `connection`, closed after: the status and the Content-Length."""
    try:
        connection.request("HEAD", "/readyz")
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Content-Length")
    finally:
        connection.close()


def _templates_path(namespace: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"


def test_requests_without_rules_pass_through_and_are_recorded(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: with no rule the proxy is transparent (reads and writes), and logs method, target and status."""
    proxied_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("t", namespace=namespace))
    assert proxied_client.get(client.RESOURCE_CLAIM_TEMPLATES, "t", namespace=namespace)["metadata"]["name"] == "t"
    seen = [(r.method, r.status, r.fault) for r in fault_proxy.requests]
    assert seen == [("POST", 201, ""), ("GET", 200, "")]
    assert [r.method for r in fault_proxy.writes()] == ["POST"]


def test_an_injected_conflict_reaches_the_caller_once(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a 409 rule with count 1 answers one matching request with Conflict and then lets requests through."""
    fault_proxy.add(faultproxy.respond(409, method="PATCH", path=f"/namespaces/{namespace}"))
    with pytest.raises(client.Conflict, match="injected"):
        proxied_client.patch(client.NAMESPACES, namespace, {"metadata": {"labels": {"a": "b"}}})
    patched = proxied_client.patch(client.NAMESPACES, namespace, {"metadata": {"labels": {"a": "b"}}})
    assert patched["metadata"]["labels"]["a"] == "b"


def test_server_errors_are_retried_a_bounded_number_of_times(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: 5xx answers are retried (and then succeed); a persistent 5xx gives Transient after `attempts` tries."""
    fault_proxy.add(faultproxy.respond(503, method="GET", path=f"/namespaces/{namespace}$", count=2))
    assert proxied_client.get(client.NAMESPACES, namespace)["metadata"]["name"] == namespace
    assert [r.status for r in fault_proxy.requests] == [503, 503, 200]
    fault_proxy.clear()
    fault_proxy.add(faultproxy.respond(500, method="GET", path=f"/namespaces/{namespace}$", count=None))
    with pytest.raises(client.Transient) as raised:
        proxied_client.get(client.NAMESPACES, namespace)
    assert raised.value.status == 500
    assert len(fault_proxy.requests) == proxied_client.attempts


def test_conflicts_are_not_retried(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a 409 is not transient: exactly one request is sent."""
    fault_proxy.add(faultproxy.respond(409, path=f"/namespaces/{namespace}$", count=None))
    with pytest.raises(client.Conflict):
        proxied_client.get(client.NAMESPACES, namespace)
    assert len(fault_proxy.requests) == 1


def test_an_injected_status_carries_retry_after_only_when_asked(
    fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: respond(..., retry_after=N) answers with a `Retry-After: N` header; without it, no such header."""
    path = f"/api/v1/namespaces/{namespace}"
    fault_proxy.add(faultproxy.respond(429, method="GET", path=path, retry_after=3), faultproxy.respond(503, path=path))
    answers = []
    for _ in range(2):
        connection = _connection(fault_proxy)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            answers.append((response.status, response.getheader("Retry-After")))
        finally:
            connection.close()
    assert answers == [(429, "3"), (503, None)]


def test_a_cut_answer_lets_the_server_act_and_gives_the_caller_none(
    kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a cut_answer rule forwards the request, the server carries it out (the object exists), and the
    caller's connection is closed without an answer; the log has the server's status; later requests are answered."""
    fault_proxy.add(faultproxy.cut_answer(method="POST", path="/resourceclaimtemplates"))
    with _cut_off():
        _request(fault_proxy, "POST", _templates_path(namespace), kube_objects.template("t", namespace=namespace))
    assert kube_client.get(client.RESOURCE_CLAIM_TEMPLATES, "t", namespace=namespace)["metadata"]["name"] == "t"
    assert [(r.method, r.status, r.fault) for r in fault_proxy.requests] == [("POST", 201, "cut answer")]
    assert _request(fault_proxy, "GET", f"{_templates_path(namespace)}/t")[0] == 200
    assert fault_proxy.busy_upstreams == 0


def test_watch_gone_gives_the_caller_a_gone_error(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: the 410 rule answers a watch with an ERROR event of code 410, which the stream raises as Gone."""
    version = proxied_client.list(client.NAMESPACES).resource_version
    fault_proxy.add(faultproxy.watch_gone(path="/namespaces"))
    stream = proxied_client.watch(client.NAMESPACES, resource_version=version, timeout_seconds=30)
    with pytest.raises(client.Gone):
        list(stream)


def test_a_dropped_watch_breaks_the_stream_after_the_given_events(
    proxied_client: client.Client, kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: drop_watch forwards N events and then cuts the connection, which the stream reports as Transient."""
    version = kube_client.list(client.RESOURCE_CLAIM_TEMPLATES, namespace=namespace).resource_version
    for i in range(3):
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(f"t{i}", namespace=namespace))
    fault_proxy.add(faultproxy.drop_watch(path="/resourceclaimtemplates", after=2))
    stream = proxied_client.watch(
        client.RESOURCE_CLAIM_TEMPLATES,
        namespace=namespace,
        resource_version=version,
        timeout_seconds=30,
        bookmarks=False,
    )
    names = []
    with pytest.raises(client.Transient):
        for event in stream:
            names.append(event.object["metadata"]["name"])
    assert names == ["t0", "t1"]
    controlplane.wait_until(lambda: fault_proxy.busy_upstreams == 0, what="the dropped watch's upstream is closed")


def test_latency_delays_the_matching_request(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a latency rule holds the request for its delay and then forwards it unchanged."""
    fault_proxy.add(faultproxy.latency(0.3, method="GET", path=f"/namespaces/{namespace}$"))
    began = time.monotonic()
    assert proxied_client.get(client.NAMESPACES, namespace)["metadata"]["name"] == namespace
    assert time.monotonic() - began >= 0.3
    assert [r.fault for r in fault_proxy.requests] == ["delay"]
    assert fault_proxy.requests[0].status == 200


def test_rules_match_by_method(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a rule for DELETE leaves GETs of the same path alone."""
    fault_proxy.add(faultproxy.respond(500, method="DELETE", path=f"/namespaces/{namespace}$", count=None))
    assert proxied_client.get(client.NAMESPACES, namespace)["metadata"]["name"] == namespace
    assert [r.fault for r in fault_proxy.requests] == [""]


def test_requests_reuse_one_kept_alive_upstream_connection(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: one request after another all go over one connection to the API server (not a new TLS
    connection each), and none is left in use."""
    for _ in range(10):
        assert proxied_client.get(client.NAMESPACES, namespace)["metadata"]["name"] == namespace
    assert fault_proxy.opened_upstreams == 1
    assert fault_proxy.busy_upstreams == 0


def test_concurrent_requests_each_get_their_own_answer(
    proxied_client: client.Client, kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: requests in flight at once never share an upstream connection: every caller gets the object it
    asked for (a delay on every GET makes them overlap, so more than one connection is opened), and all
    connections are back in the pool afterwards."""
    names = [f"t{i}" for i in range(8)]
    for name in names:
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=namespace))
    fault_proxy.add(faultproxy.latency(0.2, method="GET", count=None))

    def fetch(name: str) -> str:
        return str(proxied_client.get(client.RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)["metadata"]["name"])

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        fetched = list(pool.map(fetch, names * 5))
    assert fetched == names * 5
    assert 2 <= fault_proxy.opened_upstreams <= len(names)
    assert fault_proxy.busy_upstreams == 0


def test_a_kept_alive_connection_the_server_closed_is_replaced(
    relayed_proxy: faultproxy.FaultProxy, relay: _Relay, namespace: str
) -> None:
    """Guards: when the server has closed the kept-alive upstream connection while it sat idle, the next request
    goes over a new connection: a caller that does not retry (plain http.client) gets its answer."""
    path = f"/api/v1/namespaces/{namespace}"
    assert _request(relayed_proxy, "GET", path)[0] == 200
    relay.close_all()
    status, namespace_object = _request(relayed_proxy, "GET", path)
    assert (status, namespace_object["metadata"]["name"]) == (200, namespace)
    assert relayed_proxy.opened_upstreams == 2
    assert relayed_proxy.busy_upstreams == 0


def test_a_write_whose_answer_was_lost_is_not_sent_again_but_a_read_is(
    kube_client: client.Client, relayed_proxy: faultproxy.FaultProxy, relay: _Relay, namespace: str
) -> None:
    """Guards: when a kept-alive upstream connection breaks after a POST went out (the server may have acted on
    it), the proxy does not send it again: the caller gets a broken connection, and the server saw the POST once
    (a second one would have got 409 AlreadyExists). A GET in the same spot is sent again on a new connection."""
    path = f"/api/v1/namespaces/{namespace}"
    assert _request(relayed_proxy, "GET", path)[0] == 200
    relay.lose_next_answer()
    with _cut_off():
        _request(relayed_proxy, "POST", _templates_path(namespace), kube_objects.template("t", namespace=namespace))
    assert kube_client.get(client.RESOURCE_CLAIM_TEMPLATES, "t", namespace=namespace)["metadata"]["name"] == "t"
    assert relayed_proxy.opened_upstreams == 1

    assert _request(relayed_proxy, "GET", path)[0] == 200
    relay.lose_next_answer()
    status, template = _request(relayed_proxy, "GET", f"{_templates_path(namespace)}/t")
    assert (status, template["metadata"]["name"]) == (200, "t")
    assert relayed_proxy.opened_upstreams == 3
    assert relayed_proxy.busy_upstreams == 0


def test_stop_cuts_client_connections_and_forwards_no_held_request(
    kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: stop() stops serving: a client's kept-alive connection gets no more answers, and a POST a latency
    rule held when the proxy stopped is never forwarded; stop() ends the delay (it returns within seconds, not the
    delay's 60) and returns only once no request is handled any more."""
    held = faultproxy.latency(60, method="POST")
    kept = _connection(fault_proxy)
    try:
        kept.request("GET", f"/api/v1/namespaces/{namespace}")
        response = kept.getresponse()
        response.read()
        assert response.status == 200
        fault_proxy.add(held)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            post = pool.submit(
                _request,
                fault_proxy,
                "POST",
                _templates_path(namespace),
                kube_objects.template("t", namespace=namespace),
            )
            controlplane.wait_until(lambda: held.fired == 1, what="the proxy holds the POST")
            began = time.monotonic()
            fault_proxy.stop()
            assert time.monotonic() - began < 5  # Far below the held delay: stop() ends it.
            with _cut_off():
                post.result(timeout=30)
        with _cut_off():
            kept.request("GET", f"/api/v1/namespaces/{namespace}")
            kept.getresponse()
    finally:
        kept.close()
    with pytest.raises(client.NotFound):
        kube_client.get(client.RESOURCE_CLAIM_TEMPLATES, "t", namespace=namespace)
    assert [(r.method, r.status) for r in fault_proxy.requests] == [("GET", 200)]
    assert fault_proxy.busy_upstreams == 0


def test_stop_returns_once_every_request_has_ended(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: stop() waits for the requests it cut to end: a watch streaming when the proxy stops has given back
    its upstream connection by the time stop() returns."""
    version = proxied_client.list(client.RESOURCE_CLAIM_TEMPLATES, namespace=namespace).resource_version
    stream = proxied_client.watch(
        client.RESOURCE_CLAIM_TEMPLATES, namespace=namespace, resource_version=version, timeout_seconds=300
    )
    try:
        controlplane.wait_until(lambda: fault_proxy.busy_upstreams == 1, what="the watch is open upstream")
        fault_proxy.stop()
        assert fault_proxy.busy_upstreams == 0
    finally:
        stream.close()


def test_a_head_request_is_forwarded_and_sent_again_like_a_get(
    control_plane: controlplane.ControlPlane, relayed_proxy: faultproxy.FaultProxy, relay: _Relay
) -> None:
    """Guards: a HEAD goes to the server (not the proxy's own 501) and gets the server's status and Content-Length
    with no body, on a kept-alive connection; when that connection breaks under it, it is sent again on a new one."""
    direct = _head(
        http.client.HTTPSConnection("127.0.0.1", control_plane.port, context=control_plane.ssl_context(), timeout=30)
    )
    assert direct[0] == 200
    assert _head(_connection(relayed_proxy)) == direct
    relay.lose_next_answer()
    assert _head(_connection(relayed_proxy)) == direct
    assert [(r.method, r.status) for r in relayed_proxy.requests] == [("HEAD", 200), ("HEAD", 200)]
    assert relayed_proxy.opened_upstreams == 2
    assert relayed_proxy.busy_upstreams == 0


def test_a_watch_its_client_leaves_is_cut_upstream_at_once(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a watch has an upstream connection of its own, closed as soon as its client closes the stream
    (not when the next event or the server's timeout comes)."""
    version = proxied_client.list(client.RESOURCE_CLAIM_TEMPLATES, namespace=namespace).resource_version
    stream = proxied_client.watch(
        client.RESOURCE_CLAIM_TEMPLATES, namespace=namespace, resource_version=version, timeout_seconds=300
    )
    controlplane.wait_until(lambda: fault_proxy.busy_upstreams == 1, what="the watch is open upstream")
    stream.close()
    controlplane.wait_until(
        lambda: fault_proxy.busy_upstreams == 0, what="the proxy closed the watch's upstream connection", timeout=10
    )
