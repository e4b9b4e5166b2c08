"""Loading manifests: files, directories, multi-document YAML, JSON, Lists, workloads, skipped kinds."""

from __future__ import annotations

import json
import os
import pathlib
import threading
from collections.abc import Callable

import pytest
import yaml
from support import model_manifests as m

from dractl.model import decode

CLASS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com"
"""


def test_multi_document_yaml_keeps_order_per_kind() -> None:
    """Guards: every document of a multi-document YAML text is decoded, in input order per kind."""
    text = yaml.safe_dump_all(
        [m.claim(), m.resource_slice(), {**m.claim(), "metadata": {"name": "second", "namespace": "ml"}}]
    )
    objects = decode.load_text(CLASS + "---\n" + text)
    assert [c.meta.name for c in objects.device_classes] == ["gpu.nvidia.com"]
    assert [c.key for c in objects.resource_claims] == ["default/train", "ml/second"]
    assert [s.meta.name for s in objects.resource_slices] == ["node-1-gpu"]
    assert objects.device_classes[0].selectors == ('device.driver == "gpu.nvidia.com"',)
    assert objects.resource_claims[1].source.document == 3


def test_empty_documents_are_ignored() -> None:
    """Guards: stray `---` separators and comment-only documents do not count as objects."""
    objects = decode.load_text("---\n# nothing\n---\n" + CLASS + "---\n")
    assert len(objects.device_classes) == 1


def test_json_object_and_list(tmp_path: pathlib.Path) -> None:
    """Guards: JSON input (as the API returns it), including `kind: List` and typed `*List`, decodes like YAML."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [m.claim(), m.resource_slice()]}
    typed = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimList",
        "items": [{**m.claim(), "metadata": {"name": "b"}}],
    }
    (tmp_path / "list.json").write_text(json.dumps(listed))
    (tmp_path / "typed.json").write_text(json.dumps(typed))
    objects = decode.load_paths([tmp_path / "list.json", tmp_path / "typed.json"])
    assert [c.meta.name for c in objects.resource_claims] == ["train", "b"]
    assert len(objects.resource_slices) == 1
    assert objects.resource_claims[0].source.file == str(tmp_path / "list.json")


def test_load_documents_takes_parsed_json() -> None:
    """Guards: callers holding raw API JSON decode it without a text round trip."""
    objects = decode.load_documents([m.claim(), m.resource_slice()], file="api")
    assert objects.resource_claims[0].source.file == "api"


def test_directories_are_read_recursively_in_sorted_order(tmp_path: pathlib.Path) -> None:
    """Guards: a directory contributes its *.yaml, *.yml and *.json files recursively, sorted by path components; other
    files are ignored."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c.yml").write_text(yaml.safe_dump({**m.claim(), "metadata": {"name": "c"}}))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**m.claim(), "metadata": {"name": "a"}}))
    (tmp_path / "b.json").write_text(json.dumps({**m.claim(), "metadata": {"name": "b-json"}}))
    (tmp_path / "notes.txt").write_text("not a manifest")
    objects = decode.load_paths([tmp_path])
    assert [c.meta.name for c in objects.resource_claims] == ["a", "c", "b-json"]


def test_missing_path_and_empty_directory_are_problems(tmp_path: pathlib.Path) -> None:
    """Guards: a wrong path on the command line is reported, not silently ignored."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_paths([tmp_path / "nope.yaml", tmp_path / "empty"])
    assert caught.value.problems == (
        f"{tmp_path / 'nope.yaml'}: no such file or directory",
        f"{tmp_path / 'empty'}: no manifests (*.yaml, *.yml, *.json) in this directory",
    )


def test_input_without_objects_is_a_problem(tmp_path: pathlib.Path) -> None:
    """Guards: an empty file, a file of comments, an empty JSON list, and a directory whose manifests hold no object are
    each a problem naming the path, never a simulation of an empty cluster; an empty file beside manifests in a
    directory is skipped, as kubectl skips it."""
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "comments.yaml").write_text("# nothing yet\n---\n")
    (tmp_path / "none.json").write_text("[]")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.yaml").write_text("\n")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.yaml").write_text("")
    (tmp_path / "mixed" / "b.yaml").write_text(CLASS)
    names = ("empty.yaml", "comments.yaml", "none.json", "blank", "mixed")
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_paths([tmp_path / name for name in names])
    assert caught.value.problems == (
        f"{tmp_path / 'empty.yaml'}: no Kubernetes objects: the file is empty or only comments",
        f"{tmp_path / 'comments.yaml'}: no Kubernetes objects: the file is empty or only comments",
        f"{tmp_path / 'none.json'}: no Kubernetes objects: the file is empty or only comments",
        f"{tmp_path / 'blank'}: no Kubernetes objects: the manifests of this directory are empty or only comments",
    )
    assert len(decode.load_paths([tmp_path / "mixed"]).device_classes) == 1


