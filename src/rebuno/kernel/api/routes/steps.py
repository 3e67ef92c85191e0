"""Step routes (§5.2): list and read (bearer or HMAC), submit, complete and fail (HMAC with
a lease). Submissions are validated here and handed on as canonical `StepRequest`s.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    JsonObject,
    captures_field,
    occurrence_field,
    off_loop,
    parse_object,
    required_raw,
    step_outcomes,
    step_request,
)
from rebuno.kernel.api.routes.executions import execution_id
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, render_decision, render_step
from rebuno.kernel.domain.decision import Carried, StepDecision, StepRequest
from rebuno.kernel.domain.records import Lease, RawJson
from rebuno.kernel.domain.resource import Captures
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Scope, StepStatus
from rebuno.protocol.extensions import (
    EXTENSIONS_HEADER,
    STEP_OCCURRENCES,
    STEP_RECORDS,
    asks_for,
)

RecordOutcome = Callable[[str, str, str, Lease, RawJson, Captures], Awaitable[StepDecision]]
TERMINAL = "terminal"
STEP_STATUSES = frozenset(status.value for status in StepStatus)


def _submission_fields(raw: bytes) -> tuple[JsonObject, StepRequest, tuple[Carried, ...]]:
    body = parse_object(raw)
    return body, step_request(body), step_outcomes(body)


def _outcome_fields(raw: bytes, field: str) -> tuple[RawJson, Captures]:
    body = parse_object(raw)
    return required_raw(body, field), captures_field(body)


def step_filter(text: str) -> str | None:
    """`terminal` or one step status filters; any other value lists every step (§5.2)."""
    if text == TERMINAL or text in STEP_STATUSES:
        return text
    return None


class StepRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        steps = "/v0/executions/{execution_id}/steps"
        one = steps + "/{step_id}"
        return [
            route(
                steps,
                GET=self._gate.scoped_or_agent(self.list, Scope.EXECUTIONS_READ),
                POST=self._gate.signed(self.submit),
            ),
            route(one, GET=self._gate.scoped_or_agent(self.get, Scope.EXECUTIONS_READ)),
            route(one + "/complete", POST=self._gate.signed(self.complete)),
            route(one + "/fail", POST=self._gate.signed(self.fail)),
        ]

    async def list(self, request: Request) -> Response:
        caller = await self._gate.client_or_agent(request)
        status = step_filter(params.first(request.query_params, "status"))
        steps = await self._kernel.list_steps(execution_id(request), status, caller.agent_id)
        return json_response([render_step(step) for step in steps])

    async def get(self, request: Request) -> Response:
        caller = await self._gate.client_or_agent(request)
        step = await self._kernel.get_step(
            execution_id(request), params.step_id(request.path_params["step_id"]), caller.agent_id
        )
        return json_response(render_step(step))

    async def submit(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        body, step, outcomes = await off_loop(caller.body, _submission_fields)
        occurrence = None
        if asks_for(request.headers, STEP_OCCURRENCES):
            occurrence = occurrence_field(body)
        decision = await self._kernel.submit_step(
            target, caller.agent_id, lease, step, outcomes, occurrence
        )
        response = json_response(render_decision(decision))
        if decision.policy_free and asks_for(request.headers, STEP_RECORDS):
            # `step-records`: the agent may keep running steps before it reports them.
            response.headers[EXTENSIONS_HEADER] = STEP_RECORDS
        return response

    async def complete(self, request: Request) -> Response:
        return await self._finish(request, "result", self._kernel.complete_step)

    async def fail(self, request: Request) -> Response:
        return await self._finish(request, "error", self._kernel.fail_step)

    async def _finish(self, request: Request, field: str, record: RecordOutcome) -> Response:
        """Complete and fail read the same headers and one JSON member (`result`/`error`)."""
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        outcome, captures = await off_loop(caller.body, lambda raw: _outcome_fields(raw, field))
        step_id = params.step_id(request.path_params["step_id"])
        decision = await record(target, caller.agent_id, step_id, lease, outcome, captures)
        return json_response(render_decision(decision))
