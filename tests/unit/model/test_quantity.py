"""Kubernetes quantities parse exactly and compare by value."""

import fractions

import pytest

from dractl import model


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40Gi", 40 * 2**30),
        ("4864Mi", 4864 * 2**20),
        ("1", 1),
        ("1.5", fractions.Fraction(3, 2)),
        ("100m", fractions.Fraction(1, 10)),
        ("1e3", 1000),
        ("2E-1", fractions.Fraction(1, 5)),
        ("80G", 80 * 10**9),
        ("1k", 1000),
        (".5", fractions.Fraction(1, 2)),
        ("-2", -2),
    ],
    ids=lambda v: str(v),
)
def test_parse_values(text: str, value: fractions.Fraction | int) -> None:
    """Guards: every suffix family maps to the exact value the API server would store."""
    assert model.quantity.parse(text).value == value


@pytest.mark.parametrize("text", ["", "Gi", "40GB", "1.2.3", "ten", "4 Gi"], ids=repr)
def test_parse_rejects_non_quantities(text: str) -> None:
    """Guards: spellings the API rejects ("24GB" from the articles) are refused with the text quoted."""
    with pytest.raises(model.quantity.QuantityError, match="is not a quantity"):
        model.quantity.parse(text)


def test_parse_rejects_other_types() -> None:
    """Guards: booleans and maps from YAML are not silently taken as numbers."""
    with pytest.raises(model.quantity.QuantityError, match="must be a quantity string"):
        model.quantity.parse(True)


def test_compare_by_value_and_keep_spelling() -> None:
    """Guards: 1Gi equals 1024Mi, ordering works, and the original spelling is kept for output."""
    one_gi = model.quantity.parse("1Gi")
    assert one_gi == model.quantity.parse("1024Mi")
    assert model.quantity.parse("512Mi") < one_gi
    assert str(one_gi) == "1Gi"


def test_as_int_rounds_up() -> None:
    """Guards: fractional quantities round up to an integer like the API's Value()."""
    assert model.quantity.parse("1500m").as_int() == 2
    assert model.quantity.parse("2").as_int() == 2


def test_format_bytes() -> None:
    """Guards: the shortest exact binary spelling is chosen, falling back to plain digits."""
    assert model.quantity.format_bytes(80 * 2**30) == "80Gi"
    assert model.quantity.format_bytes(4864 * 2**20) == "4864Mi"
    assert model.quantity.format_bytes(7) == "7"


@pytest.mark.parametrize(
    "text", ["1e100", "1e999999", "-1e999999", "9" * 5000 + "Ei", "1" + "0" * 4000], ids=lambda v: str(v)[:20]
)
def test_parse_refuses_absurd_magnitudes_in_bounded_time(text: str) -> None:
    """Guards: huge exponents or thousands of digits are refused without building the number."""
    with pytest.raises(
        model.quantity.QuantityError, match=r"is too large: quantities of 10\^100 or more are not supported"
    ):
        model.quantity.parse(text)


@pytest.mark.parametrize(
    ("text", "fits"),
    [
        ("9223372036854775807", True),
        ("-9223372036854775807", True),
        ("9223372036854775808", False),
        ("8Ei", False),
        ("7Ei", True),
        ("10E", False),
        ("1e30", False),
    ],
    ids=lambda v: str(v)[:20],
)
def test_values_beyond_int64_stay_exact_and_are_flagged(text: str, fits: bool) -> None:
    """Guards: decimal values beyond int64 stay exact (CEL's isInteger needs them);
    fits_int64 flags them for the decoder."""
    assert model.quantity.fits_int64(model.quantity.parse(text)) is fits


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("9223372036854775807", 2**63 - 1),
        ("7Ei", 7 * 2**60),
        ("10E", 10**19),
        ("0.1n", fractions.Fraction(1, 10**9)),
        ("1e-999999", fractions.Fraction(1, 10**9)),
        ("-1e-999999", fractions.Fraction(-1, 10**9)),
        ("0." + "0" * 5000 + "1", fractions.Fraction(1, 10**9)),
        ("1." + "0" * 5000 + "1", 1 + fractions.Fraction(1, 10**9)),
        ("0" * 3000, 0),
        ("1.5n", fractions.Fraction(2, 10**9)),
    ],
    ids=lambda v: str(v)[:20],
)
def test_parse_rounds_up_to_nano_like_the_api(text: str, value: fractions.Fraction | int) -> None:
    """Guards: precision finer than 1n rounds up (away from zero) as resource.Quantity does;
    the bound itself is allowed."""
    assert model.quantity.parse(text).value == value


def test_non_finite_floats_are_not_quantities() -> None:
    """Guards: YAML's .inf and .nan are refused as quantities with a message, not an exception from arithmetic."""
    for raw in (float("inf"), float("nan")):
        with pytest.raises(model.quantity.QuantityError, match="is not a quantity"):
            model.quantity.parse(raw)
