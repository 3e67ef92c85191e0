"""Resource routes (§33): register, bind and publish checkpoints (HMAC with a lease). The
coverage read is `GET …/fork-points`, an execution route.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import (
    JsonObject,
    captures_field,
    integer_field,
    off_loop,
    parse_object,
    raw_field,
    text_field,
)
from rebuno.kernel.api.routes.executions import execution_id
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, no_content, render_resource
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.records import RawJson
from rebuno.kernel.domain.resource import Registration, check_key
from rebuno.kernel.service.kernel import Kernel

MAX_DRIVER_ID_BYTES = 256
MAX_JSON_BYTES = 64 * 1024


def registration(raw: bytes) -> Registration:
    """§33.2's request, with its size limits."""
    body = parse_object(raw)
    key = text_field(body, "key", required=True)
    check_key(key)
    driver_id = text_field(body, "driver_id", required=True)
    if len(driver_id.encode()) > MAX_DRIVER_ID_BYTES:
        raise ValidationFailed(
            f"validation error: driver_id is longer than {MAX_DRIVER_ID_BYTES} bytes"
        )
    configuration = _json(body, "configuration")
    every_steps = 0 if body.get("every_steps") is None else integer_field(body, "every_steps")
    if every_steps < 0 or every_steps > 2**31 - 1:
        raise ValidationFailed("validation error: every_steps must be 0 or more")
    return Registration(
        key=key,
        driver_id=driver_id,
        configuration=None if configuration == "null" else configuration,
        coverage_reuse=_flag(body, "coverage_reuse") or False,
        every_steps=every_steps,
        on_completion=_flag(body, "on_completion"),
    )


def binding(raw: bytes) -> RawJson:
    """§33.3: any JSON value but null."""
    found = _json(parse_object(raw), "binding")
    if found is None or found == "null":
        raise ValidationFailed("validation error: binding is required and must not be null")
    return found


def _json(body: JsonObject, key: str) -> RawJson | None:
    found = raw_field(body, key)
    if found is not None and len(found.encode()) > MAX_JSON_BYTES:
        raise ValidationFailed(f"validation error: {key} is larger than {MAX_JSON_BYTES} bytes")
    return found


def _flag(body: JsonObject, key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValidationFailed(f"validation error: {key} must be a boolean")
    return value


class ResourceRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        resources = "/v0/executions/{execution_id}/resources"
        return [
            route(resources, POST=self._gate.signed(self.register)),
            route(resources + "/checkpoints", POST=self._gate.signed(self.publish)),
            route(resources + "/{key}/binding", POST=self._gate.signed(self.bind)),
        ]

    async def register(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        wanted = await off_loop(caller.body, registration)
        view = await self._kernel.register_resource(target, caller.agent_id, lease, wanted)
        return json_response(render_resource(view.resource, view.covered))

    async def bind(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        value = await off_loop(caller.body, binding)
        key = request.path_params["key"]
        await self._kernel.bind_resource(target, caller.agent_id, lease, key, value)
        return no_content()

    async def publish(self, request: Request) -> Response:
        caller = await self._gate.agent(request)
        target = execution_id(request)
        lease = params.required_lease(request.headers)
        captures = await off_loop(caller.body, lambda raw: captures_field(parse_object(raw)))
        await self._kernel.publish_checkpoints(target, caller.agent_id, lease, captures)
        return no_content()
