"""Adding and removing a finalizer without re-encoding anything else of the object.

Why not a patch: the API server applies every kind of patch (merge, JSON, apply) and every JSON
PUT to the object as JSON, and decodes the result. A ResourceClaim's opaque configuration
(`spec.devices.config[].opaque.parameters`) is stored as the bytes its creator sent; when those
are not compact JSON (the Python client, dractl's own creates, any indenting client), the JSON
round trip compacts them, the spec no longer equals the stored one byte for byte, and the
immutable-spec check refuses the write (422 "spec: field is immutable"). kube-scheduler does not
meet this because it speaks protobuf, which carries those bytes verbatim. So does this module:
it reads the object in protobuf (`Client.get_protobuf`), changes only `metadata.finalizers`, sets
`metadata.resourceVersion` to the version the caller decided from (the write's precondition),
leaves `metadata.managedFields` out (the server keeps the stored ones), copies every other field as
the bytes it was, and writes it back with a protobuf PUT (`Client.update_protobuf`).

The encoding: the `k8s\\x00` magic, then a runtime.Unknown (1 typeMeta, 2 raw, 3 contentEncoding, 4
contentType) whose `raw` is the object (1 metadata, 2 spec, 3 status); in ObjectMeta, 5 uid, 6
resourceVersion, 14 finalizers, 17 managedFields (k8s.io/apimachinery's generated.proto).

`add_with_patch` is the one-request way for objects that hold no such bytes: a merge patch of
`metadata.finalizers` at the resourceVersion the caller decided from. The JSON round trip then
changes nothing the API server compares (it compares quantities by value, and nil and empty lists
as equal), so the write is accepted; the caller says whether its object qualifies (a
ResourceClaim without opaque configuration does).

What it must not do: interpret any field beyond these, or write anything but the finalizer list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dractl.kube import client as kube_client

MAGIC = b"k8s\x00"
_UNKNOWN_RAW = 2
_OBJECT_METADATA = 1
_META_UID = 5
_META_RESOURCE_VERSION = 6
_META_FINALIZERS = 14
_META_MANAGED_FIELDS = 17
_LENGTH_DELIMITED = 2


class Malformed(ValueError):
    """Bytes that are not a protobuf-encoded Kubernetes object; the message says where reading stopped."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    number: int
    encoded: bytes  # the key and the value, as they were
    value: bytes  # the payload of a length-delimited field, else b""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise Malformed("a varint runs past the end")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Malformed("a varint is longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data: bytes) -> list[_Field]:
    """The fields of one message in their order. Pure; raises `Malformed`."""
    fields: list[_Field] = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value = b""
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == _LENGTH_DELIMITED:
            length, pos = _varint(data, pos)
            value = data[pos : pos + length]
            pos += length
        else:
            raise Malformed(f"field {number} has the unsupported wire type {wire}")
        if pos > len(data):
            raise Malformed(f"field {number} runs past the end")
        fields.append(_Field(number, data[start:pos], value))
    return fields


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _only(fields: Sequence[_Field], number: int, what: str) -> bytes:
    found = [field.value for field in fields if field.number == number]
    if len(found) != 1:
        raise Malformed(f"{what} (field {number}) appears {len(found)} times")
    return found[0]


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise Malformed(f"{what} is not UTF-8") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """An object as the API server stores it. `sections` maps each top-level field of the object (1 metadata,
    2 spec, 3 status) to its encoded bytes, exactly as stored."""

    uid: str
    resource_version: str
    finalizers: tuple[str, ...]
    sections: Mapping[int, bytes]


def _split(data: bytes) -> tuple[list[_Field], list[_Field], list[_Field]]:
    if not data.startswith(MAGIC):
        raise Malformed("the protobuf envelope's magic k8s\\x00 is missing")
    envelope = _fields(data[len(MAGIC) :])
    obj = _fields(_only(envelope, _UNKNOWN_RAW, "the envelope's raw object"))
    meta = _fields(_only(obj, _OBJECT_METADATA, "the object's metadata"))
    return envelope, obj, meta


