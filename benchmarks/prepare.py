"""Node agent benchmark: NodePrepareResources latency over the DRA socket, and start-up to published slices.

Run from the repository root: `python benchmarks/prepare.py [--rounds N]`.

What it measures, with the fake GPUs (`a100-80gb-x8`) and the real `state.State` behind the
real gRPC server, a client playing the kubelet over the unix socket:

* prepare latency (client round trip of one NodePrepareResources v1 call with one claim) for a
  claim of 1 full GPU, of 8 full GPUs, and of one dynamic-MIG device (instances created at
  prepare); each prepare is followed by an unprepare (not timed) so every round does the full
  work (CDI spec written, checkpoint written twice, MIG instances created). p50 and p99. Twice:
  as the kubelet sees it, with the live ResourceClaim GET every prepare makes against a real
  kube-apiserver (the test control plane's binaries, tests/controlplane.py; the claims are
  created there, allocated), and with the claims read from memory (the node's own work). The
  GET alone is timed too, over the same client.
* start-up: from `Agent.start()` to the node's 8-GPU slices being published, to a real
  kube-apiserver when the test control plane's binaries are available (tests/controlplane.py),
  else to slices computed and encoded; and to the plugin answering on its sockets.

Targets (issue 15): p50 under 10 ms for a 1-GPU claim with the GET on a quiet machine, start-up
under 2 s. It prints the load average before and after (figures depend on it), and asserts
nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import structlog

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support import kubelet  # noqa: E402

from dractl import model  # noqa: E402  (the repository root must be on sys.path first)
from dractl._proto import dra_v1_pb2, dra_v1_pb2_grpc  # noqa: E402
from dractl.kube import claims as kube_claims  # noqa: E402
from dractl.kube import client as kube_client  # noqa: E402
from dractl.model import encode  # noqa: E402
from dractl.node import agent, cdi, fakegpu, plugin, sharing, state  # noqa: E402

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


NAMESPACE = "bench"


class Claims:
    """An in-memory ClaimSource: the node's own work, without the API read."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], model.ResourceClaim] = {}

    def get_claim(self, namespace: str, name: str) -> model.ResourceClaim | None:
        return self.claims.get((namespace, name))

    def claims_on_node(self, *, driver: str, node: str) -> list[model.ResourceClaim]:
        # What the state rebuilds from when it starts without a checkpoint: no pod holds these claims.
        return []

    def put(self, name: str, devices: Sequence[str], *, index: int) -> state.ClaimRef:
        uid = f"0c1d2e3f-0000-4000-8000-{index:012d}"
        results = tuple(
            model.DeviceRequestAllocationResult(request="gpu", driver=DRIVER, pool=NODE, device=d) for d in devices
        )
        self.claims[("bench", name)] = model.ResourceClaim(
            meta=model.ObjectMeta(name=name, namespace="bench", uid=uid),
            spec=model.ResourceClaimSpec(),
            allocation=model.AllocationResult(results=results),
        )
        return state.ClaimRef(namespace=NAMESPACE, name=name, uid=uid)


