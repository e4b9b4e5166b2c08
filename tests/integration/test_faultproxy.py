"""The fault proxy forwards faithfully and injects exactly the faults its rules name (409, 5xx, 410, drops, delay)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time

import controlplane
import faultproxy
import pytest
from support import kube_objects

from dractl.kube import client

pytestmark = pytest.mark.timeout(120)


def _namespace_body(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_requests_without_rules_pass_through_and_are_recorded(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: with no rule the proxy is transparent (reads and writes), and logs method, target and status."""
    proxied_client.create(
        client.RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "t", "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}},
        },
    )
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
        kube_client.create(
            client.RESOURCE_CLAIM_TEMPLATES,
            {
                "metadata": {"name": f"t{i}", "namespace": namespace},
                "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}},
            },
        )
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
    elapsed = time.monotonic() - began
    print(f"delayed request took {elapsed:.2f}s")
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
    asked for, and all connections are back in the pool afterwards."""
    names = [f"t{i}" for i in range(8)]
    for name in names:
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=namespace))

    def fetch(name: str) -> str:
        return str(proxied_client.get(client.RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)["metadata"]["name"])

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        fetched = list(pool.map(fetch, names * 5))
    assert fetched == names * 5
    assert 1 <= fault_proxy.opened_upstreams <= len(names)
    assert fault_proxy.busy_upstreams == 0


def test_a_stale_kept_alive_connection_is_replaced(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: when the kept-alive upstream connection is dead (the server closed it while idle), the request
    is sent once more on a new connection: a caller that does not retry (plain http.client) gets its answer."""
    proxied_client.get(client.NAMESPACES, namespace)
    [idle] = fault_proxy._idle  # The test plays the server closing it.
    assert idle.sock is not None
    idle.sock.shutdown(socket.SHUT_RDWR)
    direct = http.client.HTTPSConnection(
        "127.0.0.1", fault_proxy.port, context=fault_proxy.plane.ssl_context(), timeout=30
    )
    try:
        direct.request("GET", f"/api/v1/namespaces/{namespace}")
        response = direct.getresponse()
        assert (response.status, json.loads(response.read())["metadata"]["name"]) == (200, namespace)
    finally:
        direct.close()
    assert fault_proxy.opened_upstreams == 2


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
