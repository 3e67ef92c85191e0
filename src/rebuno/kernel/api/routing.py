"""One `Route` per path, dispatching on the method, so a 405 names every allowed method; and
`DirectRoutes`, which calls a route's handler without walking Starlette's route list.

Must not import a store backend or the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rebuno.kernel.api.errors import Endpoint, guarded


class MethodRoute(Route):
    """A `Route` that keeps its guarded handler per method, for `DirectRoutes` to call."""

    def __init__(self, path: str, handlers: dict[str, Endpoint]) -> None:
        self.handlers = handlers

        async def dispatch(request: Request) -> Response:
            # Starlette answers 405 itself before this runs for a method not listed here.
            return await handlers[request.method](request)

        super().__init__(path, dispatch, methods=list(handlers))


def route(path: str, **handlers: Endpoint) -> MethodRoute:
    """`route("/v0/agents", GET=list_agents, POST=register)`; every handler is guarded."""
    by_method = {method.upper(): guarded(handler) for method, handler in handlers.items()}
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])
    return MethodRoute(path, by_method)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A route's path cut at its slashes: fixed segments by position, then parameters."""

    route: MethodRoute
    handler: Endpoint
    literals: tuple[tuple[int, str], ...]
    params: tuple[tuple[int, str], ...]

    def match(self, segments: list[str]) -> dict[str, str] | None:
        for index, text in self.literals:
            if segments[index] != text:
                return None
        found: dict[str, str] = {}
        for index, name in self.params:
            value = segments[index]
            if not value:  # Starlette's `{name}` matches one or more characters
                return None
            found[name] = value
        return found


def _shape(route: MethodRoute, handler: Endpoint) -> _Shape:
    literals: list[tuple[int, str]] = []
    params: list[tuple[int, str]] = []
    for index, segment in enumerate(route.path.split("/")):
        if segment.startswith("{") and segment.endswith("}"):
            name = segment[1:-1]
            if ":" in name or "{" in name:
                raise ValueError(f"{route.path}: only whole-segment text parameters are direct")
            params.append((index, name))
        elif "{" in segment:
            raise ValueError(f"{route.path}: only whole-segment text parameters are direct")
        else:
            literals.append((index, segment))
    return _Shape(route, handler, tuple(literals), tuple(params))


class DirectRoutes:
    """ASGI: finds a request's route by method and path shape in a dict and calls its handler.

    It picks exactly the route Starlette's router would: candidates keep the route list's
    order, and a parameter takes one non-empty segment. What it does not find (404, 405, a
    mounted `root_path`) and every non-HTTP scope goes to the Starlette app, whose answer is
    then the same as without this layer. Starlette's error middlewares are skipped on the way
    in, which changes nothing: every handler is `guarded`, so no exception leaves one.
    """

    def __init__(self, app: Starlette, routes: Sequence[MethodRoute]) -> None:
        self._app = app
        self._table: dict[tuple[str, int], list[_Shape]] = {}
        for one in routes:
            width = one.path.count("/") + 1
            for method, handler in one.handlers.items():
                self._table.setdefault((method, width), []).append(_shape(one, handler))

    @property
    def fallback(self) -> Starlette:
        """The Starlette app that answers what this layer does not find."""
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.find(scope) if scope["type"] == "http" else None
        if found is None:
            await self._app(scope, receive, send)
            return
        shape, path_params = found
        # What Starlette's application, router and route put in the scope on the same match.
        scope["app"] = self._app
        scope["router"] = self._app.router
        scope["route"] = shape.route
        scope["endpoint"] = shape.route.endpoint
        scope["path_params"] = path_params
        response = await shape.handler(Request(scope, receive, send))
        await response(scope, receive, send)

    def find(self, scope: Scope) -> tuple[_Shape, dict[str, str]] | None:
        """The route and path parameters of an HTTP request, or None to leave it to Starlette."""
        if scope.get("root_path"):
            return None
        path: str = scope["path"]
        segments = path.split("/")
        for shape in self._table.get((scope["method"], len(segments)), ()):
            params = shape.match(segments)
            if params is not None:
                return shape, params
        return None
