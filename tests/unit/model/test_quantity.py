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
