"""The SDK's exceptions, all under one root, and the helpers that read and rebuild them.

```
RebunoError                  every SDK exception; carries rule_id, step_id, tool_id, retryable
├── NetworkError             no HTTP answer at all: refused connection, timeout
├── APIError                 the kernel answered with an error envelope {code, message}
│   ├── ValidationError      400 validation_error
│   ├── UnauthorizedError    401 unauthorized
│   ├── ForbiddenError       403 forbidden
│   ├── NotFoundError        404 not_found
│   ├── ConflictError        409 conflict
│   ├── PolicyError          a step was denied by policy (403 policy_denied); has rule_id
│   └── LeaseSuperseded      409 lease_superseded: a newer delivery attempt owns the dispatch
├── ToolError                a tool body failed, or its outcome is unknown (indeterminate)
├── RateLimited              a policy rate limit refused the step; has reason and rule_id
├── CheckpointUnavailable    a resource driver cannot restore the checkpoint it was given
├── Blocked                  control flow: a step waits for a human approval
└── Terminated               control flow: the execution is terminal (409 execution_terminal)
```

The exception chosen for an error envelope comes from its `code`, through the table of
`rebuno.protocol.codes`, so `Client` and the agent's kernel client always agree. Imports only
`rebuno.protocol`; never the kernel.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rebuno.protocol.codes import HTTP_STATUS, ErrorCode

__all__ = [
    "APIError",
    "Blocked",
    "CheckpointUnavailable",
    "ConflictError",
    "ForbiddenError",
    "LeaseSuperseded",
    "NetworkError",
    "NotFoundError",
    "PolicyError",
    "RateLimited",
    "RebunoError",
    "Terminated",
    "ToolError",
    "UnauthorizedError",
    "ValidationError",
    "error_from_envelope",
    "failure_reason",
    "raise_for_refusal",
    "refusal_message",
]

REFUSAL_TYPE = "rebuno_refusal"
_REFUSAL = re.compile(r"rebuno_refusal: (\w+)(?: reason=([^'\"\\\n]*))?")


class RebunoError(Exception):
    """Root of every exception the SDK raises.

    Attributes:
        rule_id: The policy rule behind the error, when one is known.
        step_id: The step the error belongs to, when one is known.
        tool_id: The tool (step target) the error belongs to, when one is known.
        retryable: True when the same call may succeed if made again later.
    """

    rule_id: str = ""
    step_id: str = ""
    tool_id: str = ""
    retryable: bool = False


class CheckpointUnavailable(RebunoError):
    """Raised by a resource driver's `create` when the checkpoint it should start from no
    longer exists at the provider. The run fails with it, as any handler error does."""


class NetworkError(RebunoError):
    """The kernel could not be reached: connection refused, reset, or timed out."""

    retryable = True


class APIError(RebunoError):
    """The kernel answered with an error envelope.

    Args:
        message: The envelope's human-readable message.
        code: The envelope's stable machine-readable code, for example `not_found`.
        status_code: The HTTP status of the answer.
    """

    def __init__(self, message: str, code: str, status_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.retryable = status_code >= 500

    def __str__(self) -> str:
        return f"{self.message} ({self.code}, HTTP {self.status_code})"


class ValidationError(APIError):
    """The kernel rejected the request as malformed (400 `validation_error`)."""


class UnauthorizedError(APIError):
    """Authentication failed: a bad bearer token or agent signature (401 `unauthorized`)."""


class ForbiddenError(APIError):
    """The caller is authenticated but not allowed to do this (403 `forbidden`)."""


class NotFoundError(APIError):
    """The execution, step, agent or approval does not exist (404 `not_found`)."""


class ConflictError(APIError):
    """The request conflicts with the resource's current state (409 `conflict`)."""


class PolicyError(APIError):
    """Policy denied a step.

    Args:
        message: The denial's reason, as the policy rule states it.
        rule_id: The id of the rule that denied the step, when the kernel names it.
    """

    def __init__(self, message: str, rule_id: str = "") -> None:
        code = ErrorCode.POLICY_DENIED
        super().__init__(message, code.value, HTTP_STATUS[code])
        self.rule_id = rule_id

    @property
    def reason(self) -> str:
        """The denial's reason (the same text as `message`)."""
        return self.message


class LeaseSuperseded(APIError):
    """A newer delivery attempt owns the dispatch; this attempt must stop writing."""

    def __init__(
        self,
        message: str = "dispatch lease superseded",
        code: str = ErrorCode.LEASE_SUPERSEDED.value,
        status_code: int = 409,
    ) -> None:
        super().__init__(message, code, status_code)


class ToolError(RebunoError):
    """A tool's body failed, or the kernel reports its outcome as unknown.

    Args:
        message: What went wrong.
        tool_id: The tool whose call failed.
        step_id: The recorded step of that call.
        retryable: True when calling again may succeed.
    """

    def __init__(
        self, message: str, tool_id: str = "", step_id: str = "", retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool_id = tool_id
        self.step_id = step_id
        self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.tool_id}: {self.message}" if self.tool_id else self.message


