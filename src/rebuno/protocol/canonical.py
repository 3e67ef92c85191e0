"""Literal-preserving JSON and the canonical form used for step ids and hashing.

`loads` keeps every number as its source text (`JsonNumber`) and repairs broken text as Go's
`encoding/json` does; `dumps` writes the canonical compact form: keys sorted by UTF-8 bytes, no
whitespace, strings escaped like Go's `json.Marshal`. Standard library only.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = ["JsonNumber", "args_hash", "canonical_args", "dumps", "loads"]

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"
# Go escapes these inside strings; none can occur outside a string in canonical output, so
# they are replaced on the whole text at once instead of string by string.
_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)
_PER_BYTE_REPLACE = "rebuno.per_byte_replace"


class JsonNumber(str):
    """A JSON number kept as its literal source text (`1.0`, `1E+2`, `-0` stay as written)."""

    __slots__ = ()

    def __new__(cls, literal: str) -> JsonNumber:
        if _NUMBER.fullmatch(literal) is None:
            raise ValueError(f"not a JSON number literal: {literal!r}")
        return super().__new__(cls, literal)


def _trusted_number(literal: str) -> JsonNumber:
    # The decoder hands over text it already matched against the number grammar.
    return str.__new__(JsonNumber, literal)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON: {name} is not a JSON value")


def _replace_one_byte(error: UnicodeError) -> tuple[str, int]:
    # Go's decoder replaces each invalid byte by U+FFFD and resumes at the next byte, where
    # Python's "replace" would swallow a whole malformed sequence into one U+FFFD.
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return _REPLACEMENT, error.start + 1


codecs.register_error(_PER_BYTE_REPLACE, _replace_one_byte)


class _Pairs(list[tuple[str, Any]]):
    """An object's members in source order, kept so that repaired keys still let the last win."""

    __slots__ = ()


_DECODER = json.JSONDecoder(
    parse_int=_trusted_number,
    parse_float=_trusted_number,
    parse_constant=_reject_constant,
)
_PAIRS_DECODER = json.JSONDecoder(
    object_pairs_hook=_Pairs,
    parse_int=_trusted_number,
    parse_float=_trusted_number,
    parse_constant=_reject_constant,
)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse one JSON value; numbers become `JsonNumber`, duplicate keys keep the last value.

    Invalid UTF-8 bytes and lone surrogates inside strings become U+FFFD, one per byte.

    Raises:
        ValueError: invalid JSON, `NaN`/`Infinity`, trailing data, or nesting too deep.
    """
    if isinstance(data, str):
        text, from_bytes = data, False
    else:
        text, from_bytes = _decode_utf8(data), True
    try:
        if _may_hold_surrogates(text, from_bytes):
            return _repair(_decode(_PAIRS_DECODER, text))
        return _decode(_DECODER, text)
    except RecursionError as exc:
        raise ValueError("invalid JSON: nesting too deep") from exc


def _decode_utf8(data: bytes | bytearray | memoryview) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        return str(data, "utf-8", _PER_BYTE_REPLACE)


def _may_hold_surrogates(text: str, from_bytes: bool) -> bool:
    # Decoded bytes hold no raw surrogates, so only a `\uD800`..`\uDFFF` escape can yield one;
    # the cheap substring test keeps the regex off most documents.
    if "\\u" in text and _ESCAPED_SURROGATE.search(text) is not None:
        return True
    return not from_bytes and not _is_utf8(text)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _decode(decoder: json.JSONDecoder, text: str) -> Any:
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc


def _repair(value: Any) -> Any:
    """Replace lone surrogates in every string and key by U+FFFD, as Go's decoder does."""
    if isinstance(value, JsonNumber):
        return value
    if isinstance(value, str):
        return _SURROGATE.sub(_REPLACEMENT, value)
    if isinstance(value, _Pairs):
        return {_SURROGATE.sub(_REPLACEMENT, k): _repair(v) for k, v in value}
    if isinstance(value, dict):
        return {_SURROGATE.sub(_REPLACEMENT, k): _repair(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_repair(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Return the canonical compact JSON text of `value` (docs/protocol.md §7.2).

    Accepts what `loads` returns plus plain Python values: `str` (and `str` enums), `int`,
    finite `float`, `bool`, `None`, `dict` with `str` keys, `list` and `tuple`.

    Raises:
        TypeError: a value or key of an unsupported type.
        ValueError: a non-finite float, or nesting too deep (including cycles).
    """
    try:
        text = _join(value)
        if not _is_utf8(text):
            # Go coerces strings to valid UTF-8; repair first so keys sort by their final bytes.
            text = _join(_repair(value))
    except RecursionError as exc:
        raise ValueError("cannot encode JSON: nesting too deep or circular") from exc
    for raw, escaped in _GO_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def _join(value: Any) -> str:
    parts: list[str] = []
    _write(value, parts.append)
    return "".join(parts)


_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def _write(value: Any, emit: Callable[[str], object]) -> None:
    kind = type(value)
    if kind is str:
        emit(_encode_string(value))
    elif kind is dict:
        _write_object(value, emit)
    elif kind is list or kind is tuple:
        _write_array(value, emit)
    elif kind is JsonNumber:
        emit(value)
    elif isinstance(value, dict):
        _write_object(value, emit)
    elif isinstance(value, list | tuple):
        _write_array(value, emit)
    else:
        emit(_scalar(value))


def _write_object(value: dict[Any, Any], emit: Callable[[str], object]) -> None:
    emit("{")
    separator = ""
    # Code-point order equals UTF-8 byte order for surrogate-free text.
    for key in sorted(value):
        emit(separator)
        emit(_encode_string(key if type(key) is str else _key_text(key)))
        emit(":")
        _write(value[key], emit)
        separator = ","
    emit("}")


def _key_text(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"cannot encode JSON: object keys must be str, not {type(key).__name__}")
    return str.__str__(key)


def _write_array(value: list[Any] | tuple[Any, ...], emit: Callable[[str], object]) -> None:
    emit("[")
    separator = ""
    for item in value:
        emit(separator)
        _write(item, emit)
        separator = ","
    emit("]")


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, JsonNumber):
        return str.__str__(value)
    if isinstance(value, str):
        return _encode_string(str.__str__(value))
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot encode JSON: {value!r} is not a JSON number")
        return float.__repr__(value)
    raise TypeError(f"cannot encode JSON: unsupported type {type(value).__name__}")


def canonical_args(raw: bytes | bytearray | memoryview | str | None) -> str:
    """Canonicalise the raw `args` of a step submission; missing or empty args give `null`.

    Raises:
        ValueError: the args are not one valid JSON value.
    """
    if raw is None or len(raw) == 0:
        return "null"
    return dumps(loads(raw))


def args_hash(canonical_text: str) -> str:
    """Lowercase hex SHA-256 of the UTF-8 bytes of canonical args text."""
    return hashlib.sha256(canonical_text.encode("utf-8")).hexdigest()
