"""Unauthenticated operational routes (§5.4): liveness, readiness, metrics, and the API's
OpenAPI document.

Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from rebuno.kernel import metrics
from rebuno.kernel.api import openapi
from rebuno.kernel.api.auth import Gate
from rebuno.kernel.api.routing import route
from rebuno.kernel.api.schemas import JSON_MEDIA_TYPE, json_response
from rebuno.kernel.service.kernel import Kernel

PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class OperationalRoutes:
    def __init__(self, kernel: Kernel, gate: Gate) -> None:
        self._kernel = kernel
        self._gate = gate

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v0/health", GET=self._gate.open(self.health)),
            route("/v0/ready", GET=self._gate.open(self.ready)),
            route(openapi.PATH, GET=self._gate.open(self.document)),
            route("/metrics", GET=self._gate.open(self.metrics)),
        ]

    async def health(self, request: Request) -> Response:
        await self._gate.anyone(request)
        return json_response({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        await self._gate.anyone(request)
        if await self._kernel.ready():
            return json_response({"status": "ready"})
        return json_response({"status": "unavailable"}, 503)

    async def metrics(self, request: Request) -> Response:
        """The Prometheus text; the queue's depth and lag are read from the store at scrape
        time."""
        await self._gate.anyone(request)
        await metrics.refresh_queue(self._kernel.store.dispatch_queue, self._kernel.clock())
        return Response(metrics.render(), media_type=PROMETHEUS_MEDIA_TYPE)

    async def document(self, request: Request) -> Response:
        """The OpenAPI 3.1 document of every route; it holds no secret, so anyone may read it."""
        await self._gate.anyone(request)
        return Response(openapi.document_json(), media_type=JSON_MEDIA_TYPE)
