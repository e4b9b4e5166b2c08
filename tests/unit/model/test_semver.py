"""Semantic versions parse strictly and order by semver precedence."""

import pytest

from dractl import model


def test_precedence() -> None:
    """Guards: numeric fields compare as numbers and pre-releases sort before releases."""
    parse = model.semver.parse
    assert parse("8.0.0") < parse("9.0.0") < parse("10.0.0")
    assert parse("1.0.0-alpha") < parse("1.0.0-alpha.1") < parse("1.0.0-beta") < parse("1.0.0")
    assert parse("1.0.0-2") < parse("1.0.0-10")
    assert parse("1.0.0+build") == parse("1.0.0")


@pytest.mark.parametrize("text", ["8.0", "v8.0.0", "01.0.0", "1.0.0-", "580.126"], ids=repr)
def test_strict_rejects(text: str) -> None:
    """Guards: only MAJOR.MINOR.PATCH is accepted without normalisation."""
    with pytest.raises(model.semver.SemverError, match="not a semantic version"):
        model.semver.parse(text)


def test_normalize_accepts_short_forms() -> None:
    """Guards: semver(s, true) in CEL accepts "v1", "8.0" and leading zeros."""
    assert model.semver.parse("v8.0", normalize=True) == model.semver.parse("8.0.0")
    assert model.semver.parse("08.6", normalize=True) == model.semver.parse("8.6.0")


def test_str_round_trip() -> None:
    """Guards: a parsed version prints back as written."""
    assert str(model.semver.parse("1.2.3-rc.1+abc")) == "1.2.3-rc.1+abc"
