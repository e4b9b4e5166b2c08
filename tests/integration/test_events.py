"""Events against a real kube-apiserver: one Event per distinct occurrence, repeats counted, reported by dractl."""

from __future__ import annotations

import datetime

import faultproxy
import pytest

from dractl import model
from dractl.kube import client, events

pytestmark = pytest.mark.timeout(120)


def _claim_ref(namespace: str) -> events.ObjectRef:
    meta = model.ObjectMeta(name="c", namespace=namespace, uid="1234")
    return events.ObjectRef.of(meta, api_version="resource.k8s.io/v1", kind="ResourceClaim")


def _events(api: client.Client, namespace: str) -> list[dict[str, object]]:
    return sorted(api.list(client.EVENTS, namespace=namespace).items, key=lambda e: str(e["reason"]))


def test_an_event_names_the_object_reason_message_and_component(kube_client: client.Client, namespace: str) -> None:
    """Guards: an Event carries involvedObject, reason, message, type, count 1 and the reporting component dractl."""
    recorder = events.Recorder(kube_client, host="node-a")
    recorder.event(
        _claim_ref(namespace),
        type=events.WARNING,
        reason="InvalidConfig",
        message="spec.devices.config[0].opaque.parameters.sharing: unknown strategy 'Bogus'",
    )
    [event] = _events(kube_client, namespace)
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "c",
        "namespace": namespace,
        "uid": "1234",
    }
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "InvalidConfig", 1)
    assert "unknown strategy" in str(event["message"])
    assert event["reportingComponent"] == "dractl"
    assert event["source"] == {"component": "dractl", "host": "node-a"}


def test_a_repeated_event_bumps_the_count_instead_of_creating_another(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards: the same object, type, reason and message again patch count and lastTimestamp of one Event."""
    moments = iter(datetime.datetime(2026, 1, 1, 0, 0, i, tzinfo=datetime.UTC) for i in range(10))
    recorder = events.Recorder(kube_client, clock=lambda: next(moments))
    for _ in range(3):
        recorder.event(_claim_ref(namespace), type=events.NORMAL, reason="Allocated", message="gpu-0 on node-a")
    recorder.event(_claim_ref(namespace), type=events.NORMAL, reason="Deallocated", message="gpu-0 on node-a")
    allocated, deallocated = _events(kube_client, namespace)
    assert (allocated["reason"], allocated["count"]) == ("Allocated", 3)
    assert allocated["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert allocated["lastTimestamp"] == "2026-01-01T00:00:02Z"
    assert (deallocated["reason"], deallocated["count"]) == ("Deallocated", 1)


def test_an_expired_event_is_created_again(kube_client: client.Client, namespace: str) -> None:
    """Guards: when the counted Event is gone (TTL), the next occurrence creates a new one rather than failing."""
    recorder = events.Recorder(kube_client)
    recorder.event(_claim_ref(namespace), type=events.NORMAL, reason="Prepared", message="ok")
    [event] = _events(kube_client, namespace)
    kube_client.delete(client.EVENTS, event["metadata"]["name"], namespace=namespace)
    recorder.event(_claim_ref(namespace), type=events.NORMAL, reason="Prepared", message="ok")
    [again] = _events(kube_client, namespace)
    assert again["count"] == 1


def test_cluster_scoped_objects_get_their_events_in_default(kube_client: client.Client) -> None:
    """Guards: an Event about a cluster-scoped object (a Node) is written to namespace default, as client-go does."""
    recorder = events.Recorder(kube_client)
    ref = events.ObjectRef(api_version="v1", kind="Node", name="event-node-x", uid="9")
    recorder.event(ref, type=events.WARNING, reason="GpuLost", message="gpu-3 fell off the bus")
    found = [
        e
        for e in kube_client.list(client.EVENTS, namespace="default").items
        if e["involvedObject"].get("name") == "event-node-x"
    ]
    assert [e["reason"] for e in found] == ["GpuLost"]


def test_an_api_failure_is_logged_not_raised(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards: Events are best effort: a refused create is logged and the caller carries on."""
    fault_proxy.add(faultproxy.respond(403, method="POST", path="/events", count=None, reason="Forbidden"))
    recorder = events.Recorder(proxied_client)
    recorder.event(_claim_ref(namespace), type=events.WARNING, reason="X", message="y")
    assert "could not record event Warning X" in caplog.text
