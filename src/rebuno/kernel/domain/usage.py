"""Token usage read from the result of an LLM call, for token budgets (§14.9).

The result is the SDK's envelope `{"status", "headers", "body"}` or any JSON. Its body is
parsed as JSON, or else as a server-sent-event stream of `data:` lines; every object is
searched for the usage counters of the common providers, keeping the largest value seen per
direction because streams report running totals. Malformed input yields None, never an error.

Standard library only; must not import anything else.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Final

INPUT_COUNTERS: Final = frozenset(
    {"prompt_tokens", "input_tokens", "inputTokens", "promptTokenCount", "prompt_eval_count"}
)
OUTPUT_COUNTERS: Final = frozenset(
    {"completion_tokens", "output_tokens", "outputTokens", "candidatesTokenCount", "eval_count"}
)

_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
_MAX_COUNT: Final = 2**63 - 1  # what a BIGINT column holds
_NOT_JSON: Final = object()


def extract_usage(result_json: str) -> tuple[int, int] | None:
    """`(input_tokens, output_tokens)` found in a step result, or None when both are 0."""
    result = _loads(result_json)
    documents: list[object]
    if result is _NOT_JSON:
        documents = list(_sse_documents(result_json))
    else:
        body = _envelope_body(result)
        documents = [result] if body is None else _body_documents(body)
    input_tokens, output_tokens = _largest_counts(documents)
    if input_tokens == 0 and output_tokens == 0:
        return None
    return input_tokens, output_tokens


def _envelope_body(result: object) -> str | None:
    if isinstance(result, dict):
        body = result.get("body")
        if isinstance(body, str) and body:
            return body
    return None


def _body_documents(body: str) -> list[object]:
    parsed = _loads(body)
    return list(_sse_documents(body)) if parsed is _NOT_JSON else [parsed]


def _sse_documents(text: str) -> Iterator[object]:
    for line in _LINE_BREAK.split(text):
        if line.startswith("data:"):
            parsed = _loads(line[5:])
            if parsed is not _NOT_JSON:  # `[DONE]` and other non-JSON payloads are skipped
                yield parsed


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _largest_counts(documents: list[object]) -> tuple[int, int]:
    """Walk every nested object without recursion, so depth cannot exhaust the stack."""
    input_tokens = output_tokens = 0
    pending = list(documents)
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                count = _count(value)
                if key in INPUT_COUNTERS:
                    input_tokens = max(input_tokens, count)
                elif key in OUTPUT_COUNTERS:
                    output_tokens = max(output_tokens, count)
                if isinstance(value, list | dict):
                    pending.append(value)
    return input_tokens, output_tokens


def _count(value: object) -> int:
    """A counter's value as a token count; anything but a sane number counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    count = int(value)
    return count if 0 <= count <= _MAX_COUNT else 0
