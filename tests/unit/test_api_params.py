"""Path and header UUIDs: every form Go's uuid.Parse takes reads as the canonical lowercase
text, and anything else is a 400."""

from __future__ import annotations

import uuid

import pytest

from rebuno.kernel.api.params import parse_uuid
from rebuno.kernel.domain.errors import ValidationFailed

ID = uuid.UUID("0192D8C0-1234-7ABC-8DEF-0123456789AB")


@pytest.mark.parametrize(
    "text",
    [
        str(ID),
        str(ID).upper(),
        ID.hex,
        ID.hex.upper(),
        "{" + str(ID).upper() + "}",
        "urn:uuid:" + str(ID),
        "URN:UUID:" + str(ID).upper(),
    ],
)
def test_every_accepted_form_reads_as_the_canonical_text(text: str) -> None:
    assert parse_uuid(text, "execution id") == str(ID) == "0192d8c0-1234-7abc-8def-0123456789ab"


@pytest.mark.parametrize(
    "text",
    [
        "",
        str(ID)[:-1],
        str(ID).replace("-", "_"),
        "{" + ID.hex + "}",
        "urn:uuid:" + ID.hex,
        " " + str(ID),
    ],
)
def test_other_text_is_a_validation_error(text: str) -> None:
    with pytest.raises(ValidationFailed, match="invalid execution id: not a UUID"):
        parse_uuid(text, "execution id")
