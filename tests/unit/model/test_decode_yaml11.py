"""YAML as kubectl reads it (goyaml.v2's YAML 1.1 scalars), its bounds, and decoding one API object at a time."""

from __future__ import annotations

import math
import pathlib

import pytest
from support import model_manifests as m

from dractl import model
from dractl.model import decode
from dractl.model.decode import yaml11


def _value(text: str) -> object:
    (document,) = list(yaml11.load_all(f"k: {text}\n"))
    assert isinstance(document, dict)
    return document["k"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("yes", True),
        ("Yes", True),
        ("YES", True),
        ("y", True),
        ("on", True),
        ("ON", True),
        ("true", True),
        ("no", False),
        ("N", False),
        ("off", False),
        ("False", False),
        ("~", None),
        ("null", None),
        ("", None),
        ("0777", 511),
        ("0o17", 15),
        ("0x1F", 31),
        ("-0x10", -16),
        ("0b101", 5),
        ("1_000", 1000),
        ("+12", 12),
        ("08", 8.0),
        ("1e3", 1000.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("9223372036854775808", 2**63),
        ("18446744073709551615", 2**64 - 1),
        ("18446744073709551616", 2.0**64),
        ("99999999999999999999999", 1e23),
        ("1e999999", "1e999999"),
        ("9" * 5000, "9" * 5000),
        ("0x" + "f" * 100, "0x" + "f" * 100),
        ("1:30", "1:30"),
        ("2024-01-01", "2024-01-01"),
        ("2024-01-01T10:00:00Z", "2024-01-01T10:00:00Z"),
        ("'yes'", "yes"),
        ('"0777"', "0777"),
        ("Yes please", "Yes please"),
        ("0000:10:00.0", "0000:10:00.0"),
    ],
    ids=repr,
)
def test_plain_scalars_resolve_like_goyaml_v2(text: str, value: object) -> None:
    """Guards: each plain scalar form gets the type and value kubectl (sigs.k8s.io/yaml, goyaml.v2) gives it."""
    got = _value(text)
    assert got == value and type(got) is type(value)


def test_special_floats() -> None:
    """Guards: .inf and .nan are floats, as in goyaml.v2."""
    assert _value(".inf") == math.inf and _value("-.Inf") == -math.inf
    nan = _value(".nan")
    assert isinstance(nan, float) and math.isnan(nan)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("!!str 12", "12"),
        ("!!float 12", 12.0),
        ("!!int 0x10", 16),
        ("!!bool yes", True),
        ("!!binary aGVsbG8=", "hello"),
        ("!!timestamp 2024-01-01", "2024-01-01"),
        ("!foo bar", "bar"),
        ("!foo 12", "12"),
        ("!!python/object/apply:os.system [x]", ["x"]),
        ("!!python/name:os.system {a: 1}", {"a": 1}),
    ],
    ids=repr,
)
def test_tags_as_goyaml_v2_treats_them(text: str, value: object) -> None:
    """Guards: standard tags convert, !!binary decodes, and unknown (also Python) tags are ignored, never executed."""
    assert _value(text) == value


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("!!int twelve", "line 1, column 4: YAML syntax error: cannot decode !!str `twelve` as a !!int"),
        ("!!binary '%%%'", "line 1, column 4: YAML syntax error: !!binary value is not base64 of UTF-8 text"),
        ("!!null x", "line 1, column 4: YAML syntax error: cannot decode !!str `x` as a !!null"),
        ("*nothing", "line 1, column 4: YAML syntax error: found undefined alias"),
        (
            "[1, 2",
            "line 2, column 1: YAML syntax error: while parsing a flow sequence did not find expected ',' or ']'",
        ),
    ],
    ids=repr,
)
def test_bad_tags_and_syntax_name_line_and_column(text: str, problem: str) -> None:
    """Guards: a tag that cannot hold its value, an undefined alias or a syntax error is one
    message with its position."""
    with pytest.raises(yaml11.YamlError) as caught:
        _value(text)
    assert str(caught.value) == problem


