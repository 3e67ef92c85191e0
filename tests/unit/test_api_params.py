"""Path and header UUIDs: every form Go's uuid.Parse takes reads as the canonical lowercase
text, and anything else is a 400."""

from __future__ import annotations

import uuid

import pytest

from rebuno.kernel.api.idrange import prefix_bounds, time_bound
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


# -- id ranges of the executions list (§40.4) ----------------------------------------------


def test_an_id_prefix_is_the_range_up_to_the_next_prefix() -> None:
    assert prefix_bounds("01A2-3") == (
        "01a23000-0000-0000-0000-000000000000",
        "01a24000-0000-0000-0000-000000000000",
    )
    assert prefix_bounds("0f") == (
        "0f000000-0000-0000-0000-000000000000",
        "10000000-0000-0000-0000-000000000000",
    )
    assert prefix_bounds("ff")[1] is None  # past the last id


def test_a_time_bound_is_the_first_id_of_its_millisecond() -> None:
    assert time_bound("1970-01-01T00:00:00.001+00:00", "t") == (
        "00000000-0001-0000-0000-000000000000"
    )
