"""`dractl explain pod` of a gang member explains its gang: the PodGroup (both APIs) and the other members, planned
as one decision, or why the group cannot be read."""

from __future__ import annotations

import io
import json
from typing import Any

from support import explain_api as api

from dractl import config, explain
from dractl.kube import client as kube_client

# Rack r1: node a1 with two GPUs; rack r2: node b1 with two GPUs.
NODES = [api.node("a1", rack="r1"), api.node("b1", rack="r2")]
SLICES = [api.resource_slice("a1", "gpu-0", "gpu-1"), api.resource_slice("b1", "gpu-0", "gpu-1")]


def _group(name: str, min_count: int, *, topology: str | None = "rack") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def _member(name: str, *, group: str = "train", node: str = "", claim: str = "") -> dict[str, Any]:
    pod = api.pod("ml", name, templates={"gpu": "one"}, statuses={"gpu": claim} if claim else None)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def _reader(pods: list[dict[str, Any]], *, groups: list[dict[str, Any]] = (), **extra: Any) -> api.FakeReader:  # type: ignore[assignment]
    objects = {
        "deviceclasses": [api.device_class()],
        "nodes": NODES,
        "resourceslices": SLICES,
        "resourceclaims": [],
        "resourceclaimtemplates": [api.template("ml", "one")],
        "pods": pods,
        "podgroups": list(groups),
    }
    return api.FakeReader(objects, **extra)


def _explain(reader: api.FakeReader, target: str = "ml/p0", *, output: str = "json") -> tuple[int, str, str]:
    namespace, name = explain.parse_target(target)
    settings = config.Explain(
        kind=config.ExplainKind.POD, namespace=namespace, name=name, output=config.ExplainOutput(output)
    )
    out, err = io.StringIO(), io.StringIO()
    code = explain.run(settings, out=out, err=err, connect=lambda _: reader)
    return code, out.getvalue(), err.getvalue()


def test_a_member_of_a_gang_that_does_not_fit_gives_the_gangs_line() -> None:
    """Guards: a member of a 3-pod gang (1 GPU each, racks of 2 GPUs) is explained with the gang planner's line
    naming the best rack and what is short; the pod cannot be scheduled though its own claim would fit alone."""
    reader = _reader([_member(f"p{i}") for i in range(3)], groups=[_group("train", 3)])
    code, out, err = _explain(reader)
    assert (code, err) == (0, "")
    pod = json.loads(out)["pod"]
    line = (
        "gang ml/train (minCount 3, topology rack): no rack fits 3 pods; best r1 fits 2: 1 pod short, "
        "1 GPU of class gpu.example.com"
    )
    assert pod["gang"] == {
        "podGroup": "ml/train",
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "members": ["p0", "p1", "p2"],
        "bound": [],
        "fits": False,
        "left": [],
        "reason": line,
    }
    assert (pod["status"], pod["reasons"][0]) == ("cannot be scheduled", line)
    code, text, _ = _explain(reader, output="text")
    assert f"  gang: {line}" in text.splitlines()
    assert "    gang members: p0, p1, p2" in text.splitlines()


def test_a_gang_that_fits_and_one_that_runs_say_where() -> None:
    """Guards: a 2-pod gang that fits names the rack it fits in; once both members are bound (claims allocated on
    b1), it runs there, and a third member joining it is planned in that rack only: it does not fit there, so it
    cannot be scheduled, though rack r1 has room."""
    code, out, _ = _explain(_reader([_member("p0"), _member("p1")], groups=[_group("train", 2)]))
    gang = json.loads(out)["pod"]["gang"]
    assert (gang["fits"], gang["reason"]) == (
        True,
        "gang ml/train (minCount 2, topology rack): fits, 2 of 2 member pods in rack r1",
    )

    bound = [_member("p0", node="b1"), _member("p1", node="b1")]
    code, out, _ = _explain(_reader(bound, groups=[_group("train", 2)]))
    gang = json.loads(out)["pod"]["gang"]
    assert (gang["bound"], gang["reason"]) == (
        ["p0", "p1"],
        "gang ml/train (minCount 2, topology rack): runs, 2 member pods bound in rack r2",
    )
    held = [api.resource_claim("ml", f"held-{i}", uid=f"h{i}") for i in range(2)]
    for i, claim in enumerate(held):
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "b1", "device": f"gpu-{i}"}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b1"]}]}
                    ]
                },
            }
        }
    joined = [_member("p0", node="b1", claim="held-0"), _member("p1", node="b1", claim="held-1"), _member("p2")]
    reader = _reader(joined, groups=[_group("train", 2)])
    reader.objects["resourceclaims"] = held
    code, out, _ = _explain(reader, "ml/p2")
    pod = json.loads(out)["pod"]
    line = "gang ml/train (minCount 2, topology rack): fits, 2 of 3 member pods in rack r2; p2 does not fit there"
    assert (pod["gang"]["left"], pod["gang"]["reason"]) == (["p2"], line)
    assert (pod["status"], pod["reasons"][0]) == ("cannot be scheduled", line)


