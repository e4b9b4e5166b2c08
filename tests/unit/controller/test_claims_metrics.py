"""The claim controller's metrics: on the registry passed in, and reusable by a controller made again."""

from __future__ import annotations

import prometheus_client

from dractl.controller import claims as controller


class _NoClient:
    """A client the controller never uses in these tests (nothing is started)."""


def _make(registry: prometheus_client.CollectorRegistry) -> controller.ClaimController:
    return controller.ClaimController(_NoClient(), registry=registry)  # type: ignore[arg-type]


def test_a_controller_made_again_on_one_registry_reuses_its_metrics() -> None:
    """Guards: a second controller on the same registry (leadership regained) does not fail on a duplicate
    registration, keeps the counts, and the queue-depth gauge follows the newest controller's queue."""
    registry = prometheus_client.CollectorRegistry()
    first = _make(registry)
    first.metrics.creates.labels(status="success").inc()
    first.queue.add("pod:ns/a")
    second = _make(registry)
    assert registry.get_sample_value("dractl_claim_controller_creates_total", {"status": "success"}) == 1
    assert registry.get_sample_value("dractl_claim_controller_queue_depth") == 0
    second.queue.add("pod:ns/a")
    second.queue.add("claim:ns/b")
    assert registry.get_sample_value("dractl_claim_controller_queue_depth") == 2