class ApiClaims:
    """Claims created (allocated) in a real kube-apiserver, read back with the agent's live GET."""

    def __init__(self, client: kube_client.Client, reader: kube_client.Client) -> None:
        self.client = client
        self.source = kube_claims.ApiClaimSource(reader)

    def get_claim(self, namespace: str, name: str) -> model.ResourceClaim | None:
        return self.source.get_claim(namespace, name)

    def claims_on_node(self, *, driver: str, node: str) -> Sequence[model.ResourceClaim]:
        return self.source.claims_on_node(driver=driver, node=node)

    def put(self, name: str, devices: Sequence[str], *, index: int) -> state.ClaimRef:
        from support import kube_objects

        created = kube_objects.create_allocated_claim(
            self.client,
            name,
            namespace=NAMESPACE,
            spec=kube_objects.ONE_GPU,
            allocated=kube_objects.allocation(NODE, devices),
        )
        return state.ClaimRef(namespace=NAMESPACE, name=name, uid=str(created["metadata"]["uid"]))


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def prepare_latency(
    devices: Sequence[str], *, dynamic_mig: bool, rounds: int, claims: Claims | ApiClaims, label: str
) -> list[float]:
    """Seconds per NodePrepareResources round trip, one claim per call (claims named `<label>-<i>`)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="drab-", dir="/tmp"))
    try:
        gpus = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=NODE)
        st = state.State(
            driver_name=DRIVER,
            node_name=NODE,
            backend=gpus,
            claims=claims,
            cdi_root=work / "cdi",
            state_dir=work / "state",
            mps=sharing.FakeMps(root=work / "mps"),
            common_edits=cdi.NoCommonEdits(),
            dynamic_mig=dynamic_mig,
            device_nodes=False,
        )
        sockets = plugin.socket_paths(driver_name=DRIVER, registrar_dir=work / "reg", plugins_dir=work / "plugins")
        server = plugin.Plugin(driver_name=DRIVER, sockets=sockets, preparer=st)
        server.start()
        timings: list[float] = []
        try:
            with grpc.insecure_channel(f"unix:{sockets.dra}") as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
                # Every claim exists before the first call, as the kubelet calls long after the scheduler wrote it:
                # the API server is not still busy with the claim's own writes when it is read.
                refs = [claims.put(f"{label}-{i}", devices, index=i) for i in range(rounds + 5)]
                for i, ref in enumerate(refs):
                    message = dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
                    started = time.perf_counter()
                    response = stub.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(claims=[message]), timeout=30
                    )
                    elapsed = time.perf_counter() - started
                    if response.claims[ref.uid].error:
                        raise SystemExit(f"prepare failed: {response.claims[ref.uid].error}")
                    stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[message]), timeout=30)
                    if i >= 5:  # the first calls warm up the channel and the imports
                        timings.append(elapsed)
        finally:
            server.stop(grace_s=0)
        return timings
    finally:
        shutil.rmtree(work, ignore_errors=True)


class EncodingPublisher:
    """Stands in for the API: encodes the slices as the real publisher would before writing."""

    def __init__(self) -> None:
        self.published_at: float | None = None

    def publish(self, desired: Sequence[model.ResourceSlice]) -> None:
        for value in desired:
            encode.resource_slice(value)
        if self.published_at is None:
            self.published_at = time.perf_counter()


def startup(plane: Any | None) -> tuple[str, float, float]:
    """(target, seconds to slices published, seconds to the plugin serving), from Agent.start(); to `plane`'s
    kube-apiserver when given, else to slices computed and encoded."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="drab-", dir="/tmp"))
    try:
        settings = kubelet.agent_settings(work, work, node_name=NODE)
        publisher: object
        stamps: list[float] = []
        if plane is None:
            target = "slices computed and encoded (no kube-apiserver binaries)"
            fake = EncodingPublisher()
            publisher = fake
        else:
            from dractl.node import publish

            client = kube_client.connect(plane.kubeconfig)
            real = publish.Publisher(client, driver=DRIVER, node_name=NODE)
            target = f"a real kube-apiserver ({plane.url})"

            class Timed:
                def publish(self, desired: Sequence[model.ResourceSlice]) -> None:
                    real.publish(desired)
                    stamps.append(time.perf_counter())

            publisher = Timed()
        node_agent = agent.Agent(settings, claims=Claims(), publisher=publisher)  # type: ignore[arg-type]
        started = time.perf_counter()
        node_agent.start()
        serving = time.perf_counter() - started
        published_at = fake.published_at if plane is None else (stamps[0] if stamps else None)
        node_agent.stop()
        if published_at is None:
            raise SystemExit("the agent did not publish its slices")
        return target, published_at - started, serving
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _row(label: str, timings: list[float]) -> str:
    return (
        f"{label:44} {statistics.median(timings) * 1e3:8.2f} {_percentile(timings, 0.99) * 1e3:8.2f} {len(timings):7}"
    )


@contextlib.contextmanager
def _control_plane(wanted: bool) -> Iterator[Any | None]:
    """The test control plane (kube-apiserver + etcd) with this benchmark's Node and namespace, or None."""
    if not wanted:
        yield None
        return
    try:
        import controlplane
        from support import kube_objects

        plane = controlplane.ControlPlane.start()
    except Exception as err:  # noqa: BLE001 - the benchmark falls back, and says so
        print(f"(no control plane: {err}; in-memory claims and computed slices only)", file=sys.stderr)
        yield None
        return
    try:
        client = kube_client.connect(plane.kubeconfig)
        # The publisher makes the Node the slices' owner, so the Node must exist.
        client.create(kube_client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kube_objects.make_namespace(client, NAMESPACE)
        client.close()
        yield plane
    finally:
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed prepares per claim shape (default: 200)")
    parser.add_argument(
        "--no-apiserver", action="store_true", help="in-memory claims and start-up to computed slices only"
    )
    args = parser.parse_args()
    # Per-call log lines would be most of the work measured; warnings still show.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.basicConfig(level=logging.WARNING)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; {_load()}")
    shapes = (
        ("1 full GPU", ["gpu-0"], False),
        ("8 full GPUs", [f"gpu-{i}" for i in range(8)], False),
        ("1 dynamic MIG device (1g.10gb)", ["gpu-1-mig-1g10gb-19-0"], True),
    )
    with _control_plane(not args.no_apiserver) as plane:
        print(f"{'NodePrepareResources (one claim)':44} {'p50 ms':>8} {'p99 ms':>8} {'rounds':>7}")
        sources: list[tuple[str, Any]] = []
        if plane is not None:
            writer, reader = kube_client.connect(plane.kubeconfig), kube_client.connect(plane.kubeconfig)
            sources.append(("with the live claim GET", ApiClaims(writer, reader)))
        sources.append(("claims in memory", Claims()))
        for source_label, source in sources:
            for index, (label, devices, dynamic) in enumerate(shapes):
                timings = prepare_latency(
                    devices, dynamic_mig=dynamic, rounds=args.rounds, claims=source, label=f"s{index}"
                )
                print(_row(f"{label}, {source_label}", timings))
        if plane is not None:
            timings = []
            for i in range(args.rounds):
                started = time.perf_counter()
                reader.get_resource_claim(NAMESPACE, f"s0-{i}")
                timings.append(time.perf_counter() - started)
            print(_row("the claim GET alone (client.get_resource_claim)", timings))
            writer.close()
            reader.close()
        target, published, serving = startup(plane)
    print(f"start-up, 8 GPUs: slices published after {published:.3f} s, plugin serving after {serving:.3f} s")
    print(f"  (published to {target})")
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
