"""`dractl explain` end to end without a cluster: target names, exit codes, one-line errors, warnings."""

from __future__ import annotations

import io
import json
import pathlib
import socket

import pytest
from click.testing import CliRunner
from support import explain_api as api

from dractl import cli, config, explain


@pytest.mark.parametrize(
    ("text", "expected"),
    [("team-a/train", ("team-a", "train")), ("ns/claim.v1-0", ("ns", "claim.v1-0"))],
    ids=["plain", "dotted-name"],
)
def test_a_target_is_namespace_slash_name(text: str, expected: tuple[str, str]) -> None:
    """Guards: NS/NAME parses into the namespace and the object name."""
    assert explain.parse_target(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train", "'train' is not NAMESPACE/NAME"),
        ("/train", "'/train' is not NAMESPACE/NAME"),
        ("ns/", "'ns/' is not NAMESPACE/NAME"),
        ("a/b/c", "'b/c' is not an object name"),
        ("Team/train", "'Team' is not a namespace name"),
        ("ns/-x", "'-x' is not an object name"),
        ("ns.x/y", "'ns.x' is not a namespace name"),
    ],
    ids=["no-slash", "no-namespace", "no-name", "two-slashes", "uppercase", "leading-dash", "dotted-namespace"],
)
def test_a_malformed_target_says_what_is_wrong(text: str, message: str) -> None:
    """Guards: a malformed NS/NAME is refused with one message saying which part is wrong."""
    with pytest.raises(ValueError) as raised:
        explain.parse_target(text)
    assert str(raised.value).startswith(message)


def _settings(kind: config.ExplainKind, target: str, **fields: object) -> config.Explain:
    namespace, name = explain.parse_target(target)
    return config.Explain(kind=kind, namespace=namespace, name=name, **fields)  # type: ignore[arg-type]


def _run(reader: api.FakeReader, settings: config.Explain) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = explain.run(settings, out=out, err=err, connect=lambda _: reader)
    return code, out.getvalue(), err.getvalue()


def _cluster(**extra: list[dict[str, object]]) -> api.FakeReader:
    objects = {
        "deviceclasses": [api.device_class()],
        "resourceslices": [api.resource_slice("node-a", "gpu-0")],
        "nodes": [api.node("node-a")],
        "resourceclaims": [api.resource_claim("ns", "one"), api.resource_claim("ns", "two", count=2)],
    }
    objects.update(extra)
    return api.FakeReader(objects)


def test_a_claim_that_fits_exits_0_with_its_devices() -> None:
    """Guards: explaining a pending claim that fits prints the node and devices and exits 0; the reader is closed."""
    reader = _cluster()
    code, out, err = _run(reader, _settings(config.ExplainKind.CLAIM, "ns/one"))
    assert (code, err) == (0, "")
    assert out.startswith("ResourceClaim ns/one: pending, fits on node node-a")
    assert "would get: gpu.example.com/node-a/gpu-0" in out
    assert reader.closed


def test_a_claim_that_does_not_fit_still_exits_0_with_its_reasons_as_json() -> None:
    """Guards: a claim that cannot fit is an answer, not an error: exit 0, the reasons in the JSON document."""
    code, out, _ = _run(_cluster(), _settings(config.ExplainKind.CLAIM, "ns/two", output=config.ExplainOutput.JSON))
    assert code == 0
    document = json.loads(out)
    assert document["claim"]["status"] == "pending, does not fit"
    assert document["claim"]["requests"][0]["reasons"] == [
        "device class gpu.example.com matches 1 device; 1 pass the request's selectors; "
        "1 of those are free on the candidate nodes (2 needed)"
    ]


def test_a_missing_claim_exits_1_with_one_line() -> None:
    """Guards: a claim that does not exist is one line on stderr naming it, exit 1, nothing on stdout."""
    code, out, err = _run(_cluster(), _settings(config.ExplainKind.CLAIM, "ns/nope"))
    assert (code, out) == (1, "")
    assert err == "dractl explain: ResourceClaim ns/nope not found on the API server https://api.test:6443\n"


def test_a_malformed_slice_is_a_warning_on_stderr_and_the_explanation_goes_on() -> None:
    """Guards: an undecodable object in the cluster is a `warning:` line naming it; the claim is still explained."""
    bad = api.resource_slice("node-b", "gpu-0")
    bad["spec"]["devices"][0]["name"] = "Not A Name"
    code, out, err = _run(
        _cluster(resourceslices=[api.resource_slice("node-a", "gpu-0"), bad]),
        _settings(config.ExplainKind.CLAIM, "ns/one"),
    )
    assert code == 0
    assert err.startswith("warning: skipping ResourceSlice node-b-gpu.example.com: dractl cannot decode it: ")
    assert err.count("\n") == 1
    assert out.startswith("ResourceClaim ns/one: pending, fits on node node-a")


