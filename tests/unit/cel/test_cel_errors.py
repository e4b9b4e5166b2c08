"""Compile and evaluation errors: what is rejected, where, and the rewrite the message suggests."""

from __future__ import annotations

import pytest

from dractl import cel

ARTICLE_CLASS = """device.driver == "nvidia.com/gpu" &&
device.attributes["memory"].quantity().value() >= 24000000000 && # 24GB+
device.attributes["compute-capability"].string() >= "8.0" # Ampere+
"""


def _compile_error(expression: str) -> cel.CompileError:
    with pytest.raises(cel.CompileError) as caught:
        cel.compile(expression)
    assert caught.value.expression == expression
    assert caught.value.message in str(caught.value)
    return caught.value


def _rewrite(error: cel.CompileError) -> str:
    """The expression after "write instead:", joined back from its indented lines."""
    lines = error.message.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("write instead: "))
    rewrite = [lines[start].removeprefix("write instead: ")]
    rewrite += [line.removeprefix("    ") for line in lines[start + 1 :] if line.startswith("    ")]
    return "\n".join(rewrite)


@pytest.mark.parametrize(
    ("expression", "rewrite"),
    [
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
            id="ge-quantity",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory < 40',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40")) < 0',
            id="lt-int",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory == "80Gi"',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) == 0',
            id="eq-string",
        ),
        pytest.param(
            'quantity("40Gi") <= device.capacity["gpu.nvidia.com"].memory',
            'quantity("40Gi").compareTo(device.capacity["gpu.nvidia.com"].memory) <= 0',
            id="quantity-on-left",
        ),
        pytest.param(
            '40 < device.capacity["gpu.nvidia.com"].memory',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40")) > 0',
            id="literal-on-left-flips",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi") && device.capacity["gpu.nvidia.com"].memory '
            '< quantity("90Gi")',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 && '
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("90Gi")) < 0',
            id="two-comparisons",
        ),
        pytest.param(
            'cel.bind(m, device.capacity["gpu.nvidia.com"].memory, m > quantity("1Gi"))',
            'cel.bind(m, device.capacity["gpu.nvidia.com"].memory, m.compareTo(quantity("1Gi")) > 0)',
            id="bound-variable",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].?memory.orValue(quantity("0")) > quantity("1Gi")',
            'device.capacity["gpu.nvidia.com"].?memory.orValue(quantity("0")).compareTo(quantity("1Gi")) > 0',
            id="optional-chain",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory + quantity("1Gi") == quantity("81Gi")',
            'device.capacity["gpu.nvidia.com"].memory.add(quantity("1Gi")) == quantity("81Gi")',
            id="plus-is-add",
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability >= semver("8.0.0")',
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
            id="ge-semver",
        ),
        pytest.param(
            'device.attributes["memory"].quantity().value() >= 24000000000',
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("24Gi")) >= 0',
            id="article-memory",
        ),
        pytest.param(
            'device.attributes["compute-capability"].string() >= "8.0"',
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
            id="article-compute-capability",
        ),
        pytest.param(
            'device.attributes["cuda-version"].string() >= "12.0"',
            'device.attributes["gpu.nvidia.com"].cudaDriverVersion.compareTo(semver("12.0.0")) >= 0',
            id="article-cuda-version",
        ),
        pytest.param(
            'device.attributes["architecture"].string() == "Ada Lovelace"',
            'device.attributes["gpu.nvidia.com"].architecture == "Ada Lovelace"',
            id="article-string-attribute",
        ),
        pytest.param(
            ARTICLE_CLASS,
            'device.driver == "gpu.nvidia.com" &&\n'
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("24Gi")) >= 0 && // 24GB+\n'
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0 // Ampere+',
            id="article-device-class",
        ),
        pytest.param(
            'device.driver == "fpga.example.com" && device.attributes["logic-cells"].quantity().value() >= 1000000',
            'device.driver == "fpga.example.com" && '
            'device.capacity["fpga.example.com"].logicCells.compareTo(quantity("1000000")) >= 0',
            id="article-other-driver",
        ),
        pytest.param(
            'device.attribute["gpu.nvidia.com"].type == "gpu"',
            'device.attributes["gpu.nvidia.com"].type == "gpu"',
            id="misspelt-field",
        ),
    ],
)
def test_rejected_with_rewrite(expression: str, rewrite: str) -> None:
    """Kubernetes rejects these at compile time; the message gives a rewrite that compiles."""
    error = _compile_error(expression)
    assert _rewrite(error) == rewrite
    cel.compile(rewrite)


def test_quantity_comparison_message() -> None:
    """The message keeps the library's reason and position marker, then the fix and why."""
    error = _compile_error('device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")')
    lines = error.message.split("\n")
    assert lines[0] == (
        "ERROR: <input>:1:42: found no matching overload for '_>=_' applied to '(kubernetes.Quantity, "
        "kubernetes.Quantity)'"
    )
    assert lines[2] == " | " + "." * 41 + "^"
    assert "compareTo() returns -1, 0 or 1" in error.message
    assert str(error).startswith(
        'CEL expression `device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")` is invalid: '
    )


