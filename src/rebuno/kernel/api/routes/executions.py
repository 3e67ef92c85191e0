"""Execution routes: create, list, read, events, cancel (bearer), and the agent's heartbeat,
complete and fail (HMAC with a lease), §5.1 and §5.2.

Must not import a store backend or the dispatcher.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    off_loop,
    parse_object,
    raw_field,
    reject_present,
    required_raw,
    step_outcomes,
    text_field,
)
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import (
    json_response,
    no_content,
    render_event,
    render_execution,
    render_execution_page,
)
from rebuno.kernel.domain.decision import Carried
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.records import RawJson
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import ExecutionFilter
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.extensions import EXTENSIONS_HEADER, STEP_RECORDS, asks_for

# Later-extension fields of `POST /v0/executions` (§21.3): refused rather than silently
# ignored, since ignoring idempotency or session semantics would mislead the caller.
CREATE_EXTENSIONS = (
    "session",
    "parent_execution_id",
    "idempotency_key",
    "spawned_by",
    "on_behalf_of",
)
LIST_LIMIT = (50, 200)
EVENTS_LIMIT = (100, 1000)


def _create_fields(raw: bytes) -> tuple[str, RawJson, str | None]:
    body = parse_object(raw)
    reject_present(body, CREATE_EXTENSIONS, "this kernel has no sessions or sub-executions")
    return (
        text_field(body, "agent_id", required=True),
        raw_field(body, "input") or "null",
        text_field(body, "agent_version") or None,
    )


def _completion_fields(raw: bytes) -> tuple[RawJson, tuple[Carried, ...]]:
    body = parse_object(raw)
    return required_raw(body, "output"), step_outcomes(body)


def execution_id(request: Request) -> str:
    return params.parse_uuid(request.path_params["execution_id"], "execution id")


def execution_status(text: str) -> ExecutionStatus | None:
    if not text:
        return None
    try:
        return ExecutionStatus(text)
    except ValueError:
        raise ValidationFailed(f"validation error: unknown execution status {text!r}") from None


class ExecutionRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        base = "/v0/executions"
        one = base + "/{execution_id}"
        return [
            route(base, GET=self.list, POST=self.create),
            route(one, GET=self.get),
            route(one + "/events", GET=self.events),
            route(one + "/cancel", POST=self.cancel),
            route(one + "/previous", GET=self.previous),
            route(one + "/heartbeat", POST=self.heartbeat),
            route(one + "/complete", POST=self.complete),
            route(one + "/fail", POST=self.fail),
        ]

    async def create(self, request: Request) -> Response:
        agent_id, input, agent_version = await off_loop(
            await self._gate.client(request), _create_fields
        )
        execution = await self._kernel.create_execution(agent_id, input, agent_version)
        return json_response(render_execution(execution), 201)

    async def list(self, request: Request) -> Response:
        await self._gate.client(request)
        query = request.query_params
        default, maximum = LIST_LIMIT
        agent = params.first(query, "agent_id")
        flt = ExecutionFilter(
            # An id no agent can have (a NUL, which PostgreSQL text cannot hold) is a 400.
            agent_id=params.agent_id(agent) if agent else None,
            status=execution_status(params.first(query, "status")),
            cursor=params.optional_uuid(query, "cursor"),
            limit=params.page_limit(query, default=default, maximum=maximum, strict=True),
        )
        return json_response(render_execution_page(await self._kernel.list_executions(flt)))

    async def get(self, request: Request) -> Response:
        caller = await self._gate.client_or_agent(request)
        execution = await self._kernel.get_execution(
            execution_id(request), caller.agent_id, params.long_poll(request.query_params)
        )
        return json_response(render_execution(execution))

    async def events(self, request: Request) -> Response:
        await self._gate.client(request)
        default, maximum = EVENTS_LIMIT
        query = request.query_params
        events = await self._kernel.list_events(
            execution_id(request),
            params.after_seq(query),
            params.page_limit(query, default=default, maximum=maximum, strict=False),
            params.long_poll(query),
        )
        return json_response([render_event(event) for event in events])

    async def cancel(self, request: Request) -> Response:
        await self._gate.client(request)
        await self._kernel.cancel_execution(execution_id(request))
        return no_content()

    async def previous(self, request: Request) -> Response:
        """§21.3: there are no parent executions here, so there is never a previous state."""
        caller = await self._gate.client_or_agent(request)
        await self._kernel.get_execution(execution_id(request), caller.agent_id)
        return json_response({"state": None})

    async def heartbeat(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target, lease = execution_id(request), params.required_lease(request.headers)
        # `step-records`: a heartbeat may carry completions and asks whether the agent may
        # go on reporting steps after they ran. The standard heartbeat has no body.
        outcomes = step_outcomes(parse_object(caller.body)) if caller.body.strip() else ()
        asked = asks_for(request.headers, STEP_RECORDS)
        granted = await self._kernel.heartbeat(
            target, caller.agent_id, lease, outcomes, policy=asked
        )
        response = no_content()
        if granted:
            response.headers[EXTENSIONS_HEADER] = STEP_RECORDS
        return response

    async def complete(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        # `state` (§21.3) is accepted; with no `previous` support there is nowhere to keep it.
        output, outcomes = await off_loop(caller.body, _completion_fields)
        await self._kernel.complete_execution(target, caller.agent_id, lease, output, outcomes)
        return no_content()

    async def fail(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        body = parse_object(caller.body)
        lease = params.required_lease(request.headers)
        if "error" not in body:
            raise ValidationFailed("validation error: error is required")
        reason = text_field(body, "error")
        await self._kernel.fail_execution(
            target, caller.agent_id, lease, reason, step_outcomes(body)
        )
        return no_content()
