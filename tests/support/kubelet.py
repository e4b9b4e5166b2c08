"""The kubelet's side of a node agent in the tests: its settings on a short socket directory, and the
NodePrepareResources / NodeUnprepareResources calls the kubelet makes over its DRA socket (v1).

`agent_settings` is a `config.NodeAgent` on fake GPUs whose files lie under one directory and whose sockets lie
under another (unix socket paths are limited to 107 bytes: the `sock_dir` fixture), with both HTTP endpoints off.
`prepare` and `unprepare` send one call naming the given claims and return the answer per claim UID. `Slices` is the
publisher of an agent with no API server: it keeps what it is given.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from dractl import config, model
from dractl._proto import dra_v1_pb2, dra_v1_pb2_grpc
from dractl.node import state

NODE = "node-a"
# Generous for a 2-core machine shared with other test runs; a call ends as soon as the agent answers.
RPC_TIMEOUT_S = 60.0


def agent_settings(files: pathlib.Path, sockets: pathlib.Path, **changes: Any) -> config.NodeAgent:
    """A node agent on fake GPUs for node NODE: CDI specs and state under `files`, the registration and DRA sockets
    under `sockets`, /healthz and /metrics off; `changes` replace any field."""
    settings = config.NodeAgent(
        node_name=NODE,
        device_source=config.DeviceSource.FAKE,
        cdi_root=files / "cdi",
        kubelet_registrar_dir=sockets / "reg",
        kubelet_plugins_dir=sockets / "plugins",
        state_dir=files / "state",
        health_port=-1,
        metrics_port=-1,
    )
    return dataclasses.replace(settings, **changes)


class Slices:
    """An agent's `publisher` with no API server behind it: every publish is kept in `published`."""

    def __init__(self) -> None:
        self.published: list[tuple[model.ResourceSlice, ...]] = []

    def publish(self, desired: Sequence[model.ResourceSlice]) -> None:
        self.published.append(tuple(desired))


# A claim as the tests name it (the state's reference) or as the kubelet sends it.
ClaimRef = state.ClaimRef | dra_v1_pb2.Claim


def _claims(refs: tuple[ClaimRef, ...]) -> list[dra_v1_pb2.Claim]:
    return [dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid) for ref in refs]


def prepare(
    dra_socket: pathlib.Path, *refs: ClaimRef, timeout: float = RPC_TIMEOUT_S
) -> Mapping[str, dra_v1_pb2.NodePrepareResourceResponse]:
    """NodePrepareResources of `refs` in one call, as the kubelet sends it; the answer per claim UID."""
    with grpc.insecure_channel(f"unix:{dra_socket}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=_claims(refs)), timeout=timeout
        )
    return response.claims


def unprepare(
    dra_socket: pathlib.Path, *refs: ClaimRef, timeout: float = RPC_TIMEOUT_S
) -> Mapping[str, dra_v1_pb2.NodeUnprepareResourceResponse]:
    """NodeUnprepareResources of `refs` in one call, as the kubelet sends it; the answer per claim UID."""
    with grpc.insecure_channel(f"unix:{dra_socket}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(refs)), timeout=timeout
        )
    return response.claims
