"""An in-memory `dractl.explain.cluster.Reader` for unit tests: raw objects per resource, and
errors to raise per resource, as `dractl.kube.client.Client` raises them."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dractl.kube import client as kube_client

HOST = "https://api.test:6443"


class FakeReader:
    """Lists and gets raw objects by resource plural; `errors` maps a plural to the error every
    request for it raises. Records whether it was closed."""

    def __init__(
        self,
        objects: Mapping[str, Sequence[dict[str, Any]]] | None = None,
        *,
        errors: Mapping[str, kube_client.ApiError] | None = None,
    ) -> None:
        self.objects = {plural: list(items) for plural, items in (objects or {}).items()}
        self.errors = dict(errors or {})
        self.closed = False

    @property
    def host(self) -> str:
        return HOST

    def _check(self, resource: kube_client.Resource) -> None:
        error = self.errors.get(resource.plural)
        if error is not None:
            raise error

    def get(self, resource: kube_client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        self._check(resource)
        for item in self.objects.get(resource.plural, ()):
            meta = item.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "") == namespace:
                return resource.with_kind(copy.deepcopy(item))  # as the client's get does
        raise kube_client.NotFound(404, "NotFound", f'{resource.plural} "{name}" not found')

    def list(
        self, resource: kube_client.Resource, *, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> kube_client.ListResult:
        self._check(resource)
        items = []
        for item in self.objects.get(resource.plural, ()):
            if namespace and (item.get("metadata") or {}).get("namespace") != namespace:
                continue
            items.append(resource.with_kind(copy.deepcopy(item)))
        return kube_client.ListResult(tuple(items), "1")

    def close(self) -> None:
        self.closed = True


def device_class(name: str = "gpu.example.com", *, driver: str = "gpu.example.com") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def resource_slice(node_name: str, *devices: str, driver: str = "gpu.example.com") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device} for device in devices],
        },
    }


def resource_claim(
    namespace: str, name: str, *, count: int = 1, device_class_name: str = "gpu.example.com", uid: str = ""
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class_name, "count": count}}]
            }
        },
    }


def template(namespace: str, name: str, *, count: int = 1) -> dict[str, Any]:
    claim = resource_claim(namespace, name, count=count)
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"spec": claim["spec"]}}


def pod(
    namespace: str,
    name: str,
    *,
    claims: Mapping[str, str] | None = None,
    templates: Mapping[str, str] | None = None,
    statuses: Mapping[str, str | None] | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    entries = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    entries += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    spec: dict[str, Any] = {"resourceClaims": entries, "containers": [{"name": "main", "image": "busybox"}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    raw: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}, "spec": spec}
    if statuses is not None:
        raw["status"] = {"resourceClaimStatuses": [{"name": k, "resourceClaimName": v} for k, v in statuses.items()]}
    return raw
