"""What `dractl explain` prints: the text layout, and JSON/YAML carrying the same content."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from dractl import config, model
from dractl.explain import output, reasoning


def _result(request: str, device: str, pool: str = "node-a") -> model.DeviceRequestAllocationResult:
    return model.DeviceRequestAllocationResult(request=request, driver="gpu.example.com", pool=pool, device=device)


ALLOCATED = reasoning.Claim(
    namespace="ns",
    name="train",
    state=reasoning.State.ALLOCATED,
    nodes=("node-a",),
    reserved_for=("pods/trainer",),
    requests=(
        reasoning.Request(
            name="gpu",
            device_class="gpu.example.com",
            selectors=('device.attributes["gpu.example.com"].model == "a100"',),
            count=2,
            devices=(_result("gpu", "gpu-0"), _result("gpu", "gpu-1")),
        ),
    ),
)

CEL_REASON = (
    "selectors[0]: ERROR: <input>:1:40: found no matching overload\n"
    'write instead: device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0\n'
    "note: a quantity compares with compareTo"
)
PENDING = reasoning.Claim(
    namespace="ns",
    name="seed",
    state=reasoning.State.DOES_NOT_FIT,
    requests=(
        reasoning.Request(
            name="gpu",
            device_class="gpu.example.com",
            selectors=('device.capacity["gpu.example.com"].memory >= quantity("40Gi")',),
            count=None,
            reasons=(CEL_REASON,),
        ),
    ),
    constraints=("matchAttribute gpu.example.com/partition4 over gpu",),
    reasons=("search limit reached",),
)

POD = reasoning.Pod(
    namespace="ns",
    name="p",
    state=reasoning.PodState.FITS,
    node_name="",
    node_selector={"pool": "large"},
    candidates=("node-b",),
    node="node-b",
    claims=(
        reasoning.Claim(
            namespace="ns",
            name="p-gpu-",
            state=reasoning.State.FITS,
            nodes=("node-b",),
            created=False,
            template="one-gpu",
            pod_claim="gpu",
            requests=(
                reasoning.Request(
                    name="gpu",
                    device_class="gpu.example.com",
                    selectors=(),
                    count=1,
                    devices=(_result("gpu", "gpu-0", pool="node-b"),),
                ),
            ),
        ),
    ),
)


def _text(explained: reasoning.Claim | reasoning.Pod) -> str:
    out = io.StringIO()
    output.write(explained, output=config.ExplainOutput.TEXT, out=out)
    return out.getvalue()


def test_an_allocated_claim_reads_node_consumers_and_devices() -> None:
    """Guards: the text of an allocated claim: state and node, consumers, and per request class, selector, devices."""
    assert _text(ALLOCATED) == (
        "ResourceClaim ns/train: allocated on node node-a\n"
        "  reserved for: pods/trainer\n"
        "  request gpu: 2 devices of class gpu.example.com\n"
        '    selector: device.attributes["gpu.example.com"].model == "a100"\n'
        "    devices: gpu.example.com/node-a/gpu-0, gpu.example.com/node-a/gpu-1\n"
    )


def test_a_multi_line_reason_continues_indented_under_its_label() -> None:
    """Guards: a CEL message with "write instead" keeps its lines together under the request's `why`; then the
    claim's constraints and claim-level reasons."""
    assert _text(PENDING) == (
        "ResourceClaim ns/seed: pending, does not fit\n"
        "  request gpu: all devices of class gpu.example.com\n"
        '    selector: device.capacity["gpu.example.com"].memory >= quantity("40Gi")\n'
        "    why: selectors[0]: ERROR: <input>:1:40: found no matching overload\n"
        '      write instead: device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0\n'
        "      note: a quantity compares with compareTo\n"
        "  constraint: matchAttribute gpu.example.com/partition4 over gpu\n"
        "  why: search limit reached\n"
    )


def test_a_pod_reads_its_node_constraints_and_each_pod_claim() -> None:
    """Guards: the pod's text names its node selector, the nodes it may use, and each pod claim with its source."""
    assert _text(POD) == (
        "Pod ns/p: claims fit on node node-b\n"
        "  spec.nodeSelector: pool=large\n"
        "  nodes it may use: node-b\n"
        "  pod claim gpu: template one-gpu\n"
        "    ResourceClaim ns/p-gpu-<suffix>: pending, fits on node node-b (nothing is written: a scheduler allocates "
        "it)\n"
        "      not created yet: explained from ResourceClaimTemplate one-gpu\n"
        "      request gpu: 1 device of class gpu.example.com\n"
        "        would get: gpu.example.com/node-b/gpu-0\n"
    )


@pytest.mark.parametrize("explained", [ALLOCATED, PENDING, POD], ids=["allocated", "pending", "pod"])
@pytest.mark.parametrize("fmt", [config.ExplainOutput.JSON, config.ExplainOutput.YAML], ids=["json", "yaml"])
def test_json_and_yaml_carry_the_same_content(
    explained: reasoning.Claim | reasoning.Pod, fmt: config.ExplainOutput
) -> None:
    """Guards: -o json and -o yaml parse to the same document: the explanation as data plus the warnings."""
    out = io.StringIO()
    output.write(explained, output=fmt, warnings=["skipping ResourceSlice x: bad"], out=out)
    parsed = json.loads(out.getvalue()) if fmt is config.ExplainOutput.JSON else yaml.safe_load(out.getvalue())
    key = "pod" if isinstance(explained, reasoning.Pod) else "claim"
    body = output.pod_data(explained) if isinstance(explained, reasoning.Pod) else output.claim_data(explained)
    assert parsed == {key: body, "warnings": ["skipping ResourceSlice x: bad"]}


def test_data_spells_devices_and_modes_as_the_api_does() -> None:
    """Guards: the data form names devices by driver, pool and device, and All mode as allocationMode All."""
    allocated = output.claim_data(ALLOCATED)
    assert allocated["status"] == "allocated" and allocated["nodes"] == ["node-a"]
    assert allocated["requests"][0]["devices"] == [
        {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"},
        {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-1"},
    ]
    pending = output.claim_data(PENDING)["requests"][0]
    assert (pending["allocationMode"], pending["count"], pending["reasons"]) == ("All", None, [CEL_REASON])
