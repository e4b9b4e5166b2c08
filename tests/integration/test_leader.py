"""Lease leader election against a real kube-apiserver: one leader, takeover after expiry, release on stop, and the
fence that stops a leader's writes once its renew deadline has passed or another holder took the Lease."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import controlplane
import faultproxy
import pytest
from support import kube_objects

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


def test_a_lease_the_server_refuses_is_a_warning_naming_the_lease_and_the_answer(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards: a candidate whose Lease reads are refused (403: a token without RBAC) does not lead and says why at
    warning level, naming the Lease and the server's answer, so a replica that stays a standby for ever shows why."""
    fault_proxy.add(faultproxy.respond(403, path="/leases/", count=None, reason="Forbidden"))
    elector = _elector(proxied_client, namespace, "a", FakeClock())
    with caplog.at_level("WARNING", logger=leader.__name__):
        assert not elector.try_acquire_or_renew()
    [record] = [r for r in caplog.records if r.name == leader.__name__]
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith(f"lease {namespace}/dractl-controller: cannot acquire or renew: 403 ")


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


def _fenced(elector: leader.Elector) -> str:
    """The message of the fence's refusal, or "" when it lets a write through."""
    try:
        elector.fence.check("PATCH /x")
    except client.Fenced as refused:
        return refused.message
    return ""


