"""core/v1 NodeSelector, as slices, devices and allocation results carry it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl.model import types
from dractl.model.decode import common, problems

_NODE_SELECTOR_KEYS = frozenset({"nodeSelectorTerms"})
_NODE_SELECTOR_TERM_KEYS = frozenset({"matchExpressions", "matchFields"})
_NODE_SELECTOR_REQUIREMENT_KEYS = frozenset({"key", "operator", "values"})
_NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def node_selector(o: problems.Report, raw: object, path: str) -> types.NodeSelector:
    m = common.as_map(o, raw, path, _NODE_SELECTOR_KEYS) or {}
    terms = []
    for i, item in enumerate(common.as_list(o, m.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")):
        tpath = f"{path}.nodeSelectorTerms[{i}]"
        t = common.as_map(o, item, tpath, _NODE_SELECTOR_TERM_KEYS) or {}
        terms.append(
            types.NodeSelectorTerm(
                match_expressions=_requirements(o, t, "matchExpressions", tpath),
                match_fields=_requirements(o, t, "matchFields", tpath),
            )
        )
    if not terms:
        example = "[{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-1]}]}]"
        o.error(f"{path}.nodeSelectorTerms", f"required: at least one term, e.g. {example}")
    return types.NodeSelector(terms=tuple(terms))


def _requirements(
    o: problems.Report, t: Mapping[str, Any], key: str, path: str
) -> tuple[types.NodeSelectorRequirement, ...]:
    result = []
    for i, item in enumerate(common.as_list(o, t.get(key), f"{path}.{key}")):
        rpath = f"{path}.{key}[{i}]"
        r = common.as_map(o, item, rpath, _NODE_SELECTOR_REQUIREMENT_KEYS)
        if r is None:
            continue
        label = common.required_str(o, r, "key", rpath)
        operator = common.required_str(o, r, "operator", rpath)
        values = common.as_strings(o, r, "values", rpath)
        if key == "matchFields":
            if label and label != "metadata.name":
                o.error(f"{rpath}.key", "must be metadata.name (the only field nodes can be selected by)")
            if operator and operator not in ("In", "NotIn"):
                o.error(f"{rpath}.operator", "must be In or NotIn for matchFields")
        elif label:
            common.check(o, f"{rpath}.key", common.label_key(label))
        if operator and operator not in _NODE_SELECTOR_OPERATORS:
            o.error(
                f"{rpath}.operator",
                f"must be one of {', '.join(_NODE_SELECTOR_OPERATORS)}, got {common.quote(operator)}",
            )
        elif operator in ("In", "NotIn") and not values:
            o.error(f"{rpath}.values", f"required for operator {operator}")
        elif operator in ("Exists", "DoesNotExist") and values:
            o.error(f"{rpath}.values", f"must be empty for operator {operator}")
        elif operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
            o.error(f"{rpath}.values", f"must be exactly one integer for operator {operator}")
        result.append(types.NodeSelectorRequirement(key=label, operator=operator, values=values))
    return tuple(result)
