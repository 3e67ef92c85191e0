"""Canonical JSON: literal-preserving parsing and Go-compatible canonical text
(docs/protocol.md §7.2)."""

from __future__ import annotations

import hashlib
import json
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import pytest

from rebuno.protocol.canonical import JsonNumber, args_hash, canonical_args, dumps, loads

FIXTURES = Path(__file__).parent.parent / "fixtures"
STEP_VECTORS = json.loads((FIXTURES / "step_id_vectors.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", STEP_VECTORS["vectors"], ids=lambda v: v["name"])
def test_canonical_args_match_the_shared_vectors(vector: dict[str, Any]) -> None:
    raw = vector["args_sent"]

    canonical = canonical_args(None if raw is None else raw.encode("utf-8"))

    assert canonical.encode("utf-8") == vector["canonical"].encode("utf-8")
    assert args_hash(canonical) == vector["args_hash"]


@pytest.mark.parametrize("raw", [None, b"", "", b"null", "null"])
def test_missing_empty_and_null_args_all_canonicalise_to_null(raw: bytes | str | None) -> None:
    assert canonical_args(raw) == "null"


def test_empty_object_args_differ_from_null_args() -> None:
    assert canonical_args(b"{}") == "{}"
    assert args_hash("{}") != args_hash("null")


@pytest.mark.parametrize(
    "literal",
    ["1.0", "1e3", "1E+2", "-0", "0.1000", "12345678901234567890", "-1.5e-300", "1" * 5000],
)
def test_number_literals_are_kept_verbatim(literal: str) -> None:
    value = loads(f'{{"n":{literal}}}')

    assert isinstance(value["n"], JsonNumber)
    assert value["n"] == literal
    assert dumps(value) == f'{{"n":{literal}}}'


def test_numerically_equal_literals_hash_differently() -> None:
    assert args_hash(canonical_args('{"x":1}')) != args_hash(canonical_args('{"x":1.0}'))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", '{"x": NaN}', "[Infinity]"])
def test_non_finite_constants_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a JSON value"):
        loads(text)


@pytest.mark.parametrize(
    "text",
    ["", " ", "{", "[1,]", '{"a":1,}', "01", "1.", ".5", "+1", "'a'", '{"a" 1}', "tru", "\ufeff1"],
)
def test_invalid_json_is_refused_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        loads(text)


@pytest.mark.parametrize("text", ['{"a":1} x', "1 2", "[] []", "null,"])
def test_trailing_data_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Extra data"):
        loads(text)


def test_surrounding_json_whitespace_is_allowed() -> None:
    assert canonical_args(b' \t\r\n{"a" : [ 1 , 2 ] }\n') == '{"a":[1,2]}'


def test_control_characters_inside_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        loads(b'"a\x01b"')


def test_nesting_too_deep_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nesting too deep"):
        loads("[" * 100_000 + "]" * 100_000)


def test_duplicate_keys_keep_the_last_value() -> None:
    assert canonical_args('{"a":1,"b":2,"a":3}') == '{"a":3,"b":2}'


def test_keys_sort_by_utf8_bytes_not_by_utf16_units() -> None:
    # U+FF21 sorts before U+1F600 in UTF-8 (and code points) but after it in UTF-16 units.
    value = {"\U0001f600": 1, "\uff21": 2, "z": 3, "Z": 4, "é": 5}

    assert dumps(value) == '{"Z":4,"z":3,"é":5,"Ａ":2,"😀":1}'


def test_nested_objects_are_sorted_and_arrays_keep_their_order() -> None:
    text = '{"b":[3,1,{"y":true,"x":false}],"a":{"d":null,"c":"s"}}'

    assert canonical_args(text) == '{"a":{"c":"s","d":null},"b":[3,1,{"x":false,"y":true}]}'


@pytest.mark.parametrize(
    ("source", "canonical"),
    [
        (r'"\""', r'"\""'),
        (r'"\\"', r'"\\"'),
        (r'"\n\r\t"', r'"\n\r\t"'),
        (r'"\b\f"', r'"\b\f"'),
        (r'"\u0001\u001f"', r'"\u0001\u001f"'),
        (r'"\u001F"', r'"\u001f"'),
        ('"<>&"', r'"\u003c\u003e\u0026"'),
        (r'"\u2028\u2029"', r'"\u2028\u2029"'),
        (r'"\/"', '"/"'),
        (r'"\u007f"', '"\x7f"'),
        (r'"\u00e9\u4e2d\ud83d\ude00"', '"é中😀"'),
        ('"é中😀"', '"é中😀"'),
    ],
)
def test_strings_are_escaped_like_go(source: str, canonical: str) -> None:
    assert canonical_args(source.encode("utf-8")) == canonical


def test_keys_are_escaped_like_values() -> None:
    assert canonical_args(r'{"a<b\u0000":1}') == r'{"a\u003cb\u0000":1}'


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        (b'"\xff"', "\ufffd"),
        (b'"a\xc3"', "a\ufffd"),
        # A truncated three-byte sequence: Go replaces each byte, not the sequence as a whole.
        (b'"\xe2\x82A"', "\ufffd\ufffdA"),
        (b'"\xf0\x9f\x98"', "\ufffd\ufffd\ufffd"),
        # UTF-8-encoded surrogate and overlong forms are invalid byte by byte too.
        (b'"\xed\xa0\x80"', "\ufffd\ufffd\ufffd"),
        (b'"\xc0\xaf"', "\ufffd\ufffd"),
        (b'"\xf4\x90\x80\x80"', "\ufffd\ufffd\ufffd\ufffd"),
    ],
)
def test_invalid_utf8_is_repaired_per_byte(raw: bytes, decoded: str) -> None:
    assert loads(raw) == decoded