def test_a_pod_with_a_template_is_explained_together() -> None:
    """Guards: `explain pod` reads the pod and its template and explains the claim not created yet."""
    reader = _cluster(
        pods=[api.pod("ns", "p", templates={"gpu": "one-gpu"})],
        resourceclaimtemplates=[api.template("ns", "one-gpu")],
    )
    code, out, err = _run(reader, _settings(config.ExplainKind.POD, "ns/p", output=config.ExplainOutput.YAML))
    assert (code, err) == (0, "")
    assert "status: claims fit" in out and "created: false" in out and "template: one-gpu" in out


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_the_cli_refuses_a_malformed_target_with_exit_2() -> None:
    """Guards: `dractl explain claim NAME` (no namespace) is a usage error: exit 2, the message names NS/NAME."""
    code, out, err = _invoke("explain", "claim", "train")
    assert (code, out) == (2, "")
    assert "Invalid value for NS/NAME: 'train' is not NAMESPACE/NAME" in err


def test_an_unusable_kubeconfig_is_one_line_with_exit_1(tmp_path: pathlib.Path) -> None:
    """Guards: a kubeconfig that does not exist is one line naming it, exit 1, no traceback."""
    missing = tmp_path / "nope.yaml"
    code, out, err = _invoke("explain", "pod", "ns/p", "--kubeconfig", str(missing))
    assert (code, out) == (1, "")
    assert err.startswith(f"dractl explain: cannot use the kubeconfig ({missing}): ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("", "not a kubeconfig: a mapping with clusters, users and contexts is expected, got nothing"),
        ("hello\n", "not a kubeconfig: a mapping with clusters, users and contexts is expected, got a str"),
        ("- a\n", "not a kubeconfig: a mapping with clusters, users and contexts is expected, got a list"),
        (
            "clusters: [\n",
            "not a kubeconfig: line 2, column 1: YAML syntax error: "
            "while parsing a flow node did not find expected node content",
        ),
        (b"\xff\xfe\x00", "not a kubeconfig: not UTF-8 text"),
    ],
    ids=["missing", "empty", "a-word", "a-list", "bad-yaml", "binary"],
)
def test_a_kubeconfig_that_is_none_says_why_in_plain_words(
    tmp_path: pathlib.Path, content: str | bytes | None, problem: str
) -> None:
    """Guards: a kubeconfig that is missing, empty, not YAML, binary or not a mapping is one plain line saying which
    (the official loader said "No configuration found" for a missing file and "'str' object does not support item
    assignment" for a word)."""
    kubeconfig = tmp_path / "kubeconfig"
    if isinstance(content, bytes):
        kubeconfig.write_bytes(content)
    elif content is not None:
        kubeconfig.write_text(content)
    code, out, err = _invoke("explain", "claim", "ns/c", "--kubeconfig", str(kubeconfig))
    assert (code, out, err) == (1, "", f"dractl explain: cannot use the kubeconfig ({kubeconfig}): {problem}\n")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_one_line_naming_it_and_the_resource(tmp_path: pathlib.Path) -> None:
    """Guards: an API server that does not answer is one line naming the server and what was read, exit 1."""
    port = _closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    code, out, err = _invoke("explain", "claim", "ns/c", "--kubeconfig", str(kubeconfig))
    assert (code, out) == (1, "")
    assert err.startswith(
        f"dractl explain: cannot reach the API server https://127.0.0.1:{port} to get ResourceClaim ns/c: "
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize("kind", ["claim", "pod"])
def test_every_explain_flag_states_its_default_and_env_var(kind: str) -> None:
    """Guards: --kubeconfig, --kube-api-qps, --kube-api-burst, --policy, --output and --timeout each state their
    default and name their DRACTL_<FLAG> variable."""
    code, out, _ = _invoke("explain", kind, "--help")
    assert code == 0
    text = " ".join(out.split())
    for flag, env in (
        ("--kubeconfig", "DRACTL_KUBECONFIG"),
        ("--kube-api-qps", "DRACTL_KUBE_API_QPS"),
        ("--kube-api-burst", "DRACTL_KUBE_API_BURST"),
        ("--policy", "DRACTL_POLICY"),
        ("--output", "DRACTL_OUTPUT"),
        ("--timeout", "DRACTL_TIMEOUT"),
    ):
        assert flag in text and f"env var: {env}" in text
    assert text.count("(default:") == 6
    assert "(default: 30 seconds)" in text
