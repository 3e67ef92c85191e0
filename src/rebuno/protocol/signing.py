"""HMAC-SHA256 signatures between agents and the kernel (docs/protocol.md §2.2, §2.3, §2.5).

Two schemes share the `Rebuno-Signature` header: `sha256=` signs the body alone (webhooks and
SDK 0.16), `v1=` signs method, target, timestamp, lease and body. Verifiers compare the whole
header string in constant time. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = [
    "AGENT_ID_HEADER",
    "BODY_SCHEME_PREFIX",
    "DISPATCH_ATTEMPT_HEADER",
    "DISPATCH_ID_HEADER",
    "EXECUTION_ID_HEADER",
    "REQUEST_SCHEME_PREFIX",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TIMESTAMP_WINDOW_SECONDS",
    "sign_body",
    "sign_request",
    "verify_body",
    "verify_request",
]

SIGNATURE_HEADER = "Rebuno-Signature"
AGENT_ID_HEADER = "Rebuno-Agent-Id"
TIMESTAMP_HEADER = "Rebuno-Timestamp"
DISPATCH_ID_HEADER = "Rebuno-Dispatch-Id"
DISPATCH_ATTEMPT_HEADER = "Rebuno-Dispatch-Attempt"
EXECUTION_ID_HEADER = "Rebuno-Execution-Id"

BODY_SCHEME_PREFIX = "sha256="
REQUEST_SCHEME_PREFIX = "v1="
TIMESTAMP_WINDOW_SECONDS = 300.0

_REQUEST_SCHEME_TAG = b"rebuno-request-v1"
# `[0-9]`, not `\d`: Python's `\d` and `int()` also take non-ASCII digits and underscores.
_TIMESTAMP = re.compile(r"([+-]?)([0-9]+)")
# Any timestamp with more significant digits is centuries away from every usable clock.
_MAX_TIMESTAMP_DIGITS = 18


def sign_body(secret: str, body: bytes) -> str:
    """Return the `sha256=<hex>` header value for the body scheme."""
    return BODY_SCHEME_PREFIX + _hex_mac(secret, body)


def sign_request(
    secret: str,
    method: str,
    target: str | bytes,
    timestamp: str,
    dispatch_id: str,
    attempt: str,
    body: bytes,
) -> str:
    """Return the `v1=<hex>` header value for the request scheme.

    `target` is the escaped path plus `?query` exactly as on the request line; pass the raw
    bytes when you have them (a `str` is encoded as UTF-8). Empty `dispatch_id` and `attempt`
    stand for absent lease headers.
    """
    message = _request_message(method, target, timestamp, dispatch_id, attempt, body)
    return REQUEST_SCHEME_PREFIX + _hex_mac(secret, message)


def verify_body(secret: str, body: bytes, header: str) -> bool:
    """True when `header` is exactly the body-scheme signature of `body`."""
    return _same(sign_body(secret, body), header)


def verify_request(
    secret: str,
    method: str,
    target: str | bytes,
    timestamp: str,
    dispatch_id: str,
    attempt: str,
    body: bytes,
    header: str,
    now: float,
    window: float = TIMESTAMP_WINDOW_SECONDS,
) -> bool:
    """True when `header` is the request-scheme signature and `timestamp` is fresh.

    The timestamp must be whole Unix seconds (`^[+-]?[0-9]+$`) within `window` seconds of
    `now`, bounds included. Header values carrying CR or LF never verify.
    """
    if any("\r" in field or "\n" in field for field in (timestamp, dispatch_id, attempt)):
        return False
    if not _is_fresh(timestamp, now, window):
        return False
    expected = sign_request(secret, method, target, timestamp, dispatch_id, attempt, body)
    return _same(expected, header)


def _hex_mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def _request_message(
    method: str, target: str | bytes, timestamp: str, dispatch_id: str, attempt: str, body: bytes
) -> bytes:
    target_bytes = target if isinstance(target, bytes) else target.encode("utf-8")
    fields = (
        _REQUEST_SCHEME_TAG,
        method.encode("utf-8"),
        target_bytes,
        timestamp.encode("utf-8"),
        dispatch_id.encode("utf-8"),
        attempt.encode("utf-8"),
    )
    return b"".join(field + b"\n" for field in fields) + body


def _is_fresh(timestamp: str, now: float, window: float) -> bool:
    match = _TIMESTAMP.fullmatch(timestamp)
    if match is None:
        return False
    sign, digits = match.groups()
    digits = digits.lstrip("0") or "0"
    if len(digits) > _MAX_TIMESTAMP_DIGITS:
        return False
    seconds = -int(digits) if sign == "-" else int(digits)
    return abs(seconds - now) <= window


def _same(expected: str, received: str) -> bool:
    # compare_digest refuses non-ASCII str, and a received header may hold any text.
    return hmac.compare_digest(expected.encode("ascii"), received.encode("utf-8", "surrogatepass"))
