"""Opaque configs the node agent would refuse: `simulate` allocates the claim as a scheduler would and marks it with
a warning in every output format and in trace replays, leaving every other answer as it was."""

from __future__ import annotations

import io
import json
import pathlib
import re
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from dractl import cli, config, simulate
from dractl.simulate import EXAMPLES, trace

AGENT = "the node agent will refuse to prepare it"
V1BETA1 = "apiVersion: resource.nvidia.com/v1beta1"

# Claim `odd` as a scheduler would meet it in a live cluster: each time with one config the node agent refuses.
# name -> (requests, config parameters (YAML flow), requests the config names, the agent's words after the claim).
ODD = {
    "unknown-field": (
        ["{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}"],
        f"{{{V1BETA1}, kind: GpuConfig, tuning: fast}}",
        [],
        "status.allocation.devices.config[0] (FromClaim) opaque.parameters.tuning: unknown field "
        "(allowed: apiVersion, kind, sharing)",
    ),
    "mig-time-slicing": (
        ["{name: slice, exactly: {deviceClassName: mig.nvidia.com}}"],
        f"{{{V1BETA1}, kind: MigDeviceConfig, "
        "sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}}",
        [],
        "status.allocation.devices.config[0] (FromClaim) opaque.parameters.sharing.timeSlicingConfig: unknown field "
        "(allowed: mpsConfig, strategy)",
    ),
    "other-driver-version": (
        ["{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}"],
        "{apiVersion: resource.nvidia.com/v1, kind: GpuConfig}",
        [],
        "status.allocation.devices.config[0] (FromClaim) opaque.parameters.apiVersion: must be "
        "resource.nvidia.com/v1beta1, got 'resource.nvidia.com/v1'",
    ),
    "gpu-config-scoped-to-a-mig-request": (
        [
            "{name: large, exactly: {deviceClassName: mig.nvidia.com}}",
            "{name: small, exactly: {deviceClassName: mig.nvidia.com}}",
        ],
        f"{{{V1BETA1}, kind: GpuConfig}}",
        ["large"],
        "status.allocation.devices.config[0] (FromClaim) opaque.parameters.kind: GpuConfig cannot apply to request "
        "'large', a MIG device (use MigDeviceConfig)",
    ),
}


def _claim(requests: list[str], parameters: str | None, scope: list[str]) -> str:
    text = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: odd, namespace: default}\n"
    text += "spec:\n  devices:\n    requests:\n" + "".join(f"    - {r}\n" for r in requests)
    if parameters is not None:
        named = f"requests: [{', '.join(scope)}], " if scope else ""
        text += f"    config:\n    - {{{named}opaque: {{driver: gpu.nvidia.com, parameters: {parameters}}}}}\n"
    return text


