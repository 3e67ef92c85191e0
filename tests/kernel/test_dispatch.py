"""Signed delivery, acknowledgement, retries with backoff, exhaustion and lease reclaim (§12),
with a real ASGI agent app behind the webhook URL."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from harness.asgi import asgi_body, asgi_lifespan
from harness.polling import wait_until
from harness.ports import free_port
from rebuno.kernel.background import DispatchLoop
from rebuno.kernel.domain.dispatch import Webhook
from rebuno.kernel.domain.webhook import Targets
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.kernel.webhooks.delivery import HttpDeliverer
from rebuno.protocol.enums import ExecutionStatus
from rebuno.protocol.signing import verify_body
from tests.kernel.conftest import AGENT, settings
from tests.sdk.loopback import serving

SECRET = "s3cret"


@dataclass
class WebhookAgent:
    """A minimal agent: records each signed webhook and answers with `status`."""

    status: int = 200
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    signatures_ok: list[bool] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    hold: asyncio.Event | None = None

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        body = await asgi_body(receive)
        headers = dict(scope["headers"])
        self.signatures_ok.append(verify_body(SECRET, body, headers[b"rebuno-signature"].decode()))
        self.deliveries.append(json.loads(body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.hold is not None:
            await self.hold.wait()
        self.in_flight -= 1
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def agent() -> WebhookAgent:
    return WebhookAgent()


@pytest.fixture
async def live_kernel(store: Store, agent: WebhookAgent) -> AsyncIterator[Kernel]:
    """A kernel on the real clock whose dispatch loop delivers to `agent`."""
    kernel = Kernel(
        store,
        settings(dispatch_lease_timeout=timedelta(milliseconds=300), dispatch_concurrency=2),
        bus=MemoryBus(),
    )
    async with serving(agent) as url:
        await kernel.register_agent(AGENT, f"{url}/webhook", SECRET, None, None)
        deliverer = HttpDeliverer(timeout_seconds=5)
        loop = DispatchLoop(kernel, deliverer)
        kernel.wake = loop.wake
        task = asyncio.create_task(loop.run())
        yield kernel
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await deliverer.close()


async def event_types(kernel: Kernel, execution_id: str) -> list[str]:
    return [e.type for e in await kernel.list_events(execution_id, 0, 1000)]


async def test_webhook_is_signed_and_ack_starts_the_execution(
    live_kernel: Kernel, agent: WebhookAgent
) -> None:
    execution = await live_kernel.create_execution(AGENT, "null", None)

    await wait_until(lambda: len(agent.deliveries) == 1)
    await wait_until(
        lambda: _status(live_kernel, execution.id, ExecutionStatus.RUNNING), message="started"
    )

    delivery = agent.deliveries[0]
    assert list(delivery) == [
        "execution_id",
        "dispatch_id",
        "dispatch_attempt",
        "lease_timeout_seconds",
    ]
    assert delivery["execution_id"] == execution.id
    assert delivery["dispatch_attempt"] == 1
    assert agent.signatures_ok == [True]
    types = await event_types(live_kernel, execution.id)
    assert types[2:4] == ["dispatch.acked", "execution.started"]


async def test_failed_deliveries_retry_then_exhaust(
    live_kernel: Kernel, agent: WebhookAgent
) -> None:
    agent.status = 503
    execution = await live_kernel.create_execution(AGENT, "null", None)

    await wait_until(
        lambda: _status(live_kernel, execution.id, ExecutionStatus.FAILED), message="exhausted"
    )

    failed = await live_kernel.get_execution(execution.id)
    assert failed.failure_reason == "dispatch_exhausted"
    assert [d["dispatch_attempt"] for d in agent.deliveries] == [1, 2, 3]
    failures = [
        json.loads(e.payload)
        for e in await live_kernel.list_events(execution.id, 0, 1000)
        if e.type == "dispatch.failed"
    ]
    assert [f["reason"] for f in failures] == ["agent answered 503"] * 3  # the log says why
    types = await event_types(live_kernel, execution.id)
    # The agent was never reached: pending -> failed, without `execution.started` (§10.1).
    assert types == [
        "execution.created",
        "dispatch.queued",
        *["dispatch.failed"] * 3,
        "execution.failed",
    ]


async def test_expired_lease_is_redelivered_with_the_next_attempt(
    live_kernel: Kernel, agent: WebhookAgent
) -> None:
    execution = await live_kernel.create_execution(AGENT, "null", None)
    await wait_until(lambda: len(agent.deliveries) == 1)

    async def reclaimed() -> bool:
        await live_kernel.reclaim_expired_leases()
        return len(agent.deliveries) >= 2

    await wait_until(reclaimed, message="redelivery after the lease expired")

    assert agent.deliveries[1]["dispatch_id"] == agent.deliveries[0]["dispatch_id"]
    assert agent.deliveries[1]["dispatch_attempt"] == 2
    assert agent.deliveries[0]["execution_id"] == execution.id


async def _dispatch_events(kernel: Kernel, execution_id: str) -> list[dict[str, Any]]:
    return [
        {"type": e.type, **json.loads(e.payload)}
        for e in await kernel.list_events(execution_id, 0, 1000)
        if e.type.startswith("dispatch.")
    ]


async def _expire_until_delivered(kernel: Kernel, agent: WebhookAgent, count: int) -> None:
    async def reclaimed() -> bool:
        await kernel.reclaim_expired_leases()
        return len(agent.deliveries) >= count

    await wait_until(reclaimed, message="redelivery after the lease expired")


async def test_a_redelivery_after_an_expired_lease_says_so_in_its_event(
    live_kernel: Kernel, agent: WebhookAgent
) -> None:
    execution = await live_kernel.create_execution(AGENT, "null", None)
    await wait_until(lambda: len(agent.deliveries) == 1)
    await _expire_until_delivered(live_kernel, agent, 2)

    async def acked_twice() -> bool:
        events = await _dispatch_events(live_kernel, execution.id)
        return [e["type"] for e in events].count("dispatch.acked") == 2

    await wait_until(acked_twice, message="the redelivery acknowledged")
    first, second = [
        e
        for e in await _dispatch_events(live_kernel, execution.id)
        if e["type"] == "dispatch.acked"
    ]
    assert "redelivery" not in first  # the first delivery is no redelivery
    assert (second["attempt"], second["redelivery"]) == (2, "lease_expired")


async def test_a_failed_redelivery_names_both_the_expired_lease_and_the_failure(
    live_kernel: Kernel, agent: WebhookAgent
) -> None:
    execution = await live_kernel.create_execution(AGENT, "null", None)
    await wait_until(lambda: len(agent.deliveries) == 1)
    agent.status = 401
    await _expire_until_delivered(live_kernel, agent, 3)  # a reclaim, then a plain retry

    async def failed_twice() -> bool:
        events = await _dispatch_events(live_kernel, execution.id)
        return [e["type"] for e in events].count("dispatch.failed") >= 2

    await wait_until(failed_twice, message="two failed deliveries")
    failures = [
        e
        for e in await _dispatch_events(live_kernel, execution.id)
        if e["type"] == "dispatch.failed"
    ]
    assert failures[0]["reason"] == "agent answered 401"
    assert failures[0]["redelivery"] == "lease_expired"
    assert "redelivery" not in failures[1]  # a retry after a failure is not a lease expiry


async def test_claims_never_exceed_idle_workers(live_kernel: Kernel, agent: WebhookAgent) -> None:
    agent.hold = asyncio.Event()
    for _ in range(5):
        await live_kernel.create_execution(AGENT, "null", None)

    await wait_until(lambda: agent.in_flight == 2)
    claimed_while_busy = await live_kernel.store.claim_dispatches(
        "replica-b", 10, live_kernel.clock()
    )
    agent.hold.set()
    await wait_until(lambda: len(agent.deliveries) == 5 - len(claimed_while_busy))

    assert agent.max_in_flight == 2
    assert len(claimed_while_busy) == 3


async def _status(kernel: Kernel, execution_id: str, status: ExecutionStatus) -> bool:
    return (await kernel.get_execution(execution_id)).status is status


async def test_a_refused_connection_is_named_in_the_failed_delivery(store: Store) -> None:
    kernel = Kernel(store, settings(dispatch_max_attempts=1), bus=MemoryBus())
    port = free_port()  # nobody listens there
    await kernel.register_agent(AGENT, f"http://127.0.0.1:{port}/webhook", SECRET, None, None)
    execution = await kernel.create_execution(AGENT, "null", None)
    deliverer = HttpDeliverer(timeout_seconds=5)
    try:
        [claimed] = await kernel.claim(10)
        await kernel.deliver(claimed, deliverer)
    finally:
        await deliverer.close()

    [failed] = [
        json.loads(e.payload)
        for e in await kernel.list_events(execution.id, 0, 100)
        if e.type == "dispatch.failed"
    ]
    assert f"cannot connect to 127.0.0.1:{port}" in failed["reason"]


async def test_a_name_that_resolves_to_a_refused_address_is_never_connected_to(
    agent: WebhookAgent,
) -> None:
    async with serving(agent) as url:
        port = url.rsplit(":", 1)[1]
        named = f"http://localhost:{port}/webhook"  # a name, checked once resolved
        refusing = HttpDeliverer(timeout_seconds=5, targets=Targets())
        allowing = HttpDeliverer(timeout_seconds=5, targets=Targets(loopback=True))
        try:
            refused = await refusing.deliver(Webhook(named, SECRET, "e", b"{}", 5.0))
            delivered = await allowing.deliver(Webhook(named, SECRET, "e", b"{}", 5.0))
        finally:
            await refusing.close()
            await allowing.close()

    assert not refused.ok
    assert "REBUNO_WEBHOOK_ALLOW" in refused.detail
    assert delivered.ok
    assert len(agent.deliveries) == 1  # the refused one never reached the agent
