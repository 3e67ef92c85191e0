"""Submitting a dispatch's steps and acting on the kernel's decision (docs/protocol.md §8):
`proceed` runs the body and records its outcome, `replay` returns the recorded one, every
other decision raises. Under `step-records` a safe step runs first and is reported afterwards.

This is the path of every step, so it adds no await, task or allocation a step does not need:
what waits to be carried travels with the submission, a `safe_to_retry` result waits for the
next call, and the occurrence is counted only under `step-occurrences`. Imports only
`rebuno.protocol`, the SDK's own modules and the models; never the kernel.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any, assert_never

from pydantic import BaseModel

from rebuno.protocol.enums import Decision, StepKind
from rebuno.sdk._carried import Carrier, check_size
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Completion, Report, encode_json
from rebuno.sdk._numbering import Numbering
from rebuno.sdk._resources import Resources
from rebuno.sdk._suspension import Suspension
from rebuno.sdk.errors import (
    Blocked,
    LeaseSuperseded,
    PolicyError,
    RateLimited,
    RebunoError,
    Terminated,
    ToolError,
)
from rebuno.types import StepDecision, StepResource

logger = logging.getLogger("rebuno")

_DECISIONS = {member.value: member for member in Decision}

_current_step: ContextVar[str | None] = ContextVar("rebuno_step", default=None)
"""The id of the recorded step whose body the current code runs in (for `subagent`)."""


def current_step() -> str | None:
    """The id of the recorded step whose body is running, or None."""
    return _current_step.get()


class Submitter:
    """Submits one dispatch's steps, runs the bodies that proceed and records their outcomes."""

    def __init__(
        self,
        dispatch: Dispatch,
        carrier: Carrier,
        numbering: Numbering | None,
        resources: Resources,
        suspension: Suspension,
    ) -> None:
        """`numbering`: present when the delivery numbers its steps (`step-occurrences`)."""
        self._dispatch = dispatch
        self._kernel = dispatch.kernel
        self._id = dispatch.execution_id
        self._lease = dispatch.lease
        self._carrier = carrier
        self._numbering = numbering
        self._resources = resources
        self._suspension = suspension

    async def invoke(
        self,
        kind: str,
        target: str,
        encoded: bytes,
        idempotency: str,
        run: Callable[[], Any] | None,
        resources: Sequence[str] = (),
    ) -> Any:
        """Submits one effect whose arguments are `encoded` and acts on the decision."""
        decision = await self.submit(kind, target, encoded, idempotency, resources)
        match _decision(decision):
            case Decision.PROCEED:
                due = [entry for entry in decision.resources if entry.due]
                return await self._run_body(decision.step_id, target, run, idempotency, due)
            case Decision.REPLAY:
                return _replayed(decision, target)
            case _:
                raise self.refusal(decision)

    async def submit(
        self, kind: str, target: str, args: bytes, idempotency: str, resources: Sequence[str] = ()
    ) -> StepDecision:
        """Submits a step under the lease, with what waits to be carried."""
        # `args` is encoded before the completions are taken, so a refused value loses none.
        carrier = self._carrier
        if carrier.crowds(len(args)):
            await carrier.flush()  # they would not fit beside these arguments
        send = partial(
            self._kernel.submit_step,
            self._id,
            self._lease,
            kind=kind,
            target=target,
            args=args,
            idempotency=idempotency,
            completions=carrier.take(),
            resources=resources if kind != StepKind.LLM_CALL else (),
        )
        if self._numbering is not None:
            numbered = self._numbering.submit(kind, target, args, send)
            decision, _ = await self._dispatch.call(numbered)
            return decision
        asked = carrier.reporting
        decision, granted = await self._dispatch.call(send(ask_records=asked))
        if asked and not granted:
            carrier.reporting = False
        return decision

    async def run_unsubmitted(
        self, kind: str, target: str, args: bytes, run: Callable[[], Any] | None
    ) -> Any:
        """`step-records`: the kernel has said no policy decides this agent's steps and none
        was recorded before this delivery, so a `safe_to_retry` step runs at once and is
        reported with its outcome by a later call. A crash before that only runs it again."""
        if self._dispatch.signal is not None:
            raise self._dispatch.signal
        if self._dispatch.superseded:
            raise LeaseSuperseded("the lease of this delivery was superseded")
        try:
            result = await _call(run)
            recorded = _recorded(result)
            check_size("result", recorded)
        except (Blocked, Terminated, LeaseSuperseded):
            raise
        except Exception as exc:
            error = encode_json(_error_of(exc))
            await self._carrier.hold(Report(kind, target, args, error=error))
            raise ToolError(str(exc) or type(exc).__name__, target) from exc
        await self._carrier.hold(Report(kind, target, args, result=recorded))
        return result

    async def complete(self, step_id: str, result: bytes) -> None:
        """Records a step's result, encoded already, on its own call."""
        await self._dispatch.call(
            self._kernel.complete_step(self._id, step_id, self._lease, result)
        )

    async def fail(self, step_id: str, error: Any) -> None:
        """Records a step's failure on its own call."""
        await self._dispatch.call(self._kernel.fail_step(self._id, step_id, self._lease, error))

    def refusal(self, decision: StepDecision) -> RebunoError:
        """The exception for a decision that is neither proceed nor replay; `Blocked` and
        `Terminated` are remembered, so the dispatch unwinds even if the handler swallows
        them."""
        match _decision(decision):
            case Decision.DENIED:
                error: RebunoError = PolicyError(decision.reason or "policy_denied")
                error.rule_id = decision.rule_id
            case Decision.RATE_LIMITED:
                error = RateLimited(decision.reason or "rate_limit_exceeded")
                error.rule_id = decision.rule_id
            case Decision.BLOCKED | Decision.EXECUTION_BLOCKED:
                error = self._dispatch.remember(Blocked())
            case Decision.EXECUTION_TERMINAL:
                error = self._dispatch.remember(Terminated("the execution is terminal"))
            case Decision.PROCEED | Decision.REPLAY | Decision.RECORDED:
                error = RebunoError(f"unexpected step decision {decision.decision!r}")
            case unexpected:
                assert_never(unexpected)
        error.step_id = decision.step_id
        return error

    async def _run_body(
        self,
        step_id: str,
        target: str,
        run: Callable[[], Any] | None,
        idempotency: str,
        due: Sequence[StepResource] = (),
    ) -> Any:
        """Runs a proceeding step's body and records its outcome, with a capture of each
        resource `due` after it (§33.6)."""
        token = _current_step.set(step_id)
        suspension = self._suspension
        suspension.started()
        try:
            result = await _call(run)
            recorded = _recorded(result)
            check_size("result", recorded)
        except (Blocked, Terminated, LeaseSuperseded):
            # A nested call unwinding the dispatch is no failure of this step: it stays open
            # and the next attempt decides it by its idempotency.
            raise
        except Exception as exc:
            captures = await self._resources.capture(due)
            await self._fail_quietly(step_id, exc, captures)
            raise ToolError(str(exc) or type(exc).__name__, target, step_id) from exc
        finally:
            _current_step.reset(token)
            suspension.ended()
        if due:
            captures = await self._resources.capture(due)
            send = self._kernel.complete_step(self._id, step_id, self._lease, recorded, captures)
            await self._dispatch.call(send)
            return result
        await self._record(step_id, recorded, idempotency)
        return result

    async def _record(self, step_id: str, result: bytes, idempotency: str) -> None:
        if self._carrier.carry and idempotency == "safe_to_retry":
            await self._carrier.hold(Completion(step_id, result))
            return
        await self._dispatch.call(
            self._kernel.complete_step(self._id, step_id, self._lease, result)
        )

    async def _fail_quietly(
        self, step_id: str, exc: Exception, captures: dict[str, Any] | None = None
    ) -> None:
        error = _error_of(exc)
        try:
            send = self._kernel.fail_step(self._id, step_id, self._lease, error, captures)
            await self._dispatch.call(send)
        except RebunoError as failure:
            # The body's own error is what the caller needs; this one only loses the record.
            logger.warning(
                "could not record failure of step_id=%s execution_id=%s: %s",
                step_id,
                self._id,
                failure,
            )


def _recorded(value: Any) -> bytes:
    """`value` encoded as it will be recorded (pydantic models dumped; non-JSON raises
    `TypeError`); the encoding is kept, so a result is encoded once."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return encode_json(value)


def _error_of(exc: Exception) -> dict[str, str]:
    """How a step body's exception is recorded."""
    return {"message": str(exc) or type(exc).__name__, "type": type(exc).__name__}


def _decision(decision: StepDecision) -> Decision:
    # A dict lookup is several times cheaper than calling the enum, on every step.
    known = _DECISIONS.get(decision.decision)
    if known is None:
        raise RebunoError(f"unknown step decision {decision.decision!r}")
    return known


def _replayed(decision: StepDecision, target: str) -> Any:
    if decision.error is None:
        return decision.result
    error = decision.error
    message = error.get("message") or error.get("reason") if isinstance(error, dict) else None
    raise ToolError(str(message or error), target, decision.step_id)


async def _call(run: Callable[[], Any] | None) -> Any:
    if run is None:
        return None
    result = run()
    if inspect.isawaitable(result):
        return await result
    return result
