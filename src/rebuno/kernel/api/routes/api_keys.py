"""Scoped API key routes (§34.3, bearer `api_keys:manage`): create, list, rotate, revoke.

A token leaves the kernel only in the answer to its creation or rotation, with
`Cache-Control: no-store`; lists never carry a token or a hash. Must not import a store
backend or `kernel.webhooks`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import parse_object, text_field
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import json_response, no_content, render_api_key
from rebuno.kernel.domain.api_key import key_scopes
from rebuno.kernel.domain.errors import KernelError, NotFound
from rebuno.kernel.service.api_keys import IssuedKey
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Scope

NO_STORE = {"Cache-Control": "no-store"}


def key_id(request: Request) -> str:
    """A key id is a UUID; any other text names no key (404, §34.3)."""
    text = request.path_params["key_id"]
    try:
        return params.parse_uuid(text, "api key id")
    except KernelError:
        raise NotFound("api key not found") from None


def _issued(issued: IssuedKey, status: int) -> Response:
    body = {**render_api_key(issued.key), "token": issued.token}
    response = json_response(body, status)
    response.headers.update(NO_STORE)
    return response


class ApiKeyRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        manage, base = Scope.API_KEYS_MANAGE, "/v0/api-keys"
        gate = self._gate
        return [
            route(base, GET=gate.scoped(self.list, manage), POST=gate.scoped(self.create, manage)),
            route(base + "/{key_id}", DELETE=gate.scoped(self.revoke, manage)),
            route(base + "/{key_id}/rotate", POST=gate.scoped(self.rotate, manage)),
        ]

    async def create(self, request: Request) -> Response:
        raw, principal = await self._gate.principal(request)
        body = parse_object(raw)
        name = text_field(body, "name", required=True)
        issued = await self._kernel.create_api_key(name, key_scopes(body.get("scopes")), principal)
        return _issued(issued, 201)

    async def list(self, request: Request) -> Response:
        await self._gate.client(request)
        keys = await self._kernel.list_api_keys()
        return json_response([render_api_key(key) for key in keys])

    async def rotate(self, request: Request) -> Response:
        """The body is not read (§34.3)."""
        target = key_id(request)
        return _issued(await self._kernel.rotate_api_key(target), 200)

    async def revoke(self, request: Request) -> Response:
        target = key_id(request)
        await self._kernel.revoke_api_key(target)
        return no_content()
