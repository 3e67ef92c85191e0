"""Fixtures for the HTTP contract: the ASGI app over a real `Kernel` on the `store` fixture
(both backends), a bearer client, an unauthenticated client and signing agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from starlette.types import ASGIApp

from rebuno.kernel.config import Settings
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.server import application
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from tests.api.harness import AGENT, BASE_URL, SECRET, TOKEN, AgentClient, claim
from tests.support import ManualClock


@pytest.fixture
def api_settings() -> Settings:
    return Settings(
        dev=False,
        bearer_token=TOKEN,
        webhook_allow="127.0.0.0/8",  # the test agents' webhooks are on loopback
        db_url="sqlite:///unused",
        replica_id="replica-a",
        dispatch_lease_timeout=timedelta(seconds=30),
        sse_keepalive=timedelta(milliseconds=50),
    )


@pytest.fixture
async def kernel(store: Store, clock: ManualClock, api_settings: Settings) -> Kernel:
    kernel = Kernel(store, api_settings, clock=clock.now, bus=MemoryBus())
    await kernel.register_agent(AGENT, "http://127.0.0.1:9/webhook", SECRET, None, None)
    return kernel


@pytest.fixture
def app(kernel: Kernel, api_settings: Settings) -> ASGIApp:
    """The app a replica serves: the API and the console beside it."""
    return application(kernel, api_settings)


@pytest.fixture
async def anon(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    """A client that sends no credentials."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http:
        yield http


@pytest.fixture
async def client(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    """A bearer client with the configured token."""
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as http:
        yield http


@pytest.fixture
def agent(anon: httpx.AsyncClient, clock: ManualClock) -> AgentClient:
    return AgentClient(anon, clock)


@pytest.fixture
async def execution(kernel: Kernel) -> Execution:
    return await kernel.create_execution(AGENT, '{"topic":"x"}', None)


@pytest.fixture
async def leased(kernel: Kernel, execution: Execution, agent: AgentClient) -> AgentClient:
    """The agent holding the live lease of `execution`'s first delivery."""
    return replace(agent, lease=await claim(kernel, execution.id))