def test_merge_keys_work() -> None:
    """Guards: `<<: *anchor` merges a mapping, as goyaml.v2 does."""
    (document,) = yaml11.load_all("a: &x {p: 1, q: 1}\nb: {<<: *x, q: 2}\n")
    assert document == {"a": {"p": 1, "q": 1}, "b": {"p": 1, "q": 2}}


def test_shared_aliases_within_the_bound_are_fine() -> None:
    """Guards: ordinary anchors and aliases (a few shared values) decode; only bombs are refused."""
    (document,) = yaml11.load_all("a: &x [1, 2]\nb: [*x, *x, *x]\n")
    assert document == {"a": [1, 2], "b": [[1, 2]] * 3}


def test_alias_bomb_is_refused_quickly() -> None:
    """Guards: aliases that would expand to 10^9 values are refused by counting, without expanding them."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        ref = chr(ord("a") + i - 1)
        levels.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{', '.join(['*' + ref] * 10)}]")
    with pytest.raises(yaml11.YamlError, match=r"document 1 \(line 1\): aliases expand to more than 1000000 values"):
        list(yaml11.load_all("\n".join(levels) + "\n"))


def test_recursive_anchor_is_refused() -> None:
    """Guards: a mapping that contains itself through an alias is one message, not endless recursion."""
    with pytest.raises(yaml11.YamlError, match="recursive anchor"):
        list(yaml11.load_all("a: &a {b: *a}\n"))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: " + "[" * 1001 + "]" * 1001, "nested too deeply: more than 1000 levels of [ and {"),
        (
            "".join(" " * i + "a:\n" for i in range(2100)),
            "line 2001: nested too deeply: indented more than 2000 columns",
        ),
        ("- " * 1001 + "x\n", "line 1: nested too deeply: indented more than 2000 columns"),
    ],
    ids=["flow", "block", "dashes"],
)
def test_nesting_is_bounded_before_parsing(text: str, problem: str) -> None:
    """Guards: text nested deeper than the bounds is refused before PyYAML's recursive composer sees it."""
    with pytest.raises(yaml11.YamlError) as caught:
        list(yaml11.load_all(text))
    assert str(caught.value) == problem


def test_wide_indentation_of_shallow_documents_is_fine() -> None:
    """Guards: indentation alone (a shallow document indented far) is not nesting: the fast path reads it."""
    assert list(yaml11.load_all("a:\n" + " " * 2001 + "b: 1\n")) == [{"a": {"b": 1}}]


def test_brackets_inside_strings_within_the_bound_are_fine() -> None:
    """Guards: the bracket count also sees quoted brackets, but real CEL selectors stay far below the bound."""
    expression = 'device.attributes["gpu.nvidia.com"].productName == "x"'
    (document,) = yaml11.load_all("e: " + repr(expression) + "\n" * 2000)
    assert document == {"e": expression}


def test_decoder_recursion_becomes_one_problem() -> None:
    """Guards: Lists nested past Python's recursion limit (only possible from parsed objects) are one problem,
    not a crash."""
    document: dict[str, object] = {"apiVersion": "v1", "kind": "List", "items": []}
    for _ in range(5000):
        document = {"apiVersion": "v1", "kind": "List", "items": [document]}
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_documents([document], file="deep")
    assert caught.value.problems == ("deep: document 1: nested too deeply to decode",)


@pytest.mark.parametrize(
    ("count", "problem"),
    [
        (2**63, "must fit in 64 bits (at most 9223372036854775807), got 9223372036854775808"),
        (-(2**63) - 1, "must fit in 64 bits (at most 9223372036854775807), got -9223372036854775809"),
        (1e23, "must fit in 64 bits (at most 9223372036854775807), got 1e+23"),
        (1.5, "must be an integer, got the number 1.5"),
    ],
    ids=["2^63", "below-int64", "float-beyond", "fraction"],
)
def test_integers_are_bounded_to_int64(count: object, problem: str) -> None:
    """Guards: counts beyond int64 (as JSON or goyaml.v2 would deliver them) are refused with the bound named."""
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_documents(
            [m.claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}])], file="f"
        )
    assert caught.value.problems == (
        f"f: ResourceClaim default/train: spec.devices.requests[0].exactly.count: {problem}",
    )


