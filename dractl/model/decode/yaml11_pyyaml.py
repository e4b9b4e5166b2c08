"""The PyYAML half of `yaml11`: anchors, aliases, tags, merge keys and syntax errors.

What it does: reads the documents `yaml11`'s libyaml fast path leaves to PyYAML, with the same
goyaml.v2 rules for scalars (`yaml11._plain`) and tags, and checks aliases after parsing
(`yaml11._check_aliases`). It is `yaml11`'s other half and shares its private tables; it is a
module of its own so that PyYAML's Python modules (about 15 ms to import) are imported only
when a document needs them, never for JSON or plain YAML.

What it must not do: be imported by anything but `yaml11.load_all_with_pyyaml`, validate
Kubernetes fields, or read files. Pure.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any

import yaml

from dractl.model.decode import yaml11

# PyYAML's libyaml binding; the dependency is declared as PyYAML built with it (see pyproject.toml).
_CParser: type[Any] = yaml._yaml.CParser


def load_all(text: str) -> Iterator[object]:
    """`yaml11.load_all_with_pyyaml`: the documents through PyYAML, raising `yaml11.YamlError`.

    Pure; the caller must have run `yaml11.check_flow_nesting` and `yaml11.check_block_nesting`.
    """
    loader = _Loader(text)
    index = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            value = loader.construct_document(node)
            index += 1
            if loader.aliased:
                loader.aliased = False
                problem = yaml11._check_aliases(value)
                if problem is not None:
                    raise yaml11.YamlError(f"document {index} (line {node.start_mark.line + 1}): {problem}")
            yield value
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(part for part in (error.context, error.problem) if part)
        raise yaml11.YamlError(f"{where}YAML syntax error: {problem}") from None
    except yaml.YAMLError as error:
        raise yaml11.YamlError(f"YAML syntax error: {str(error).splitlines()[0]}") from None
    except RecursionError:
        raise yaml11.YamlError(f"nested too deeply (at most {yaml11.MAX_FLOW_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _short(tag: str) -> str:
    return "!!" + tag.rsplit(":", 1)[-1]


def _error(problem: str, node: yaml.Node) -> yaml.MarkedYAMLError:
    error_type: Any = yaml.constructor.ConstructorError
    error: yaml.MarkedYAMLError = error_type(None, None, problem, node.start_mark)
    return error


class _Resolver(yaml.resolver.BaseResolver):
    """Tags for untagged nodes; plain scalars are resolved when constructed (see `yaml11._plain`)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                # Merge keys must carry their tag already: PyYAML flattens them before construction.
                return yaml11._MERGE if value == "<<" else "!plain"
            return yaml11._STR
        return yaml11._SEQ if kind is yaml.SequenceNode else yaml11._MAP


class _Constructor(yaml.constructor.SafeConstructor):
    aliased = False

    def construct_plain(self, node: yaml.ScalarNode) -> object:
        return yaml11._plain(node.value)[1]

    def construct_tagged(self, node: yaml.Node) -> object:
        """Explicit tags, as goyaml.v2 treats them; unknown tags are ignored."""
        if isinstance(node, yaml.MappingNode):
            return self.construct_yaml_map_now(node)
        if isinstance(node, yaml.SequenceNode):
            return self.construct_sequence(node, deep=True)
        tag, text = node.tag, str(node.value)
        if tag == yaml11._BINARY:
            try:
                # Like Go's base64 decoder: line breaks are fine, any other stray character is not.
                packed = "".join(text.split()).encode("ascii", "strict")
                return base64.b64decode(packed, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeError, ValueError):
                raise _error("!!binary value is not base64 of UTF-8 text", node) from None
        if tag not in yaml11._RESOLVABLE:
            return text
        resolved, value = yaml11._plain(text)
        if tag == yaml11._STR:
            return text
        if tag == resolved or (tag == yaml11._TIMESTAMP and resolved == yaml11._TIMESTAMP):
            return value
        if tag == yaml11._FLOAT and resolved == yaml11._INT:
            return float(value)  # type: ignore[arg-type]
        raise _error(f"cannot decode {_short(resolved)} `{text[:40]}` as a {_short(tag)}", node)

    def construct_yaml_map_now(self, node: yaml.MappingNode) -> dict[Any, Any]:
        return self.construct_mapping(node, deep=True)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.constructed_objects:
            self.aliased = True
        base: Any = super()
        return base.construct_object(node, deep=deep)


_SAFE: Any = yaml.constructor.SafeConstructor
_Constructor.yaml_constructors = {
    **_SAFE.yaml_constructors,
    "!plain": _Constructor.construct_plain,
    yaml11._STR: _SAFE.construct_yaml_str,
    yaml11._SEQ: _SAFE.construct_yaml_seq,
    yaml11._MAP: _SAFE.construct_yaml_map,
    **{
        tag: _Constructor.construct_tagged
        for tag in (
            yaml11._INT,
            yaml11._FLOAT,
            yaml11._BOOL,
            yaml11._NULL,
            yaml11._TIMESTAMP,
            yaml11._BINARY,
            "tag:yaml.org,2002:set",
            "tag:yaml.org,2002:omap",
            "tag:yaml.org,2002:pairs",
            None,
        )
    },
}


class _Loader(_CParser, _Constructor, _Resolver):  # type: ignore[misc]
    def __init__(self, stream: str) -> None:
        _CParser.__init__(self, stream)
        _Constructor.__init__(self)
        _Resolver.__init__(self)
