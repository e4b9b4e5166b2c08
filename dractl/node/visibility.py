"""What a container of a prepared claim sees: the claim's CDI devices and what the kubelet gets for each.

What it does: `plan(claim_uid=, pool=, devices=)` turns the devices a prepare made ready (request,
device, share, UUID, memory limit, the device's own edits) into the CDI spec's device entries and
the `checkpoint.DeviceRecord`s the kubelet gets back, so that a container sees exactly the devices
of the requests it names, and every device of the claim when it names none: through each device's
own nodes, and through `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES`.

Why a claim of several requests gets one more entry: the kubelet gives a container the CDI ids of
every device whose request names hold the request the container names (of every device when it
names none), in the order the prepare returned them; the runtime applies them in that order, and
an env edit of a later CDI device replaces the same variable of an earlier one. So each device
carries the UUIDs of its own request, and, when the claim has two requests or more, a last entry
carries the UUIDs of all of them under the request name `ALL_REQUESTS`. That name is not a DNS
label, so no container can name it, and the kubelet gives that entry only to a container that names
no request. Without it such a container would see only the last request's devices in its
environment, and CUDA, which obeys `CUDA_VISIBLE_DEVICES`, would hide the others.

What no CDI spec can give: a container that names two requests of one claim, or that uses two
claims, gets every device node, but the variables name the devices of the last request or claim it
lists. The kubelet passes the same CDI ids to every container that names a request, so no entry can
hold a union that depends on the container.

What it must not do: read files or GPUs, or decide which devices a claim gets: it is pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dractl.node import cdi, checkpoint

__all__ = ["ALL_REQUESTS", "Device", "Plan", "plan"]

ALL_REQUESTS = "dractl.all-requests"
"""The request name of a claim's every-request entry (and its CDI device name): a dot makes it no DNS
label, so no container's `resources.claims[].request` can name it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    """One device of a prepared claim, in result order."""

    request: str  # the base request name ("gpu", not "gpu/sub")
    device: str  # its name in the slice
    cdi_name: str  # its CDI device name within the claim (two shares of one device differ)
    share_id: str | None
    uuid: str
    memory_mib: int | None  # a share's memory limit, enforced through MPS
    edits: cdi.ContainerEdits  # its own edits: device nodes, an MPS daemon's pipe and variables


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The spec's devices (CDI name within the claim, edits) and what the kubelet gets, both in order."""

    entries: tuple[tuple[str, cdi.ContainerEdits], ...]
    prepared: tuple[checkpoint.DeviceRecord, ...]


def _visible(devices: Sequence[Device]) -> cdi.ContainerEdits:
    """The variables that make exactly `devices` visible, with the memory limits of those that have one
    (indexed by position, as CUDA numbers the visible devices). Each device counts once."""
    unique = list({(d.device, d.share_id): d for d in devices}.values())
    uuids = ",".join(d.uuid for d in unique)
    env = [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"]
    limits = [f"{n}={d.memory_mib}M" for n, d in enumerate(unique) if d.memory_mib is not None]
    if limits:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    return cdi.ContainerEdits(env=tuple(env))


def plan(*, claim_uid: str, pool: str, devices: Sequence[Device]) -> Plan:
    """The claim's CDI entries and prepared devices. Pure and deterministic: the checkpoint rebuild computes the
    answer a prepare gave from the same devices. A device listed under two requests (admin access, say) is one
    entry whose request names hold both."""
    by_request: dict[str, list[Device]] = {}
    for device in devices:
        by_request.setdefault(device.request, []).append(device)
    entries: list[tuple[str, cdi.ContainerEdits]] = []
    prepared: dict[tuple[str, str | None], checkpoint.DeviceRecord] = {}
    for device in devices:
        key = (device.device, device.share_id)
        known = prepared.get(key)
        if known is not None:
            if device.request not in known.requests:
                prepared[key] = dataclasses.replace(known, requests=(*known.requests, device.request))
            continue
        entries.append((device.cdi_name, device.edits.merged(_visible(by_request[device.request]))))
        prepared[key] = checkpoint.DeviceRecord(
            requests=(device.request,),
            pool=pool,
            device=device.device,
            cdi_device_ids=(cdi.qualified_name(claim_uid, device.cdi_name),),
            share_id=device.share_id,
        )
    records = list(prepared.values())
    if len(by_request) > 1:
        last = devices[-1]
        entries.append((ALL_REQUESTS, _visible(devices)))
        records.append(
            checkpoint.DeviceRecord(
                requests=(ALL_REQUESTS,),
                pool=pool,
                device=last.device,
                cdi_device_ids=(cdi.qualified_name(claim_uid, ALL_REQUESTS),),
            )
        )
    return Plan(entries=tuple(entries), prepared=tuple(records))
