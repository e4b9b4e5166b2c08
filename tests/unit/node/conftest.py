"""Fixtures shared by the node agent's tests."""

from __future__ import annotations

import pytest

from dractl.node import checkpoint


@pytest.fixture
def encoded_claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The UID of every claim record the checkpoint encodes from now on, in order."""
    encoded: list[str] = []
    encode = checkpoint._encode_claim

    def counted(record: checkpoint.ClaimRecord) -> dict[str, object]:
        encoded.append(record.uid)
        return encode(record)

    monkeypatch.setattr(checkpoint, "_encode_claim", counted)
    return encoded
