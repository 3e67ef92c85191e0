"""Tracing (`--otel-endpoint`, the `otel` extra): a span per API request and per delivery
attempt, the ids log lines carry, and a clear error when the extra is missing."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness.ports import free_port
from rebuno.kernel.api.app import create_app
from rebuno.kernel.config import Settings
from rebuno.kernel.domain.dispatch import DeliveryOutcome, Webhook
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.kernel.tracing import MISSING_EXTRA, CorrelationFilter, Tracing, current_ids
from rebuno.kernel.webhooks.delivery import HttpDeliverer
from tests.cli.harness import child_env
from tests.support import ManualClock

SETTINGS = Settings(dev=True, db_url="sqlite:///unused", replica_id="replica-t")
MISSING = "00000000-0000-7000-8000-000000000001"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    return Tracing.from_settings(SETTINGS, exporter=exporter)


@pytest.fixture
async def http(
    store: Store, clock: ManualClock, tracing: Tracing
) -> AsyncIterator[httpx.AsyncClient]:
    kernel = Kernel(store, SETTINGS, clock=clock.now, bus=MemoryBus())
    app = tracing.asgi(create_app(kernel, SETTINGS))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://kernel.test") as client:
        yield client


async def test_each_api_request_is_a_server_span_named_by_its_route(
    http: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    response = await http.get(f"/v0/executions/{MISSING}")

    assert response.status_code == 404
    (span,) = exporter.get_finished_spans()
    assert span.name == "GET /v0/executions/{execution_id}"
    assert span.kind is SpanKind.SERVER
    assert span.attributes is not None
    assert span.attributes["http.response.status_code"] == 404
    assert span.attributes["execution_id"] == MISSING
    assert span.resource.attributes["service.name"] == "rebuno-kernel"


async def test_a_request_span_joins_the_callers_trace(
    http: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"

    await http.get("/v0/health", headers={"traceparent": traceparent})

    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id


async def test_a_delivery_attempt_is_a_client_span_failing_when_the_agent_is_unreachable(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    http = HttpDeliverer()
    body = b'{"execution_id":"e-1","dispatch_id":"d-1","dispatch_attempt":2}'
    try:
        url = f"http://127.0.0.1:{free_port()}/webhook"
        outcome = await tracing.deliverer(http).deliver(Webhook(url, "secret", "e-1", body, 2.0))
    finally:
        await http.close()

    assert outcome.ok is False
    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind) == ("webhook delivery", SpanKind.CLIENT)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert (span.attributes["dispatch_id"], span.attributes["dispatch_attempt"]) == ("d-1", "2")


class _Recorder:
    """A deliverer that notes the log ids in effect while it delivers."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome:
        self.seen = dict(current_ids())
        return DeliveryOutcome(True)


async def test_log_records_carry_the_ids_of_the_delivery_in_progress() -> None:
    recorder = _Recorder()
    body = b'{"execution_id":"e-9","dispatch_id":"d-9","dispatch_attempt":1}'
    record = logging.LogRecord(
        "rebuno.kernel", logging.WARNING, "", 0, "delivery failed", None, None
    )

    await (
        Tracing().deliverer(recorder).deliver(Webhook("http://agent.test/", "s", "e-9", body, 1.0))
    )
    CorrelationFilter().filter(record)

    expected = {"execution_id": "e-9", "dispatch_id": "d-9", "dispatch_attempt": "1"}
    assert recorder.seen == expected
    assert {name: getattr(record, name) for name in expected} == expected


def test_tracing_is_on_only_with_an_endpoint() -> None:
    traced = Tracing.from_settings(replace(SETTINGS, otel_endpoint="http://127.0.0.1:4317"))
    try:
        assert traced.enabled
        assert Tracing.from_settings(SETTINGS).enabled is False
    finally:
        traced.shutdown()


def test_otel_endpoint_without_the_extra_is_one_clear_error(tmp_path: Path) -> None:
    # The extra is absent when its top-level package cannot be imported.
    program = (
        "import sys; sys.modules['opentelemetry'] = None; "
        "from rebuno.cli.main import main; main(sys.argv[1:])"
    )
    args = [
        "server",
        "--db-url",
        f"sqlite:///{tmp_path / 'k.db'}",
        "--bearer-token",
        "t",
        "--listen-addr",
        f"127.0.0.1:{free_port()}",
        "--otel-endpoint",
        "http://127.0.0.1:4317",
    ]
    result = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=child_env(),
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr == f"error: {MISSING_EXTRA}\n"
