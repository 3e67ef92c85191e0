"""Token-bucket arithmetic of rate limits (§14.7)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from rebuno.kernel.domain.ratelimit import park_wait, take

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_new_bucket_starts_full_and_gives_a_token() -> None:
    assert take(None, None, 5, 60.0, T0) == (4.0, None)


def test_bucket_refuses_when_empty_with_estimated_wait() -> None:
    tokens, wait = take(0.0, T0, 5, 60.0, T0)

    assert (tokens, wait) == (0.0, 12.0)


def test_calls_drain_the_bucket_then_are_refused() -> None:
    tokens: float | None = None
    updated_at: datetime | None = None
    granted = 0
    for _ in range(8):
        tokens, wait = take(tokens, updated_at, 3, 60.0, T0)
        updated_at = T0
        granted += wait is None

    assert granted == 3


def test_bucket_refills_continuously() -> None:
    tokens, wait = take(0.0, T0, 5, 60.0, at(6))

    assert wait == pytest.approx(6.0)
    assert tokens == pytest.approx(0.5)


def test_whole_refill_gives_a_token_exactly_on_time() -> None:
    assert take(0.0, T0, 5, 60.0, at(12)) == (0.0, None)


def test_refill_stops_at_capacity() -> None:
    assert take(1.0, T0, 5, 60.0, at(3600)) == (4.0, None)


def test_lowered_capacity_applies_to_an_existing_bucket() -> None:
    assert take(10.0, T0, 2, 60.0, T0) == (1.0, None)


def test_changed_window_changes_the_refill_rate() -> None:
    tokens, wait = take(0.0, T0, 5, 10.0, at(2))

    assert tokens == pytest.approx(0.0)
    assert wait is None


def test_clock_behind_the_bucket_does_not_drain_it() -> None:
    assert take(2.0, at(30), 5, 60.0, T0) == (1.0, None)


def test_wait_estimate_accounts_for_partial_token() -> None:
    _, wait = take(0.75, T0, 4, 60.0, T0)

    assert wait == pytest.approx(3.75)


@pytest.mark.parametrize(("max_calls", "window"), [(0, 60.0), (-1, 60.0), (5, 0.0), (5, -1.0)])
def test_invalid_limit_is_a_programming_error(max_calls: int, window: float) -> None:
    with pytest.raises(ValueError, match="invalid rate limit"):
        take(None, None, max_calls, window, T0)


def test_park_wait_without_jitter_is_the_estimate() -> None:
    assert park_wait(10.0, 60.0, lambda low, high: low) == 10.0


def test_park_wait_adds_at_most_half_the_wait() -> None:
    assert park_wait(10.0, 60.0, lambda low, high: high) == 15.0


def test_park_wait_never_exceeds_max_wait() -> None:
    assert park_wait(10.0, 12.0, lambda low, high: high) == 12.0


def test_park_wait_draws_jitter_from_zero_to_half_in_milliseconds() -> None:
    drawn: list[tuple[int, int]] = []

    def rand(low: int, high: int) -> int:
        drawn.append((low, high))
        return 250

    assert park_wait(3.0, 60.0, rand) == 3.25
    assert drawn == [(0, 1500)]


def test_park_wait_with_real_randomness_stays_in_range() -> None:
    rand = random.Random(7).randint

    waits = [park_wait(8.0, 11.0, rand) for _ in range(200)]

    assert all(8.0 <= wait <= 11.0 for wait in waits)
    assert len(set(waits)) > 1


def test_negative_wait_parks_for_no_time() -> None:
    assert park_wait(-1.0, 5.0, lambda low, high: high) == 0.0
