"""Token-bucket arithmetic of the rate limiter (§14.7); the stores keep the buckets.

A bucket holds up to `max_calls` tokens and refills continuously at `max_calls / window`
tokens per second; a new bucket starts full. Pure functions: time comes in as `now`,
randomness as a function.

Must not import anything outside `rebuno.protocol` and the standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

_MILLISECONDS = 1000


def take(
    tokens: float | None,
    updated_at: datetime | None,
    max_calls: int,
    window_seconds: float,
    now: datetime,
) -> tuple[float, float | None]:
    """Try to consume one token.

    Returns the bucket's new token count and None when a token was consumed, or the
    unchanged (refilled) count and the estimated seconds until a token is available.
    """
    if max_calls < 1 or window_seconds <= 0:
        raise ValueError(f"invalid rate limit: {max_calls} calls per {window_seconds}s")
    available = _refill(tokens, updated_at, max_calls, window_seconds, now)
    if available >= 1:
        return available - 1, None
    return available, (1 - available) * window_seconds / max_calls


def park_wait(wait: float, max_wait: float, rand: Callable[[int, int], int]) -> float:
    """Seconds a parked execution waits: `min(wait + uniform[0, wait/2], max_wait)`.

    The jitter spreads executions parked together; it is drawn in whole milliseconds with
    `rand(low, high)` inclusive on both ends, like `random.randint`.
    """
    wait = max(wait, 0.0)
    jitter_ms = rand(0, int(wait * _MILLISECONDS / 2))
    return min(wait + jitter_ms / _MILLISECONDS, max_wait)


def _refill(
    tokens: float | None,
    updated_at: datetime | None,
    max_calls: int,
    window_seconds: float,
    now: datetime,
) -> float:
    if tokens is None or updated_at is None:
        return float(max_calls)
    # A replica whose clock runs behind must not drain the bucket: no negative refill.
    elapsed = max((now - updated_at).total_seconds(), 0.0)
    # Multiply before dividing so whole refills come out exact (12 s of 5/min is 1.0 token).
    return min(float(max_calls), tokens + elapsed * max_calls / window_seconds)
