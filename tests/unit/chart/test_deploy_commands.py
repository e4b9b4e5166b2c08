"""The deploying page's commands (docs/helm.md), run as printed: Helm's flags through its engine.

Every shell command of the page's `sh` blocks is read with shlex (comments dropped, continuation lines joined)
and checked: the image built and imported is the one the installs and the upgrade run, each `helm install` /
`helm upgrade` renders with exactly its flags (parsed by Helm's own `--set` parsers, `--reuse-values` over the
install before it) and gives what its comment promises, and each `kubectl` command names what the chart made.
A command this test does not know fails it, so the page cannot print one no test ran. (tests/test_docs.py holds
README.md's quick start to commands of the docs pages.)
"""

from __future__ import annotations

import pathlib
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import Any

import build_image
import helm_python
import pytest
from support import chart

import dractl

ROOT = pathlib.Path(__file__).resolve().parents[3]

DOC = ROOT / "docs" / "helm.md"
GPU_NODES = {"nvidia.com/gpu.present": "true"}


def _page() -> str:
    return DOC.read_text(encoding="utf-8")


def _commands() -> list[list[str]]:
    """Every command of the page's sh blocks, as its words (comments dropped, `\\` continuations joined)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", _page(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def _set_into(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`new` set into `base` as Helm's strvals sets each `--set` path: maps are entered, any other value (an empty
    map too) replaces. Pure."""
    merged = dict(base)
    for key, value in new.items():
        if isinstance(value, Mapping) and value and isinstance(merged.get(key), dict):
            merged[key] = _set_into(merged[key], value)
        else:
            merged[key] = value
    return merged


_PARSERS = {
    "--set": helm_python.parse_set_string,
    "--set-json": helm_python.parse_set_json,
    "--set-string": helm_python.parse_set_string_values,
}


@pytest.fixture(scope="module")
def commands() -> list[list[str]]:
    found = _commands()
    assert found, f"{DOC}: no sh block"
    return found


def _helm(words: list[str]) -> tuple[str, list[str], str, dict[str, Any], bool]:
    """(action, positional arguments, namespace, values from the flags, --reuse-values) of a helm command."""
    action, rest = words[1], iter(words[2:])
    positional: list[str] = []
    namespace, values, reuse = "default", {}, False
    for word in rest:
        if word in ("-n", "--namespace"):
            namespace = next(rest)
        elif word in _PARSERS:
            values = _set_into(values, _PARSERS[word](next(rest)))
        elif word == "--reuse-values":
            reuse = True
        elif word.startswith("-"):
            pytest.fail(f"{DOC}: `{shlex.join(words)}`: flag {word} is not one this test knows")
        else:
            positional.append(word)
    return action, positional, namespace, values, reuse


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("Deployment", "DaemonSet"):
        for workload in chart.find(objects, kind):
            yield workload["metadata"]["name"], workload["spec"]["template"]["spec"]


def test_every_command_of_the_deploying_page_does_what_it_says(commands: list[list[str]]) -> None:
    """Guards the page as a new user runs it: the installs and the upgrade render with Helm's engine exactly as
    printed, the fake-GPU install's node agent selects every node (no GPU label left by a merge: issue 25's 0-pod
    DaemonSet), the NVML one GPU nodes, every workload runs the image the page built and imported, and the verify,
    uninstall and namespace commands name the release's own objects."""
    built = imported = ""
    namespace = ""
    installs: list[tuple[str, dict[str, Any]]] = []
    rendered: list[list[dict[str, Any]]] = []
    seen: set[str] = set()
    for words in commands:
        line = shlex.join(words)
        if words[:2] == ["python3", "tools/build_image.py"]:
            tag = words[words.index("--tag") + 1] if "--tag" in words else f"dractl:{dractl.__version__}"
            name, _ = build_image.image_name(tag)
            built, imported = tag, ""
            archive = f"{name.rpartition('/')[2].replace(':', '-')}.oci.tar"
            seen.add("build")
        elif words[:4] == ["ctr", "-n", "k8s.io", "images"] and words[4] == "import":
            assert built, f"`{line}` imports an image the page has not built yet"
            assert words[5:] == [archive], f"`{line}`: the archive built is {archive}"
            imported = built
            seen.add("import")
        elif words[:3] == ["kubectl", "create", "namespace"]:
            namespace = words[3]
        elif words[0] == "helm" and words[1] in ("install", "upgrade"):
            action, positional, where, values, reuse = _helm(words)
            assert positional == [chart.RELEASE, "charts/dractl"] and where == namespace == chart.NAMESPACE, line
            assert (ROOT / positional[1]).resolve() == chart.CHART
            bases = [v for _, v in installs] if reuse else [{}]
            assert bases, f"`{line}` reuses the values of an install the page has not made"
            for base in bases:
                objects = chart.render(_set_into(base, values))
                rendered.append(objects)
                images = {n: [c["image"] for c in spec["containers"]] for n, spec in _pod_specs(objects)}
                assert imported and all(i == [imported] for i in images.values()), (line, images, imported)
                if action == "install":
                    installs.append((line, values))
                    (agent,) = chart.find(objects, "DaemonSet")
                    fake = "--fake-profile=a100-80gb-x8" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
                    expected = None if fake else GPU_NODES
                    assert agent["spec"]["template"]["spec"].get("nodeSelector") == expected, line
            seen.add(action)
        elif words[:2] == ["helm", "uninstall"]:
            assert words[2:] == [chart.RELEASE, "-n", namespace], line
            seen.add("uninstall")
        elif words[0] == "kubectl":
            _check_kubectl(words, rendered[-1] if rendered else [])
        else:
            pytest.fail(f"{DOC}: `{line}` is a command this test does not know")
    assert seen == {"build", "import", "install", "upgrade", "uninstall"}
    assert len(installs) == 2 and sum(1 for _, v in installs if v.get("nodeAgent", {}).get("deviceSource")) == 1


