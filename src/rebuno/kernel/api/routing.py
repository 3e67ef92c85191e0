"""One `Route` per path, dispatching on the method, so a 405 names every allowed method.

Must not import a store backend or the dispatcher.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rebuno.kernel.api.errors import Endpoint, guarded


def route(path: str, **handlers: Endpoint) -> Route:
    """`route("/v0/agents", GET=list_agents, POST=register)`; every handler is guarded."""
    by_method = {method.upper(): guarded(handler) for method, handler in handlers.items()}
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])

    async def dispatch(request: Request) -> Response:
        # Starlette answers 405 itself before this runs for a method not listed here.
        return await by_method[request.method](request)

    return Route(path, dispatch, methods=list(by_method))