def test_a_pipe_is_read_like_a_file(tmp_path: pathlib.Path) -> None:
    """Guards: a named pipe (what bash's `-f <(kubectl get ...)` passes) is read, not reported as missing."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(CLASS,), daemon=True)
    writer.start()
    try:
        objects = decode.load_paths([fifo])
    finally:
        if writer.is_alive():  # nothing opened the pipe to read: open it once, so the writer is not left blocked
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=10)
    assert [c.meta.name for c in objects.device_classes] == ["gpu.nvidia.com"]


def test_a_binary_file_is_one_problem(tmp_path: pathlib.Path) -> None:
    """Guards: a file that is not UTF-8 text gets one line saying so, not a codec's error."""
    (tmp_path / "blob.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_paths([tmp_path / "blob.yaml"])
    assert caught.value.problems == (
        f"{tmp_path / 'blob.yaml'}: cannot read: not UTF-8 text (a binary file?); manifests are YAML or JSON",
    )


def test_an_object_given_twice_is_a_problem_naming_both_places(tmp_path: pathlib.Path) -> None:
    """Guards: a slice or claim given twice (a file passed twice, `-o yaml` output fed back beside the claims it came
    from) is refused naming both places, instead of a pool counted twice ("2 of 1 slices") or one claim kept silently;
    the same name in another namespace or of another kind is no duplicate."""
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([m.resource_slice(), m.claim()]))
    elsewhere = {**m.claim(), "metadata": {"name": "train", "namespace": "ml"}}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "train"}}
    template["spec"] = {"spec": m.claim()["spec"]}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump_all([elsewhere, template, m.claim()]))
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_paths([tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "a.yaml"])
    twice = "given twice, first in {} (document {}); the API holds one object per name: remove one or rename it"
    assert caught.value.problems == (
        f"{tmp_path / 'a.yaml'}: ResourceSlice node-1-gpu: metadata.name: {twice.format(tmp_path / 'a.yaml', 1)}",
        f"{tmp_path / 'b.yaml'}: ResourceClaim default/train: metadata.name: {twice.format(tmp_path / 'a.yaml', 2)}",
        f"{tmp_path / 'a.yaml'}: ResourceClaim default/train: metadata.name: {twice.format(tmp_path / 'a.yaml', 2)}",
    )


def test_yaml_syntax_error_names_file_and_line(problems: Callable[..., list[str]]) -> None:
    """Guards: a YAML syntax error names the file and the line."""
    text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n   bad: indent\n"
    assert problems(text, file="pods.yaml") == [
        "pods.yaml: line 5, column 7: YAML syntax error: mapping values are not allowed in this context",
    ]


def test_problems_from_all_files_are_collected(tmp_path: pathlib.Path) -> None:
    """Guards: decoding never stops at the first problem; every file and document is checked."""
    (tmp_path / "a.yaml").write_text("a: [\n")
    bad = m.mutated(m.claim(), lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=-1))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump_all([bad, {**bad, "metadata": {"name": "other"}}]))
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_paths([tmp_path])
    assert len(caught.value.problems) == 3
    assert caught.value.problems[0].startswith(f"{tmp_path / 'a.yaml'}: line 2, column 1: YAML syntax error: ")
    assert (
        caught.value.problems[1]
        == f"{tmp_path / 'b.yaml'}: ResourceClaim default/train: spec.devices.requests[0].exactly.count: must be >= 1"
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("- a\n- b\n", "m.yaml: document 1: must be a Kubernetes object (a mapping with apiVersion and kind)"),
        (
            "apiVersion: v1\nmetadata: {name: a}\n",
            "m.yaml: document 1: kind: required (for example DeviceClass, ResourceClaim, Pod)",
        ),
        (
            "kind: Pod\nmetadata: {name: a}\n",
            "m.yaml: document 1: apiVersion: required (for example resource.k8s.io/v1 or v1)",
        ),
        (
            "apiVersion: v1\nkind: ResourceClaim\nmetadata: {name: a}\n",
            "m.yaml: ResourceClaim default/a: apiVersion: ResourceClaim belongs to resource.k8s.io: write apiVersion: "
            "resource.k8s.io/v1",
        ),
        (
            "apiVersion: apps/v1\nkind: Pod\nmetadata: {name: a}\n",
            "m.yaml: Pod default/a: apiVersion: Pod is core/v1: write apiVersion: v1",
        ),
        (
            "apiVersion: resource.k8s.io/v2\nkind: DeviceClass\nmetadata: {name: a}\n",
            "m.yaml: DeviceClass a: apiVersion: resource.k8s.io/v2 is not a served version: write apiVersion: "
            "resource.k8s.io/v1",
        ),
    ],
    ids=["not-a-mapping", "no-kind", "no-api-version", "claim-in-core", "pod-in-apps", "unknown-version"],
)
def test_document_envelope_problems(problems: Callable[..., list[str]], document: str, message: str) -> None:
    """Guards: documents that are not usable objects are named by file and document number or object."""
    assert problems(document) == [message]


