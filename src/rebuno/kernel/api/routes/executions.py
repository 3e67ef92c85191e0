"""Execution routes: create, list, read, events, cancel (bearer), and the agent's heartbeat,
complete and fail (HMAC with a lease), §5.1 and §5.2.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import idrange, params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    JsonObject,
    integer_field,
    label_field,
    off_loop,
    parse_object,
    raw_field,
    required_raw,
    step_outcomes,
    text_field,
)
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import (
    json_response,
    no_content,
    render_coverage,
    render_event,
    render_execution,
    render_execution_page,
)
from rebuno.kernel.domain.decision import Carried
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.records import RawJson
from rebuno.kernel.service.executions import Labels
from rebuno.kernel.service.forks import ForkRequest
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import ExecutionFilter
from rebuno.protocol.enums import ExecutionStatus, Scope
from rebuno.protocol.extensions import EXTENSIONS_HEADER, STEP_RECORDS, asks_for

REPLAY_HEADER = "Rebuno-Idempotent-Replay"
LIST_LIMIT = (50, 200)
EVENTS_LIMIT = (100, 1000)


@dataclass(frozen=True, slots=True)
class _Create:
    agent_id: str
    input: RawJson
    agent_version: str | None
    idempotency_key: str | None
    parent_execution_id: str | None
    on_behalf_of: str | None
    session: str | None
    spawned_by: tuple[str, str] | None


def _create_fields(raw: bytes) -> _Create:
    body = parse_object(raw)
    parent = text_field(body, "parent_execution_id")
    return _Create(
        agent_id=text_field(body, "agent_id", required=True),
        input=raw_field(body, "input") or "null",
        agent_version=text_field(body, "agent_version") or None,
        idempotency_key=label_field(body, "idempotency_key"),
        parent_execution_id=params.parse_uuid(parent, "parent_execution_id") if parent else None,
        on_behalf_of=label_field(body, "on_behalf_of"),
        session=label_field(body, "session"),
        spawned_by=_spawned_by(body.get("spawned_by")),
    )


def _at_seq(body: JsonObject) -> int:
    """§26.2: a JSON integer (not a string, a fraction or a boolean) of at least 1."""
    number = integer_field(body, "at_seq")
    if number < 1:
        raise ValidationFailed("validation error: at_seq must be at least 1")
    return number


def _spawned_by(value: object) -> tuple[str, str] | None:
    """§25.2: an object of two non-empty strings, the execution's a UUID; absent or null is
    none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationFailed("validation error: spawned_by must be an object")
    parts = [text_field(value, key, required=True) for key in ("execution_id", "step_id")]
    execution, step = parts
    return params.parse_uuid(execution, "spawned_by.execution_id"), step


def _completion_fields(raw: bytes) -> tuple[RawJson, tuple[Carried, ...], RawJson | None]:
    body = parse_object(raw)
    return required_raw(body, "output"), step_outcomes(body), raw_field(body, "state")


