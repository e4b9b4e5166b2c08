"""The informer against a real kube-apiserver: sync, live updates, relists after a dropped watch or a 410.

No event may be lost or repeated across a relist.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import controlplane
import faultproxy
import pytest
from support import kube_objects

from dractl import model
from dractl.kube import client, informer, workqueue

pytestmark = pytest.mark.timeout(120)


class Recorder:
    """Every handler call as (event, key, labels), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, str]] = []

    def _label(self, value: model.ResourceClaimTemplate) -> str:
        return value.meta.labels.get("v", "")

    def handlers(self) -> informer.Handlers[model.Decoded]:
        def add(value: model.Decoded) -> None:
            assert isinstance(value, model.ResourceClaimTemplate)
            with self.lock:
                self.events.append(("add", value.meta.name, self._label(value)))

        def update(old: model.Decoded, new: model.Decoded) -> None:
            assert isinstance(new, model.ResourceClaimTemplate)
            with self.lock:
                self.events.append(("update", new.meta.name, self._label(new)))

        def delete(value: model.Decoded) -> None:
            assert isinstance(value, model.ResourceClaimTemplate)
            with self.lock:
                self.events.append(("delete", value.meta.name, self._label(value)))

        return informer.Handlers(on_add=add, on_update=update, on_delete=delete)

    def snapshot(self) -> list[tuple[str, str, str]]:
        with self.lock:
            return list(self.events)


StartInformer = Callable[[informer.Handlers[model.Decoded]], informer.Informer[model.Decoded]]


@contextlib.contextmanager
def _informers(api: client.Client, namespace: str) -> Iterator[StartInformer]:
    """Starts informers on the templates of `namespace` through `api`, each synced before it is returned; on exit
    stops them (last started first, each even when stopping another failed)."""
    with contextlib.ExitStack() as started:

        def start(handlers: informer.Handlers[model.Decoded]) -> informer.Informer[model.Decoded]:
            one: informer.Informer[model.Decoded] = informer.Informer(
                api,
                client.RESOURCE_CLAIM_TEMPLATES,
                decode=client.decode,
                handlers=handlers,
                namespace=namespace,
                watch_timeout=60,
            )
            started.callback(one.stop)
            one.start()
            assert one.wait_synced(30)
            return one

        yield start


@pytest.fixture
def start_informer(kube_client: client.Client, namespace: str) -> Iterator[StartInformer]:
    """Starts informers on the test namespace's templates with the direct client; stopped after the test."""
    with _informers(kube_client, namespace) as start:
        yield start


@pytest.fixture
def start_proxied_informer(proxied_client: client.Client, namespace: str) -> Iterator[StartInformer]:
    """Starts informers on the test namespace's templates through the fault proxy; stopped after the test, before
    the proxied client is closed."""
    with _informers(proxied_client, namespace) as start:
        yield start


def test_sync_fills_the_store_and_reports_each_object_once(
    kube_client: client.Client, namespace: str, start_informer: StartInformer
) -> None:
    """Guards: after the first list has_synced() is true, the store holds every object, one add each."""
    for name in ("a", "b", "c"):
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=namespace))
    recorder = Recorder()
    one = start_informer(recorder.handlers())
    assert one.has_synced()
    assert one.store.keys() == [f"{namespace}/a", f"{namespace}/b", f"{namespace}/c"]
    value = one.store.get(f"{namespace}/a")
    assert isinstance(value, model.ResourceClaimTemplate)
    assert sorted(recorder.snapshot()) == [("add", "a", ""), ("add", "b", ""), ("add", "c", "")]


def test_live_adds_updates_and_deletes_arrive_in_order(
    kube_client: client.Client, namespace: str, start_informer: StartInformer
) -> None:
    """Guards: watch events after the sync become add, update and delete callbacks in the order they happened."""
    recorder = Recorder()
    one = start_informer(recorder.handlers())
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("x", namespace=namespace))
    kube_client.patch(client.RESOURCE_CLAIM_TEMPLATES, "x", {"metadata": {"labels": {"v": "2"}}}, namespace=namespace)
    kube_client.delete(client.RESOURCE_CLAIM_TEMPLATES, "x", namespace=namespace)
    controlplane.wait_until(lambda: len(recorder.snapshot()) >= 3, what="three events arrived")
    assert recorder.snapshot() == [("add", "x", ""), ("update", "x", "2"), ("delete", "x", "2")]
    assert one.store.keys() == []
    assert one.lists == 1


