"""Path ids, query parameters and lease headers, parsed as §3.3 and §5 say.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers, QueryParams

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.records import Lease
from rebuno.protocol.durations import parse_duration
from rebuno.protocol.signing import DISPATCH_ATTEMPT_HEADER, DISPATCH_ID_HEADER

_INTEGER = re.compile(r"[+-]?[0-9]+")
# The forms Go's uuid.Parse takes; Python's uuid.UUID alone would also take stray hyphens
# and underscores anywhere in the text.
_UUID = re.compile(
    r"(?:urn:uuid:)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"|\{([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\}"
    r"|([0-9a-f]{32})",
    re.IGNORECASE,
)


MAX_AGENT_ID = 128
# An agent id travels in paths (percent-escaped) and in the `Rebuno-Agent-Id` header: no `/`,
# which no escaping gets through a path segment, and no control characters (PostgreSQL text
# cannot hold NUL, a header cannot hold a line break).
_AGENT_ID = re.compile(rf"[^/\x00-\x1f\x7f]{{1,{MAX_AGENT_ID}}}")
_STEP_ID = re.compile(r"[0-9a-f]{64}")
INT64_MAX = 2**63 - 1
MAX_ATTEMPT = 2**31 - 1


def is_agent_id(value: str) -> bool:
    """1 to 128 characters, none of them `/` or a control character."""
    return _AGENT_ID.fullmatch(value) is not None


def agent_id(value: str) -> str:
    """`value` when it is an agent id (`is_agent_id`), else a 400."""
    if not is_agent_id(value):
        raise ValidationFailed(
            f"validation error: invalid agent id: 1 to {MAX_AGENT_ID} characters, without '/'"
            " or control characters"
        )
    return value


def step_id(value: str) -> str:
    """A step id as the kernel derives them: 64 lowercase hex digits (§7)."""
    if _STEP_ID.fullmatch(value) is None:
        raise ValidationFailed("validation error: invalid step id: not 64 lowercase hex digits")
    return value


def parse_uuid(value: str, what: str) -> str:
    """A UUID in any case, passed on in its canonical lowercase form."""
    match = _UUID.fullmatch(value)
    if match is None:
        raise ValidationFailed(f"validation error: invalid {what}: not a UUID")
    hyphenated, braced, bare = match.groups()
    if bare is not None:
        hyphenated = f"{bare[:8]}-{bare[8:12]}-{bare[12:16]}-{bare[16:20]}-{bare[20:]}"
    # str(uuid.UUID(...)) of the same digits, without building the UUID.
    return str(hyphenated or braced).lower()


def first(params: QueryParams, key: str) -> str:
    """The first value of a query parameter, `""` when absent."""
    values = params.getlist(key)
    return values[0] if values else ""


def _integer(text: str) -> int | None:
    """A decimal integer, clamped to 64 bits (so a 5,000-digit one is not parsed at all)."""
    if _INTEGER.fullmatch(text) is None:
        return None
    if len(text.lstrip("+-")) > 19:
        return -INT64_MAX if text.startswith("-") else INT64_MAX
    return max(-INT64_MAX, min(int(text), INT64_MAX))


def page_limit(params: QueryParams, *, default: int, maximum: int, strict: bool) -> int:
    """`limit`: absent or <= 0 gives the default, above the maximum gives the maximum. A
    non-integer is a 400 when `strict`, otherwise the default."""
    text = first(params, "limit")
    if not text:
        return default
    value = _integer(text)
    if value is None:
        if strict:
            raise ValidationFailed("validation error: limit must be an integer")
        return default
    if value <= 0:
        return default
    return min(value, maximum)


def after_seq(params: QueryParams) -> int:
    """`after_seq`: a non-integer reads as 0, as the reference kernel does."""
    value = _integer(first(params, "after_seq"))
    return max(value or 0, 0)


def optional_uuid(params: QueryParams, key: str) -> str | None:
    text = first(params, key)
    return parse_uuid(text, key) if text else None


def required_lease(headers: Headers) -> Lease:
    """The `(Rebuno-Dispatch-Id, Rebuno-Dispatch-Attempt)` pair a mutating agent route needs."""
    dispatch_id = _single(headers, DISPATCH_ID_HEADER)
    attempt = _single(headers, DISPATCH_ATTEMPT_HEADER)
    if dispatch_id is None:
        raise ValidationFailed(f"validation error: missing {DISPATCH_ID_HEADER}")
    if attempt is None:
        raise ValidationFailed(f"validation error: missing {DISPATCH_ATTEMPT_HEADER}")
    number = _integer(attempt.strip())
    if number is None or not 1 <= number <= MAX_ATTEMPT:
        raise ValidationFailed(
            f"validation error: invalid {DISPATCH_ATTEMPT_HEADER}: must be an integer from 1"
            f" to {MAX_ATTEMPT}"
        )
    return Lease(dispatch_id=parse_uuid(dispatch_id.strip(), DISPATCH_ID_HEADER), attempt=number)


def optional_lease(headers: Headers) -> Lease | None:
    """The lease when either header is sent (then both must be valid), else None."""
    if DISPATCH_ID_HEADER in headers or DISPATCH_ATTEMPT_HEADER in headers:
        return required_lease(headers)
    return None


def _single(headers: Headers, name: str) -> str | None:
    values = headers.getlist(name)
    if len(values) > 1:
        raise ValidationFailed(f"validation error: {name} given more than once")
    return values[0] if values else None


MAX_LONG_POLL_SECONDS = 30.0


def long_poll(query: QueryParams) -> float:
    """`wait` (ours): how long a long poll may hold its answer (an empty events page, a live
    execution), as a Go duration capped at 30 s; absent means answer at once."""
    text = first(query, "wait")
    if not text:
        return 0.0
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError:
        raise ValidationFailed(f"validation error: wait {text!r} is not a duration") from None
    return min(max(seconds, 0.0), MAX_LONG_POLL_SECONDS)
