"""Argument values decoded like Go's encoding/json and rendered like Go's `%v` (§14.5)."""

from __future__ import annotations

import pytest

from rebuno.kernel.policy.render import (
    format_float,
    go_string,
    parse_arguments,
    render_value,
)


def rendered(json_value: str) -> str:
    arguments = parse_arguments('{"v": ' + json_value + "}")
    assert arguments is not None
    return render_value(arguments["v"])


@pytest.mark.parametrize(
    ("json_value", "text"),
    [
        ("1", "1"),
        ("1.5", "1.5"),
        ("100000", "100000"),
        ("1000000", "1e+06"),
        ("1234567", "1.234567e+06"),
        ("0.0001", "0.0001"),
        ("0.00001", "1e-05"),
        ("123456789012", "1.23456789012e+11"),
        ("12345678901234567890", "1.2345678901234567e+19"),
        ("-0", "-0"),
        ("-0.0", "-0"),
        ("0", "0"),
        ("0.0", "0"),
        ("-1.5", "-1.5"),
        ("999999", "999999"),
        ("123456.7", "123456.7"),
        ("-1234567", "-1.234567e+06"),
        ("0.000123", "0.000123"),
        ("1e-7", "1e-07"),
        ("1e21", "1e+21"),
        ("1e100", "1e+100"),
        ("0.1", "0.1"),
        ("2.5e-5", "2.5e-05"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("9007199254740993", "9.007199254740992e+15"),
        ("100", "100"),
        ("1.0", "1"),
    ],
)
def test_number_renders_as_go_float64(json_value: str, text: str) -> None:
    assert rendered(json_value) == text


@pytest.mark.parametrize(
    ("json_value", "text"),
    [
        ('"ls -la"', "ls -la"),
        ('""', ""),
        ("true", "true"),
        ("false", "false"),
        ("null", "<nil>"),
        ('[1, "x"]', "[1 x]"),
        ("[]", "[]"),
        ("{}", "map[]"),
        ('{"b": 2, "a": "x"}', "map[a:x b:2]"),
        ('[null, true, [1, [2]], {"k": [3]}]', "[<nil> true [1 [2]] map[k:[3]]]"),
        ('{"z": {"y": null}, "a b": "c d"}', "map[a b:c d z:map[y:<nil>]]"),
        ('["a b", "c"]', "[a b c]"),
        ("[1000000, 0.5]", "[1e+06 0.5]"),
        ('"\\ud800x"', "\ufffdx"),
        ('"caf\\u00e9"', "café"),
    ],
)
def test_value_renders_as_go_percent_v(json_value: str, text: str) -> None:
    assert rendered(json_value) == text


def test_non_finite_floats_render_like_go() -> None:
    assert [format_float(x) for x in (float("nan"), float("inf"), float("-inf"))] == [
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_map_keys_sort_by_code_point() -> None:
    assert render_value({"é": 1.0, "z": 2.0, "A": 3.0}) == "map[A:3 z:2 é:1]"


def test_deeply_nested_value_renders_without_recursion() -> None:
    value: object = "x"
    for _ in range(20_000):
        value = [value]

    text = render_value(value)

    assert text == "[" * 20_000 + "x" + "]" * 20_000


def test_big_integer_decodes_to_nearest_float() -> None:
    arguments = parse_arguments('{"n": 12345678901234567890}')

    assert arguments == {"n": 1.2345678901234567e19}


@pytest.mark.parametrize(
    "args_json",
    [
        None,
        "null",
        "[1, 2]",
        '"text"',
        "42",
        "not json",
        "{",
        '{"n": 1e400}',
        '{"n": -1e400}',
        '{"n": NaN}',
        '{"n": Infinity}',
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_args_that_are_not_a_go_json_object_parse_to_none(args_json: str | None) -> None:
    assert parse_arguments(args_json) is None


def test_duplicate_keys_keep_the_last_value() -> None:
    assert parse_arguments('{"a": 1, "a": 2}') == {"a": 2.0}


def test_lone_surrogates_become_replacement_characters() -> None:
    assert go_string("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert go_string("plain") == "plain"
    assert go_string("😀") == "😀"