def test_big_json_integers_are_read_as_floats() -> None:
    """Guards: a JSON integer of thousands of digits (past json's 4,300-digit limit) is a field problem, not a crash."""
    text = '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": ' + (
        '{"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": '
        + "9" * 5000
        + "}}]}}}"
    )
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_text(text, file="f.json")
    assert caught.value.problems == (
        "f.json: ResourceClaim default/c: spec.devices.requests[0].exactly.count: "
        "must fit in 64 bits (at most 9223372036854775807), got inf",
    )


def test_huge_strings_are_shortened_in_messages() -> None:
    """Guards: a 5,000-digit plain scalar (a string for kubectl) is quoted shortened,
    so the message stays one short line."""
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_text(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n"
            "    requests: [{name: gpu, exactly: {deviceClassName: gpu, count: " + "9" * 5000 + "}}]\n",
            file="f",
        )
    assert caught.value.problems == (
        "f: ResourceClaim default/c: spec.devices.requests[0].exactly.count: must be an integer, got the string "
        f'"{"9" * 40}..." (5000 characters)',
    )


def test_boolean_where_a_string_belongs_says_to_quote_it() -> None:
    """Guards: `nodeName: no` (false for kubectl) gets a message explaining YAML 1.1 booleans."""
    slice_ = m.resource_slice()
    slice_["spec"]["nodeName"] = False
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_documents([slice_], file="f")
    assert caught.value.problems[0] == (
        "f: ResourceSlice node-1-gpu: spec.nodeName: must be a string, got a boolean: quote it "
        "(unquoted y, n, yes, no, on, off, true and false are booleans)"
    )


def test_load_object_returns_the_model_value() -> None:
    """Guards: one API object decodes into its model value, as a watch event delivers it."""
    claim = decode.load_object(m.claim(), source="watch resourceclaims")
    assert isinstance(claim, model.ResourceClaim)
    assert claim.key == "default/train" and claim.source.file == "watch resourceclaims"
    assert isinstance(decode.load_object(m.resource_slice(), source="api"), model.ResourceSlice)


def test_load_object_raises_naming_the_object_and_field() -> None:
    """Guards: a bad object raises DecodeError naming source, object and field, so the caller can skip just it."""
    bad = m.claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": -1}}])
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_object(bad, source="api")
    assert caught.value.problems == (
        "api: ResourceClaim default/train: spec.devices.requests[0].exactly.count: must be >= 1",
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
        },
    ],
    ids=["other-kind", "workload"],
)
def test_load_object_refuses_kinds_that_are_not_one_value(raw: dict[str, object]) -> None:
    """Guards: kinds dractl skips, and workloads that expand to several Pods, are a DecodeError naming the kind."""
    with pytest.raises(decode.DecodeError, match=f"api: a {raw['kind']} is not one object of a kind dractl decodes"):
        decode.load_object(raw, source="api")


# Plain documents of every shape the fast path takes: block and flow, literal and folded
# scalars, quoting styles, YAML 1.1 scalars, empty documents, comments and document markers.
PLAIN_DOCUMENTS = [
    "a: yes\nb: 'yes'\nc: 0777\nd: [1, {x: ~}]\ne: \"0x1F\"\nf: 1e3\ng: 1:30\nh: 2024-01-01\n",
    "---\n# only a comment\n---\na: 1\n...\n---\n- x\n",
    "a: |\n  literal\n   text\nb: >\n  folded\n  text\nc: ! tagged-nonspecific\n",
    "- 1\n- - 2\n  - 3\n- {a: [b, {c: d}], e: []}\n- ''\n- \"\"\n-\n",
    "{a: b, 1: one, true: t, ~: null-key, 1.5: f}\n",
    "key with spaces: 'value with: colon'\n'quoted key': 99999999999999999999999\n\"9\": 1e999999\n",
    "dup: 1\ndup: 2\n",
    "\ufeffa: bom\n",
    "a: \u00e9\u4e2d\u6587\U0001f600\n",
]


