"""Decoder test set-up: the `problems` fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from dractl.model import decode

Problems = Callable[..., list[str]]


@pytest.fixture
def problems() -> Problems:
    """Decode YAML text (or objects, dumped as YAML) that must be rejected; return the problems."""

    def run(manifest: str | list[dict[str, Any]] | dict[str, Any], *, file: str = "m.yaml") -> list[str]:
        text = (
            manifest
            if isinstance(manifest, str)
            else yaml.safe_dump_all(manifest if isinstance(manifest, list) else [manifest])
        )
        with pytest.raises(decode.DecodeError) as caught:
            decode.load_text(text, file=file)
        assert str(caught.value) == "\n".join(caught.value.problems)
        return list(caught.value.problems)

    return run