def _id_range(query: QueryParams) -> tuple[str | None, str | None]:
    """`created_after`, `created_before` and `id_prefix` (§40.4) as one id range: the
    floor (inclusive) and the ceiling (exclusive)."""
    after, before, prefix = (
        params.first(query, key) for key in ("created_after", "created_before", "id_prefix")
    )
    floors: list[str | None] = [idrange.time_bound(after, "created_after") if after else None]
    ceilings: list[str | None] = [idrange.time_bound(before, "created_before") if before else None]
    if prefix:
        floor, ceiling = idrange.prefix_bounds(prefix)
        floors.append(floor)
        ceilings.append(ceiling)
    return idrange.highest(*floors), idrange.lowest(*ceilings)


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
        gate, read, write = self._gate, Scope.EXECUTIONS_READ, Scope.EXECUTIONS_WRITE
        return [
            route(base, GET=gate.scoped(self.list, read), POST=gate.scoped(self.create, write)),
            route(one, GET=gate.scoped_or_agent(self.get, read)),
            route(one + "/events", GET=gate.scoped(self.events, read)),
            route(one + "/cancel", POST=gate.scoped(self.cancel, write)),
            route(one + "/previous", GET=gate.scoped_or_agent(self.previous, read)),
            route(one + "/suspend", POST=gate.signed(self.suspend)),
            route(one + "/fork", POST=gate.scoped(self.fork, write)),
            route(one + "/fork-points", GET=gate.scoped(self.fork_points, read)),
            route(one + "/heartbeat", POST=gate.signed(self.heartbeat)),
            route(one + "/complete", POST=gate.signed(self.complete)),
            route(one + "/fail", POST=gate.signed(self.fail)),
        ]

    async def create(self, request: Request) -> Response:
        body, principal = await self._gate.principal(request)
        fields = await off_loop(body, _create_fields)
        labels = Labels(
            principal=principal,
            idempotency_key=fields.idempotency_key,
            parent_execution_id=fields.parent_execution_id,
            on_behalf_of=fields.on_behalf_of,
            session=fields.session,
            spawned_by=fields.spawned_by,
        )
        created = await self._kernel.create(
            fields.agent_id, fields.input, fields.agent_version, labels
        )
        response = json_response(render_execution(created.execution), 201)
        if created.repeat:
            response.headers[REPLAY_HEADER] = "true"
        return response

    async def list(self, request: Request) -> Response:
        await self._gate.client(request)
        query = request.query_params
        default, maximum = LIST_LIMIT
        agent = params.first(query, "agent_id")
        floor, ceiling = _id_range(query)
        flt = ExecutionFilter(
            # An id no agent can have (a NUL, which PostgreSQL text cannot hold) is a 400.
            agent_id=params.agent_id(agent) if agent else None,
            status=execution_status(params.first(query, "status")),
            session=params.first(query, "session") or None,
            parent_execution_id=params.optional_uuid(query, "parent_execution_id"),
            spawned_by=params.optional_uuid(query, "spawned_by"),
            forked_from=params.optional_uuid(query, "forked_from"),
            cursor=idrange.lowest(params.optional_uuid(query, "cursor"), ceiling),
            floor=floor,
            limit=params.page_limit(query, default=default, maximum=maximum, strict=True),
        )
        return json_response(render_execution_page(await self._kernel.list_executions(flt)))

    async def get(self, request: Request) -> Response:
        caller = await self._gate.client_or_agent(request)
        execution = await self._kernel.get_execution(
            execution_id(request), caller.agent_id, params.long_poll(request.query_params)
        )
        restoration = await self._kernel.restoration_of(execution)
        return json_response(render_execution(execution, restoration))

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
        """§24.5: what the execution continues from."""
        caller = await self._gate.client_or_agent(request)
        state = await self._kernel.previous_state(execution_id(request), caller.agent_id)
        return json_response({"state": orjson.Fragment(state)})

    async def fork(self, request: Request) -> Response:
        """§26.2: `{"at_seq", "session"?, "policy_bundle"?}` → the fork."""
        body, principal = await self._gate.principal(request)
        target = execution_id(request)
        fields = parse_object(body)
        fork = ForkRequest(
            at_seq=_at_seq(fields),
            session=label_field(fields, "session"),
            policy_bundle=text_field(fields, "policy_bundle") or None,
            principal=principal,
        )
        if fork.policy_bundle:  # §34.2: after parsing, before the source is looked up
            principal.require(Scope.POLICIES_WRITE)
        forked = await self._kernel.fork(target, fork)
        restoration = await self._kernel.restoration_of(forked)
        return json_response(render_execution(forked, restoration), 201)

    async def fork_points(self, request: Request) -> Response:
        """§26.1: every seq up to the latest is a fork point; §33.7: and what covers each."""
        await self._gate.client(request)
        found = await self._kernel.coverage(execution_id(request))
        return json_response(render_coverage(found.latest_seq, found.resources, found.checkpoints))

    async def suspend(self, request: Request) -> Response:
        """§25.3: blocks the execution while a step waits; the body is not read."""
        caller = await self._gate.agent(request)
        target, lease = execution_id(request), params.required_lease(request.headers)
        suspended = await self._kernel.suspend(target, caller.agent_id, lease)
        return json_response({"suspended": suspended})

    async def heartbeat(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target, lease = execution_id(request), params.required_lease(request.headers)
        # `step-records`: a heartbeat may carry completions and asks whether the agent may
        # go on reporting steps after they ran. The standard heartbeat has no body.
        outcomes = step_outcomes(parse_object(caller.body)) if caller.body.strip() else ()
        asked = asks_for(request.headers, STEP_RECORDS)
        granted = await self._kernel.heartbeat(
            target, caller.agent_id, lease, outcomes, policy=asked, seen=caller.seen()
        )
        response = no_content()
        if granted:
            response.headers[EXTENSIONS_HEADER] = STEP_RECORDS
        return response

    async def complete(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        output, outcomes, state = await off_loop(caller.body, _completion_fields)
        await self._kernel.complete_execution(
            target, caller.agent_id, lease, output, outcomes, state
        )
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
