"""Timestamps as stored: INTEGER microseconds since the Unix epoch, UTC.

Integers keep the exact microsecond, sort and compare in SQL, and cost nothing to index.
Must import only the standard library.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """An aware datetime as microseconds since the epoch (exact, no float rounding)."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def to_micros_or_none(moment: datetime | None) -> int | None:
    return None if moment is None else to_micros(moment)


def from_micros_or_none(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)
