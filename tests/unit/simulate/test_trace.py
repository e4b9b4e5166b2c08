"""Trace files: the generator, the writer, and the loader's ordering and validation."""

from __future__ import annotations

import collections
import functools
import pathlib
import textwrap
from typing import Any

import pytest
import yaml

from dractl import model
from dractl.model import encode
from dractl.simulate import metrics, trace


@functools.cache
def reference(seed: int = 1, claims: int = 200) -> trace.Trace:
    return trace.generate(f"mix=reference,seed={seed},claims={claims}")


def _events(t: trace.Trace) -> list[tuple[Any, ...]]:
    """The events as plain data: what they are, when, and the arriving object as the API would hold it."""
    out: list[tuple[Any, ...]] = []
    for e in t.events:
        if isinstance(e, trace.Arrival):
            assert isinstance(e.object, model.ResourceClaim)
            out.append(("arrive", e.at, e.index, encode.resource_claim(e.object)))
        else:
            out.append(("depart", e.at, e.index, e.kind, e.key, e.implied))
    return out


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_generated_trace_round_trips_through_a_file(tmp_path: pathlib.Path, suffix: str) -> None:
    """generate -> write -> load gives the same document, events and cluster."""
    generated = reference()
    path = tmp_path / f"trace{suffix}"
    trace.write(generated, path)
    loaded = trace.load(path)
    assert loaded.document == generated.document
    assert _events(loaded) == _events(generated)
    assert [encode.resource_slice(s) for s in loaded.cluster.resource_slices] == [
        encode.resource_slice(s) for s in generated.cluster.resource_slices
    ]
    assert [n.meta for n in loaded.cluster.nodes] == [n.meta for n in generated.cluster.nodes]
    assert loaded.name == "reference-seed-1" and loaded.file == str(path)


def test_a_trace_in_yaml_flow_style_reads_as_the_same_trace() -> None:
    """Guards: a trace written in YAML flow style (a brace first, but not JSON: unquoted keys) is read as YAML, as
    `simulate -f` reads such manifests, not refused as bad JSON."""
    generated = trace.generate("mix=reference,seed=1,claims=5,t4=1")
    flow = yaml.dump(dict(generated.document), Dumper=yaml.CSafeDumper, default_flow_style=True, width=1 << 16)
    assert flow.startswith("{apiVersion: dractl.io/v1alpha1, ")
    loaded = trace.parse_text(flow, file="flow.yaml")
    assert loaded.document == generated.document and _events(loaded) == _events(generated)


def test_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    """The generator is deterministic for a seed and depends on it."""
    assert trace.generate("mix=reference,seed=1,claims=200").document == reference().document
    assert trace.generate("mix=reference,seed=2,claims=200").document != reference().document


def test_keyword_arguments_give_the_same_trace_as_the_spec_string() -> None:
    """generate(mix=..., seed=..., claims=..., nodes=...) equals the spec string's trace and checks its values."""
    by_keywords = trace.generate(mix="reference", seed=1, claims=20, nodes={"h100": 2})
    assert by_keywords.document == trace.generate("mix=reference,seed=1,claims=20,h100=2").document
    with pytest.raises(ValueError, match="node kind 'v100' is unknown"):
        trace.generate(mix="reference", nodes={"v100": 1})
    with pytest.raises(ValueError, match="mix 'chaos' is unknown"):
        trace.generate(mix="chaos")


def test_reference_cluster_is_twenty_example_nodes_with_136_gpus() -> None:
    """8 A100 (dynamic MIG), 8 H100 and 4 T4 nodes, renamed, with GPU uuids unique across nodes."""
    cluster = reference().cluster
    assert [n.meta.name for n in cluster.nodes] == [
        *(f"a100-{i:02d}" for i in range(1, 9)),
        *(f"h100-{i:02d}" for i in range(1, 9)),
        *(f"t4-{i:02d}" for i in range(1, 5)),
    ]
    measured = metrics.measure(cluster.resource_slices, [])
    assert (measured.cluster.gpus, len(measured.nodes)) == (136, 20)
    assert len({g.uuid for g in measured.gpus}) == 136
    parents = {g.uuid for g in measured.gpus}
    assert all(len(g.placements) == 18 for g in measured.gpus if g.node.startswith("a100"))
    names = {(s.meta.name, s.pool.name, s.node_name) for s in cluster.resource_slices}
    assert not any("dgx-" in n or "t4-node" in n for triple in names for n in triple if n) and parents
    assert {s.pool.name for s in cluster.resource_slices} == {n.meta.name for n in cluster.nodes}
    assert {c.meta.name for c in cluster.device_classes} >= {"gpu.nvidia.com", "mig.nvidia.com"}