def _check_kubectl(words: list[str], objects: list[dict[str, Any]]) -> None:
    """A kubectl command of the page names objects the last install made (or reads only)."""
    line = shlex.join(words)
    assert objects, f"`{line}` comes before any install"
    if "-n" in words:
        assert words[words.index("-n") + 1] == chart.NAMESPACE, line
    if "rollout" in words:
        kind, _, name = words[words.index("status") + 1].partition("/")
        assert chart.find(objects, {"deployment": "Deployment", "daemonset": "DaemonSet"}[kind], name), line
    elif "lease" in words:
        (deployment,) = chart.find(objects, "Deployment")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--lease-name={words[words.index('lease') + 1]}" in args, line
    elif "resourceslices" in words:
        assert "--field-selector" in words
        (agent,) = chart.find(objects, "DaemonSet")
        selector = words[words.index("--field-selector") + 1]
        assert (
            f"--driver-name={selector.removeprefix('spec.driver=')}"
            in agent["spec"]["template"]["spec"]["containers"][0]["args"]
        ), line
    elif "deviceclasses" in words:
        names = words[words.index("deviceclasses") + 1 :]
        assert sorted(names) == sorted(o["metadata"]["name"] for o in chart.find(objects, "DeviceClass")), line
    elif words[1:3] == ["get", "resourceclaims"]:
        assert "-A" in words, line
    else:
        pytest.fail(f"{DOC}: `{line}` is a kubectl command this test does not know")


def test_the_pages_inline_flags_render_as_it_says() -> None:
    """Guards the page's inline `--set`/`--set-json` examples: each renders with Helm's engine, and a nodeSelector
    given replaces the default instead of merging with it (`{}`: every node)."""
    flags = re.findall(r"`(--set(?:-json|-string)? [^`]+)`", _page().replace("\n", " "))
    assert flags, f"{DOC}: no inline --set example"
    for flag in flags:
        words = shlex.split(flag)
        _, _, _, values, _ = _helm(["helm", "install", *words])
        objects = chart.render(values)
        selector = values.get("nodeAgent", {}).get("nodeSelector")
        if selector is not None:
            (agent,) = chart.find(objects, "DaemonSet")
            assert agent["spec"]["template"]["spec"].get("nodeSelector") == (selector or None), flag


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, GPU_NODES),
        ({"nodeAgent": {"deviceSource": "fake"}}, None),
        ({"nodeAgent": {"nodeSelector": {}}}, None),
        ({"nodeAgent": {"nodeSelector": None}}, GPU_NODES),
        ({"nodeAgent": {"nodeSelector": {"pool": "a"}}}, {"pool": "a"}),
        ({"nodeAgent": {"deviceSource": "fake", "nodeSelector": {"pool": "a"}}}, {"pool": "a"}),
    ],
    ids=["nvml-default", "fake-default", "empty-map", "null", "given-nvml", "given-fake"],
)
def test_the_node_agents_selector_is_the_one_given_or_the_device_sources(
    values: dict[str, Any], expected: dict[str, str] | None
) -> None:
    """Guards against Helm's map merge: a nodeSelector given is used exactly (not merged with the GPU label), `{}`
    selects every node, and unset it is GPU nodes with NVML and every node with fake GPUs."""
    (agent,) = chart.find(chart.render(values), "DaemonSet")
    assert agent["spec"]["template"]["spec"].get("nodeSelector") == expected
