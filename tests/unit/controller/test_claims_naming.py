"""Generated claims: upstream's generateName truncation (one implementation for simulate and the controller),
the claim body made from a template, and how pods are read from the API."""

from __future__ import annotations

import pytest
from support import controller_inputs as build

from dractl.controller import claims as controller
from dractl.model import podclaims
from dractl.simulate import claims as simulate_claims


@pytest.mark.parametrize(
    ("pod_name", "pod_claim", "expected"),
    [
        ("web-0", "gpu", "web-0-gpu-"),
        ("p" * 39, "c" * 16, "p" * 39 + "-" + "c" * 16 + "-"),  # exactly 57: kept whole
        ("p" * 40, "c" * 16, "p" * 39 + "-" + "c" * 15),  # 58: both cut by 57/58, no trailing hyphen
        ("p" * 50, "c" * 30, "p" * 34 + "-" + "c" * 20),
        ("x" * 100, "y", "x" * 55 + "-"),  # a one-letter claim name is cut to nothing
        ("x", "y" * 100, "-" + "y" * 55),  # and so is a one-letter pod name
    ],
    ids=["short", "exactly-57", "58-cut", "both-long", "long-pod-name", "long-claim-name"],
)
def test_generate_name_follows_upstream_truncation(pod_name: str, pod_claim: str, expected: str) -> None:
    """Guards: generateName is `<pod>-<claim>-`, cut proportionally beyond 57 characters as upstream does."""
    name = podclaims.generate_name(pod_name, pod_claim)
    assert name == expected
    assert len(name) + 5 <= 63


def test_simulate_and_the_controller_share_one_naming_function() -> None:
    """Guards: `dractl simulate` names generated claims with the model's function, not a copy of it."""
    assert simulate_claims.generate_name is podclaims.generate_name
    assert simulate_claims.POD_CLAIM_NAME_ANNOTATION == podclaims.POD_CLAIM_NAME_ANNOTATION


def test_the_claim_body_copies_the_template_and_points_at_the_pod() -> None:
    """Guards: the created claim carries the template's labels, annotations and spec, the pod-claim-name annotation
    and a controller owner reference to the pod; the template itself is not shared with the body."""
    template = {
        "spec": {
            "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        }
    }
    pod = build.pod("trainer", uid="u-1")
    body = controller.claim_body(pod, pod_claim_name="gpu", template=template)
    assert body["metadata"] == {
        "generateName": "trainer-gpu-",
        "namespace": "ns",
        "labels": {"team": "ml"},
        "annotations": {"note": "x", podclaims.POD_CLAIM_NAME_ANNOTATION: "gpu"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "trainer",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    assert body["spec"] == template["spec"]["spec"]
    body["spec"]["devices"]["requests"].clear()
    assert template["spec"]["spec"]["devices"]["requests"] == [{"name": "gpu"}]
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceClaim")


def _raw_pod(status: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ns", "uid": "u-1", "resourceVersion": "9"},
        "spec": {
            "containers": [{"name": "main"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        },
        "status": status,
    }


def test_a_pod_is_read_with_its_phase_and_claim_records() -> None:
    """Guards: decode_pod keeps the phase and resourceClaimStatuses (a record without a claim name means
    "not needed"), and ignores malformed records instead of failing the pod."""
    state = controller.decode_pod(
        _raw_pod(
            {
                "phase": "Succeeded",
                "resourceClaimStatuses": [
                    {"name": "gpu", "resourceClaimName": "trainer-gpu-abcde"},
                    {"name": "other"},
                    {"bogus": 1},
                    "junk",
                ],
            }
        )
    )
    assert state is not None
    assert state.phase == "Succeeded" and state.done
    assert state.claim_statuses == {"gpu": "trainer-gpu-abcde", "other": None}
    assert state.pod.meta.resource_version == "9"


@pytest.mark.parametrize(
    "status",
    [None, "junk", {"phase": 3, "resourceClaimStatuses": "junk"}],
    ids=["no-status", "status-not-a-map", "fields-of-wrong-type"],
)
def test_a_pod_with_an_odd_status_reads_as_no_phase_and_no_records(status: object) -> None:
    """Guards: a missing or malformed pod status gives an empty phase and no records, not an exception."""
    state = controller.decode_pod(_raw_pod(status))
    assert state is not None
    assert (state.phase, dict(state.claim_statuses)) == ("", {})


def test_a_pod_the_model_refuses_is_skipped() -> None:
    """Guards: a pod that does not decode gives None (logged by the kube layer), so the informer leaves it out."""
    raw = _raw_pod({})
    raw["spec"] = {"resourceClaims": "not-a-list"}
    assert controller.decode_pod(raw) is None
