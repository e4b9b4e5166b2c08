"""Builders for node state tests: claims with allocations, an in-test ClaimSource, a State on temp dirs."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from dractl import model
from dractl.node import cdi, checkpoint, fakegpu, sharing, state

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
API = "resource.nvidia.com/v1beta1"


class Claims:
    """An in-memory ClaimSource: `put` a claim, `delete` it; counts reads. Its claims on a node are those with a
    result in the node's pool and a consumer in `reservedFor` (a pod there: no pods are modelled). `error`, when
    set, is what every read raises (an API outage)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], model.ResourceClaim] = {}
        self.reads = 0
        self.error: Exception | None = None

    def put(self, claim: model.ResourceClaim) -> state.ClaimRef:
        self.claims[(claim.meta.namespace, claim.meta.name)] = claim
        return state.ClaimRef(namespace=claim.meta.namespace, name=claim.meta.name, uid=claim.meta.uid)

    def delete(self, namespace: str, name: str) -> None:
        self.claims.pop((namespace, name), None)

    def get_claim(self, namespace: str, name: str) -> model.ResourceClaim | None:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return self.claims.get((namespace, name))

    def claims_on_node(self, *, driver: str, node: str) -> list[model.ResourceClaim]:
        if self.error is not None:
            raise self.error
        return [
            c
            for c in self.claims.values()
            if c.reserved_for
            and c.allocation is not None
            and any(r.driver == driver and r.pool == node for r in c.allocation.results)
        ]


def result(
    device: str,
    request: str = "gpu",
    *,
    pool: str = NODE,
    share_id: str | None = None,
    admin: bool = False,
    memory: str | None = None,
    driver: str = DRIVER,
) -> model.DeviceRequestAllocationResult:
    return model.DeviceRequestAllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device,
        share_id=share_id,
        admin_access=True if admin else None,
        consumed_capacity={"memory": model.quantity.parse(memory)} if memory else {},
    )


def config(
    parameters: Mapping[str, Any], *, requests: Sequence[str] = (), source: str = "FromClaim", driver: str = DRIVER
) -> model.DeviceAllocationConfiguration:
    return model.DeviceAllocationConfiguration(
        source=source,
        requests=tuple(requests),
        opaque=model.OpaqueDeviceConfiguration(driver=driver, parameters=dict(parameters)),
    )


def gpu_config(sharing_: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig", **extra}
    if sharing_ is not None:
        raw["sharing"] = dict(sharing_)
    return raw


def claim(
    name: str,
    uid: str,
    results: Sequence[model.DeviceRequestAllocationResult] = (),
    configs: Sequence[model.DeviceAllocationConfiguration] = (),
    *,
    namespace: str = "default",
    allocated: bool = True,
    reserved: bool = False,
) -> model.ResourceClaim:
    """A claim; `reserved` adds a pod to its reservedFor (for `Claims`, a pod on this node)."""
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace=namespace, uid=uid),
        spec=model.ResourceClaimSpec(),
        allocation=model.AllocationResult(results=tuple(results), config=tuple(configs)) if allocated else None,
        reserved_for=(
            (model.ResourceClaimConsumerReference(resource="pods", name=f"pod-{name}", uid=f"pod-{uid}"),)
            if reserved
            else ()
        ),
    )


@dataclasses.dataclass
class Node:
    """A node under test: fake GPUs, claims, MPS fake, dirs, and the State over them."""

    gpus: fakegpu.FakeGpus
    claims: Claims
    mps: sharing.FakeMps
    cdi_root: pathlib.Path
    state_dir: pathlib.Path
    boot_id: pathlib.Path
    proc: pathlib.Path
    dynamic_mig: bool
    warnings: list[state.Notice] = dataclasses.field(default_factory=list)
    common: cdi.CommonEdits = dataclasses.field(default_factory=cdi.NoCommonEdits)

    def state(self) -> state.State:
        """A new State on the same dirs (as after an agent restart)."""
        return state.State(
            driver_name=DRIVER,
            node_name=NODE,
            backend=self.gpus,
            claims=self.claims,
            cdi_root=self.cdi_root,
            state_dir=self.state_dir,
            mps=self.mps,
            common_edits=self.common,
            dynamic_mig=self.dynamic_mig,
            boot_id_path=self.boot_id,
            proc_root=self.proc,
            on_warning=self.warnings.append,
        )

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.iterdir()) if self.cdi_root.exists() else []


def make_node(tmp_path: pathlib.Path, profile: str = "a100-80gb-x8", *, dynamic_mig: bool = False) -> Node:
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("boot-1\n")
    return Node(
        gpus=fakegpu.FakeGpus(fakegpu.load_profile(profile), node_name=NODE),
        claims=Claims(),
        mps=sharing.FakeMps(root=tmp_path / "state" / "mps"),
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        boot_id=boot_id,
        proc=tmp_path / "proc",
        dynamic_mig=dynamic_mig,
    )


def env_of(spec: Mapping[str, Any], device_name: str) -> dict[str, str]:
    """The env a CDI device sets, as a dict."""
    device = next(d for d in spec["devices"] if d["name"] == device_name)
    return dict(item.split("=", 1) for item in device["containerEdits"].get("env", ()))


def container_sees(
    spec: Mapping[str, Any], prepared: Sequence[checkpoint.DeviceRecord], *, requests: Sequence[str] = ()
) -> tuple[dict[str, str], list[str]]:
    """The env and device node paths a container gets that names `requests` of the claim (none: the whole claim), as
    the kubelet and a CDI runtime give them: the kubelet takes the CDI ids of every prepared device whose request
    names hold a named request (of every device when none is named), in the order the prepare returned them; the
    runtime applies the spec's common edits once, then each device's edits in that order, a later value of a variable
    replacing an earlier one, device nodes adding up."""
    ids = [
        cdi_id
        for request in requests or ("",)
        for device in prepared
        if not request or not device.requests or request in device.requests
        for cdi_id in device.cdi_device_ids
    ]
    by_id = {f"{cdi.KIND}={device['name']}": device for device in spec["devices"]}
    edits = [spec.get("containerEdits") or {}, *(by_id[cdi_id].get("containerEdits") or {} for cdi_id in ids)]
    env: dict[str, str] = {}
    nodes: list[str] = []
    for edit in edits:
        env.update(item.split("=", 1) for item in edit.get("env", ()))
        nodes.extend(node["path"] for node in edit.get("deviceNodes", ()) if node["path"] not in nodes)
    return env, nodes
