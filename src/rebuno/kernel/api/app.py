"""The route table: `create_app` wires every route group to one `Kernel`.

The app has no lifespan of its own; the server owns start-up and shutdown. Requests reach
their route through `DirectRoutes`, and Starlette answers what it does not find. Routes served
beside the API behind the same authentication (the console's, §40) are handed in by the server
as `Beside`, so this package never imports the console. Must not import a store backend,
`kernel.webhooks` or the console.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from rebuno.kernel.api.auth import Authenticator, Gate
from rebuno.kernel.api.errors import http_exception_handler
from rebuno.kernel.api.routes.activity import ActivityRoutes
from rebuno.kernel.api.routes.agents import AgentRoutes
from rebuno.kernel.api.routes.api_keys import ApiKeyRoutes
from rebuno.kernel.api.routes.approvals import ApprovalRoutes
from rebuno.kernel.api.routes.executions import ExecutionRoutes
from rebuno.kernel.api.routes.operational import OperationalRoutes
from rebuno.kernel.api.routes.policies import PolicyRoutes
from rebuno.kernel.api.routes.resources import ResourceRoutes
from rebuno.kernel.api.routes.steps import StepRoutes
from rebuno.kernel.api.routes.stream import StreamRoutes
from rebuno.kernel.api.routing import DirectRoutes, MethodRoute
from rebuno.kernel.config import Settings
from rebuno.kernel.service.kernel import Kernel


class RouteGroup(Protocol):
    """What hands out routes, as each group under `routes/` does."""

    def routes(self) -> list[BaseRoute]: ...


Beside = Callable[[Authenticator, Gate], RouteGroup]
"""A route group another package serves beside the API's, built on the API's authentication
(its `Authenticator` and `Gate`)."""


def create_app(kernel: Kernel, settings: Settings, beside: Beside | None = None) -> ASGIApp:
    """The API's routes on `kernel`, then the routes of `beside`, if any."""
    authenticator = Authenticator(
        settings, kernel.agent_secret, kernel.clock, kernel.verify_api_key
    )
    gate = Gate(settings, authenticator)
    routes: list[BaseRoute] = [
        *ExecutionRoutes(kernel, gate).routes(),
        *StepRoutes(kernel, gate).routes(),
        *ResourceRoutes(kernel, gate).routes(),
        *StreamRoutes(kernel, gate, settings.sse_keepalive).routes(),
        *AgentRoutes(kernel, gate).routes(),
        *PolicyRoutes(kernel, gate).routes(),
        *ApprovalRoutes(kernel, gate).routes(),
        *ApiKeyRoutes(kernel, gate).routes(),
        *OperationalRoutes(kernel, gate).routes(),
        *ActivityRoutes(kernel, gate, settings.sse_keepalive).routes(),
    ]
    if beside is not None:
        routes += beside(authenticator, gate).routes()
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_exception_handler})
    # A trailing-slash redirect would be a 3xx, which SDK 0.29.2 treats as an error anyway.
    app.router.redirect_slashes = False
    return DirectRoutes(app, [one for one in routes if isinstance(one, MethodRoute)])
