"""`POST /v0/policies/{agent_id}` (§5.3, bearer): replace or remove an agent's bundle.

Must not import a store backend or the dispatcher.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel.api import params
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.body import is_text, parse_object
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import no_content
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.service.kernel import Kernel


class PolicyRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        return [route("/v0/policies/{agent_id}", POST=self.set)]

    async def set(self, request: Request) -> Response:
        body = parse_object(await self._gate.client(request))
        bundle = body.get("bundle")
        if not is_text(bundle):
            raise ValidationFailed('validation error: bundle must be a string ("" removes it)')
        await self._kernel.set_policy(params.agent_id(request.path_params["agent_id"]), str(bundle))
        return no_content()
