"""Scoped API keys (§34.3, §34.4): the stored record and the token's format. The secret is
never stored, only the SHA-256 of the whole token; comparisons are constant-time. Pure:
imports `protocol` and the domain only (randomness comes from the caller).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.protocol.enums import Scope

TOKEN_PREFIX = "rbk_"
SECRET_BYTES = 32
MAX_NAME_BYTES = 200
_TOKEN = re.compile(
    r"rbk_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.[A-Za-z0-9_-]{43}"
)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as stored: its scopes never change after creation (§34.7)."""

    id: str
    name: str
    scopes: tuple[Scope, ...]
    secret_hash: bytes
    created_at: datetime
    revoked_at: datetime | None = None
    created_by: str | None = None


def token_for(key_id: str, secret: bytes) -> str:
    """`rbk_<id>.<base64url of the secret, unpadded>`."""
    encoded = base64.urlsafe_b64encode(secret).rstrip(b"=").decode("ascii")
    return f"{TOKEN_PREFIX}{key_id}.{encoded}"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def token_key_id(token: str) -> str | None:
    """The key id a well-formed token names, or None: only such a token is looked up."""
    match = _TOKEN.fullmatch(token)
    return match.group(1) if match else None


def verifies(key: ApiKey, token: str) -> bool:
    """Whether a token names this live key: its hash compared in constant time."""
    return key.revoked_at is None and hmac.compare_digest(token_hash(token), key.secret_hash)


def key_name(value: str) -> str:
    """The name trimmed, 1 to 200 bytes of UTF-8 with no NUL."""
    name = value.strip()
    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ValidationFailed(f"validation error: name must be 1 to {MAX_NAME_BYTES} bytes")
    if "\x00" in name:
        raise ValidationFailed("validation error: name must not contain a NUL character")
    return name


def key_scopes(values: object) -> tuple[Scope, ...]:
    """A non-empty list of known scopes, sorted and without repeats."""
    if not isinstance(values, list) or not values:
        raise ValidationFailed("validation error: scopes must be a non-empty list of scopes")
    known = {scope.value: scope for scope in Scope}
    chosen: set[Scope] = set()
    for value in values:
        if not isinstance(value, str) or value not in known:
            allowed = ", ".join(sorted(known))
            raise ValidationFailed(f"validation error: unknown scope; scopes are {allowed}")
        chosen.add(known[value])
    return tuple(sorted(chosen))
