"""Reading manifests: files and directories -> text -> documents -> decoded objects.

What it does: walks the given paths, reads each file (at most `MAX_FILE_BYTES`; the path `-` is
standard input, named `<stdin>` in messages: `read_text`, `input_name`), parses JSON
with the json module (far faster than a YAML parser) and everything else with `yaml11`
(YAML as kubectl reads it: `documents`), and hands each document to `dispatch`. Every problem names the
file; syntax errors also name the line and column. Hostile input is bounded here: nesting
depth before a recursive parser runs, integers of thousands of digits, alias bombs (in
`yaml11`), and a document whose decoding still recurses too deeply becomes one message.

What it must not do: validate fields (the kind modules do) or write anything. Pure apart
from reading the given paths (and standard input, for `-`).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import os
import pathlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from dractl.model import types
from dractl.model.decode import dispatch, problems, yaml11

# A 1,000-node cluster with 7,000 claims is 7 MiB of YAML; ten times that still fits.
MAX_FILE_BYTES = 64 * 1024 * 1024
# json.loads refuses integers of more than 4,300 digits with a ValueError; beyond 20 digits no
# integer fits in 64 bits, so such numbers are read as floats, as Go's JSON decoder reads them.
_INT_DIGITS = 20

# The path that means standard input, as in `kubectl apply -f -`, and its name in messages.
STDIN = "-"
STDIN_NAME = "<stdin>"


def load_paths(paths: Sequence[str | os.PathLike[str]]) -> types.Objects:
    """Decode files and directories (recursively, `*.yaml`/`*.yml`/`*.json`, sorted), and standard
    input for `-`.

    Raises `problems.DecodeError` with every problem of every file. Reads the files, and standard
    input to its end for `-`: give `-` at most once (a second read finds it empty). Otherwise pure.
    """
    out = problems.Results()
    with _without_gc():
        for given in paths:
            _load_path(out, pathlib.Path(given))
    return out.finish()


def input_name(path: str | os.PathLike[str]) -> str:
    """How messages name an input: `<stdin>` for `-`, otherwise the path as given. Pure."""
    return STDIN_NAME if os.fspath(path) == STDIN else os.fspath(path)


class ReadError(ValueError):
    """An input that cannot be read; the message is one line naming the input."""


def read_text(path: str | os.PathLike[str], *, binary: str, too_large: str) -> str:
    """The whole text of one input (`-`: standard input), at most `MAX_FILE_BYTES`: a larger input is refused by
    its size before it is read where the size is known (a file), else after one character past the limit (a pipe,
    `/dev/zero`), so memory stays bounded. Raises `ReadError` naming the input (as `input_name` does), with the
    caller's advice for text that is not UTF-8 (`binary`) and for an input too large (`too_large`). Reads that
    input only."""
    name = input_name(path)
    limit = f"{MAX_FILE_BYTES // (1024 * 1024)} MiB: {too_large}"
    try:
        if os.fspath(path) != STDIN:
            size = os.stat(path).st_size
            if size > MAX_FILE_BYTES:
                raise ReadError(f"{name}: {size} bytes is larger than {limit}")
        with _open_text(path) as stream:
            text = stream.read(MAX_FILE_BYTES + 1)
    except UnicodeDecodeError:
        raise ReadError(f"{name}: cannot read: not UTF-8 text (a binary file?); {binary}") from None
    except OSError as error:
        raise ReadError(f"{name}: cannot read: {error}") from None
    if len(text) > MAX_FILE_BYTES:
        raise ReadError(f"{name}: more than {limit}")
    return text


@contextlib.contextmanager
def _open_text(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """Open one input as UTF-8 text: a file or a pipe, or standard input for `-`.

    Standard input is read the way a file is (UTF-8 whatever the locale, universal newlines)
    and left open on exit. Raises `OSError` when the input cannot be opened, standard input
    included when it is closed (`<&-`); reading raises `UnicodeDecodeError` for text that is not
    UTF-8. Reads nothing itself.
    """
    if os.fspath(path) != STDIN:
        with open(path, encoding="utf-8") as stream:
            yield stream
        return
    # sys.stdin is None when the process started with file descriptor 0 closed.
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        raise OSError(errno.EBADF, "standard input is closed")
    stream = io.TextIOWrapper(buffer, encoding="utf-8")
    try:
        yield stream
    finally:
        stream.detach()  # closing the wrapper would close standard input


def _load_path(out: problems.Results, path: pathlib.Path) -> None:
    """One given path: a file, a directory's manifests (recursively, sorted), or standard input (`-`).

    A given file, or a directory as a whole, that holds no object is a problem: an empty
    input is a mistake (a failed `kubectl get ... > file`), not a cluster without devices.
    A pipe, standard input included, is read like a file (`-f <(kubectl get resourceslices -o yaml)`),
    bounded alike.
    """
    if str(path) == STDIN:
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))
        if not files:
            out.problems.append(f"{path}: no manifests (*.yaml, *.yml, *.json) in this directory")
    elif path.exists():
        files = [path]
    else:
        out.problems.append(f"{path}: no such file or directory")
        return
    held = False  # whether any file held an object, or a problem of its own
    for file in files:
        text = _read(out, file)
        if text is None:
            held = True
            continue
        held = _load_text(out, text, input_name(file)) or held
    if files and not held:
        if str(path) == STDIN:
            what = "standard input is"
        else:
            what = "the manifests of this directory are" if path.is_dir() else "the file is"
        out.problems.append(f"{input_name(path)}: no Kubernetes objects: {what} empty or only comments")


def _read(out: problems.Results, file: pathlib.Path) -> str | None:
    """The text of one input, or None with its problem added to `out`."""
    try:
        return read_text(file, binary="manifests are YAML or JSON", too_large="split the manifests into several files")
    except ReadError as error:
        out.problems.append(str(error))
        return None


class ConfigError(ValueError):
    """A configuration file that cannot be read as one YAML document; str() is one line saying why, without the
    file's name (the caller names the file and what it is for). `readable` is False when the file itself could not be
    read (missing, no permission), True when what it holds is wrong."""

    def __init__(self, message: str, *, readable: bool = True) -> None:
        super().__init__(message)
        self.readable = readable


def load_config(path: str | os.PathLike[str]) -> object:
    """The one YAML (or JSON) document of a configuration file (a kubeconfig, a fake GPU profile), read as kubectl
    reads YAML (`yaml11`) and bounded as manifests are: at most `MAX_FILE_BYTES`, nesting depth, alias expansion, no
    unbounded integer conversion. None for a file without a document.

    Raises `ConfigError` for a file that is missing, unreadable, too large, not UTF-8 text, not YAML, or holds more
    than one document. Reads the file; otherwise pure.
    """
    limit = f"{MAX_FILE_BYTES // (1024 * 1024)} MiB"
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", readable=False) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text") from None
    except OSError as error:
        raise ConfigError(f"cannot read it: {error.strerror or error}", readable=False) from None
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {limit}")
    try:
        documents = [document for document in yaml11.load_all(text) if document is not None]
    except yaml11.YamlError as error:
        raise ConfigError(str(error)) from None
    if len(documents) > 1:
        raise ConfigError(f"holds {len(documents)} YAML documents where one is expected")
    return documents[0] if documents else None


@contextlib.contextmanager
def _without_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while decoding, then restore it.

    Decoding builds millions of small acyclic objects; the collector's generation scans cost a
    third of the decode time and find nothing (self-containing YAML aliases are refused).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_text(text: str, *, file: str = "<input>") -> types.Objects:
    """Decode one manifest text (YAML, possibly multi-document, or JSON). Pure.

    Raises `problems.DecodeError` with every problem; `file` names the text in messages.
    """
    out = problems.Results()
    with _without_gc():
        _load_text(out, text, file)
    return out.finish()


def load_documents(documents: Sequence[object], *, file: str = "<input>") -> types.Objects:
    """Decode already-parsed objects (dicts as `json.loads` returns them). Pure.

    For callers that hold raw API JSON; raises `problems.DecodeError` like `load_text`.
    """
    out = problems.Results()
    with _without_gc():
        for index, document in enumerate(documents):
            _decode(out, document, file, index)
    return out.finish()


def load_object(raw: Mapping[str, Any], *, source: str) -> types.Decoded:
    """Decode ONE already-parsed API object (as a list or watch event delivers it) into its model value.

    Raises `problems.DecodeError` naming `source`, the object and the field when the object is
    invalid, or when it is not one of the kinds dractl decodes (DeviceClass, ResourceSlice,
    ResourceClaim, ResourceClaimTemplate, Pod, Node): a caller watching many objects skips the
    bad one and goes on. Warnings (legal input DRA ignores) are dropped. Pure; may be called
    any number of times.
    """
    out = problems.Results()
    _decode(out, raw if isinstance(raw, dict) else dict(raw), source, 0)
    if out.problems:
        raise problems.DecodeError(out.problems)
    values: list[types.Decoded] = [*out.classes, *out.slices, *out.claims, *out.templates, *out.pods, *out.nodes]
    if len(values) != 1:
        kind = raw.get("kind")
        what = f"a {kind}" if isinstance(kind, str) and kind else "this object"
        raise problems.DecodeError(
            [
                f"{source}: {what} is not one object of a kind dractl decodes "
                "(DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate, Pod or Node)"
            ]
        )
    return values[0]


def _decode(out: problems.Results, document: object, file: str, index: int) -> None:
    """One document; a structure too deep for the decoders' recursion becomes one problem."""
    try:
        dispatch.document(out, document, file, index)
    except RecursionError:
        out.problems.append(f"{file}: document {index + 1}: nested too deeply to decode")


