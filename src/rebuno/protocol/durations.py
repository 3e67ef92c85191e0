"""Go duration syntax (`1h30m`, `1.5s`, `500ms`) to and from `timedelta` (docs/protocol.md §18.2).

Durations are counted in whole nanoseconds within Go's signed 64-bit range, as Go does, then
truncated toward zero to the microsecond that `timedelta` can hold. Standard library only.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_MAX_NANOSECONDS = 2**63 - 1
_COMPONENT = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_UNITS_HINT = "ns, us, µs, ms, s, m or h"


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration such as `30s`, `1h30m`, `1.5s`, `-2m` or `0`.

    Raises:
        ValueError: empty text, a missing or unknown unit (there is no `d`), or a value
            beyond Go's range of about 292 years.
    """
    sign, rest = _split_sign(text)
    if rest == "0":
        return timedelta(0)
    if not rest:
        raise ValueError(f"invalid duration {text!r}: expected a number and a unit such as 30s")
    total = 0
    position = 0
    while position < len(rest):
        match = _COMPONENT.match(rest, position)
        assert match is not None  # every group of the pattern may match empty
        total += _component_nanoseconds(text, *match.groups())
        position = match.end()
    limit = _MAX_NANOSECONDS + (1 if sign < 0 else 0)
    if total > limit:
        raise ValueError(f"invalid duration {text!r}: out of range")
    return _from_nanoseconds(sign * total)


def _split_sign(text: str) -> tuple[int, str]:
    if text[:1] == "-":
        return -1, text[1:]
    if text[:1] == "+":
        return 1, text[1:]
    return 1, text


def _component_nanoseconds(text: str, whole: str, fraction: str | None, unit: str) -> int:
    if not whole and not fraction:
        raise ValueError(f"invalid duration {text!r}: expected a number before {unit!r}")
    if not unit:
        raise ValueError(f"invalid duration {text!r}: missing unit (use {_UNITS_HINT})")
    scale = _NANOSECONDS.get(unit)
    if scale is None:
        raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use {_UNITS_HINT})")
    digits = fraction or ""
    fractional = int(digits) * scale // 10 ** len(digits) if digits else 0
    return int(whole or "0") * scale + fractional


def _from_nanoseconds(nanoseconds: int) -> timedelta:
    microseconds = abs(nanoseconds) // 1_000
    return timedelta(microseconds=-microseconds if nanoseconds < 0 else microseconds)


def format_duration(duration: timedelta) -> str:
    """Render a duration the way Go's `Duration.String` does: `1h30m0s`, `1m30s`, `500ms`."""
    nanoseconds = (
        (duration.days * 86_400 + duration.seconds) * 1_000_000 + duration.microseconds
    ) * 1_000
    text = _format_magnitude(abs(nanoseconds))
    return "-" + text if nanoseconds < 0 else text


def _format_magnitude(nanoseconds: int) -> str:
    if nanoseconds == 0:
        return "0s"
    if nanoseconds < 1_000:
        return f"{nanoseconds}ns"
    if nanoseconds < 1_000_000:
        return _decimal(nanoseconds, 3) + "µs"
    if nanoseconds < 1_000_000_000:
        return _decimal(nanoseconds, 6) + "ms"
    seconds, remainder = divmod(nanoseconds, 1_000_000_000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    text = _decimal(seconds * 1_000_000_000 + remainder, 9) + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def _decimal(value: int, places: int) -> str:
    whole, fraction = divmod(value, 10**places)
    digits = f"{fraction:0{places}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)
