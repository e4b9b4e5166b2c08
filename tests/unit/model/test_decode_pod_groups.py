"""Decoding PodGroups of both APIs and the pods (and workload templates) that join them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dractl import model
from dractl.model import decode

V1ALPHA2 = "scheduling.k8s.io/v1alpha2"
V1ALPHA1 = "scheduling.x-k8s.io/v1alpha1"
GROUP = "m.yaml: PodGroup ml/train: "


def _group(spec: Any, *, api: str = V1ALPHA2, name: str = "train") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "PodGroup", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def _gang(min_count: Any = 4, **spec: Any) -> dict[str, Any]:
    return _group({"schedulingPolicy": {"gang": {"minCount": min_count}}, **spec})


def _pod(name: str = "w-0", *, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", **({"labels": labels} if labels else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c"}], **(spec or {})},
    }


def _job(*, template_spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "c"}], **(template_spec or {})}}
    if labels:
        template["metadata"] = {"labels": labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"parallelism": 4, "template": template},
    }


def _load(*documents: dict[str, Any]) -> model.Objects:
    import yaml

    return decode.load_text(yaml.safe_dump_all(documents), file="m.yaml")


def test_v1alpha2_gang_with_topology_and_claims_decodes() -> None:
    """Guards: a scheduling.k8s.io/v1alpha2 PodGroup keeps minCount, its one topology key and its claims, namespaced."""
    claims = [{"name": "shared", "resourceClaimName": "dataset"}, {"name": "t", "resourceClaimTemplateName": "one"}]
    objects = _load(_gang(8, schedulingConstraints={"topology": [{"key": "rack"}]}, resourceClaims=claims))
    assert objects.pod_groups == (
        model.PodGroup(
            meta=model.ObjectMeta(name="train", namespace="ml"),
            api=model.PodGroupApi.WORKLOAD,
            min_count=8,
            topology_key="rack",
            resource_claims=(
                model.PodResourceClaim(name="shared", resource_claim_name="dataset"),
                model.PodResourceClaim(name="t", resource_claim_template_name="one"),
            ),
            source=model.Source(file="m.yaml", document=0),
        ),
    )
    assert objects.warnings == ()


def test_v1alpha2_basic_policy_has_no_minimum() -> None:
    """Guards: `basic: {}` decodes as a group without a gang minimum."""
    (group,) = _load(_group({"schedulingPolicy": {"basic": {}}})).pod_groups
    assert group.min_count is None and group.topology_key is None


def test_seed_004_coscheduling_pod_group_decodes_as_written() -> None:
    """Guards: the seed article's scheduling.x-k8s.io/v1alpha1 PodGroup (minMember 8, timeout 300) is read, not
    skipped, in the default namespace."""
    text = (
        "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata:\n  name: distributed-training\n"
        "spec:\n  minMember: 8\n  scheduleTimeoutSeconds: 300\n"
    )
    objects = decode.load_text(text, file="seed.yaml")
    (group,) = objects.pod_groups
    assert (group.key, group.api, group.min_count, group.schedule_timeout_seconds) == (
        "default/distributed-training",
        model.PodGroupApi.COSCHEDULING,
        8,
        300,
    )
    assert objects.warnings == ()


def test_coscheduling_min_resources_are_quantities() -> None:
    """Guards: v1alpha1 `minResources` amounts are parsed as quantities."""
    (group,) = _load(_group({"minMember": 2, "minResources": {"cpu": "4"}}, api=V1ALPHA1)).pod_groups
    assert group.min_resources == {"cpu": model.quantity.parse("4")}


def test_pods_join_by_field_or_label_also_from_job_templates() -> None:
    """Guards: spec.schedulingGroup.podGroupName (v1alpha2) and the scheduling.x-k8s.io/pod-group label (v1alpha1)
    join a pod to its group, on Pods and on every pod a Job's template makes."""
    by_field = {"schedulingGroup": {"podGroupName": "train"}}
    objects = _load(
        _gang(),
        _group({"minMember": 1}, api=V1ALPHA1, name="seed"),
        _pod("a", spec=by_field),
        _pod("b", labels={model.POD_GROUP_LABEL: "seed"}),
        _job(template_spec=by_field),
    )
    refs = [(pod.meta.name, pod.pod_group) for pod in objects.pods]
    workload = model.PodGroupRef(name="train", api=model.PodGroupApi.WORKLOAD)
    assert refs == [
        ("a", workload),
        ("b", model.PodGroupRef(name="seed", api=model.PodGroupApi.COSCHEDULING)),
        *[(f"train-{i}", workload) for i in range(4)],
    ]