def test_a_pod_group_that_is_missing_or_not_served_is_said_so() -> None:
    """Guards: a member whose PodGroup does not exist, or whose API the server does not serve (a 404 on the
    collection, discovered rather than assumed), gets one line saying which; the pod is still explained."""
    code, out, err = _explain(_reader([_member("p0")]))
    assert (code, err) == (0, "")
    gang = json.loads(out)["pod"]["gang"]
    assert (gang["fits"], gang["reason"]) == (
        None,
        "PodGroup ml/train (scheduling.k8s.io/v1alpha2) does not exist: a scheduler keeps the pod pending until "
        "it does",
    )
    assert json.loads(out)["pod"]["status"] == "claims fit"
    missing = kube_client.NotFound(404, "NotFound", "the server could not find the requested resource")
    code, out, err = _explain(_reader([_member("p0")], errors={"podgroups": missing}))
    assert (code, err) == (0, "")
    assert json.loads(out)["pod"]["gang"]["reason"] == (
        f"PodGroup ml/train (scheduling.k8s.io/v1alpha2): the API server {api.HOST} does not serve it (its API is "
        "alpha: kube-apiserver needs --runtime-config=scheduling.k8s.io/v1alpha2=true and the GenericWorkload "
        "feature gate)"
    )


def test_a_coscheduling_pod_group_is_read_through_its_crd() -> None:
    """Guards: a pod labelled scheduling.x-k8s.io/pod-group joins a v1alpha1 PodGroup (minMember): its gang is
    explained from that API; pods without the label are not members."""
    members = []
    for i in range(3):
        pod = api.pod("ml", f"p{i}", templates={"gpu": "one"})
        pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "seed"} if i < 2 else {}
        members.append(pod)
    group = {"metadata": {"name": "seed", "namespace": "ml"}, "spec": {"minMember": 2}}
    reader = _reader(members, groups=[group])
    code, out, err = _explain(reader)
    assert (code, err) == (0, "")
    gang = json.loads(out)["pod"]["gang"]
    assert (gang["apiVersion"], gang["members"], gang["reason"]) == (
        "scheduling.x-k8s.io/v1alpha1",
        ["p0", "p1"],
        "gang ml/seed (minCount 2): fits, 2 of 2 member pods in the cluster",
    )


def test_a_pod_without_a_pod_group_reads_no_pod_groups() -> None:
    """Guards: explaining a pod that joins no PodGroup sends no request for PodGroups and prints no gang."""
    reader = _reader(
        [api.pod("ml", "p0", templates={"gpu": "one"})], errors={"podgroups": kube_client.NotFound(404, "NotFound", "")}
    )
    code, out, err = _explain(reader)
    assert (code, err) == (0, "")
    assert "gang" not in json.loads(out)["pod"]


def test_a_pod_group_dractl_cannot_decode_is_one_line() -> None:
    """Guards: a PodGroup whose fields dractl refuses (minCount 0, two topology keys) is one line naming it and the
    fields; the pod is still explained."""
    group = _group("train", 1)
    group["spec"]["schedulingPolicy"]["gang"]["minCount"] = 0
    group["spec"]["schedulingConstraints"]["topology"].append({"key": "zone"})
    code, out, err = _explain(_reader([_member("p0")], groups=[group]))
    assert (code, err) == (0, "")
    reason = json.loads(out)["pod"]["gang"]["reason"]
    assert reason.startswith(
        "PodGroup ml/train (scheduling.k8s.io/v1alpha2) cannot be explained: dractl cannot decode it: api: PodGroup "
        "ml/train: spec.schedulingPolicy.gang.minCount: must be a positive integer"
    )
    assert "\n" not in reason
