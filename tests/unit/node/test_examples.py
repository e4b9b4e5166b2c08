"""The example cluster's node files are exactly what `dractl discover` prints for the fake profiles."""

from __future__ import annotations

import os

import pytest

from dractl.model import decode
from dractl.node import discover


@pytest.mark.parametrize("example", discover.EXAMPLES, ids=lambda e: e.file)
def test_example_node_file_matches_discover(example: discover.Example) -> None:
    """Guards against the shipped example slices drifting from the fake profiles and the slice code."""
    expected = discover.example_text(example)
    path = discover.EXAMPLES_DIR / example.file
    if os.environ.get("DRACTL_REGENERATE_EXAMPLES") == "1":
        path.write_text(expected, encoding="utf-8")
    actual = path.read_text(encoding="utf-8")
    assert actual == expected, (
        f"{path} differs from `dractl discover` for profile {example.settings.fake_profile}; "
        "regenerate with DRACTL_REGENERATE_EXAMPLES=1 pytest tests/unit/node/test_examples.py"
    )


@pytest.mark.parametrize("example", discover.EXAMPLES, ids=lambda e: e.file)
def test_example_node_file_is_valid(example: discover.Example) -> None:
    """Guards that every shipped example slice passes the API's validation rules (decode)."""
    objects = decode.load_paths([discover.EXAMPLES_DIR / example.file])
    assert objects.resource_slices
    assert {s.pool.name for s in objects.resource_slices} == {example.settings.node_name}
    assert all(s.pool.resource_slice_count == len(objects.resource_slices) for s in objects.resource_slices)