def documents(text: str, *, file: str) -> Iterator[object]:
    """The documents of one text as `simulate -f` reads them: JSON where the text is JSON (a top-level array gives
    its items), else YAML as kubectl reads it (`yaml11`; YAML flow style starts with a brace too), an empty YAML
    document as None. Lazy: YAML documents are parsed one at a time. Raises `problems.DecodeError` with one message
    naming `file` where the text stops being readable (syntax, nesting, alias bombs). Pure."""
    if text.lstrip()[:1] in ("{", "["):
        data = _json(text)
        if data is not _NOT_JSON:
            if isinstance(data, str):
                raise problems.DecodeError([f"{file}: {data}"])
            yield from data if isinstance(data, list) else [data]
            return
    try:
        yield from yaml11.load_all(text)
    except yaml11.YamlError as error:
        raise problems.DecodeError([f"{file}: {error}"]) from None


def _load_text(out: problems.Results, text: str, file: str) -> bool:
    """Decode every document of `text` into `out`; returns whether it held any (a document, or
    a problem where the text could not be read as documents)."""
    held = False
    try:
        for index, document in enumerate(documents(text, file=file)):
            if document is not None:
                held = True
                _decode(out, document, file, index)
    except problems.DecodeError as error:
        out.problems.extend(error.problems)
        return True
    return held


_NOT_JSON = object()


def _json(text: str) -> object:
    """The parsed JSON, a problem message (str) for JSON too deep to parse, or `_NOT_JSON`.

    YAML flow style also starts with a brace: text that is not JSON goes to the YAML parser.
    """
    # msgspec's decoder reads a large manifest about a quarter faster than json's, and what it
    # accepts json.loads reads alike; where it refuses (malformed text, and some input json.loads
    # takes: NaN, Infinity, lone surrogates, numbers beyond its range), json.loads decides as
    # before. Imported here, so YAML input does not pay for it.
    import msgspec

    try:
        return msgspec.json.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        pass
    try:
        # No depth scan first: json.loads guards its C recursion and raises RecursionError itself.
        return json.loads(text)
    except RecursionError:
        return f"nested too deeply: more than {yaml11.MAX_FLOW_DEPTH} levels of [ and {{"
    except json.JSONDecodeError:
        return _NOT_JSON
    except ValueError:
        # Integers of more than 4,300 digits; read with a bound instead.
        try:
            return json.loads(text, parse_int=_bounded_int)
        except (ValueError, RecursionError):
            return _NOT_JSON


def _bounded_int(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= _INT_DIGITS else float(text)