def test_article_notes_explain_each_fix() -> None:
    """The article's class selector gets one note per mistake: comments, driver, keys and types."""
    message = _compile_error(ARTICLE_CLASS).message
    assert "note: CEL comments start with //, not #" in message
    assert 'the NVIDIA DRA driver is named "gpu.nvidia.com"' in message
    assert '"memory" is a capacity' in message
    assert (
        '"compute-capability" is the version attribute device.attributes["gpu.nvidia.com"].cudaComputeCapability'
        in message
    )
    assert "token recognition error at: '#'" in message


def test_memory_in_decimal_bytes_not_from_gigabytes() -> None:
    """A byte count that is not whole gigabytes is suggested as the exact number."""
    error = _compile_error('device.attributes["memory"].quantity().value() >= 1500000')
    assert _rewrite(error) == 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1500000")) >= 0'


@pytest.mark.parametrize(
    ("expression", "note"),
    [
        pytest.param(
            "device == device",
            "`device` is used through its fields: device.driver, device.attributes",
            id="bare-device",
        ),
        pytest.param('device.color == "red"', "`device` has no field 'color'; its fields are", id="unknown-field"),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory.quantity() == quantity("1")',
            'quantity() is a function of a string, such as quantity("40Gi")',
            id="quantity-as-member",
        ),
    ],
)
def test_undeclared_references_get_notes(expression: str, note: str) -> None:
    """Undeclared references are compile errors with a note on what exists instead."""
    error = _compile_error(expression)
    assert "undeclared reference to" in error.message
    assert note in error.message
    assert "write instead" not in error.message


def test_syntax_error_has_library_marker() -> None:
    """A syntax error reports the library's position marker and no rewrite."""
    error = _compile_error('device.driver == "gpu.nvidia.com" &&')
    assert "Syntax error: mismatched input '<EOF>'" in error.message
    assert error.message.split("\n")[2].endswith("^")
    assert "write instead" not in error.message


@pytest.mark.parametrize(
    ("expression", "kind"),
    [
        pytest.param("device.driver", "string", id="string"),
        pytest.param('device.capacity["gpu.nvidia.com"].memory', "kubernetes.quantity", id="quantity"),
        pytest.param("1 + 1", "int", id="int"),
    ],
)
def test_statically_non_bool_is_compile_error(expression: str, kind: str) -> None:
    """An expression whose type is known not to be bool is rejected when compiled, as in Kubernetes."""
    error = _compile_error(expression)
    assert error.message == f"it must evaluate to bool, but evaluates to {kind}"


def test_dynamically_non_bool_is_eval_error(gpu: cel.DeviceInput) -> None:
    """A dyn result (an attribute value) that is not a bool fails evaluation."""
    program = cel.compile('device.attributes["gpu.nvidia.com"].productName')
    with pytest.raises(cel.EvalError) as caught:
        program.matches(gpu)
    assert caught.value.message == "must evaluate to bool, but evaluated to string 'NVIDIA A100-SXM4-80GB'"
    assert str(caught.value) == f"CEL expression `{program.expression}` failed: {caught.value.message}"


def test_runtime_error_is_eval_error(gpu: cel.DeviceInput) -> None:
    """A runtime error inside the expression fails evaluation with the library's reason."""
    with pytest.raises(cel.EvalError, match="divide by zero"):
        cel.compile('device.attributes["gpu.nvidia.com"].index / 0 == 1').matches(gpu)


def test_iteration_budget_is_eval_error(gpu: cel.DeviceInput) -> None:
    """Runaway comprehensions stop at the library's iteration budget instead of running on."""
    numbers = "[" + ",".join(["0"] * 200) + "]"
    with pytest.raises(cel.EvalError, match="Iteration budget exceeded"):
        cel.compile(f"{numbers}.all(x, {numbers}.all(y, x == y))").matches(gpu)


def test_length_limit() -> None:
    """Expressions up to 10 KiB compile; one byte more is rejected before parsing."""
    head = 'device.driver == "'
    fits = head + "x" * (cel.MAX_EXPRESSION_BYTES - len(head) - 1) + '"'
    assert len(fits.encode()) == cel.MAX_EXPRESSION_BYTES
    cel.compile(fits)
    too_long = head + "x" * (cel.MAX_EXPRESSION_BYTES - len(head)) + '"'
    assert _compile_error(too_long).message == "it is 10241 bytes long; the limit is 10240 bytes (10 KiB)"


def test_length_limit_counts_bytes() -> None:
    """The limit counts UTF-8 bytes, not characters."""
    expression = 'device.driver == "' + "é" * 5200 + '"'
    assert len(expression) < cel.MAX_EXPRESSION_BYTES
    assert "bytes long; the limit is 10240 bytes" in _compile_error(expression).message


def test_errors_are_value_errors() -> None:
    """Both error types are ValueErrors, so callers may treat them as invalid input."""
    assert issubclass(cel.CompileError, ValueError)
    assert issubclass(cel.EvalError, ValueError)


def test_accessor_on_typed_attribute_gets_note() -> None:
    """`.string()` on an attribute that is already typed is explained, not silently refused."""
    error = _compile_error('device.attributes["gpu.nvidia.com"].productName.string() == "x"')
    assert "note: attribute values are already typed: compare them directly, without .string()" in error.message
