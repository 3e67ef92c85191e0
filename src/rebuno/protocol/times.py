"""RFC 3339 timestamps as they travel on the wire (docs/protocol.md §3.3). Standard library only.

Emitted in UTC with a `Z` suffix and the fractional seconds trimmed of trailing zeros
(`2026-07-07T12:00:00.123456Z`, `2026-07-07T12:00:00Z`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["format_timestamp", "parse_timestamp"]

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


def format_timestamp(moment: datetime) -> str:
    """Render an aware datetime in UTC as RFC 3339 with `Z`.

    Raises:
        ValueError: `moment` is naive, so its instant is unknown.
    """
    if moment.utcoffset() is None:
        raise ValueError(f"cannot format a naive datetime as a timestamp: {moment!r}")
    utc = moment.astimezone(UTC)
    text = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}"
        f"T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
    if utc.microsecond:
        text += "." + f"{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime.

    Digits beyond the microsecond are truncated; an offset other than `Z` is converted to UTC.

    Raises:
        ValueError: the text is not an RFC 3339 date-time, or names an impossible date or time.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid timestamp {text!r}: expected RFC 3339, e.g. 2026-07-07T12:00:00Z"
        )
    year, month, day, hour, minute, second, fraction, _, sign, off_h, off_m = match.groups()
    try:
        local = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=_offset(sign, off_h, off_m),
        )
        return local.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"invalid timestamp {text!r}: {exc}") from exc


def _offset(sign: str | None, hours: str | None, minutes: str | None) -> timezone:
    if sign is None or hours is None or minutes is None:
        return UTC
    if int(hours) > 23 or int(minutes) > 59:
        raise ValueError(f"offset {sign}{hours}:{minutes} out of range")
    delta = timedelta(hours=int(hours), minutes=int(minutes))
    return timezone(-delta if sign == "-" else delta)
