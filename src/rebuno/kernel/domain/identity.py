"""Deterministic step ids (docs/protocol.md §7.1) and policy bundle hashes (§35.6).

`step_id` hashes the length-prefixed fields `execution_id`, `kind`, `target`, `args_hash` and
`occurrence`, so the same effect at the same position of a delivery attempt always gets the same
id. Pure: must not import anything outside the standard library and `rebuno.protocol`.
"""

from __future__ import annotations

import hashlib

__all__ = ["policy_hash", "step_id"]


def step_id(execution_id: str, kind: str, target: str, args_hash: str, occurrence: int) -> str:
    """Return the lowercase hex SHA-256 step id.

    Each field is written as its UTF-8 byte length, `:`, then its bytes; byte lengths (not
    character counts) keep the encoding unambiguous for non-ASCII targets.

    Raises:
        ValueError: `occurrence` is negative.
    """
    if occurrence < 0:
        raise ValueError(f"occurrence must be zero or more, got {occurrence}")
    preimage = b"".join(
        _length_prefixed(field)
        for field in (execution_id, kind, target, args_hash, str(int(occurrence)))
    )
    return hashlib.sha256(preimage).hexdigest()


def _length_prefixed(field: str) -> bytes:
    data = field.encode("utf-8")
    return str(len(data)).encode("ascii") + b":" + data


def policy_hash(text: str) -> str:
    """§35.6: lowercase hex SHA-256 of the bundle text's exact UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