def test_a_pod_without_a_group_joins_none() -> None:
    """Guards: a plain pod has no PodGroup."""
    assert _load(_pod()).pods[0].pod_group is None


CASES: list[tuple[str, list[dict[str, Any]], list[str]]] = [
    (
        "min-count-zero",
        [_gang(0)],
        [GROUP + "spec.schedulingPolicy.gang.minCount: must be a positive integer (at most 2147483647), got a number"],
    ),
    (
        "min-count-string",
        [_gang("4")],
        [
            GROUP + "spec.schedulingPolicy.gang.minCount: must be a positive integer (at most 2147483647), "
            'got the string "4"'
        ],
    ),
    (
        "min-count-missing",
        [_group({"schedulingPolicy": {"gang": {}}})],
        [
            GROUP + "spec.schedulingPolicy.gang.minCount: required: how many pods must have a place before any of "
            "them is bound"
        ],
    ),
    (
        "two-policies",
        [_group({"schedulingPolicy": {"basic": {}, "gang": {"minCount": 2}}})],
        [GROUP + "spec.schedulingPolicy: exactly one of basic: {} or gang: {minCount: N} is required"],
    ),
    (
        "no-policy",
        [_group({})],
        [GROUP + "spec.schedulingPolicy: exactly one of basic: {} or gang: {minCount: N} is required"],
    ),
    (
        "two-topology-constraints",
        [_gang(schedulingConstraints={"topology": [{"key": "rack"}, {"key": "block"}]})],
        [
            GROUP + "spec.schedulingConstraints.topology: at most 1 topology constraint in Kubernetes 1.36, got 2: "
            "keep one key"
        ],
    ),
    (
        "topology-without-key",
        [_gang(schedulingConstraints={"topology": [{}]})],
        [GROUP + "spec.schedulingConstraints.topology[0].key: required (a node label key, e.g. rack)"],
    ),
    (
        "claim-with-both-sources",
        [_gang(resourceClaims=[{"name": "d", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}])],
        [
            GROUP + "spec.resourceClaims[0]: exactly one of resourceClaimName or resourceClaimTemplateName is allowed, "
            "but both are set"
        ],
    ),
    (
        "claim-with-neither-source",
        [_gang(resourceClaims=[{"name": "d"}])],
        [GROUP + "spec.resourceClaims[0]: exactly one of resourceClaimName or resourceClaimTemplateName is required"],
    ),
    (
        "claim-names-repeat",
        [_gang(resourceClaims=[{"name": "d", "resourceClaimName": "a"}, {"name": "d", "resourceClaimName": "b"}])],
        [GROUP + 'spec.resourceClaims[1].name: duplicate claim name "d"'],
    ),
    (
        "min-member-negative",
        [_group({"minMember": -1}, api=V1ALPHA1)],
        [GROUP + "spec.minMember: must be a positive integer (at most 2147483647), got a number"],
    ),
    (
        "min-member-missing",
        [_group({"scheduleTimeoutSeconds": 30}, api=V1ALPHA1)],
        [GROUP + "spec.minMember: required: how many pods must have a place before any of them is bound"],
    ),
    (
        "timeout-zero",
        [_group({"minMember": 2, "scheduleTimeoutSeconds": 0}, api=V1ALPHA1)],
        [GROUP + "spec.scheduleTimeoutSeconds: must be a positive number of seconds, got 0"],
    ),
    (
        "coscheduling-unknown-field",
        [_group({"minMember": 2, "minCount": 2}, api=V1ALPHA1)],
        [
            GROUP + "spec.minCount: a scheduling.k8s.io/v1alpha2 field (under schedulingPolicy.gang): this API's is "
            "spec.minMember"
        ],
    ),
    (
        "old-workload-version",
        [_gang() | {"apiVersion": "scheduling.k8s.io/v1alpha1"}],
        [
            GROUP + "apiVersion: PodGroup is served as scheduling.k8s.io/v1alpha2: write apiVersion: "
            "scheduling.k8s.io/v1alpha2"
        ],
    ),
    (
        "duplicate-group",
        [_gang(), _gang()],
        [
            "m.yaml: PodGroup ml/train: metadata.name: given twice, first in m.yaml (document 1); the API holds one "
            "object per name: remove one or rename it"
        ],
    ),
    (
        "pod-joins-by-both-apis",
        [_pod(spec={"schedulingGroup": {"podGroupName": "train"}}, labels={model.POD_GROUP_LABEL: "train"})],
        [
            "m.yaml: Pod ml/w-0: spec.schedulingGroup: the pod joins PodGroup train here and train by the label "
            "scheduling.x-k8s.io/pod-group in metadata.labels: a pod joins one PodGroup, through one API: keep one"
        ],
    ),
    (
        "scheduling-group-without-name",
        [_pod(spec={"schedulingGroup": {}})],
        ["m.yaml: Pod ml/w-0: spec.schedulingGroup.podGroupName: required"],
    ),
    (
        "pod-label-names-a-v1alpha2-group",
        [_gang(), _pod(labels={model.POD_GROUP_LABEL: "train"})],
        [
            "m.yaml: Pod ml/w-0: metadata.labels[scheduling.x-k8s.io/pod-group]: PodGroup ml/train is a "
            "scheduling.k8s.io/v1alpha2 PodGroup, which pods join with spec.schedulingGroup: {podGroupName: train}; "
            "this field is for scheduling.x-k8s.io/v1alpha1 PodGroups"
        ],
    ),
    (
        "job-field-names-a-v1alpha1-group",
        [_group({"minMember": 4}, api=V1ALPHA1), _job(template_spec={"schedulingGroup": {"podGroupName": "train"}})],
        [
            "m.yaml: Job ml/train: spec.template.spec.schedulingGroup.podGroupName: PodGroup ml/train is a "
            "scheduling.x-k8s.io/v1alpha1 PodGroup, which pods join with the label scheduling.x-k8s.io/pod-group: "
            "train; this field is for scheduling.k8s.io/v1alpha2 PodGroups"
        ],
    ),
]