def _simulate(tmp_path: pathlib.Path, manifest: str, output: config.OutputFormat) -> tuple[int, str, str]:
    path = tmp_path / "odd.yaml"
    path.write_text(manifest, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = simulate.run(config.Simulate(paths=(EXAMPLES, path), output=output), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _claims(out: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(out)["claims"]}


@pytest.mark.parametrize("name", sorted(ODD))
def test_a_claim_the_agent_would_refuse_is_allocated_with_its_warning(name: str, tmp_path: pathlib.Path) -> None:
    """Guards: a claim whose opaque config the node agent refuses is allocated (exit 0) and carries the agent's
    message naming the claim and the field; every claim's allocation, the odd one's included, is what it is
    without the config."""
    requests, parameters, scope, words = ODD[name]
    code, out, err = _simulate(tmp_path, _claim(requests, parameters, scope), config.OutputFormat.JSON)
    plain_code, plain_out, plain_err = _simulate(tmp_path, _claim(requests, None, []), config.OutputFormat.JSON)
    assert (code, plain_code, plain_err) == (0, 0, ""), err + plain_err
    odd, plain = _claims(out), _claims(plain_out)
    assert odd["odd"]["status"] == "allocated"
    assert odd["odd"]["warnings"] == [f"{AGENT}: claim default/odd: {words}"]
    assert {key: c["warnings"] for key, c in odd.items() if key != "odd"} == dict.fromkeys(set(odd) - {"odd"}, [])
    for entry in (*odd.values(), *plain.values()):
        entry["allocation"]["devices"].pop("config", None)
        entry["warnings"] = []
    assert odd == plain


def test_a_class_config_the_agent_would_refuse_marks_the_claims_it_reaches(tmp_path: pathlib.Path) -> None:
    """Guards: a DeviceClass config the agent refuses is one stderr warning naming the class and field, and each claim
    allocated through the class carries the agent's message with source FromClass."""
    manifest = (
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: tuned-gpu}\nspec:\n"
        "  selectors:\n  - cel: {expression: 'device.driver == \"gpu.nvidia.com\"'}\n"
        f"  config:\n  - opaque: {{driver: gpu.nvidia.com, parameters: {{{V1BETA1}, kind: GpuConfig, x: 1}}}}\n---\n"
        + _claim(["{name: gpu, exactly: {deviceClassName: tuned-gpu}}"], None, [])
    )
    code, out, err = _simulate(tmp_path, manifest, config.OutputFormat.JSON)
    assert code == 0
    assert err.splitlines() == [
        f"warning: {tmp_path / 'odd.yaml'}: DeviceClass tuned-gpu: spec.config[0].opaque.parameters.x: unknown field "
        "(allowed: apiVersion, kind, sharing) (the node agent will refuse to prepare a claim with this config)"
    ]
    assert _claims(out)["odd"]["warnings"] == [
        f"{AGENT}: claim default/odd: status.allocation.devices.config[0] (FromClass) opaque.parameters.x: "
        "unknown field (allowed: apiVersion, kind, sharing)"
    ]


def test_an_unallocated_claim_is_warned_of_its_own_config(tmp_path: pathlib.Path) -> None:
    """Guards: a claim that cannot be allocated keeps its reasons and is warned of its own refused config, as the
    chart's admission policy words it."""
    requests = ["{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 40}}"]
    manifest = _claim(requests, "{apiVersion: resource.nvidia.com/v1}", [])
    code, out, _ = _simulate(tmp_path, manifest, config.OutputFormat.JSON)
    odd = _claims(out)["odd"]
    assert code == 0 and odd["status"] == "not allocated" and odd["reasons"]
    assert odd["warnings"] == [
        f"{AGENT}: claim default/odd: spec.devices.config[0].opaque.parameters.apiVersion: must be "
        "resource.nvidia.com/v1beta1, got 'resource.nvidia.com/v1'"
    ]


def _flat(text: str) -> str:
    """A rich table's text with its borders gone and every run of spaces one space: a wrapped cell reads as one line."""
    return re.sub(r"[\s│┃|]+", " ", text)


def test_the_warning_shows_in_table_json_and_yaml(tmp_path: pathlib.Path) -> None:
    """Guards: the warning is under the claim in the table (with a count in the footer), in the claim's `warnings` in
    JSON, and a `# dractl: warning:` comment right above the claim in YAML, which still reads as the same claims."""
    requests, parameters, scope, words = ODD["unknown-field"]
    manifest = _claim(requests, parameters, scope)
    warning = f"{AGENT}: claim default/odd: {words}"
    code, table, _ = _simulate(tmp_path, manifest, config.OutputFormat.TABLE)
    assert code == 0
    assert f"warning: {warning}" in _flat(table)
    assert "claims allocated. 1 the node agent will refuse to prepare." in table
    _, as_json, _ = _simulate(tmp_path, manifest, config.OutputFormat.JSON)
    assert _claims(as_json)["odd"]["warnings"] == [warning]
    _, as_yaml, _ = _simulate(tmp_path, manifest, config.OutputFormat.YAML)
    documents = as_yaml.split("---\n")
    above = next(i for i, d in enumerate(documents) if "\n  name: odd\n" in d) - 1
    assert documents[above].splitlines()[-1] == f"# dractl: warning: {warning}"
    claims = [d for d in yaml.safe_load_all(as_yaml)]
    assert [c["metadata"]["name"] for c in claims] == list(_claims(as_json))


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.main, ["simulate", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def odd_trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A short generated trace whose first arriving claim has an unknown field in its GpuConfig and never departs."""
    document = json.loads(json.dumps(trace.generate("mix=reference,seed=1,claims=3,a100=1").document))
    first = document["spec"]["events"][0]["arrive"]
    first["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": first_kind(first), "x": 1},
            }
        }
    ]
    path = tmp_path_factory.mktemp("trace") / "odd.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def first_kind(claim: dict[str, Any]) -> str:
    """The config kind that fits the claim's devices."""
    classes = {r["exactly"]["deviceClassName"] for r in claim["spec"]["devices"]["requests"]}
    return "MigDeviceConfig" if classes == {"mig.nvidia.com"} else "GpuConfig"


def test_a_trace_replays_a_claim_the_agent_would_refuse_with_its_warning(odd_trace: pathlib.Path) -> None:
    """Guards: --trace replays a claim whose config the agent refuses (exit 0, one stderr warning naming the event's
    claim and field) and marks it in the table, in JSON and in YAML."""
    table = _invoke("--trace", str(odd_trace))
    assert table.exit_code == 0, table.stderr
    [line] = table.stderr.splitlines()
    assert line.startswith("warning: ") and ": ResourceClaim default/c-00001: spec.devices.config[0]" in line
    assert ".opaque.parameters.x: unknown field (allowed: apiVersion, kind, sharing)" in line
    words = "opaque.parameters.x: unknown field (allowed: apiVersion, kind, sharing)"
    assert "1 claims the node agent will refuse to prepare, under binpack:" in table.stdout
    assert f"  default/c-00001: warning: {AGENT}: claim default/c-00001: status.allocation" in table.stdout
    as_json = _invoke("--trace", str(odd_trace), "-o", "json")
    [run] = json.loads(as_json.stdout)["runs"]
    warned = {c["name"]: c["warnings"] for c in run["claims"] if c["warnings"]}
    assert list(warned) == ["c-00001"] and warned["c-00001"][0].endswith(words)
    as_yaml = _invoke("--trace", str(odd_trace), "-o", "yaml")
    assert f"# dractl: warning: {warned['c-00001'][0]}\n---\n" in as_yaml.stdout
