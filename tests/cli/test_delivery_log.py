"""How `exec watch`, `exec get` and the REPL's same commands tell a delivery problem: a
refused webhook names the agent's answer, a redelivery after an expired lease says so, and an
execution whose attempts ran out shows what became of its last delivery. Against a real
kernel served in the test's event loop, with real webhooks on loopback."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.asgi import asgi_body, asgi_lifespan
from harness.polling import wait_until
from rebuno.cli import operations
from rebuno.cli.admin import AdminClient
from rebuno.cli.render import Output
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve
from rebuno.protocol.enums import ExecutionStatus
from tests.sdk.loopback import serving

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def answering(status: int) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    """A webhook that answers every delivery with `status` and never runs anything: with 200,
    the lease of each delivery runs out."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        await asgi_body(receive)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AdminClient]:
    settings = Settings(
        dev=True,
        listen_addr="127.0.0.1:0",
        db_url=f"sqlite:///{tmp_path / 'kernel.db'}",
        dispatch_poll_interval=timedelta(milliseconds=20),
        dispatch_lease_timeout=timedelta(milliseconds=400),
        dispatch_max_attempts=2,
        backoff_base=timedelta(milliseconds=20),
        backoff_max=timedelta(milliseconds=50),
    )
    urls: list[str] = []
    task = asyncio.create_task(serve(settings, on_ready=urls.append), name="kernel")
    await wait_until(lambda: bool(urls) or task.done(), timeout=20, message="kernel ready")
    if task.done():
        task.result()
    try:
        async with AdminClient(base_url=urls[0]) as admin:
            yield admin
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run_to_failure(client: AdminClient, status: int) -> tuple[str, str, str]:
    """An execution of an agent whose webhook answers `status`, run until its attempts ran
    out; what `exec watch` and `exec get` print for it."""
    async with serving(answering(status)) as url:
        await client.register_agent("stuck", f"{url}/webhook", "s3cret")
        execution = await client.create("stuck", {})
        watched = io.StringIO()
        await operations.watch_execution(client, Output(watched), execution.id, interval=0.05)
    shown = io.StringIO()
    await operations.show_execution(client, Output(shown), execution.id)
    assert (await client.get(execution.id)).status is ExecutionStatus.FAILED
    return execution.id, watched.getvalue(), shown.getvalue()


def line_of(text: str, event_type: str, attempt: int) -> str:
    [line] = [
        each for each in text.splitlines() if event_type in each and f"attempt={attempt}" in each
    ]
    return line


async def test_a_refused_delivery_shows_the_agents_answer(client: AdminClient) -> None:
    _, watched, shown = await run_to_failure(client, 401)

    assert line_of(watched, "dispatch.failed", 1).endswith("attempt=1  agent answered 401")
    assert "failure: dispatch_exhausted" in shown
    assert "last delivery: attempt=2  agent answered 401" in shown


async def test_a_redelivery_after_an_expired_lease_says_so(client: AdminClient) -> None:
    _, watched, shown = await run_to_failure(client, 200)

    first = line_of(watched, "dispatch.acked", 1)
    second = line_of(watched, "dispatch.acked", 2)
    assert "redelivered" not in first
    assert second.endswith("attempt=2  redelivered: the previous attempt's lease expired")
    assert "last delivery: attempt=2  redelivered: the previous attempt's lease expired" in shown
