"""Token usage read from LLM call results, for token budgets (§14.9)."""

from __future__ import annotations

import json

import pytest

from rebuno.kernel.domain.usage import extract_usage


def envelope(body: str, status: int = 200) -> str:
    """The SDK's recorded HTTP response."""
    return json.dumps({"status": status, "headers": {"content-type": "x"}, "body": body})


def sse(*events: object) -> str:
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


def test_openai_chat_completion_in_envelope() -> None:
    body = json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46}}
    )

    assert extract_usage(envelope(body)) == (12, 34)


def test_anthropic_message_in_envelope() -> None:
    body = json.dumps({"content": [], "usage": {"input_tokens": 7, "output_tokens": 9}})

    assert extract_usage(envelope(body)) == (7, 9)


def test_gemini_usage_metadata() -> None:
    body = json.dumps({"usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 6}})

    assert extract_usage(envelope(body)) == (5, 6)


def test_ollama_counts() -> None:
    body = json.dumps({"response": "hi", "prompt_eval_count": 26, "eval_count": 290})

    assert extract_usage(envelope(body)) == (26, 290)


def test_bedrock_counts() -> None:
    body = json.dumps({"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}})

    assert extract_usage(envelope(body)) == (3, 4)


def test_result_without_envelope_is_searched_itself() -> None:
    result = json.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 2}})

    assert extract_usage(result) == (1, 2)


def test_openai_stream_takes_usage_from_final_chunk() -> None:
    body = sse(
        {"choices": [{"delta": {"content": "a"}}], "usage": None},
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 22}},
    )

    assert extract_usage(envelope(body)) == (11, 22)


def test_anthropic_stream_keeps_the_largest_count_per_direction() -> None:
    body = (
        "event: message_start\n"
        + sse(
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 25, "output_tokens": 1}},
            }
        )
        + "event: message_delta\n"
        + sse({"type": "message_delta", "usage": {"output_tokens": 15}})
    )

    assert extract_usage(envelope(body)) == (25, 15)


def test_stream_lines_may_end_with_crlf() -> None:
    body = 'data: {"usage": {"input_tokens": 2, "output_tokens": 3}}\r\n\r\ndata: [DONE]\r\n'

    assert extract_usage(envelope(body)) == (2, 3)


def test_stream_result_not_wrapped_in_json_is_parsed_as_sse() -> None:
    assert extract_usage(sse({"usage": {"input_tokens": 4, "output_tokens": 0}})) == (4, 0)


def test_counters_are_found_at_any_depth() -> None:
    body = json.dumps({"a": [{"b": {"c": [{"prompt_tokens": 8}]}}], "d": {"eval_count": 2}})

    assert extract_usage(envelope(body)) == (8, 2)


def test_only_one_direction_reported_is_found() -> None:
    assert extract_usage(json.dumps({"output_tokens": 5})) == (0, 5)


@pytest.mark.parametrize(
    "result",
    [
        json.dumps({"usage": {"prompt_tokens": 0, "completion_tokens": 0}}),
        json.dumps({"choices": [{"text": "no usage"}]}),
        envelope("plain text, not json"),
        envelope(""),
        envelope("data: [DONE]\n\n"),
        "null",
        '"a string result"',
        "",
        "{",
        "not json at all",
        "data: {broken\n\n",
        json.dumps({"total_tokens": 50, "cached_tokens": 3}),
    ],
)
def test_result_without_usage_gives_none(result: str) -> None:
    assert extract_usage(result) is None


@pytest.mark.parametrize(
    "value",
    [True, "12", -3, None, [5], {"n": 5}, 1e400, float("nan")],
    ids=["bool", "string", "negative", "null", "list", "object", "inf", "nan"],
)
def test_counter_that_is_not_a_count_is_ignored(value: object) -> None:
    result = json.dumps({"prompt_tokens": value, "completion_tokens": 1})

    assert extract_usage(result) == (0, 1)


def test_fractional_counter_is_truncated() -> None:
    assert extract_usage('{"prompt_tokens": 12.9, "completion_tokens": 1.0}') == (12, 1)


def test_counter_beyond_64_bits_is_ignored() -> None:
    assert extract_usage('{"prompt_tokens": 99999999999999999999, "eval_count": 3}') == (0, 3)


def test_non_string_body_means_the_result_itself_is_searched() -> None:
    result = json.dumps({"body": {"usage": {"input_tokens": 6, "output_tokens": 7}}})

    assert extract_usage(result) == (6, 7)


def test_deeply_nested_result_does_not_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000

    assert extract_usage(deep) is None
    assert extract_usage(envelope(deep)) is None


def test_deep_but_parseable_nesting_is_walked_without_recursion() -> None:
    nested = '{"x": [' * 400 + '{"prompt_tokens": 3}' + "]}" * 400

    assert extract_usage('{"completion_tokens": 1, "n": ' + nested + "}") == (3, 1)
