"""HMAC signatures: the shared vectors, and what verification refuses (docs/protocol.md §2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebuno.protocol.signing import (
    AGENT_ID_HEADER,
    DISPATCH_ATTEMPT_HEADER,
    DISPATCH_ID_HEADER,
    EXECUTION_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign_body,
    sign_request,
    verify_body,
    verify_request,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
SIGNATURES = json.loads((FIXTURES / "signature_vectors.json").read_text(encoding="utf-8"))
SECRET: str = SIGNATURES["secret"]
BODY_VECTORS = [v for v in SIGNATURES["vectors"] if v["scheme"] == "body"]
REQUEST_VECTORS = [v for v in SIGNATURES["vectors"] if v["scheme"] == "v1"]
S4 = REQUEST_VECTORS[0]
NOW = float(S4["timestamp"])


def _request_args(vector: dict[str, Any]) -> tuple[str, str, str, str, str, bytes]:
    return (
        vector["method"],
        vector["target"],
        vector["timestamp"],
        vector["dispatch_id"],
        vector["attempt"],
        vector["body"].encode("utf-8"),
    )


def _verify_s4(
    *, timestamp: str | None = None, header: str | None = None, now: float = NOW
) -> bool:
    method, target, stamp, dispatch_id, attempt, body = _request_args(S4)
    stamp = stamp if timestamp is None else timestamp
    header = (
        sign_request(SECRET, method, target, stamp, dispatch_id, attempt, body)
        if header is None
        else header
    )
    return verify_request(SECRET, method, target, stamp, dispatch_id, attempt, body, header, now)


@pytest.mark.parametrize("vector", BODY_VECTORS, ids=lambda v: v["name"])
def test_body_signature_matches_the_shared_vector(vector: dict[str, Any]) -> None:
    body = vector["body"].encode("utf-8")

    assert sign_body(SECRET, body) == vector["header"]
    assert verify_body(SECRET, body, vector["header"])


@pytest.mark.parametrize("vector", REQUEST_VECTORS, ids=lambda v: v["name"])
def test_request_signature_matches_the_shared_vector(vector: dict[str, Any]) -> None:
    args = _request_args(vector)

    assert sign_request(SECRET, *args) == vector["header"]
    assert verify_request(SECRET, *args, vector["header"], NOW)


def test_request_target_may_be_given_as_raw_bytes() -> None:
    method, target, timestamp, dispatch_id, attempt, body = _request_args(S4)
    raw_target = target.encode("ascii")

    assert (
        sign_request(SECRET, method, raw_target, timestamp, dispatch_id, attempt, body)
        == (S4["header"])
    )


def test_uppercase_hex_does_not_verify() -> None:
    vector = BODY_VECTORS[0]
    prefix, digest = vector["header"].split("=", 1)

    assert not verify_body(SECRET, vector["body"].encode("utf-8"), f"{prefix}={digest.upper()}")
    assert not _verify_s4(header="v1=" + S4["header"].removeprefix("v1=").upper())


@pytest.mark.parametrize(
    "header",
    [
        "",
        "sha256=",
        "c37470af87d38fddda62fb8d177162e392a0a3b0196e32c9d5b309d289afca0a",
        "v1=x",
        "é",
    ],
)
def test_malformed_body_signatures_do_not_verify(header: str) -> None:
    assert not verify_body(SECRET, BODY_VECTORS[0]["body"].encode("utf-8"), header)


def test_body_signature_from_another_secret_does_not_verify() -> None:
    body = b"{}"

    assert not verify_body(SECRET, body, sign_body("other-secret", body))


def test_body_signature_does_not_verify_a_changed_body() -> None:
    assert not verify_body(SECRET, b'{"a":2}', sign_body(SECRET, b'{"a":1}'))


def test_body_scheme_header_does_not_verify_as_request_scheme() -> None:
    assert not _verify_s4(header=sign_body(SECRET, S4["body"].encode("utf-8")))


@pytest.mark.parametrize(
    "field", ["method", "target", "timestamp", "dispatch_id", "attempt", "body"]
)
def test_changing_any_signed_field_breaks_a_request_signature(field: str) -> None:
    names = ("method", "target", "timestamp", "dispatch_id", "attempt", "body")
    fields: dict[str, Any] = dict(zip(names, _request_args(S4), strict=True))
    fields[field] += b"x" if field == "body" else "1"

    assert not verify_request(SECRET, **fields, header=S4["header"], now=NOW)


@pytest.mark.parametrize("offset", [-300, -299.5, 0, 299.5, 300])
def test_timestamp_within_300_seconds_inclusive_verifies(offset: float) -> None:
    assert _verify_s4(now=NOW + offset)


@pytest.mark.parametrize("offset", [-301, -300.5, 300.5, 301])
def test_timestamp_beyond_300_seconds_is_refused(offset: float) -> None:
    assert not _verify_s4(now=NOW + offset)


@pytest.mark.parametrize(
    "timestamp",
    [
        "1767225600.0",
        "",
        " 1767225600",
        "1767225600 ",
        "1767225600\n",
        "1_767_225_600",
        "0x69",
        "١٢٣",
    ],
)
def test_malformed_timestamps_are_refused_even_when_signed(timestamp: str) -> None:
    assert not _verify_s4(timestamp=timestamp)


@pytest.mark.parametrize("timestamp", ["+1767225600", "0001767225600", "0" * 5000 + "1767225600"])
def test_signed_decimal_timestamps_with_sign_or_leading_zeros_verify(timestamp: str) -> None:
    assert _verify_s4(timestamp=timestamp)


def test_negative_and_huge_timestamps_are_out_of_window() -> None:
    assert not _verify_s4(timestamp="-1767225600")
    assert not _verify_s4(timestamp="9" * 5000)


def test_lease_fields_with_line_breaks_are_refused() -> None:
    method, target, timestamp, _, attempt, body = _request_args(S4)
    dispatch_id = "a\nb"
    header = sign_request(SECRET, method, target, timestamp, dispatch_id, attempt, body)

    assert not verify_request(
        SECRET, method, target, timestamp, dispatch_id, attempt, body, header, NOW
    )


def test_header_names_are_the_wire_names() -> None:
    assert [
        SIGNATURE_HEADER,
        AGENT_ID_HEADER,
        TIMESTAMP_HEADER,
        DISPATCH_ID_HEADER,
        DISPATCH_ATTEMPT_HEADER,
        EXECUTION_ID_HEADER,
    ] == [
        "Rebuno-Signature",
        "Rebuno-Agent-Id",
        "Rebuno-Timestamp",
        "Rebuno-Dispatch-Id",
        "Rebuno-Dispatch-Attempt",
        "Rebuno-Execution-Id",
    ]
