"""One `Route` per path, dispatching on the method, so a 405 names every allowed method; and
`DirectRoutes`, which calls a route's handler without walking Starlette's route list.

Every handler declares who may call it (§34.2): `route` takes only `Handler`s, which carry
their `Access` beside the endpoint, and the route keeps each method's access for the tests
and the documents to read. `Gate` (in `auth.py`) makes the handlers.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from rebuno.kernel.api.errors import Endpoint, guarded
from rebuno.protocol.enums import Scope


class Credential(StrEnum):
    """What a route accepts: no credential, a bearer token holding scopes, an agent's
    signature, or either of the last two."""

    NONE = "none"
    BEARER = "bearer"
    AGENT = "agent"
    BEARER_OR_AGENT = "bearer_or_agent"


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call one method of a route: a bearer caller needs every scope in `scopes`."""

    credential: Credential
    scopes: tuple[Scope, ...] = ()

    def __post_init__(self) -> None:
        bearer = self.credential in (Credential.BEARER, Credential.BEARER_OR_AGENT)
        if bearer != bool(self.scopes):
            raise ValueError(f"a {self.credential} route needs scopes exactly when it is bearer")


@dataclass(frozen=True, slots=True)
class Handler:
    """An endpoint, already wrapped so that it admits only what `access` says."""

    access: Access
    endpoint: Endpoint


class MethodRoute(Route):
    """A `Route` that keeps its guarded handler per method, for `DirectRoutes` to call, and
    the access each method declared."""

    def __init__(self, path: str, handlers: dict[str, Endpoint], access: dict[str, Access]) -> None:
        self.handlers = handlers
        self.access = access

        async def dispatch(request: Request) -> Response:
            # Starlette answers 405 itself before this runs for a method not listed here.
            return await handlers[request.method](request)

        super().__init__(path, dispatch, methods=list(handlers))


def route(path: str, **handlers: Handler) -> MethodRoute:
    """`route("/v0/agents", GET=gate.scoped(list_agents, Scope.AGENTS_READ), ...)`: every
    handler declares its access (a bare endpoint is refused) and is guarded."""
    for method, handler in handlers.items():
        if not isinstance(handler, Handler):
            raise TypeError(
                f"{method} {path}: declare who may call it with gate.scoped, "
                "gate.scoped_or_agent, gate.signed or gate.open"
            )
    by_method = {method.upper(): guarded(one.endpoint) for method, one in handlers.items()}
    access = {method.upper(): one.access for method, one in handlers.items()}
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])
        access.setdefault("HEAD", access["GET"])
    return MethodRoute(path, by_method, access)


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

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
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

    def find(self, scope: AsgiScope) -> tuple[_Shape, dict[str, str]] | None:
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