def test_reference_mix_has_the_issue_shares() -> None:
    """Over 2,000 claims each kind of the reference mix is within 3 points of its share."""
    generated = trace.generate("mix=reference,seed=7,claims=2000")
    counts = collections.Counter(a.object.meta.labels["dractl.io/mix"] for a in trace.arrivals(generated))
    shares = {
        "gpu-memory-floor": 0.40,
        "one-mig-slice": 0.30,
        "two-mig-slices-one-parent": 0.10,
        "nvlink-gpus": 0.15,
        "eight-gpus": 0.05,
    }
    for kind, share in shares.items():
        assert abs(counts[kind] / 2000 - share) < 0.03, (kind, counts[kind])


def test_thirty_percent_of_present_claims_depart_at_each_later_round() -> None:
    """At each round after the first, round(30%) of the claims present depart, before that round's arrivals."""
    present: set[str] = set()
    rounds = 0
    events = reference().events
    for at in sorted({e.at for e in events if isinstance(e, trace.Departure)}):
        before = {e.key for e in events if isinstance(e, trace.Arrival) and e.at < at}
        gone = {e.key for e in events if isinstance(e, trace.Departure) and e.at < at}
        present = before - gone
        leaving = [e for e in events if isinstance(e, trace.Departure) and e.at == at]
        assert len(leaving) == round(len(present) * 0.3)
        first = next(i for i, e in enumerate(events) if e.at == at)
        assert all(isinstance(e, trace.Departure) for e in events[first : first + len(leaving)])
        rounds += 1
    assert rounds == 19


def test_generated_claims_declare_their_shapes() -> None:
    """Every generated claim names its request shapes, and the shapes match its requests."""
    for arrival in trace.arrivals(reference()):
        assert isinstance(arrival.object, model.ResourceClaim)
        shapes = trace.shapes_of(arrival.object)
        requested = sum(r.exactly.count for r in arrival.object.spec.requests if r.exactly is not None)
        assert len(shapes) == requested and shapes


def _trace(events: str, *, cluster: str = "") -> str:
    if events == "[]":
        return _trace("", cluster=cluster).replace("  events:\n", "  events: []\n")
    return (
        textwrap.dedent("""\
        apiVersion: dractl.io/v1alpha1
        kind: Trace
        metadata: {name: t}
        spec:
        """)
        + textwrap.indent(textwrap.dedent(cluster), "  ")
        + "  events:\n"
        + textwrap.indent(textwrap.dedent(events), "  ")
    )


CLAIM = (
    "{apiVersion: resource.k8s.io/v1, kind: ResourceClaim, metadata: {name: %s}, "
    "spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com}}]}}}"
)


def test_departs_after_annotation_implies_a_departure_ordered_before_arrivals() -> None:
    """An arriving claim annotated departs-after leaves that much later; at equal times departures come first."""
    text = _trace(f"""\
        - at: 10
          arrive: {CLAIM % "b"}
        - at: 0
          arrive:
            apiVersion: resource.k8s.io/v1
            kind: ResourceClaim
            metadata: {{name: a, annotations: {{dractl.io/departs-after: "10"}}}}
            spec: {{devices: {{requests: [{{name: g, exactly: {{deviceClassName: gpu.nvidia.com}}}}]}}}}
        - at: 20
          depart: {{kind: ResourceClaim, name: b}}
        """)
    loaded = trace.parse_text(text, file="t.yaml")
    assert [(type(e).__name__, e.at, e.key) for e in loaded.events] == [
        ("Arrival", 0.0, "default/a"),
        ("Departure", 10.0, "default/a"),
        ("Arrival", 10.0, "default/b"),
        ("Departure", 20.0, "default/b"),
    ]
    implied = loaded.events[1]
    assert isinstance(implied, trace.Departure) and implied.implied and implied.index == 1