def test_other_kinds_are_skipped_with_a_warning() -> None:
    """Guards: Services, ConfigMaps, Namespaces and CRDs are skipped and listed in warnings, not errors."""
    text = (
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ml}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\n"
    )
    objects = decode.load_text(text, file="extra.yaml")
    assert objects.warnings == (
        "extra.yaml: Service ml/web: skipped (not used by allocation)",
        "extra.yaml: Namespace ml: skipped (not used by allocation)",
        "extra.yaml: ConfigMap default/cfg: skipped (not used by allocation)",
    )


def test_pods_and_nodes() -> None:
    """Guards: Pod claim references, container claims, node selection and scheduler name, and Node labels,
    are decoded."""
    text = """\
apiVersion: v1
kind: Pod
metadata: {name: infer, namespace: ml, labels: {app: infer}}
spec:
  schedulerName: dractl
  nodeSelector: {pool: a100}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
  - {name: shared, resourceClaimName: shared-gpu}
  initContainers:
  - name: warm
    resources: {claims: [{name: shared}]}
  containers:
  - name: app
    image: vllm
    resources: {claims: [{name: gpu, request: big}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {nvidia.com/gpu.present: "true"}}
status: {capacity: {cpu: "8"}}
"""
    objects = decode.load_text(text)
    pod = objects.pods[0]
    assert pod.meta.namespace == "ml" and pod.scheduler_name == "dractl" and dict(pod.node_selector) == {"pool": "a100"}
    assert [(c.name, c.resource_claim_name, c.resource_claim_template_name) for c in pod.resource_claims] == [
        ("gpu", None, "one-gpu"),
        ("shared", "shared-gpu", None),
    ]
    assert [(c.container, c.name, c.request) for c in pod.container_claims] == [
        ("warm", "shared", ""),
        ("app", "gpu", "big"),
    ]
    assert dict(objects.nodes[0].meta.labels) == {"nvidia.com/gpu.present": "true"}


WORKLOAD = """\
apiVersion: {api}
kind: {kind}
metadata: {{name: train, namespace: ml}}
spec:
  {count}
  template:
    metadata: {{labels: {{app: train}}}}
    spec:
      resourceClaims: [{{name: gpu, resourceClaimTemplateName: one-gpu}}]
      containers: [{{name: main, resources: {{claims: [{{name: gpu}}]}}}}]
"""


@pytest.mark.parametrize(
    ("api", "kind", "count", "names"),
    [
        ("apps/v1", "Deployment", "replicas: 3", ["train-0", "train-1", "train-2"]),
        ("apps/v1", "Deployment", "", ["train-0"]),
        ("apps/v1", "StatefulSet", "replicas: 2", ["train-0", "train-1"]),
        ("apps/v1", "ReplicaSet", "replicas: 0", []),
        ("batch/v1", "Job", "parallelism: 2", ["train-0", "train-1"]),
        ("batch/v1", "Job", "completions: 5", ["train-0"]),
    ],
    ids=["deployment", "deployment-default-1", "statefulset", "replicaset-zero", "job-parallelism", "job-default-1"],
)
def test_workloads_expand_into_pods(api: str, kind: str, count: str, names: list[str]) -> None:
    """Guards: workloads become Pods <name>-<i> with the template's namespace, labels and claims."""
    objects = decode.load_text(WORKLOAD.format(api=api, kind=kind, count=count))
    assert [p.meta.name for p in objects.pods] == names
    for pod in objects.pods:
        assert pod.meta.namespace == "ml"
        assert dict(pod.meta.labels) == {"app": "train"}
        assert pod.resource_claims[0].resource_claim_template_name == "one-gpu"
        assert pod.container_claims[0].container == "main"


def test_workload_problems_name_the_workload(problems: Callable[..., list[str]]) -> None:
    """Guards: a bad pod template is reported once, at the workload's path, not once per replica."""
    text = WORKLOAD.format(api="apps/v1", kind="Deployment", count="replicas: 4").replace("one-gpu", "One_GPU")
    assert problems(text) == [
        'm.yaml: Deployment ml/train: spec.template.spec.resourceClaims[0].resourceClaimTemplateName: "One_GPU" is not '
        "a DNS subdomain: "
        "at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
    ]


def test_replicas_are_bounded(problems: Callable[..., list[str]]) -> None:
    """Guards: a huge replica count is refused instead of materialising millions of pods."""
    text = WORKLOAD.format(api="apps/v1", kind="Deployment", count="replicas: 1000000")
    assert problems(text) == [
        "m.yaml: Deployment ml/train: spec.replicas: must be at most 100000: dractl expands every replica into a Pod"
    ]


def test_control_characters_are_a_syntax_error(problems: Callable[..., list[str]]) -> None:
    """Guards: a YAML reader error (a control character) is reported on one line naming the file."""
    assert problems("a: \x00\n") == [
        "m.yaml: YAML syntax error: unacceptable character #x0000: control characters are not allowed"
    ]
