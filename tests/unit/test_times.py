"""RFC 3339 timestamps on the wire (docs/protocol.md §3.3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rebuno.protocol.times import format_timestamp, parse_timestamp


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 7, 7, 12, 0, 0, tzinfo=UTC), "2026-07-07T12:00:00Z"),
        (datetime(2026, 7, 7, 12, 0, 0, 123456, tzinfo=UTC), "2026-07-07T12:00:00.123456Z"),
        (datetime(2026, 7, 7, 12, 0, 0, 120000, tzinfo=UTC), "2026-07-07T12:00:00.12Z"),
        (datetime(2026, 7, 7, 12, 0, 0, 1, tzinfo=UTC), "2026-07-07T12:00:00.000001Z"),
        (datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC), "0005-01-02T03:04:05Z"),
    ],
)
def test_timestamps_format_in_utc_with_trimmed_fraction(moment: datetime, text: str) -> None:
    assert format_timestamp(moment) == text


def test_other_offsets_are_converted_to_utc() -> None:
    moment = datetime(2026, 1, 1, 1, 30, tzinfo=timezone(timedelta(hours=2)))

    assert format_timestamp(moment) == "2025-12-31T23:30:00Z"


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_timestamp(datetime(2026, 7, 7, 12, 0))


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-07-07T12:00:00Z", datetime(2026, 7, 7, 12, tzinfo=UTC)),
        ("2026-07-07T12:00:00.5Z", datetime(2026, 7, 7, 12, 0, 0, 500000, tzinfo=UTC)),
        ("2026-07-07T12:00:00.123456789Z", datetime(2026, 7, 7, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2026-07-07T14:30:00+02:30", datetime(2026, 7, 7, 12, tzinfo=UTC)),
        ("2026-07-07T10:00:00-02:00", datetime(2026, 7, 7, 12, tzinfo=UTC)),
        ("2026-07-07t12:00:00z", datetime(2026, 7, 7, 12, tzinfo=UTC)),
    ],
)
def test_rfc3339_timestamps_parse_to_aware_utc(text: str, moment: datetime) -> None:
    parsed = parse_timestamp(text)

    assert parsed == moment
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-07-07",
        "2026-07-07T12:00:00",
        "2026-07-07 12:00:00Z",
        "2026-07-07T12:00Z",
        "2026-07-07T12:00:00.Z",
        "2026-07-07T12:00:00.1234567890Z",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-07-07T24:00:00Z",
        "2026-07-07T12:00:60Z",
        "2026-07-07T12:00:00+2:00",
        "2026-07-07T12:00:00+24:00",
        "2026-07-07T12:00:00+01:60",
        "20260707T120000Z",
        "2026-07-07T12:00:00Z\n",
    ],
)
def test_malformed_timestamps_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid timestamp"):
        parse_timestamp(text)


def test_formatted_timestamps_parse_back() -> None:
    moment = datetime(2026, 7, 7, 12, 0, 0, 450, tzinfo=UTC)

    assert parse_timestamp(format_timestamp(moment)) == moment