@pytest.mark.parametrize(("manifests", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_pod_groups_get_one_line_each(
    problems: Callable[..., list[str]], manifests: list[dict[str, Any]], expected: list[str]
) -> None:
    """Guards: each malformed PodGroup field, and each pod joining a group wrongly, is one line naming the file,
    the object and the field."""
    assert problems(manifests) == expected


def test_other_pod_group_apis_are_still_skipped() -> None:
    """Guards: a PodGroup of another scheduler (Volcano) is skipped with a warning, named in its namespace."""
    objects = _load(_group({"minMember": 2}, api="scheduling.volcano.sh/v1beta1"))
    assert objects.pod_groups == ()
    assert objects.warnings == ("m.yaml: PodGroup ml/train: skipped (not used by allocation)",)


def test_one_pod_group_of_each_api_may_share_a_name() -> None:
    """Guards: a v1alpha2 and a v1alpha1 PodGroup of one name are two objects (different resources), and a pod
    joining either through its own API's field is valid."""
    objects = _load(
        _gang(),
        _group({"minMember": 1}, api=V1ALPHA1),
        _pod("a", spec={"schedulingGroup": {"podGroupName": "train"}}),
        _pod("b", labels={model.POD_GROUP_LABEL: "train"}),
    )
    assert [g.api for g in objects.pod_groups] == [model.PodGroupApi.WORKLOAD, model.PodGroupApi.COSCHEDULING]
