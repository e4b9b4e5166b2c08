"""Claims for pods: upstream's generated names, template copies, and the standalone/pod split."""

from __future__ import annotations

import pytest
from support.simulate_manifests import CLUSTER, claim, load, pod, template

from dractl.simulate import claims

ALPHABET = set("bcdfghjklmnpqrstvwxz2456789")


@pytest.mark.parametrize(
    ("pod_name", "pod_claim", "expected"),
    [
        ("web-0", "gpu", "web-0-gpu-"),
        ("p" * 39, "c" * 16, "p" * 39 + "-" + "c" * 16 + "-"),  # exactly 57: kept whole
        ("a" * 50, "b" * 20, "a" * 39 + "-" + "b" * 15),  # 72 > 57: both cut by 57/72
        ("x" * 100, "y", "x" * 55 + "-"),  # a one-letter claim name is cut to nothing
    ],
    ids=["short", "exactly-57", "both-cut-proportionally", "long-pod-name"],
)
def test_generate_name_follows_upstream_truncation(pod_name: str, pod_claim: str, expected: str) -> None:
    """Guards: generateName is `<pod>-<claim>-`, cut proportionally beyond 57 characters like
    kube-controller-manager."""
    assert claims.generate_name(pod_name, pod_claim) == expected


def test_generated_claim_name_is_deterministic_and_fits_a_name() -> None:
    """Guards: the claim name is generateName plus 5 characters of the API server's alphabet, the same on every run."""
    name = claims.generated_claim_name("a" * 60, "b" * 30, namespace="default")
    assert name == claims.generated_claim_name("a" * 60, "b" * 30, namespace="default")
    base = claims.generate_name("a" * 60, "b" * 30)
    assert name.startswith(base) and len(name) == len(base) + 5 <= 63
    assert set(name[len(base) :]) <= ALPHABET
    assert claims.generated_claim_name("a" * 60, "b" * 30, namespace="other") != name


def test_claim_from_template_copies_metadata_and_spec() -> None:
    """Guards: a generated claim carries the template's claim labels/annotations, the pod-claim-name annotation and a
    controller ownerReference."""
    objects = load(template("tmpl"), pod("trainer", templates={"gpu": "tmpl"}))
    made = claims.claim_from_template(
        objects.resource_claim_templates[0],
        pod=objects.pods[0],
        uid="uid-1",
        pod_claim_name="gpu",
        name="trainer-gpu-x",
    )
    assert made.meta.name.startswith("trainer-gpu-") and made.meta.generate_name == "trainer-gpu-"
    assert made.meta.namespace == "default"
    assert made.meta.labels == {"claim-label": "x"}
    assert made.meta.annotations == {"claim-note": "noted", "resource.kubernetes.io/pod-claim-name": "gpu"}
    assert made.meta.owner_references == (
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "trainer",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        },
    )
    assert made.spec == objects.resource_claim_templates[0].spec
    assert made.allocation is None and made.reserved_for == ()


def test_plan_splits_standalone_claims_from_pod_claims_in_input_order() -> None:
    """Guards: claims no pod uses are standalone in input order; pods keep input order and their claims spec order."""
    objects = load(
        CLUSTER,
        claim("late"),
        pod("first", claims={"shared": "shared"}, templates={"own": "tmpl"}),
        claim("shared"),
        claim("early"),
        template("tmpl"),
        pod("second", claims={"shared": "shared"}),
    )
    plan = claims.plan(objects)
    assert [c.meta.name for c in plan.standalone] == ["late", "early"]
    assert [w.pod.meta.name for w in plan.pods] == ["first", "second"]
    first = plan.pods[0].claims
    assert [item.pod_claim_name for item in first] == ["shared", "own"]
    assert first[0].claim is not None and first[0].claim.meta.name == "shared"
    assert first[1].claim is not None and first[1].name == claims.generated_claim_name(
        "first", "own", namespace="default"
    )


def test_plan_reports_missing_templates_and_claims() -> None:
    """Guards: a pod naming a missing template or claim gets a problem naming the object and the pod field."""
    objects = load(CLUSTER, pod("lonely", claims={"shared": "nope"}, templates={"own": "absent"}))
    items = claims.plan(objects).pods[0].claims
    assert [item.claim for item in items] == [None, None]
    assert (
        items[0].problem
        == "ResourceClaim default/nope does not exist (used by pod default/lonely spec.resourceClaims[0] (shared))"
    )
    assert (
        items[1].problem == "ResourceClaimTemplate default/absent does not exist "
        "(used by pod default/lonely spec.resourceClaims[1] (own))"
    )
    assert items[1].name == claims.generated_claim_name("lonely", "own", namespace="default")


# A claim kube-controller-manager made for pod claim "gpu" of pod "trainer" (uid u-1).
MADE_FOR_TRAINER = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: trainer-gpu-abcde
  annotations: {resource.kubernetes.io/pod-claim-name: gpu}
  ownerReferences: [{apiVersion: v1, kind: Pod, name: trainer, uid: u-1, controller: true, blockOwnerDeletion: true}]
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
"""


def test_plan_reuses_a_claim_already_made_for_the_pod() -> None:
    """Guards: a claim in the input owned by the pod for that pod claim is used instead of a new one
    (upstream's orphan lookup)."""
    objects = load(CLUSTER, MADE_FOR_TRAINER, template("tmpl"), pod("trainer", templates={"gpu": "tmpl"}))
    plan = claims.plan(objects)
    assert plan.standalone == ()
    assert plan.pods[0].claims[0].name == "trainer-gpu-abcde"


def test_a_claim_controlled_by_another_pod_of_that_name_is_not_reused() -> None:
    """Guards: a claim whose controller owner reference has another uid than the pod (a pod deleted and made again
    under its name) is not the pod's, as upstream compares uids: the pod gets a new claim, the old one is standalone."""
    again = pod("trainer", templates={"gpu": "tmpl"}).replace("{name: trainer}", "{name: trainer, uid: u-2}")
    plan = claims.plan(load(CLUSTER, MADE_FOR_TRAINER, template("tmpl"), again))
    assert [c.meta.name for c in plan.standalone] == ["trainer-gpu-abcde"]
    made_now = plan.pods[0].claims[0]
    assert made_now.claim is not None and made_now.name == claims.generated_claim_name(
        "trainer", "gpu", namespace="default"
    )
    assert made_now.claim.meta.owner_references[0]["uid"] == "u-2"


def test_a_generated_name_taken_by_another_claim_gets_the_next_one() -> None:
    """Guards: when the input holds a claim (not the pod's) under the name the pod's claim would get, the pod's claim
    is named as the API server's next try would name it, and the other claim stays a claim of its own."""
    taken = claims.generated_claim_name("trainer", "gpu", namespace="default")
    plan = claims.plan(load(CLUSTER, claim(taken), template("tmpl"), pod("trainer", templates={"gpu": "tmpl"})))
    assert [c.meta.name for c in plan.standalone] == [taken]
    item = plan.pods[0].claims[0]
    assert item.name == claims.generated_claim_name("trainer", "gpu", namespace="default", attempt=1) != taken
    assert item.claim is not None and item.claim.meta.name == item.name


def test_pod_uid_is_kept_or_derived_deterministically() -> None:
    """Guards: pods without a uid get the same derived UUID on every run, distinct per pod."""
    objects = load(pod("a", templates={"g": "t"}), pod("b", templates={"g": "t"}))
    a, b = objects.pods
    assert claims.pod_uid(a) == claims.pod_uid(a) != claims.pod_uid(b)
    assert len(claims.pod_uid(a)) == 36
