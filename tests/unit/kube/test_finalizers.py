"""The protobuf side of `kube.finalizers`: reading an object's uid, version and finalizers, and rewriting only the
finalizers (and the version) while every other byte stays as it was."""

from __future__ import annotations

import pytest
from support import kube_objects

from dractl.kube import finalizers

FINALIZER = "resource.kubernetes.io/delete-protection"
# Fields the rewrite must carry over untouched: a varint (generation, 7), a fixed64 (8) and a fixed32 (9), whatever
# they mean; spec bytes that are not compact JSON (what a JSON round trip would change). managedFields is field 17:
# its key is the two-byte varint 0x8a 0x01.
OTHER_META = bytes([7 << 3, 0x96, 0x01]) + bytes([8 << 3 | 1]) + b"\x01" * 8 + bytes([9 << 3 | 5]) + b"\x02" * 4
MANAGED_FIELDS = b"\x8a\x01\x03abc"
SPEC = b'{"kind": "GpuConfig",  "sharing": {"strategy": "MPS"}}'


def test_reading_gives_uid_version_finalizers_and_the_sections_as_stored() -> None:
    """Guards: the fields the finalizer write needs are read, and the spec's bytes are exactly those stored."""
    data = kube_objects.protobuf_object(
        uid="u-1", resource_version="42", finalizers_=["a.io/x", FINALIZER], spec=SPEC, other_meta=OTHER_META
    )
    stored = finalizers.read(data)
    assert (stored.uid, stored.resource_version, stored.finalizers) == ("u-1", "42", ("a.io/x", FINALIZER))
    assert stored.sections[2] == SPEC


@pytest.mark.parametrize("wanted", [(), ("a.io/x",), ("a.io/x", FINALIZER)], ids=["none", "one", "two"])
def test_rewriting_changes_only_the_finalizers_and_the_version(wanted: tuple[str, ...]) -> None:
    """Guards: the rewritten object reads back with the new finalizers and version; its spec bytes and every other
    metadata field (varint, fixed64, fixed32) are unchanged and in order; managedFields are left out."""
    data = kube_objects.protobuf_object(
        uid="u-1", resource_version="41", finalizers_=[FINALIZER], spec=SPEC, other_meta=OTHER_META + MANAGED_FIELDS
    )
    rewritten = finalizers.with_finalizers(data, wanted, resource_version="42")
    stored = finalizers.read(rewritten)
    assert (stored.uid, stored.resource_version, stored.finalizers) == ("u-1", "42", wanted)
    assert stored.sections[2] == SPEC
    assert OTHER_META in rewritten and MANAGED_FIELDS not in rewritten


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b'{"kind": "ResourceClaim"}', "magic", id="json-not-protobuf"),
        pytest.param(finalizers.MAGIC + b"\x12\x05ab", "runs past the end", id="truncated"),
        pytest.param(finalizers.MAGIC + b"\x0b", "unsupported wire type", id="group-wire-type"),
        pytest.param(finalizers.MAGIC + b"\x0a\x00", "appears 0 times", id="no-raw-object"),
        pytest.param(finalizers.MAGIC + b"\x12\x02\x0a\x00", "metadata.uid", id="no-uid"),
    ],
)
def test_bytes_that_are_no_object_raise_malformed_saying_where(data: bytes, message: str) -> None:
    """Guards: unreadable bytes raise `Malformed` (the caller names the object), never a crash elsewhere."""
    with pytest.raises(finalizers.Malformed, match=message):
        finalizers.read(data)