@pytest.mark.parametrize(
    ("events", "message"),
    [
        pytest.param(
            f"- at: -1\n  arrive: {CLAIM % 'a'}\n",
            "t.yaml: events[0].at: must be a number of seconds >= 0, got -1",
            id="negative-time",
        ),
        pytest.param(
            f"- at: soon\n  arrive: {CLAIM % 'a'}\n",
            't.yaml: events[0].at: must be a number of seconds >= 0, got "soon"',
            id="time-not-a-number",
        ),
        pytest.param(
            f"- arrive: {CLAIM % 'a'}\n",
            "t.yaml: events[0].at: must be a number of seconds >= 0, got nothing",
            id="time-missing",
        ),
        pytest.param(f"- at: .nan\n  arrive: {CLAIM % 'a'}\n", "t.yaml: events[0].at: must be a number", id="time-nan"),
        pytest.param(
            "- at: 1\n  depart: {kind: ResourceClaim, name: ghost}\n",
            "t.yaml: events[0].depart: ResourceClaim default/ghost departs at 1s but is not present then",
            id="departure-of-unknown-object",
        ),
        pytest.param(
            f"- at: 5\n  arrive: {CLAIM % 'a'}\n- at: 1\n  depart: {{kind: ResourceClaim, name: a}}\n",
            "t.yaml: events[1].depart: ResourceClaim default/a departs at 1s but is not present",
            id="departure-before-arrival",
        ),
        pytest.param(
            f"- at: 0\n  arrive: {CLAIM % 'a'}\n- at: 1\n  depart: {{kind: ResourceClaim, name: a}}\n"
            "- at: 2\n  depart: {kind: ResourceClaim, name: a}\n",
            "t.yaml: events[2].depart: ResourceClaim default/a departs at 2s",
            id="departs-twice",
        ),
        pytest.param(
            f"- at: 0\n  arrive: {CLAIM % 'a'}\n- at: 1\n  arrive: {CLAIM % 'a'}\n",
            "t.yaml: events[1].arrive: ResourceClaim default/a arrives at 1s while it is still present",
            id="arrives-twice",
        ),
        pytest.param(
            "- at: 0\n  arrive: {apiVersion: v1, metadata: {name: a}}\n",
            "t.yaml: events[0].arrive.kind: only a ResourceClaim, a Pod or a PodGroup arrives, got no kind",
            id="missing-kind",
        ),
        pytest.param(
            "- at: 0\n  arrive: {apiVersion: v1, kind: Service, metadata: {name: a}}\n",
            't.yaml: events[0].arrive.kind: only a ResourceClaim, a Pod or a PodGroup arrives, got kind "Service"',
            id="wrong-kind",
        ),
        pytest.param(
            "- at: 0\n  depart: {name: a}\n",
            "t.yaml: events[0].depart.kind: must be ResourceClaim, Pod or PodGroup, got nothing",
            id="departure-without-kind",
        ),
        pytest.param(
            f"- at: 0\n  arrive: {CLAIM % 'a'}\n  depart: {{kind: ResourceClaim, name: a}}\n",
            "t.yaml: events[0]: needs exactly one of arrive (a ResourceClaim, Pod or PodGroup) and depart",
            id="arrive-and-depart",
        ),
        pytest.param(
            f"- at: 0\n  when: later\n  arrive: {CLAIM % 'a'}\n",
            "t.yaml: events[0].when: unknown field",
            id="unknown-event-field",
        ),
        pytest.param(
            "- at: 0\n  arrive: {apiVersion: resource.k8s.io/v1, kind: ResourceClaim, metadata: {name: a}, "
            "spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com, "
            "count: x}}]}}}\n",
            "t.yaml: events[0].arrive: ResourceClaim default/a: spec.devices.requests[0].exactly.count",
            id="invalid-claim-names-event-and-field",
        ),
        pytest.param(
            "- at: 0\n  arrive: {apiVersion: resource.k8s.io/v1, kind: ResourceClaim, metadata: {name: a, "
            "annotations: {dractl.io/departs-after: soon}}, spec: {devices: {requests: [{name: g, exactly: "
            "{deviceClassName: gpu.nvidia.com}}]}}}\n",
            "t.yaml: events[0].arrive.metadata.annotations[dractl.io/departs-after]: must be a number of "
            'seconds > 0, got "soon"',
            id="bad-departs-after",
        ),
        pytest.param(
            "- at: 0\n  arrive: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {resourceClaims: "
            "[{name: g, resourceClaimTemplateName: missing}], containers: [{name: c, image: i}]}}\n",
            "t.yaml: events[0].arrive: Pod default/p: spec.resourceClaims[0].resourceClaimTemplateName: "
            "no ResourceClaimTemplate default/missing in spec.cluster",
            id="pod-with-missing-template",
        ),
        pytest.param(
            "- 3\n", "t.yaml: events[0]: must be a mapping with at, and arrive or depart", id="event-not-a-mapping"
        ),
    ],
)
def test_bad_trace_events_get_their_message(events: str, message: str) -> None:
    """Each bad event is reported with the file, the event index as written and the field."""
    with pytest.raises(trace.TraceError) as raised:
        trace.parse_text(_trace(events), file="t.yaml")
    assert any(p.startswith(message) for p in raised.value.problems), raised.value.problems


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "apiVersion: v1\nkind: Trace\nspec: {events: []}\n",
            't.yaml: apiVersion: must be dractl.io/v1alpha1, got "v1"',
            id="wrong-api-version",
        ),
        pytest.param("apiVersion: dractl.io/v1alpha1\nkind: Trace\n", "t.yaml: spec: required", id="no-spec"),
        pytest.param(
            "apiVersion: dractl.io/v1alpha1\nkind: Trace\nspec: {}\n", "t.yaml: spec.events: required", id="no-events"
        ),
        pytest.param("- just\n- a list\n", "t.yaml: must be a mapping", id="not-a-mapping"),
        pytest.param("a: [1,\n", "t.yaml: line 2, column 1: YAML syntax error", id="not-yaml"),
        pytest.param("kind: Trace\n---\nkind: Trace\n", "t.yaml: a trace is one YAML document", id="two-documents"),
        pytest.param(
            '{"a": ' + "[" * 100000 + "]" * 100000 + "}",
            "t.yaml: nested too deeply: more than 1000 levels of [ and {",
            id="json-nested-too-deeply",
        ),
        pytest.param(
            "a: " + "[" * 100000 + "]" * 100000 + "\n",
            "t.yaml: nested too deeply: more than 1000 levels of [ and {",
            id="yaml-nested-too-deeply",
        ),
        pytest.param(
            _trace("[]", cluster="cluster:\n  examples: [{file: ../../etc/passwd, node: a}]\n"),
            "t.yaml: spec.cluster.examples[0].file: must be one of the example nodes",
            id="bad-example",
        ),
        pytest.param(
            _trace("[]", cluster="cluster:\n  examples: [{file: 22-t4-node-01.yaml, node: T4}]\n"),
            "t.yaml: spec.cluster.examples[0].node: must be a DNS label",
            id="bad-node-name",
        ),
        pytest.param(
            _trace(
                "[]",
                cluster="cluster:\n  objects: [{apiVersion: resource.k8s.io/v1, "
                "kind: DeviceClass, metadata: {name: Bad_Name}}]\n",
            ),
            "t.yaml: spec.cluster.objects: DeviceClass Bad_Name: metadata.name",
            id="invalid-cluster-object",
        ),
    ],
)
def test_bad_trace_files_get_their_message(text: str, message: str) -> None:
    """A trace that is not a valid Trace document gets one message naming the file and the field."""
    with pytest.raises(trace.TraceError) as raised:
        trace.parse_text(text, file="t.yaml")
    assert any(p.startswith(message) for p in raised.value.problems), raised.value.problems