def read(data: bytes) -> Stored:
    """The object in `data` (as `Client.get_protobuf` returns it). Pure; raises `Malformed`."""
    _, obj, meta = _split(data)
    return Stored(
        uid=_text(_only(meta, _META_UID, "metadata.uid"), "metadata.uid"),
        resource_version=_text(
            _only(meta, _META_RESOURCE_VERSION, "metadata.resourceVersion"), "metadata.resourceVersion"
        ),
        finalizers=tuple(
            _text(field.value, "metadata.finalizers") for field in meta if field.number == _META_FINALIZERS
        ),
        sections={field.number: field.value for field in obj},
    )


def with_finalizers(data: bytes, finalizers: Sequence[str], *, resource_version: str) -> bytes:
    """`data` with metadata.finalizers replaced, metadata.resourceVersion set to `resource_version` and
    metadata.managedFields left out; every other field's bytes unchanged and in order. Pure; raises `Malformed`."""
    envelope, obj, meta = _split(data)
    dropped = (_META_RESOURCE_VERSION, _META_FINALIZERS, _META_MANAGED_FIELDS)
    new_meta = b"".join(field.encoded for field in meta if field.number not in dropped)
    new_meta += _bytes_field(_META_RESOURCE_VERSION, resource_version.encode())
    new_meta += b"".join(_bytes_field(_META_FINALIZERS, item.encode()) for item in finalizers)
    new_obj = b"".join(
        _bytes_field(_OBJECT_METADATA, new_meta) if field.number == _OBJECT_METADATA else field.encoded for field in obj
    )
    new_envelope = b"".join(
        _bytes_field(_UNKNOWN_RAW, new_obj) if field.number == _UNKNOWN_RAW else field.encoded for field in envelope
    )
    return MAGIC + new_envelope


def change(
    api: kube_client.Client,
    resource: kube_client.Resource,
    name: str,
    *,
    namespace: str,
    resource_version: str,
    add: str = "",
    remove: str = "",
) -> dict[str, Any] | None:
    """Add the finalizer `add` (at the end) or remove `remove` from the object, as it is at `resource_version`.

    Returns the stored object (JSON) after the write, or None when there was nothing to change (no
    write). Raises `Conflict` when the object is no longer at `resource_version` (then nothing is
    written), `NotFound`, another `ApiError`, or `BadObject` naming the object when its bytes cannot
    be read. One protobuf GET and at most one protobuf PUT; idempotent.
    """
    where = f"{resource.kind} {namespace}/{name}" if namespace else f"{resource.kind} {name}"
    data = api.get_protobuf(resource, name, namespace=namespace)
    try:
        stored = read(data)
    except Malformed as error:
        raise kube_client.BadObject(f"{where}: its protobuf encoding cannot be read: {error}") from None
    if stored.resource_version != resource_version:
        raise kube_client.Conflict(
            409, "Conflict", f"{where} changed: resourceVersion {stored.resource_version}, not {resource_version}"
        )
    finalizers = [item for item in stored.finalizers if item != remove]
    if add and add not in finalizers:
        finalizers.append(add)
    if finalizers == list(stored.finalizers):
        return None
    body = with_finalizers(data, finalizers, resource_version=resource_version)
    return api.update_protobuf(resource, name, body, namespace=namespace)


def add_with_patch(
    api: kube_client.Client,
    resource: kube_client.Resource,
    name: str,
    *,
    namespace: str,
    resource_version: str,
    finalizers: Sequence[str],
    add: str,
) -> dict[str, Any] | None:
    """Add the finalizer `add` (at the end) to the object whose finalizers at `resource_version` are `finalizers`,
    with one merge patch of `metadata.finalizers` carrying that resourceVersion as precondition.

    Only for an object nothing of which the API server keeps as raw bytes (see the module's docstring).
    Returns the stored object after the write, or None when `add` is already there (no write). Raises
    `Conflict` when the object is no longer at `resource_version` (nothing is written), `NotFound` or another
    `ApiError`. One request at most; idempotent.
    """
    if add in finalizers:
        return None
    body = {"metadata": {"resourceVersion": resource_version, "finalizers": [*finalizers, add]}}
    return api.patch(resource, name, body, namespace=namespace)
