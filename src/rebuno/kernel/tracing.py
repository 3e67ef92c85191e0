"""Log correlation for every request and delivery, and optional OpenTelemetry tracing.

Each HTTP request and each webhook delivery sets the ids it concerns (`execution_id`,
`step_id`, `dispatch_id`) in a context variable; `CorrelationFilter` copies them onto the log
records emitted meanwhile, so JSON lines carry them as fields. With `--otel-endpoint` the same
two places also open a span: one per API request (joining a caller's W3C `traceparent`) and
one per delivery attempt, exported over OTLP gRPC. OpenTelemetry (the `otel` extra) is
imported only then; without it the flag is a clear start-up error.

Must not import the services, the API, `kernel.webhooks` or a store.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import orjson

from rebuno.kernel.config import Settings
from rebuno.kernel.domain.dispatch import Deliverer, DeliveryOutcome, Webhook
from rebuno.kernel.domain.errors import ValidationFailed

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

SERVICE_NAME = "rebuno-kernel"
MISSING_EXTRA = (
    "--otel-endpoint needs OpenTelemetry, which is not installed: "
    "install the otel extra (pip install 'rebuno[otel]') or unset the endpoint"
)
_NO_IDS: Mapping[str, str] = MappingProxyType({})
_IDS: ContextVar[Mapping[str, str]] = ContextVar("rebuno_log_ids", default=_NO_IDS)
_EXECUTION_PATH = re.compile(r"^/v0/executions/([^/]+)(?:/steps/([^/]+))?")
# Only id-shaped values reach a log line: a path segment can decode to a newline.
_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")
_DISPATCH_ID = b"rebuno-dispatch-id"


class CorrelationFilter(logging.Filter):
    """Adds the current request's or delivery's ids to each record that lacks them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _IDS.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def install_log_correlation() -> None:
    """Puts a `CorrelationFilter` on every handler of the root logger (once each)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(existing, CorrelationFilter) for existing in handler.filters):
            handler.addFilter(CorrelationFilter())


def current_ids() -> Mapping[str, str]:
    """The ids log records get right now (empty outside a request or a delivery)."""
    return _IDS.get()


def request_ids(path: str, dispatch_id: str | None) -> dict[str, str]:
    ids: dict[str, str] = {}
    match = _EXECUTION_PATH.match(path)
    if match:
        _keep(ids, "execution_id", match.group(1))
        _keep(ids, "step_id", match.group(2))
    _keep(ids, "dispatch_id", dispatch_id)
    return ids


def _dispatch_id(scope: Scope) -> str | None:
    """The last `Rebuno-Dispatch-Id` header, as a dict of the headers would keep it; read
    without decoding the others, since without tracing nothing else needs them."""
    found: bytes | None = None
    for name, value in scope["headers"]:
        if name == _DISPATCH_ID:
            found = value
    return None if found is None else found.decode("latin-1")


def _keep(ids: dict[str, str], name: str, value: str | None) -> None:
    if value and _ID.match(value):
        ids[name] = value


class Tracing:
    """The replica's tracer, or none; wraps the ASGI app and the webhook deliverer."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer: Tracer | None = provider.get_tracer("rebuno.kernel") if provider else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @classmethod
    def from_settings(cls, settings: Settings, exporter: SpanExporter | None = None) -> Tracing:
        """No tracing without `otel_endpoint`. `exporter` replaces the OTLP one (tests).

        Raises:
            ValidationFailed: an endpoint is set but the `otel` extra is not installed.
        """
        if not settings.otel_endpoint and exporter is None:
            return cls()
        try:
            return cls(_provider(settings, exporter))
        except ImportError:
            raise ValidationFailed(MISSING_EXTRA) from None

    def asgi(self, app: ASGIApp) -> ASGIApp:
        return _RequestObserver(app, self._tracer)

    def deliverer(self, inner: Deliverer) -> Deliverer:
        return _ObservedDeliverer(inner, self._tracer)

    def shutdown(self) -> None:
        """Flushes the spans still queued; blocks up to the exporter's timeout."""
        if self._provider is not None:
            self._provider.shutdown()


class _RequestObserver:
    """ASGI middleware: the request's ids for log lines and, when tracing, a server span."""

    def __init__(self, app: ASGIApp, tracer: Tracer | None) -> None:
        self.app = app
        self._tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _IDS.set(request_ids(scope["path"], _dispatch_id(scope)))
        try:
            if self._tracer is None:
                await self.app(scope, receive, send)
            else:
                await self._traced(self._tracer, scope, receive, send, _headers(scope))
        finally:
            _IDS.reset(token)

    async def _traced(
        self, tracer: Tracer, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> None:
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        method = scope["method"]
        attributes = {"http.request.method": method, "url.path": scope["path"], **_IDS.get()}
        with tracer.start_as_current_span(
            method, context=extract(headers), kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            status = 500

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                _finish_request_span(span, method, _route(scope), status)


class _ObservedDeliverer:
    """A deliverer whose attempts carry their ids in log lines and, when tracing, a span."""

    def __init__(self, inner: Deliverer, tracer: Tracer | None) -> None:
        self._inner = inner
        self._tracer = tracer

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome:
        ids = {"execution_id": webhook.execution_id, **_dispatch_ids(webhook.body)}
        # Not reset afterwards: the dispatch loop runs each delivery in a task of its own, so
        # the ids also label what the service logs about the outcome ("delivery failed").
        _IDS.set(ids)
        delivery = self._inner.deliver(webhook)
        if self._tracer is None:
            return await delivery
        from opentelemetry.trace import SpanKind

        attributes = {"url.full": webhook.url, **ids}
        with self._tracer.start_as_current_span(
            "webhook delivery", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            outcome = await delivery
            _finish_delivery_span(span, outcome)
            return outcome


def _dispatch_ids(body: bytes) -> dict[str, str]:
    try:
        payload: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(payload, dict):
        return {}
    ids: dict[str, str] = {}
    _keep(ids, "dispatch_id", str(payload.get("dispatch_id", "")))
    _keep(ids, "dispatch_attempt", str(payload.get("dispatch_attempt", "")))
    return ids


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _route(scope: Scope) -> str:
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else ""


# -- OpenTelemetry: only reached when tracing is on, so only then imported --------------------


def _provider(settings: Settings, exporter: SpanExporter | None) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create(
        {"service.name": SERVICE_NAME, "service.instance.id": settings.replica_id}
    )
    sampler = ParentBased(TraceIdRatioBased(settings.otel_sample_rate))
    provider = TracerProvider(resource=resource, sampler=sampler)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(settings)))
    return provider


def _otlp_exporter(settings: Settings) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.otel_endpoint, insecure=settings.otel_insecure)


def _finish_request_span(span: Span, method: str, route: str, status: int) -> None:
    from opentelemetry.trace import Status, StatusCode

    if route:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def _finish_delivery_span(span: Span, outcome: DeliveryOutcome) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rebuno.delivery.ok", outcome.ok)
    if not outcome.ok:
        span.set_status(Status(StatusCode.ERROR, outcome.detail))
