"""Step ids match the shared vectors byte for byte (docs/protocol.md §7.1, §7.4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from rebuno.kernel.domain.identity import step_id
from rebuno.protocol.canonical import args_hash, canonical_args

FIXTURES = Path(__file__).parent.parent / "fixtures"
STEP_VECTORS = json.loads((FIXTURES / "step_id_vectors.json").read_text(encoding="utf-8"))
EXECUTION_ID: str = STEP_VECTORS["execution_id"]


@pytest.mark.parametrize("vector", STEP_VECTORS["vectors"], ids=lambda v: v["name"])
def test_step_id_matches_the_shared_vector(vector: dict[str, Any]) -> None:
    computed = step_id(
        EXECUTION_ID, vector["kind"], vector["target"], vector["args_hash"], vector["occurrence"]
    )

    assert computed == vector["step_id"]


@pytest.mark.parametrize("vector", STEP_VECTORS["vectors"], ids=lambda v: v["name"])
def test_step_id_from_raw_args_matches_the_shared_vector(vector: dict[str, Any]) -> None:
    raw = vector["args_sent"]
    digest = args_hash(canonical_args(None if raw is None else raw.encode("utf-8")))

    computed = step_id(EXECUTION_ID, vector["kind"], vector["target"], digest, vector["occurrence"])

    assert computed == vector["step_id"]


@pytest.mark.parametrize(
    "vector", [v for v in STEP_VECTORS["vectors"] if "preimage" in v], ids=lambda v: v["name"]
)
def test_preimage_uses_utf8_byte_lengths(vector: dict[str, Any]) -> None:
    expected = hashlib.sha256(vector["preimage"].encode("utf-8")).hexdigest()

    assert expected == vector["step_id"]


def test_each_occurrence_gets_its_own_id() -> None:
    ids = {step_id(EXECUTION_ID, "tool_call", "t", "h", n) for n in range(20)}

    assert len(ids) == 20


def test_length_prefixes_keep_shifted_field_boundaries_apart() -> None:
    assert step_id(EXECUTION_ID, "ab", "c", "h", 0) != step_id(EXECUTION_ID, "a", "bc", "h", 0)


def test_ids_are_scoped_to_their_execution() -> None:
    other = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e10"

    assert step_id(EXECUTION_ID, "local", "now", "h", 0) != step_id(other, "local", "now", "h", 0)


def test_negative_occurrence_is_refused() -> None:
    with pytest.raises(ValueError, match="occurrence"):
        step_id(EXECUTION_ID, "local", "now", "h", -1)
