"""scheduler-plugins' coscheduling PodGroup CRD (`scheduling.x-k8s.io/v1alpha1`, the seed article's API), installed
for the tests that need it and removed after them.

What it does: `COSCHEDULING_CRD` is the CRD as far as dractl reads it; `installed(api)` creates it (waiting out one
still being deleted by an earlier test), waits until the server serves it, and on leaving deletes it and waits until
it is gone. What it must not do: leave the CRD installed (every later test would see the API served).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import controlplane

from dractl.kube import client

CRDS = client.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
# scheduler-plugins' coscheduling PodGroup, as far as dractl reads it: the seed article's API.
COSCHEDULING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup", "listKind": "PodGroupList"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "minMember": {"type": "integer", "format": "int32"},
                                    "scheduleTimeoutSeconds": {"type": "integer", "format": "int32"},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


@contextlib.contextmanager
def installed(api: client.Client) -> Iterator[None]:
    """The coscheduling CRD, served while the block runs (bounded waits), deleted and gone after it."""
    name = COSCHEDULING_CRD["metadata"]["name"]

    def created() -> bool:
        try:
            api.create(CRDS, COSCHEDULING_CRD)
        except client.AlreadyExists:
            return False  # An earlier test's is still being deleted.
        return True

    controlplane.wait_until(created, what="the coscheduling PodGroup CRD is created", timeout=60)
    try:
        controlplane.wait_until(
            lambda: api.serves(client.COSCHEDULING_POD_GROUPS), what="the coscheduling PodGroup CRD is served"
        )
        yield
    finally:
        api.delete(CRDS, name)

        def gone() -> bool:
            try:
                api.get(CRDS, name)
            except client.NotFound:
                return True
            return False

        controlplane.wait_until(gone, what="the coscheduling PodGroup CRD is gone", timeout=60)
