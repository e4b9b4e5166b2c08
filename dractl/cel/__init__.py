"""The Kubernetes DRA CEL environment for device selectors, on `cel-expr-python`.

What it does: compiles selector expressions (cached by their text) in the environment the API
server and the scheduler use for `resource.k8s.io/v1` device selectors, and evaluates them
against per-device inputs that are built once per device and reused for every expression.
Expressions that Kubernetes rejects are rejected at compile time, with the library's position
marker and, where we know one, the expression to write instead; expressions that could build
huge values or run long are refused by a static cost bound. `sharing` tells which devices an
expression cannot tell apart, so callers may evaluate it once for all of them.

What it must not do: know about claims, classes, pools or the allocator's caches, or do I/O.
Only `environment` imports `cel_expr_python`.

Modules, bottom up: `environment` (types, functions, device values), `lexer` (tokens and the
optional-domain rewrite), `checked` (the library's checked AST as Python values), `cost` (the
static bound), `fixes` ("write instead"), `program` (compile and run), `sharing` (which devices
share a result), `problems` (every invalid selector of a set of manifests).

The public API is re-exported here: `from dractl import cel`, then `cel.compile(text)`,
`cel.device_input(driver, device)`, `program.matches(input)`, `cel.problems(objects)`,
`cel.CompileError`, `cel.EvalError`, `cel.sharing.footprint(text)`.
"""

from dractl.cel import sharing
from dractl.cel.environment import LIST_INCLUDES_LIMIT, quote
from dractl.cel.problems import problems
from dractl.cel.program import (
    MAX_EXPRESSION_BYTES,
    CompileError,
    DeviceInput,
    EvalError,
    Program,
    compile,
    device_input,
)

__all__ = [
    "LIST_INCLUDES_LIMIT",
    "MAX_EXPRESSION_BYTES",
    "CompileError",
    "DeviceInput",
    "EvalError",
    "Program",
    "compile",
    "device_input",
    "problems",
    "quote",
    "sharing",
]
