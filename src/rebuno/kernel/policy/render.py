"""Step arguments as the reference kernel sees them: decoded like Go's `encoding/json` into
`map[string]any`, and each value rendered to text like Go's `fmt` verb `%v` (§14.5).

Numbers are IEEE-754 doubles (`1000000` renders `1e+06`), `null` renders `<nil>`, arrays
`[a b]` and objects `map[k:v]` with sorted keys. Lone UTF-16 surrogates become U+FFFD, as Go
decodes them.

Standard library only; must not import the rest of rebuno.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Final

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_FIXED_LIMIT: Final = 1e6  # %v switches to exponent form at a decimal exponent of 6


def parse_arguments(args_json: str | None) -> dict[str, object] | None:
    """The args as a JSON object with every number a float, or None when they are not one."""
    if args_json is None:
        return None
    try:
        value = json.loads(
            args_json, parse_int=_go_number, parse_float=_go_number, parse_constant=_no_constant
        )
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def render_value(value: object) -> str:
    """Render a decoded JSON value as Go's `%v` would; iterative, so depth cannot overflow."""
    parts: list[str] = []
    pending: list[object] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, _Punctuation):
            parts.append(item)
        elif isinstance(item, list):
            pending.extend(_list_items(item))
        elif isinstance(item, dict):
            pending.extend(_dict_items(item))
        else:
            parts.append(_render_scalar(item))
    return "".join(parts)


def format_float(number: float) -> str:
    """Go's `%v` for a float64: shortest round-trip digits, exponent form outside [1e-4, 1e6)."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if number == 0:
        return "-0" if math.copysign(1.0, number) < 0 else "0"
    if number.is_integer() and abs(number) < _FIXED_LIMIT:
        return str(int(number))
    return _format_digits(number)


def go_string(text: str) -> str:
    """Replace lone surrogates with U+FFFD, as Go's JSON decoder does."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


class _Punctuation(str):
    """Text of the rendering itself, never a value to render."""

    __slots__ = ()


_OPEN_LIST: Final = _Punctuation("[")
_OPEN_MAP: Final = _Punctuation("map[")
_CLOSE: Final = _Punctuation("]")
_SPACE: Final = _Punctuation(" ")


def _list_items(items: list[object]) -> list[object]:
    """The work stack entries for a list, in reverse (the stack pops from the end)."""
    entries: list[object] = [_CLOSE]
    for index in range(len(items) - 1, -1, -1):
        entries.append(items[index])
        if index:
            entries.append(_SPACE)
    entries.append(_OPEN_LIST)
    return entries


def _dict_items(mapping: dict[object, object]) -> list[object]:
    # Go's map holds keys after surrogate repair, so colliding keys keep the last value.
    repaired = {go_string(str(key)): value for key, value in mapping.items()}
    entries: list[object] = [_CLOSE]
    keys = sorted(repaired)
    for index in range(len(keys) - 1, -1, -1):
        entries.append(repaired[keys[index]])
        entries.append(_Punctuation(f"{keys[index]}:"))
        if index:
            entries.append(_SPACE)
    entries.append(_OPEN_MAP)
    return entries


def _render_scalar(value: object) -> str:
    if value is None:
        return "<nil>"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, int):
        return format_float(float(value))
    return go_string(str(value))


def _format_digits(number: float) -> str:
    sign, digit_tuple, exponent = Decimal(repr(number)).normalize().as_tuple()
    if not isinstance(exponent, int):  # unreachable for finite numbers; keeps mypy exact
        return repr(number)
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # the decimal point sits after this many digits
    prefix = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 6:
        return prefix + _exponent_form(digits, point - 1)
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return prefix + digits + "0" * (point - len(digits))
    return f"{prefix}{digits[:point]}.{digits[point:]}"


def _exponent_form(digits: str, exponent: int) -> str:
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


def _go_number(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        # Go refuses a number that does not fit a float64; the args are then not an object.
        raise ValueError(f"number out of range: {text[:32]}")
    return number


def _no_constant(name: str) -> float:
    raise ValueError(f"not JSON: {name}")