def test_invalid_utf8_outside_strings_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        loads(b"[1,\xff]")


@pytest.mark.parametrize(
    ("source", "decoded"),
    [
        (r'"\ud800"', "\ufffd"),
        (r'"\udc00"', "\ufffd"),
        (r'"\ud800\u0041"', "\ufffdA"),
        (r'"\udc00\ud800"', "\ufffd\ufffd"),
        (r'"\ud800\ud800\udc00"', "\ufffd\U00010000"),
        (r'"\uD83D\uDE00"', "\U0001f600"),
    ],
)
def test_escaped_lone_surrogates_become_replacement_characters(source: str, decoded: str) -> None:
    assert loads(source.encode("ascii")) == decoded


def test_lone_surrogates_in_keys_are_repaired_and_the_last_duplicate_wins() -> None:
    value = loads(rb'{"\ud800":1,"\udc00":2,"\ud800":3}')

    assert value == {"\ufffd": "3"}


def test_lone_surrogates_in_nested_values_are_repaired() -> None:
    value = loads(rb'{"a":[{"b":"x\udfff"}],"n":1.50}')

    assert value == {"a": [{"b": "x\ufffd"}], "n": "1.50"}
    assert isinstance(value["n"], JsonNumber)


def test_raw_lone_surrogates_in_str_input_are_repaired() -> None:
    assert loads('"a\ud800"') == "a\ufffd"


def test_an_escaped_backslash_before_u_is_not_a_surrogate_escape() -> None:
    assert loads(rb'"\\ud800"') == "\\ud800"


def test_dumps_accepts_plain_python_values() -> None:
    value = {"i": 10, "f": 0.5, "t": True, "n": None, "l": [1, "x"], "tu": (False,), "big": 2**70}

    assert dumps(value) == (
        '{"big":1180591620717411303424,"f":0.5,"i":10,"l":[1,"x"],"n":null,"t":true,"tu":[false]}'
    )


def test_dumps_writes_str_and_int_enums_as_their_values() -> None:
    class Colour(StrEnum):
        RED = "red"

    class Level(IntEnum):
        HIGH = 3

    assert dumps({Colour.RED: [Colour.RED, Level.HIGH]}) == '{"red":["red",3]}'


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_dumps_refuses_non_finite_floats(number: float) -> None:
    with pytest.raises(ValueError, match="not a JSON number"):
        dumps([number])


@pytest.mark.parametrize("value", [{1: "a"}, {None: 1}, {"a": {1, 2}}, [b"x"], object()])
def test_dumps_refuses_unsupported_types(value: object) -> None:
    with pytest.raises(TypeError, match="cannot encode JSON"):
        dumps(value)


def test_dumps_refuses_cycles() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)

    with pytest.raises(ValueError, match="nesting too deep or circular"):
        dumps(cycle)


def test_dumps_repairs_lone_surrogates_in_python_strings() -> None:
    assert dumps({"k\udc00": "v\ud800"}) == '{"k\ufffd":"v\ufffd"}'


def test_json_number_refuses_text_that_is_not_a_number_literal() -> None:
    for text in ["", "1.", "+1", "0x10", "NaN", "1 ", "<1>"]:
        with pytest.raises(ValueError, match="not a JSON number literal"):
            JsonNumber(text)


def test_json_number_built_by_hand_is_written_verbatim() -> None:
    assert dumps([JsonNumber("-0.0e-0")]) == "[-0.0e-0]"


def test_canonical_text_is_a_fixed_point() -> None:
    text = canonical_args(r'{"b":"<\u00e9>","a":[1.10,-0,{"c":"\ud800"}]}')

    assert canonical_args(text.encode("utf-8")) == text


def test_args_hash_is_lowercase_hex_sha256_of_the_utf8_bytes() -> None:
    assert args_hash("é") == hashlib.sha256(b"\xc3\xa9").hexdigest()
    assert args_hash("null") == "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