class RateLimited(RebunoError):
    """A policy rate limit refused the step.

    Args:
        reason: `rate_limit_exceeded`, or `rate_limiter_unavailable` when the limiter failed.
    """

    retryable = True

    def __init__(self, reason: str = "rate_limit_exceeded") -> None:
        super().__init__(reason)
        self.reason = reason


class Blocked(RebunoError):
    """A step waits for a human approval; the dispatch unwinds and resumes once it is decided."""

    def __init__(self) -> None:
        super().__init__("step blocked: awaiting approval")


class Terminated(RebunoError):
    """The execution is already terminal (completed, failed or cancelled)."""


class _InputInvalid(RebunoError):
    """The execution's input does not fit the handler's signature. Raised by the agent only."""


_BY_CODE: dict[str, type[APIError]] = {
    ErrorCode.VALIDATION_ERROR: ValidationError,
    ErrorCode.UNAUTHORIZED: UnauthorizedError,
    ErrorCode.FORBIDDEN: ForbiddenError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.CONFLICT: ConflictError,
}


def error_from_envelope(status_code: int, body: bytes) -> RebunoError:
    """Build the exception for an error answer from its envelope `{code, message}`.

    A body that is not an envelope still yields an `APIError` carrying the raw text.
    """
    envelope = _parse_envelope(body)
    code = str(envelope.get("code") or ErrorCode.INTERNAL_ERROR.value)
    message = str(envelope.get("message") or body.decode("utf-8", "replace"))
    if code == ErrorCode.EXECUTION_TERMINAL:
        return Terminated(message)
    if code == ErrorCode.LEASE_SUPERSEDED:
        return LeaseSuperseded(message, code, status_code)
    if code == ErrorCode.POLICY_DENIED:
        return PolicyError(message, str(envelope.get("rule_id") or ""))
    return _BY_CODE.get(code, APIError)(message, code, status_code)


def _parse_envelope(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def refusal_message(decision: str, reason: str = "") -> str:
    """The text that marks an LLM call the kernel refused: `rebuno_refusal: <decision>`.

    A non-empty `reason` is appended as ` reason=<reason>`.
    """
    return (
        f"{REFUSAL_TYPE}: {decision} reason={reason}" if reason else f"{REFUSAL_TYPE}: {decision}"
    )


def raise_for_refusal(exc: BaseException) -> None:
    """Re-raise a Rebuno refusal that a provider SDK wrapped in its own error type.

    LLM calls the kernel refuses come back to the provider SDK as 403/429 answers carrying the
    `rebuno_refusal` marker, and the provider turns them into its own exception. This finds the
    marker in `exc` or in the exceptions it was raised from, and raises the matching `Blocked`,
    `PolicyError`, `RateLimited`, `Terminated` or `LeaseSuperseded`. Any other exception is left
    alone: the function returns and the caller re-raises it.

    Example:
        try:
            reply = await llm.chat.completions.create(model="gpt-4o", messages=messages)
        except Exception as exc:
            rebuno.raise_for_refusal(exc)
            raise
    """
    signal = refusal_from(exc)
    if signal is not None:
        raise signal from exc


def refusal_from(exc: BaseException) -> RebunoError | None:
    """The control-flow exception a refusal marker in `exc` (or its causes) stands for."""
    for link in _chain(exc):
        if isinstance(link, Blocked | Terminated | LeaseSuperseded | PolicyError | RateLimited):
            return link
        for text in _texts(link):
            match = _REFUSAL.search(text)
            if match is not None:
                return _signal(match.group(1), (match.group(2) or "").strip())
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen) and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _texts(exc: BaseException) -> list[str]:
    # Provider SDKs keep the parsed error body on `.body`; its message has no repr quoting.
    body = getattr(exc, "body", None)
    texts = []
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            texts.append(error["message"])
    texts.append(str(exc))
    return texts


def _signal(decision: str, reason: str) -> RebunoError:
    if decision in ("blocked", "execution_blocked"):
        return Blocked()
    if decision == "denied":
        return PolicyError(reason or "policy_denied")
    if decision == "rate_limited":
        return RateLimited(reason or "rate_limit_exceeded")
    if decision == "lease_superseded":
        return LeaseSuperseded()
    if decision == "execution_terminal":
        return Terminated("execution_terminal")
    return RebunoError(f"the kernel refused the call: {decision}")


def failure_reason(exc: BaseException) -> str:
    """The text the agent records as an execution's `failure_reason` when `exc` ends it.

    The part before the first colon is a stable token: `policy_denied`, a rate-limit reason
    such as `rate_limit_exceeded`, `tool_error`, `input_invalid` or `agent_error`.
    """
    if isinstance(exc, PolicyError):
        return f"policy_denied: {exc.message}"
    if isinstance(exc, RateLimited):
        return exc.reason
    if isinstance(exc, ToolError):
        return f"tool_error: {exc}"
    if isinstance(exc, _InputInvalid):
        return f"input_invalid: {exc}"
    message = exc.message if isinstance(exc, APIError) else str(exc)
    return f"agent_error: {type(exc).__name__}: {message}"