@pytest.mark.parametrize("text", PLAIN_DOCUMENTS, ids=range(len(PLAIN_DOCUMENTS)))
def test_fast_path_equals_pyyaml(text: str) -> None:
    """Guards: the libyaml fast path builds exactly the values the PyYAML path builds, for plain documents."""
    from dractl.model.decode import _fastyaml

    fast = _fastyaml.load_all(text.encode(), yaml11._plain_value, yaml11.MAX_FLOW_DEPTH)
    assert fast is not None, "the fast path should take this document"
    assert fast == list(yaml11.load_all_with_pyyaml(text))


@pytest.mark.parametrize(
    "text",
    [
        "a: &x 1\nb: *x\n",
        "a: !foo b\n",
        "a: !!str 1\n",
        "b: {<<: {a: 1}}\n",
        "? [a]\n: 1\n",
        "a: [1,\n",
        "a: b\n- c\n",
    ],
    ids=["anchor", "tag", "standard-tag", "merge", "collection-key", "unterminated", "bad-indent"],
)
def test_fast_path_hands_everything_else_to_pyyaml(text: str) -> None:
    """Guards: anchors, tags, merge keys, collection keys and syntax errors leave the fast path (None) for PyYAML."""
    from dractl.model.decode import _fastyaml

    assert _fastyaml.load_all(text.encode(), yaml11._plain_value, yaml11.MAX_FLOW_DEPTH) is None


def test_benchmark_cluster_is_read_alike_by_both_paths() -> None:
    """Guards: a generated cluster (slices, CEL selectors, claims) reads the same through both paths."""
    import sys

    import yaml

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmarks"))
    import alloc as generator

    text = yaml.safe_dump_all(generator.manifests(5), sort_keys=False)
    assert list(yaml11.load_all(text)) == list(yaml11.load_all_with_pyyaml(text)) == generator.manifests(5)


def test_fast_path_bounds_its_depth() -> None:
    """Guards: nesting past the bound leaves the fast path (None), so PyYAML's bounds and messages apply."""
    from dractl.model.decode import _fastyaml

    text = "".join(" " * i + "a:\n" for i in range(50)) + " " * 50 + "1\n"
    assert _fastyaml.load_all(text.encode(), yaml11._plain_value, 49) is None
    assert _fastyaml.load_all(text.encode(), yaml11._plain_value, 50) is not None


def test_text_that_is_not_utf8_is_one_problem() -> None:
    """Guards: a lone surrogate (possible in text handed to load_text, never in a file read as UTF-8) is a message."""
    with pytest.raises(decode.DecodeError) as caught:
        decode.load_text("a: \ud800\n", file="x")
    assert caught.value.problems == ("x: not UTF-8 text: surrogates not allowed at character 3",)


@pytest.mark.parametrize(
    "text",
    ["", "a: 1\n", "a: [1, {b: [2]}]\n", "]]][[", 'a: "[[[ é ü {"\n', "x: ]\ny: [[[]]]\n", "ß[" * 5 + "]" * 5],
    ids=["empty", "none", "nested", "closing-first", "quoted-and-multibyte", "unbalanced", "multibyte-between"],
)
def test_flow_depth_counts_brackets_as_the_python_check(text: str) -> None:
    """Guards: the C bracket count the fast path uses gives the deepest running depth over the
    UTF-8 bytes, the same number `check_flow_nesting` computes over the text."""
    from dractl.model.decode import _fastyaml

    depth, deepest = 0, 0
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        deepest = max(deepest, depth) if char in "[{" else deepest
    assert _fastyaml.flow_depth(text.encode()) == deepest


def test_too_deep_text_that_is_not_utf8_reports_the_nesting() -> None:
    """Guards: text both too deeply nested and not UTF-8 gets the nesting message, as before the C count."""
    with pytest.raises(yaml11.YamlError, match="nested too deeply: more than 1000 levels"):
        list(yaml11.load_all("a: \ud800 " + "[" * 1001 + "]" * 1001))
