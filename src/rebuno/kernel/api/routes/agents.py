"""Agent administration (§5.3, bearer), and the agent's own routes (HMAC): its metadata
(§36) and the announcement of a restarted instance (`agent-instances`).

The secret goes in with a registration and never comes back out. Must not import a store
backend or `kernel.webhooks`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    JsonObject,
    is_text,
    number_field,
    off_loop,
    parse_object,
    text_field,
)
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, no_content, render_agent
from rebuno.kernel.domain.errors import Forbidden, ValidationFailed
from rebuno.kernel.domain.records import AgentMetadata, RawJson
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.canonical import dumps
from rebuno.protocol.enums import Scope
from rebuno.protocol.extensions import AgentInstance, is_incarnation, is_instance_name


class AgentRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        one = "/v0/agents/{agent_id}"
        return [
            route(
                "/v0/agents",
                GET=self._gate.scoped(self.list, Scope.AGENTS_READ),
                POST=self._gate.scoped(self.register, Scope.AGENTS_WRITE),
            ),
            route(
                one,
                GET=self._gate.scoped(self.get, Scope.AGENTS_READ),
                DELETE=self._gate.scoped(self.delete, Scope.AGENTS_WRITE),
            ),
            route(one + "/metadata", PUT=self._gate.signed(self.metadata)),
            route(one + "/instances", POST=self._gate.signed(self.announce)),
        ]

    async def register(self, request: Request) -> Response:
        raw, principal = await self._gate.principal(request)
        body = parse_object(raw)
        bundle = body.get("policy_bundle")
        if bundle is not None and not is_text(bundle):
            raise ValidationFailed("validation error: policy_bundle must be a string")
        agent_id = params.agent_id(text_field(body, "id", required=True))
        webhook_url = text_field(body, "webhook_url", required=True)
        secret = text_field(body, "secret", required=True)
        lease_timeout = number_field(body, "lease_timeout_seconds")
        if bundle:  # §34.2: a bundle also needs policies:write, checked before it compiles
            principal.require(Scope.POLICIES_WRITE)
        agent = await self._kernel.register_agent(
            agent_id,
            webhook_url,
            secret,
            lease_timeout,
            str(bundle) if bundle else None,
            # An absent bundle keeps the stored one; an explicit "" removes it (§5.3).
            keep_bundle=bundle is None,
        )
        return json_response(render_agent(agent), 201)

    async def list(self, request: Request) -> Response:
        await self._gate.client(request)
        agents = await self._kernel.list_agents()
        return json_response([render_agent(agent) for agent in agents])

    async def get(self, request: Request) -> Response:
        await self._gate.client(request)
        agent = await self._kernel.get_agent(params.agent_id(request.path_params["agent_id"]))
        return json_response(render_agent(agent))

    async def delete(self, request: Request) -> Response:
        await self._gate.client(request)
        await self._kernel.delete_agent(params.agent_id(request.path_params["agent_id"]))
        return no_content()

    async def metadata(self, request: Request) -> Response:
        """§36.1: the agent's description and schemas, replaced whole (an absent member is
        null)."""
        caller = await self._gate.agent(request)
        if caller.agent_id != request.path_params["agent_id"]:
            raise Forbidden("forbidden: an agent may only describe itself")
        # Schemas may be large: parsed and made canonical off the loop, as step arguments are.
        metadata = await off_loop(caller.body, lambda body: _metadata(parse_object(body)))
        await self._kernel.publish_metadata(caller.agent_id, metadata)
        return no_content()

    async def announce(self, request: Request) -> Response:
        """An incarnation of an agent instance started: what earlier ones held is reclaimed."""
        caller = await self._gate.agent(request)
        if caller.agent_id != request.path_params["agent_id"]:
            raise Forbidden("forbidden: an agent may only announce itself")
        body = parse_object(caller.body)
        name = text_field(body, "instance", required=True)
        incarnation = text_field(body, "incarnation", required=True)
        if not is_instance_name(name):
            raise ValidationFailed(
                "validation error: instance must be 1 to 200 visible ASCII characters, with"
                " no double quote, comma, semicolon or backslash"
            )
        if not is_incarnation(incarnation):
            raise ValidationFailed(
                "validation error: incarnation must be a lower-case hyphenated UUID"
            )
        instance = AgentInstance(name, incarnation)
        reclaimed = await self._kernel.announce_instance(caller.agent_id, instance, caller.seen())
        return json_response({"reclaimed": reclaimed})


def _metadata(body: JsonObject) -> AgentMetadata:
    description = body.get("description")
    if description is not None and not is_text(description):
        raise ValidationFailed("validation error: description must be a string or null")
    if description is not None and "\x00" in description:
        raise ValidationFailed("validation error: description must not contain a NUL character")
    return AgentMetadata(
        description=str(description) if description else None,
        input_schema=_schema(body, "input_schema"),
        output_schema=_schema(body, "output_schema"),
    )


def _schema(body: JsonObject, key: str) -> RawJson | None:
    """A JSON Schema member: an object, as canonical text, or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationFailed(f"validation error: {key} must be a JSON object or null")
    return dumps(value)
