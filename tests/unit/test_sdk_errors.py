"""The SDK's error tree: envelope mapping, failure reasons, and refusals found in wrappers."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import openai
import pytest

from rebuno import (
    APIError,
    Blocked,
    ConflictError,
    ForbiddenError,
    LeaseSuperseded,
    NotFoundError,
    PolicyError,
    RateLimited,
    Terminated,
    ToolError,
    UnauthorizedError,
    ValidationError,
    failure_reason,
    raise_for_refusal,
)
from rebuno.sdk.errors import error_from_envelope, refusal_message
from rebuno.sdk.llm import _refusal


def envelope(code: str, message: str = "it went wrong", **extra: str) -> bytes:
    return json.dumps({"code": code, "message": message, **extra}).encode()


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("validation_error", 400, ValidationError),
        ("unauthorized", 401, UnauthorizedError),
        ("forbidden", 403, ForbiddenError),
        ("not_found", 404, NotFoundError),
        ("conflict", 409, ConflictError),
        ("lease_superseded", 409, LeaseSuperseded),
        ("policy_denied", 403, PolicyError),
        ("method_not_allowed", 405, APIError),
        ("internal_error", 500, APIError),
    ],
)
def test_envelope_code_chooses_the_exception(code: str, status: int, expected: type) -> None:
    error = error_from_envelope(status, envelope(code))

    assert type(error) is expected
    assert isinstance(error, APIError)
    assert (error.code, error.status_code, error.message) == (code, status, "it went wrong")


def test_execution_terminal_code_is_terminated() -> None:
    error = error_from_envelope(409, envelope("execution_terminal", "already completed"))

    assert isinstance(error, Terminated)
    assert str(error) == "already completed"


def test_policy_denied_envelope_carries_rule_id() -> None:
    error = error_from_envelope(403, envelope("policy_denied", "no", rule_id="r7"))

    assert isinstance(error, PolicyError)
    assert error.rule_id == "r7"


def test_unknown_code_is_plain_api_error_with_status() -> None:
    error = error_from_envelope(418, envelope("teapot"))

    assert type(error) is APIError
    assert (error.code, error.status_code) == ("teapot", 418)


def test_non_json_error_body_keeps_raw_text() -> None:
    error = error_from_envelope(502, b"<html>bad gateway</html>")

    assert type(error) is APIError
    assert (error.code, error.message) == ("internal_error", "<html>bad gateway</html>")
    assert error.retryable


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PolicyError("no shell"), "policy_denied: no shell"),
        (RateLimited(), "rate_limit_exceeded"),
        (RateLimited("rate_limiter_unavailable"), "rate_limiter_unavailable"),
        (ToolError("boom", tool_id="search"), "tool_error: search: boom"),
        (ValueError("bad value"), "agent_error: ValueError: bad value"),
        (NotFoundError("gone", "not_found", 404), "agent_error: NotFoundError: gone"),
    ],
)
def test_failure_reason_starts_with_a_stable_token(error: Exception, reason: str) -> None:
    assert failure_reason(error) == reason


def test_structured_fields_default_to_empty() -> None:
    error = ToolError("boom", tool_id="t", step_id="s", retryable=True)

    assert (error.tool_id, error.step_id, error.retryable, error.rule_id) == ("t", "s", True, "")
    assert Blocked().rule_id == ""


@pytest.mark.parametrize(
    ("decision", "reason", "expected", "text"),
    [
        ("blocked", "", Blocked, None),
        ("execution_blocked", "", Blocked, None),
        ("denied", "no shell allowed", PolicyError, "no shell allowed"),
        ("denied", "", PolicyError, "policy_denied"),
        ("rate_limited", "", RateLimited, "rate_limit_exceeded"),
        ("execution_terminal", "", Terminated, None),
        ("lease_superseded", "", LeaseSuperseded, None),
    ],
)
def test_refusal_marker_is_raised_back_as_control_flow(
    decision: str, reason: str, expected: type, text: str | None
) -> None:
    wrapped = RuntimeError(f"provider said: {refusal_message(decision, reason)}")

    with pytest.raises(expected) as raised:
        raise_for_refusal(wrapped)

    assert raised.value.__cause__ is wrapped
    if text is not None:
        assert getattr(raised.value, "reason", None) == text


def test_refusal_is_found_in_the_cause_chain() -> None:
    try:
        try:
            raise ValueError(refusal_message("denied", "budget"))
        except ValueError as inner:
            raise RuntimeError("framework wrapper") from inner
    except RuntimeError as outer:
        with pytest.raises(PolicyError, match="budget"):
            raise_for_refusal(outer)


def test_error_without_marker_is_left_alone() -> None:
    raise_for_refusal(RuntimeError("an ordinary failure"))


def _openai_over(handler: Callable[[httpx.Request], httpx.Response]) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    # openai annotates `http_client` with its own httpx2 client type only, but it checks at
    # run time for an httpx2 or an httpx `AsyncClient` and takes either; this is httpx's.
    return openai.AsyncOpenAI(api_key="k", base_url="http://provider.test/v1", http_client=http)  # type: ignore[arg-type]


async def test_refusal_response_survives_the_openai_client() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return _refusal(request, "denied", "model not allowed")

    llm = _openai_over(refuse)

    with pytest.raises(openai.PermissionDeniedError) as raised:
        await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(PolicyError) as denied:
        raise_for_refusal(raised.value)

    assert denied.value.reason == "model not allowed"
    await llm.close()


async def test_rate_limit_refusal_is_not_retried_by_the_openai_client() -> None:
    seen: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _refusal(request, "rate_limited", "")

    llm = _openai_over(refuse)

    with pytest.raises(openai.RateLimitError) as raised:
        await llm.chat.completions.create(model="m", messages=[])
    with pytest.raises(RateLimited):
        raise_for_refusal(raised.value)

    assert len(seen) == 1
    await llm.close()
