"""Lease leader election against a real kube-apiserver: one leader, takeover after expiry, release on stop."""

from __future__ import annotations

import datetime
import threading

import controlplane
import pytest

from dractl.kube import client, leader

pytestmark = pytest.mark.timeout(120)


class FakeClock:
    """Monotonic and wall time that move only when the test says so."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def advance(self, seconds: float) -> None:
        self.seconds += seconds

    def monotonic(self) -> float:
        return self.seconds

    def wall(self) -> datetime.datetime:
        return datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=self.seconds)


def _elector(api: client.Client, namespace: str, identity: str, clock: FakeClock) -> leader.Elector:
    return leader.Elector(
        api,
        leader.Config(
            namespace=namespace,
            name="dractl-controller",
            identity=identity,
            lease_duration=15,
            renew_deadline=10,
            retry_period=2,
        ),
        clock=clock,
    )


def _holder(api: client.Client, namespace: str) -> str:
    lease = api.get(client.LEASES, "dractl-controller", namespace=namespace)
    return str(lease["spec"].get("holderIdentity") or "")


def test_only_one_of_two_electors_leads(kube_client: client.Client, namespace: str) -> None:
    """Guards: the first elector creates the Lease and leads; the second does not while the first renews."""
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = _elector(kube_client, namespace, "a", clock_a), _elector(kube_client, namespace, "b", clock_b)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(5):
        clock_a.advance(5)
        clock_b.advance(5)
        assert a.try_acquire_or_renew()  # renews
        assert not b.try_acquire_or_renew()  # sees a fresh renewTime each time
    assert _holder(kube_client, namespace) == "a"
    lease = kube_client.get(client.LEASES, "dractl-controller", namespace=namespace)
    assert lease["spec"]["leaseTransitions"] == 0
    assert lease["spec"]["leaseDurationSeconds"] == 15


def test_the_other_takes_over_when_the_leader_stops_renewing(kube_client: client.Client, namespace: str) -> None:
    """Guards: once the holder has not renewed for leaseDuration (on the candidate's clock) it is taken over."""
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = _elector(kube_client, namespace, "a", clock_a), _elector(kube_client, namespace, "b", clock_b)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock_b.advance(14)
    assert not b.try_acquire_or_renew()  # not expired yet
    clock_b.advance(2)
    assert b.try_acquire_or_renew()
    assert _holder(kube_client, namespace) == "b"
    lease = kube_client.get(client.LEASES, "dractl-controller", namespace=namespace)
    assert lease["spec"]["leaseTransitions"] == 1
    # The old leader, back from a pause, finds the lease held and fresh: it does not lead.
    assert not a.try_acquire_or_renew()


def test_two_racing_candidates_never_both_win(kube_client: client.Client, namespace: str) -> None:
    """Guards: with resourceVersion preconditions, concurrent attempts on a free lease give exactly one leader."""
    clocks = [FakeClock() for _ in range(4)]
    electors = [_elector(kube_client, namespace, f"c{i}", clocks[i]) for i in range(4)]
    results: list[bool] = [False] * 4
    barrier = threading.Barrier(4)

    def campaign(i: int) -> None:
        barrier.wait()
        results[i] = electors[i].try_acquire_or_renew()

    threads = [threading.Thread(target=campaign, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results.count(True) == 1
    assert _holder(kube_client, namespace) == f"c{results.index(True)}"


def test_release_on_stop_lets_the_successor_lead_at_once(kube_client: client.Client, namespace: str) -> None:
    """Guards: run() releases the lease on stop (on_started, on_stopped once each); a successor leads at once."""
    clock_a, clock_b = FakeClock(), FakeClock()
    a = leader.Elector(
        kube_client,
        leader.Config(namespace=namespace, name="dractl-controller", identity="a", retry_period=0.05),
        clock=clock_a,
    )
    b = _elector(kube_client, namespace, "b", clock_b)
    stop = threading.Event()
    calls: list[str] = []
    runner = threading.Thread(
        target=a.run,
        args=(stop,),
        kwargs={"on_started": lambda: calls.append("started"), "on_stopped": lambda: calls.append("stopped")},
    )
    runner.start()
    try:
        controlplane.wait_until(lambda: calls == ["started"], what="a started leading")
        assert not b.try_acquire_or_renew()
    finally:
        stop.set()
        runner.join(timeout=30)
    assert calls == ["started", "stopped"]
    assert _holder(kube_client, namespace) == ""
    assert b.try_acquire_or_renew()
    assert _holder(kube_client, namespace) == "b"
