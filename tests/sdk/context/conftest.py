"""Fixtures for the execution context's parts, each driven on its own against a real kernel: a
webhook that acknowledges deliveries and runs nothing, and the `Dispatch` of the delivery it got
for a new execution, so a test acts under a real lease with nothing else writing to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.asgi import asgi_body, asgi_lifespan
from harness.polling import wait_until
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import KernelClient, Lease, encode_json
from rebuno.sdk._webhook import Delivery, parse_delivery
from tests.sdk.conftest import SECRET, Harness
from tests.sdk.loopback import serving

AGENT = "parts"


@pytest.fixture
def shortcuts() -> bool:
    """The kernel runs as configured by default: what it may skip is the subject of the
    behavioural suites beside these, not of the SDK's parts."""
    return True


@dataclass
class Webhook:
    """Where the kernel delivers: every delivery is acknowledged, noted, and not run."""

    url: str
    deliveries: list[Delivery] = field(default_factory=list)

    async def delivery_of(self, execution_id: str) -> Delivery:
        def delivered() -> bool:
            return any(each.execution_id == execution_id for each in self.deliveries)

        await wait_until(delivered, timeout=10, message=f"a delivery of {execution_id}")
        return next(each for each in self.deliveries if each.execution_id == execution_id)


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    noted: list[Delivery] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        delivery = parse_delivery(await asgi_body(receive))
        if delivery is not None:
            noted.append(delivery)
        body = json.dumps({"accepted": delivery is not None}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async with serving(app) as url:
        yield Webhook(url + "/webhook", noted)


async def delivered(harness: Harness, webhook: Webhook, agent_id: str = AGENT) -> Dispatch:
    """The dispatch of a new execution of `agent_id`, as its agent would hold it while the
    handler runs (on this loop, as `ExecutionContext.activate` sets it)."""
    created = await harness.client.create(agent_id)
    delivery = await webhook.delivery_of(created.id)
    kernel = KernelClient(agent_id=agent_id, secret=SECRET, base_url=harness.kernel_url, timeout=5)
    dispatch = Dispatch(kernel, created.id, delivery.lease)
    dispatch.loop = asyncio.get_running_loop()
    return dispatch


@pytest.fixture
async def dispatch(harness: Harness, webhook: Webhook) -> AsyncIterator[Dispatch]:
    await harness.register(AGENT, webhook.url)
    dispatch = await delivered(harness, webhook)
    try:
        yield dispatch
    finally:
        await dispatch.kernel.aclose()


def idle() -> Dispatch:
    """A dispatch that never calls its kernel, for what a part decides without one."""
    kernel = KernelClient(agent_id=AGENT, secret=SECRET, base_url="http://127.0.0.1:9", timeout=1)
    return Dispatch(kernel, "00000000-0000-7000-8000-000000000000", Lease("d", 1, 60.0))


async def proceeding(dispatch: Dispatch, count: int, target: str = "work") -> list[str]:
    """The ids of `count` new steps the kernel let proceed: executing, their outcomes open."""
    step_ids = []
    for index in range(count):
        decision, _ = await dispatch.kernel.submit_step(
            dispatch.execution_id,
            dispatch.lease,
            kind="local",
            target=target,
            args=encode_json({"index": index}),
            idempotency="safe_to_retry",
        )
        assert decision.decision == "proceed", decision
        step_ids.append(decision.step_id)
    return step_ids


async def statuses(harness: Harness, execution_id: str) -> dict[str, str]:
    """Each recorded step's status, by step id."""
    return {s.step_id: s.status for s in await harness.client.list_steps(execution_id)}
