# cython: language_level=3, boundscheck=True, wraparound=True
"""The fast path of `yaml11`: libyaml events straight into dicts, lists and strings.

What it does: walks libyaml's event stream in C, building plain Python values without PyYAML's
Node and Mark objects (most of PyYAML's time on big manifests); plain scalars are resolved by
the `resolve` callable `yaml11` passes in (goyaml.v2's rules, memoised), so both paths give the
same values. Iterative: nesting costs no C stack.

What it must not do: handle anything but plain documents. At the first anchor, alias, tag
other than `!`, merge key, non-scalar key or syntax error it returns None and `yaml11` parses
the text with PyYAML instead, which handles (and reports) all of those with line and column.
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8


cdef extern from "yaml.h":
    ctypedef unsigned char yaml_char_t
    ctypedef enum yaml_event_type_t:
        YAML_NO_EVENT
        YAML_STREAM_START_EVENT
        YAML_STREAM_END_EVENT
        YAML_DOCUMENT_START_EVENT
        YAML_DOCUMENT_END_EVENT
        YAML_ALIAS_EVENT
        YAML_SCALAR_EVENT
        YAML_SEQUENCE_START_EVENT
        YAML_SEQUENCE_END_EVENT
        YAML_MAPPING_START_EVENT
        YAML_MAPPING_END_EVENT
    ctypedef enum yaml_scalar_style_t:
        YAML_ANY_SCALAR_STYLE
        YAML_PLAIN_SCALAR_STYLE
    ctypedef struct _scalar_data:
        yaml_char_t *anchor
        yaml_char_t *tag
        yaml_char_t *value
        size_t length
        int plain_implicit
        int quoted_implicit
        yaml_scalar_style_t style
    ctypedef struct _collection_data:
        yaml_char_t *anchor
        yaml_char_t *tag
        int implicit
    ctypedef union _event_data:
        _scalar_data scalar
        _collection_data sequence_start
        _collection_data mapping_start
    ctypedef struct yaml_event_t:
        yaml_event_type_t type
        _event_data data
    ctypedef struct yaml_parser_t:
        pass
    int yaml_parser_initialize(yaml_parser_t *parser)
    void yaml_parser_delete(yaml_parser_t *parser)
    void yaml_parser_set_input_string(yaml_parser_t *parser, const unsigned char *input, size_t size)
    int yaml_parser_parse(yaml_parser_t *parser, yaml_event_t *event)
    void yaml_event_delete(yaml_event_t *event)


cdef inline bint _plain_tag(yaml_char_t *tag):
    """No tag, or the non-specific `!` (a string, as for quoted scalars)."""
    return tag == NULL or (tag[0] == b'!' and tag[1] == 0)


def load_all(bytes data, resolve, Py_ssize_t max_depth):
    """The documents of `data` (UTF-8 YAML) as plain values, or None when it needs the full parser.

    `resolve(text)` gives the value of a plain scalar. Nesting deeper than `max_depth` also returns
    None, so the caller's bounds and messages apply. Pure; the GIL is held throughout.
    """
    cdef yaml_parser_t parser
    cdef yaml_event_t event
    cdef list documents = []
    cdef list stack = []  # the open containers around `top`, outermost first
    cdef list keys = []  # the pending key of each container in `stack`, or `no_key`
    cdef dict resolved = {}  # plain scalar text -> its value: keys and values repeat across objects
    cdef object value, top = None, key
    cdef object no_key = keys  # a marker no YAML value can be
    cdef bint done = False, bail = False, container, top_is_list = False
    cdef Py_ssize_t depth = 0
    key = no_key
    if not yaml_parser_initialize(&parser):
        return None
    yaml_parser_set_input_string(&parser, data, len(data))
    try:
        while not done and not bail:
            if not yaml_parser_parse(&parser, &event):
                return None  # a syntax error: PyYAML reports it with its position
            container = False
            value = None
            if event.type == YAML_SCALAR_EVENT:
                if event.data.scalar.anchor != NULL or not _plain_tag(event.data.scalar.tag):
                    bail = True
                else:
                    value = PyUnicode_DecodeUTF8(<char *>event.data.scalar.value, event.data.scalar.length, "strict")
                    if event.data.scalar.plain_implicit and event.data.scalar.tag == NULL and \
                            event.data.scalar.style == YAML_PLAIN_SCALAR_STYLE:
                        if value == "<<":
                            bail = True  # merge keys
                        else:
                            hit = resolved.get(value, no_key)
                            if hit is no_key:
                                hit = resolve(value)
                                resolved[value] = hit
                            value = hit
                    container = True
            elif event.type == YAML_MAPPING_START_EVENT or event.type == YAML_SEQUENCE_START_EVENT:
                if event.data.mapping_start.anchor != NULL or not _plain_tag(event.data.mapping_start.tag):
                    bail = True
                elif depth >= max_depth:
                    bail = True
                else:
                    if depth:
                        stack.append(top)
                        keys.append(key)
                    depth += 1
                    top_is_list = event.type == YAML_SEQUENCE_START_EVENT
                    top = [] if top_is_list else {}
                    key = no_key
            elif event.type == YAML_MAPPING_END_EVENT or event.type == YAML_SEQUENCE_END_EVENT:
                value = top
                depth -= 1
                if depth:
                    top = stack.pop()
                    key = keys.pop()
                    top_is_list = type(top) is list
                container = True
            elif event.type == YAML_STREAM_END_EVENT:
                done = True
            elif event.type == YAML_ALIAS_EVENT:
                bail = True
            yaml_event_delete(&event)
            if container and not bail:
                # Attach the finished value to its parent, or close the document.
                if not depth:
                    documents.append(value)
                elif top_is_list:
                    (<list>top).append(value)
                elif key is no_key:
                    if type(value) is dict or type(value) is list:
                        bail = True  # a collection as a key
                    else:
                        key = value
                else:
                    (<dict>top)[key] = value
                    key = no_key
    finally:
        yaml_parser_delete(&parser)
    return None if bail else documents


def flow_depth(bytes data):
    """The deepest nesting of `[`/`{` against `]`/`}` over `data`, counting every bracket
    (quoted ones too) as `yaml11.check_flow_nesting` does, 0 at least. Pure. UTF-8 never uses
    these bytes inside a multi-byte character, so the count equals the text's."""
    cdef const unsigned char* p = data
    cdef Py_ssize_t i, n = len(data)
    cdef Py_ssize_t depth = 0, deepest = 0
    for i in range(n):
        if p[i] == b'[' or p[i] == b'{':
            depth += 1
            if depth > deepest:
                deepest = depth
        elif p[i] == b']' or p[i] == b'}':
            depth -= 1
    return deepest