def test_missing_trace_file_is_named(tmp_path: pathlib.Path) -> None:
    """A trace file that cannot be read gets one message naming it."""
    with pytest.raises(trace.TraceError, match=r"nope\.yaml: cannot read"):
        trace.load(tmp_path / "nope.yaml")


def test_spec_string_round_trips_and_applies_defaults() -> None:
    """A spec string parses into the documented defaults and prints back in full."""
    spec = trace.parse_spec("mix=reference,seed=3,claims=50")
    assert (spec.seed, spec.claims, dict(spec.nodes), spec.round, spec.departures) == (
        3,
        50,
        {"a100": 8, "h100": 8, "t4": 4},
        10,
        0.3,
    )
    assert trace.parse_spec(str(spec)) == spec
    assert dict(trace.parse_spec("mix=reference,h100=2").nodes) == {"h100": 2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("seed=1,claims=10", "mix is required (one of reference, h100-nvlink)", id="no-mix"),
        pytest.param("mix=chaos", "mix 'chaos' is unknown (one of reference, h100-nvlink)", id="unknown-mix"),
        pytest.param("mix=reference,seed=x", "seed must be an integer >= 0, got 'x'", id="bad-seed"),
        pytest.param("mix=reference,claims=0", "claims must be an integer >= 1, got '0'", id="no-claims"),
        pytest.param("mix=reference,colour=red", "unknown key 'colour'", id="unknown-key"),
        pytest.param("mix=reference,seed", "'seed' is not key=value", id="not-key-value"),
        pytest.param("mix=reference,seed=1,seed=2", "seed is given twice", id="duplicate-key"),
        pytest.param("mix=reference,a100=0", "the cluster has no node", id="no-nodes"),
        pytest.param("mix=reference,departures=2", "departures must be a share from 0 to 1", id="bad-share"),
    ],
)
def test_bad_generator_specs_get_one_message(text: str, message: str) -> None:
    """A malformed --generate spec names itself and the key at fault."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as raised:
        trace.parse_spec(text)
    assert repr(text) in str(raised.value)
