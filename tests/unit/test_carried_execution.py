"""`execution-input`: the status and input a webhook carries are read back only under their
signature, which binds them to that webhook's body."""

from __future__ import annotations

import pytest

from rebuno.protocol.extensions import carried, read_carried, sign_carried

SECRET = "s3cret"
BODY = b'{"execution_id":"e","dispatch_id":"d","dispatch_attempt":1,"lease_timeout_seconds":120}'


def test_a_signed_value_reads_back_as_status_and_input() -> None:
    value = carried("running", '{"topic":"caf\u00e9","n":[1,2.50]}')

    assert value.isascii() and "=" not in value
    read = read_carried(SECRET, BODY, value, sign_carried(SECRET, BODY, value))
    assert read == ("running", {"topic": "caf\u00e9", "n": [1, 2.5]})


@pytest.mark.parametrize(
    ("secret", "body", "signed_body"),
    [
        ("other", BODY, BODY),
        (SECRET, BODY.replace(b'"d"', b'"x"'), BODY),
    ],
)
def test_another_secret_or_another_body_reads_nothing(
    secret: str, body: bytes, signed_body: bytes
) -> None:
    value = carried("running", '"input"')

    assert read_carried(secret, body, value, sign_carried(SECRET, signed_body, value)) is None


def test_a_value_swapped_for_another_reads_nothing() -> None:
    value, other = carried("running", '"mine"'), carried("running", '"theirs"')

    assert read_carried(SECRET, BODY, other, sign_carried(SECRET, BODY, value)) is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "not base64 at all!",
        "caf\u00e9",
        carried("completed", "null"),
        carried("running", "null")[:-4],
    ],
)
def test_a_missing_malformed_or_terminal_value_reads_nothing(value: str | None) -> None:
    signature = sign_carried(SECRET, BODY, value) if value and value.isascii() else "sha256=00"

    assert read_carried(SECRET, BODY, value, signature) is None


def test_a_missing_signature_reads_nothing() -> None:
    assert read_carried(SECRET, BODY, carried("running", "null"), None) is None