def test_the_fence_opens_on_acquiring_and_closes_at_the_renew_deadline(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards: writes pass the fence only while this elector leads and its last renewal began less than the renew
    deadline ago (on its own clock); each renewal moves the deadline on; past it, a renewal is not even tried."""
    clock = FakeClock()
    a = _elector(kube_client, namespace, "a", clock)
    assert "does not hold the Lease" in _fenced(a)
    assert a.try_acquire_or_renew()
    assert _fenced(a) == ""
    clock.advance(9.9)
    assert _fenced(a) == ""
    assert a.try_acquire_or_renew()
    clock.advance(9.9)
    assert _fenced(a) == ""
    clock.advance(0.1)
    assert _fenced(a) == (
        f"PATCH /x: not sent: the Lease {namespace}/dractl-controller was last renewed 10.0s ago, past the renew "
        "deadline (10s): another replica may lead"
    )
    assert not a.try_acquire_or_renew()
    assert "past the renew deadline" in _fenced(a)
    assert _holder(kube_client, namespace) == "a"


def test_a_leader_that_sees_another_holder_gives_up_at_once(kube_client: client.Client, namespace: str) -> None:
    """Guards: when a step finds the Lease held (and freshly renewed) by another identity, the leader does not wait
    for its renew deadline: the fence closes, on_stopped is called and run() ends without a release."""
    clock = FakeClock()  # Never moves: only the other holder can end this leadership.
    a = leader.Elector(
        kube_client,
        leader.Config(namespace=namespace, name="dractl-controller", identity="a", retry_period=0.05),
        clock=clock,
    )
    calls: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=a.run,
        args=(stop,),
        kwargs={"on_started": lambda: calls.append("started"), "on_stopped": lambda: calls.append("stopped")},
        daemon=True,
    )
    runner.start()
    try:
        controlplane.wait_until(lambda: calls == ["started"], what="a leads")
        lease = kube_client.get(client.LEASES, "dractl-controller", namespace=namespace)
        lease["spec"] = {**lease["spec"], "holderIdentity": "b", "renewTime": "2026-01-01T00:00:01.000000Z"}
        kube_client.update(client.LEASES, lease)
        controlplane.wait_until(lambda: not runner.is_alive(), what="a's run() ended on its own", timeout=30)
    finally:
        stop.set()
        runner.join(timeout=30)
    assert calls == ["started", "stopped"]
    assert "does not hold the Lease" in _fenced(a) and not a.leading
    assert _holder(kube_client, namespace) == "b"


def test_a_leader_paused_past_its_renew_deadline_gives_up_without_a_write(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: a leader whose clock jumps past the renew deadline between two steps (the process was paused) sends
    nothing when it goes on: no renewal, no release; it calls on_stopped and run() ends."""
    clock = FakeClock()
    a = leader.Elector(
        proxied_client,
        leader.Config(namespace=namespace, name="dractl-controller", identity="a", retry_period=0.05),
        clock=clock,
    )
    calls: list[str] = []
    writes_before: list[int] = []

    def on_step(leading: bool) -> None:
        if leading and not writes_before:
            writes_before.append(len(fault_proxy.writes()))
            clock.advance(10.5)  # The pause, between this step and the next one.

    stop = threading.Event()
    runner = threading.Thread(
        target=a.run,
        args=(stop,),
        kwargs={
            "on_started": lambda: calls.append("started"),
            "on_stopped": lambda: calls.append("stopped"),
            "on_step": on_step,
        },
        daemon=True,
    )
    runner.start()
    try:
        controlplane.wait_until(lambda: not runner.is_alive(), what="a's run() ended on its own", timeout=30)
    finally:
        stop.set()
        runner.join(timeout=30)
    assert calls == ["started", "stopped"]
    assert writes_before == [1]  # The create of the Lease.
    assert [r.method for r in fault_proxy.writes()] == ["POST"]
    assert "does not hold the Lease" in _fenced(a) and not a.leading


def test_a_renewal_read_before_a_pause_is_not_written_after_it(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: when the process is paused past the renew deadline between reading the Lease and writing the
    renewal, the renewal is not sent: the step fails and the fence stays shut."""
    clock = FakeClock()
    pause = {"seconds": 0.0}

    class PausingClient(client.Client):
        def get(self, resource: client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
            answer = super().get(resource, name, namespace=namespace)
            clock.advance(pause["seconds"])
            return answer

    api = PausingClient(proxied_client.api_client)
    a = _elector(api, namespace, "a", clock)
    assert a.try_acquire_or_renew()
    clock.advance(5)
    assert a.try_acquire_or_renew()  # An ordinary renewal: read, then write.
    assert [r.method for r in fault_proxy.writes()] == ["POST", "PUT"]
    pause["seconds"] = 10.5
    assert not a.try_acquire_or_renew()
    assert [r.method for r in fault_proxy.writes()] == ["POST", "PUT"]
    assert "past the renew deadline" in _fenced(a)


def _pod_holder(api: client.Client, namespace: str, pod: str) -> leader.Elector:
    """An elector that runs in pod `pod` (created here), holding the Lease with its pod named in it."""
    api.create(client.PODS, kube_objects.pod(pod, namespace=namespace, claims=[]))
    holder = leader.Elector(
        api,
        leader.Config(namespace=namespace, name="dractl-controller", identity=f"{pod}_1234", pod=pod),
        clock=FakeClock(),
    )
    assert holder.try_acquire_or_renew()
    return holder


def _gone_by_deletion(api: client.Client, namespace: str, pod: str) -> None:
    api.delete(client.PODS, pod, namespace=namespace)  # on no node: gone at once


def _gone_by_replacement(api: client.Client, namespace: str, pod: str) -> None:
    _gone_by_deletion(api, namespace, pod)
    api.create(client.PODS, kube_objects.pod(pod, namespace=namespace, claims=[]))


def _gone_by_ending(api: client.Client, namespace: str, pod: str) -> None:
    api.patch(client.PODS, pod, namespace=namespace, subresource="status", patch={"status": {"phase": "Failed"}})


@pytest.mark.parametrize(
    "gone",
    [_gone_by_deletion, _gone_by_replacement, _gone_by_ending],
    ids=["pod-deleted", "pod-replaced-by-another-uid", "pod-ended"],
)
def test_a_lease_whose_holders_pod_is_gone_is_taken_over_at_once(
    kube_client: client.Client, namespace: str, gone: Any
) -> None:
    """Guards the next install after `helm uninstall` (the Role deleted before the leader's pod ended, so it could not
    release): a Lease whose holder named its pod, renewed just now, is taken over at the first step once that pod is
    deleted, replaced by another of its name or ended."""
    _pod_holder(kube_client, namespace, "old-leader")
    annotation = kube_client.get(client.LEASES, "dractl-controller", namespace=namespace)["metadata"]["annotations"]
    record = json.loads(annotation[leader.HOLDER_POD])
    assert record["identity"] == "old-leader_1234" and record["pod"] == "old-leader" and record["uid"]
    gone(kube_client, namespace, "old-leader")
    successor = _elector(kube_client, namespace, "new", FakeClock())
    assert successor.try_acquire_or_renew()
    assert _holder(kube_client, namespace) == "new"


def test_a_lease_whose_holders_pod_runs_is_waited_out_reading_the_pod_once(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards the takeover's safety and cost: while the holder's pod exists a candidate waits out the lease as before,
    reading that pod once, not at every step; a Lease naming a pod for another identity (written by an elector that
    names none) is waited out too."""
    _pod_holder(proxied_client, namespace, "leader")
    clock = FakeClock()
    standby = _elector(proxied_client, namespace, "standby", clock)
    fault_proxy.clear()
    for _ in range(3):
        assert not standby.try_acquire_or_renew()
        clock.advance(2)
    pod_reads = [r for r in fault_proxy.requests if "/pods/" in r.target]
    assert [r.method for r in pod_reads] == ["GET"]
    lease = proxied_client.get(client.LEASES, "dractl-controller", namespace=namespace)
    lease["spec"]["holderIdentity"] = "client-go-elector"
    proxied_client.update(client.LEASES, lease)
    proxied_client.delete(client.PODS, "leader", namespace=namespace)
    other = _elector(proxied_client, namespace, "other", FakeClock())
    assert not other.try_acquire_or_renew()
    assert _holder(proxied_client, namespace) == "client-go-elector"