def test_a_dropped_watch_relists_without_losing_or_repeating_events(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    start_proxied_informer: StartInformer,
) -> None:
    """Guards: a watch cut mid-stream leads to a relist; changes made meanwhile arrive exactly once, none repeat."""
    for name in ("keep", "change", "remove"):
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=namespace))
    recorder = Recorder()
    fault_proxy.add(faultproxy.drop_watch(path="/resourceclaimtemplates", after=1))
    one = start_proxied_informer(recorder.handlers())
    # The first watch event (this create) is forwarded, then the connection is cut.
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("first", namespace=namespace))
    kube_client.patch(
        client.RESOURCE_CLAIM_TEMPLATES, "change", {"metadata": {"labels": {"v": "2"}}}, namespace=namespace
    )
    kube_client.delete(client.RESOURCE_CLAIM_TEMPLATES, "remove", namespace=namespace)
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("new", namespace=namespace))
    controlplane.wait_until(
        lambda: (
            one.store.keys() == sorted(f"{namespace}/{n}" for n in ("keep", "change", "first", "new"))
            and recorder.snapshot().count(("update", "change", "2")) == 1
        ),
        what="the informer caught up after the dropped watch",
    )
    events = recorder.snapshot()
    assert sorted(events[:3]) == [("add", "change", ""), ("add", "keep", ""), ("add", "remove", "")]
    assert sorted(events[3:]) == sorted(
        [("add", "first", ""), ("update", "change", "2"), ("delete", "remove", ""), ("add", "new", "")]
    )
    assert len(events) == len(set(events))
    assert one.lists >= 2
    assert any(r.fault == "drop watch" for r in fault_proxy.requests)


def test_a_410_relists_and_diffs_against_the_store(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
    start_proxied_informer: StartInformer,
) -> None:
    """Guards: on 410 Gone the informer relists; changes made while it could not watch give one event each."""
    for name in ("keep", "change", "remove"):
        kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(name, namespace=namespace))
    recorder = Recorder()
    # Every watch is refused with 410 until the rule is removed.
    fault_proxy.add(faultproxy.watch_gone(path="/resourceclaimtemplates", count=None))
    one = start_proxied_informer(recorder.handlers())
    kube_client.patch(
        client.RESOURCE_CLAIM_TEMPLATES, "change", {"metadata": {"labels": {"v": "2"}}}, namespace=namespace
    )
    kube_client.delete(client.RESOURCE_CLAIM_TEMPLATES, "remove", namespace=namespace)
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("new", namespace=namespace))
    controlplane.wait_until(
        lambda: any(r.fault == "watch gone" for r in fault_proxy.requests), what="a watch was refused with 410"
    )
    fault_proxy.clear()
    controlplane.wait_until(lambda: len(recorder.snapshot()) >= 6, what="the relist's events arrived")
    events = recorder.snapshot()
    assert sorted(events[:3]) == [("add", "change", ""), ("add", "keep", ""), ("add", "remove", "")]
    assert sorted(events[3:]) == sorted([("update", "change", "2"), ("delete", "remove", ""), ("add", "new", "")])
    kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("after", namespace=namespace))
    controlplane.wait_until(lambda: ("add", "after", "") in recorder.snapshot(), what="the watch resumed")
    assert len(recorder.snapshot()) == 7
    assert one.lists >= 2


def test_stop_ends_the_thread_while_a_watch_is_open(kube_client: client.Client, namespace: str) -> None:
    """Guards: stop() closes an open watch and joins the informer's thread promptly."""
    one: informer.Informer[model.Decoded] = informer.Informer(
        kube_client, client.RESOURCE_CLAIM_TEMPLATES, decode=client.decode, namespace=namespace, watch_timeout=300
    )
    one.start()
    assert one.wait_synced(30)
    one.stop(timeout=20)
    assert one._thread is not None
    assert not one._thread.is_alive()


def test_the_informer_feeds_a_work_queue_that_converges(
    kube_client: client.Client, namespace: str, start_informer: StartInformer
) -> None:
    """Guards: handlers that only enqueue keys, and a worker reading the store, see the final state of each object."""
    queue = workqueue.WorkQueue()
    seen: dict[str, str] = {}

    def enqueue(value: model.Decoded, *_: model.Decoded) -> None:
        queue.add(f"{value.meta.namespace}/{value.meta.name}")

    one = start_informer(informer.Handlers(on_add=enqueue, on_update=lambda old, new: enqueue(new), on_delete=enqueue))

    def work() -> None:
        while (key := queue.get()) is not None:
            value = one.store.get(key)
            seen[key] = "gone" if value is None else value.meta.labels.get("v", "")
            queue.done(key)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        for i in range(5):
            kube_client.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template(f"w{i}", namespace=namespace))
        for i in range(5):
            kube_client.patch(
                client.RESOURCE_CLAIM_TEMPLATES, f"w{i}", {"metadata": {"labels": {"v": "final"}}}, namespace=namespace
            )
        kube_client.delete(client.RESOURCE_CLAIM_TEMPLATES, "w0", namespace=namespace)
        expected = {f"{namespace}/w0": "gone", **{f"{namespace}/w{i}": "final" for i in range(1, 5)}}
        controlplane.wait_until(lambda: seen == expected, what="the worker saw every object's final state")
    finally:
        queue.shutdown()
        worker.join(timeout=10)
