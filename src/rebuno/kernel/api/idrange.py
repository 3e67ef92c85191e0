"""Execution list filters that are id ranges (§40.4): a creation-time range and an id prefix.

Execution ids are UUIDv7, whose first 48 bits are the creation time in milliseconds, and
their canonical text sorts as their number does, so both filters become bounds on the
primary key that keyset paging already walks. Must not import a store backend.
"""

from __future__ import annotations

import re
from datetime import datetime

from rebuno.kernel.domain.errors import ValidationFailed

_PREFIX = re.compile(r"[0-9a-f]{1,32}")
_DIGITS = 32


def _hyphenated(digits: str) -> str:
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def time_bound(text: str, what: str) -> str:
    """The smallest id an execution created at this instant (RFC 3339, with an offset) has."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationFailed(f"validation error: {what} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValidationFailed(f"validation error: {what} needs a UTC offset")
    millis = max(0, min(int(moment.timestamp() * 1000), 2**48 - 1))
    return _hyphenated(f"{millis:012x}".ljust(_DIGITS, "0"))


def prefix_bounds(text: str) -> tuple[str, str | None]:
    """The ids that start with `text` (hex digits, hyphens ignored): from the floor, up to
    but excluding the ceiling (None past the last id)."""
    digits = text.replace("-", "").lower()
    if _PREFIX.fullmatch(digits) is None:
        raise ValidationFailed("validation error: id_prefix must be hexadecimal digits of an id")
    floor = _hyphenated(digits.ljust(_DIGITS, "0"))
    following = int(digits, 16) + 1
    if following >= 16 ** len(digits):
        return floor, None
    return floor, _hyphenated(f"{following:0{len(digits)}x}".ljust(_DIGITS, "0"))


def lowest(*bounds: str | None) -> str | None:
    """The narrowest of the upper bounds that are set."""
    present = [bound for bound in bounds if bound is not None]
    return min(present) if present else None


def highest(*bounds: str | None) -> str | None:
    """The narrowest of the lower bounds that are set."""
    present = [bound for bound in bounds if bound is not None]
    return max(present) if present else None
