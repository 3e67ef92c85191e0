"""Go duration syntax for configuration values (docs/protocol.md §18.2)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebuno.protocol.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("-0", timedelta(0)),
        ("+0", timedelta(0)),
        ("0s", timedelta(0)),
        ("30s", timedelta(seconds=30)),
        ("2m", timedelta(minutes=2)),
        ("15m", timedelta(minutes=15)),
        ("24h", timedelta(hours=24)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h0m30s", timedelta(hours=1, seconds=30)),
        ("30s1h", timedelta(hours=1, seconds=30)),
        ("1.5s", timedelta(seconds=1.5)),
        (".5s", timedelta(milliseconds=500)),
        ("1.s", timedelta(seconds=1)),
        ("1.5h", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("250us", timedelta(microseconds=250)),
        ("250µs", timedelta(microseconds=250)),
        ("250μs", timedelta(microseconds=250)),
        ("1500ns", timedelta(microseconds=1)),
        ("-1m30s", -timedelta(seconds=90)),
        ("+10s", timedelta(seconds=10)),
        ("0.000001s", timedelta(microseconds=1)),
    ],
)
def test_go_durations_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_sub_microsecond_precision_truncates_toward_zero() -> None:
    assert parse_duration("999ns") == timedelta(0)
    assert parse_duration("-1999ns") == -timedelta(microseconds=1)


def test_the_largest_go_durations_parse() -> None:
    assert parse_duration("2562047h47m16.854775807s") == timedelta(microseconds=2**63 // 1000)
    assert parse_duration("-2562047h47m16.854775808s") == -timedelta(microseconds=2**63 // 1000)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected a number"),
        ("-", "expected a number"),
        ("1", "missing unit"),
        ("10", "missing unit"),
        ("00", "missing unit"),
        ("1h30", "missing unit"),
        ("1d", "unknown unit 'd'"),
        ("1H", "unknown unit 'H'"),
        ("1 s", "unknown unit ' s'"),
        ("1sec", "unknown unit 'sec'"),
        (" 1s", "expected a number"),
        ("s", "expected a number"),
        (".s", "expected a number"),
        ("1..5s", "missing unit"),
        ("2562047h47m16.854775808s", "out of range"),
        ("9999999h", "out of range"),
    ],
)
def test_invalid_durations_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(text)


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(microseconds=1), "1µs"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(minutes=2), "2m0s"),
        (timedelta(minutes=90), "1h30m0s"),
        (timedelta(hours=24), "24h0m0s"),
        (timedelta(days=2, microseconds=10), "48h0m0.00001s"),
        (-timedelta(seconds=90), "-1m30s"),
        (-timedelta(microseconds=5), "-5µs"),
    ],
)
def test_durations_format_like_go(duration: timedelta, text: str) -> None:
    assert format_duration(duration) == text


@pytest.mark.parametrize(
    "duration",
    [timedelta(0), timedelta(microseconds=7), timedelta(days=3, seconds=5, microseconds=120)],
)
def test_formatted_durations_parse_back(duration: timedelta) -> None:
    assert parse_duration(format_duration(duration)) == duration
    assert parse_duration(format_duration(-duration)) == -duration
