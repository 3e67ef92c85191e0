"""Fixtures for the SDK against a real kernel: the kernel's own server runs in the test's event
loop on a loopback port, on SQLite and on PostgreSQL; agents are served on loopback with uvicorn
exactly as `Agent.run()` would serve them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.polling import wait_until
from rebuno import Agent, Client
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve
from rebuno.sdk.agent import Durability
from rebuno.types import Execution
from tests.sdk.loopback import free_socket, serving, url_of

SECRET = "agent-secret"
_STOP_TIMEOUT = 5.0
_STOP_ATTEMPTS = 3
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kernel.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def kernel_settings(db_url: str, shortcuts: bool) -> Settings:
    return Settings(
        dev=True,
        shortcuts=shortcuts,
        listen_addr="127.0.0.1:0",
        db_url=db_url,
        dispatch_poll_interval=timedelta(milliseconds=20),
        backoff_base=timedelta(milliseconds=50),
        backoff_max=timedelta(milliseconds=200),
    )


@pytest.fixture
async def kernel_url(kernel_settings: Settings) -> AsyncIterator[str]:
    """The URL of a kernel server running in this event loop until the test ends."""
    urls: list[str] = []
    task = asyncio.create_task(serve(kernel_settings, on_ready=urls.append), name="kernel")
    await wait_until(lambda: bool(urls) or task.done(), timeout=20, message="kernel ready")
    if task.done():
        task.result()
    try:
        yield urls[0]
    finally:
        await _stop(task)


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel the kernel and wait for it, bounded. A background job of the kernel can lose a
    cancellation that lands inside its tick (seen on PostgreSQL), so cancel again while it
    has not stopped rather than hang the suite."""
    for _ in range(_STOP_ATTEMPTS):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT)
        if done:
            return
    raise AssertionError(f"the kernel did not stop after {_STOP_ATTEMPTS} cancellations")


@dataclass
class Harness:
    """Registers agents with the kernel and serves them; a `Client` for the rest."""

    kernel_url: str
    client: Client
    agents: list[Agent] = field(default_factory=list)

    async def register(
        self,
        agent_id: str,
        webhook_url: str,
        *,
        policy: str | None = None,
        lease_timeout_seconds: float | None = None,
    ) -> None:
        body: dict[str, Any] = {"id": agent_id, "webhook_url": webhook_url, "secret": SECRET}
        if policy is not None:
            body["policy_bundle"] = policy
        if lease_timeout_seconds is not None:
            body["lease_timeout_seconds"] = lease_timeout_seconds
        async with httpx.AsyncClient(base_url=self.kernel_url) as http:
            response = await http.post("/v0/agents", json=body)
            response.raise_for_status()

    def agent(self, agent_id: str, durability: Durability = "durable") -> Agent:
        agent = Agent(agent_id, secret=SECRET, base_url=self.kernel_url, durability=durability)
        self.agents.append(agent)
        return agent

    @asynccontextmanager
    async def serve(
        self,
        agent_id: str,
        handler: Callable[..., Any],
        *,
        policy: str | None = None,
        lease_timeout_seconds: float | None = None,
        durability: Durability = "durable",
    ) -> AsyncIterator[Agent]:
        """Register `agent_id` with a loopback webhook and serve `handler` there."""
        sock = free_socket()
        webhook = url_of(sock) + "/webhook"
        await self.register(
            agent_id, webhook, policy=policy, lease_timeout_seconds=lease_timeout_seconds
        )
        agent = self.agent(agent_id, durability)
        agent.bind(handler)
        async with serving(agent.app, sock):
            yield agent

    async def answered(self, method: str, route: str) -> float:
        """How many `method route` requests (`route` is the template, `{execution_id}` and
        all) the kernel has answered so far, as its `/metrics` counts them. The counters are
        the test process's, so a test compares two readings."""
        series = f'rebuno_http_requests_total{{method="{method}",route="{route}",'
        async with httpx.AsyncClient(base_url=self.kernel_url) as http:
            text = (await http.get("/metrics")).text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)
        )

    async def run(self, agent_id: str, input: Any = None, timeout: float = 20) -> Execution:
        """Create an execution and wait for it to end."""
        execution = await self.client.create(agent_id, input=input)
        return await self.client.wait(execution.id, timeout=timeout)


@pytest.fixture
async def harness(kernel_url: str) -> AsyncIterator[Harness]:
    async with Client(base_url=kernel_url) as client:
        harness = Harness(kernel_url, client)
        try:
            yield harness
        finally:
            for agent in harness.agents:
                await agent.close()
