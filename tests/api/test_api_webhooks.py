"""Registering a webhook URL in server mode (§6): only http and https URLs with a host, and
no loopback, link-local or private address (in any spelling) unless the allow list names it.
These tests' kernel allows 127.0.0.0/8, where its test agents listen."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from starlette.types import ASGIApp

from rebuno.kernel.api.app import create_app
from rebuno.kernel.config import Settings
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.stream.memory import MemoryBus
from tests.api.harness import BASE_URL, TOKEN, assert_error
from tests.support import ManualClock

WRITER = {"id": "writer", "secret": "s"}


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/hook",
        "http://[::1]:5001/hook",
        "file:///etc/passwd",
        "gopher://example.com/",
        "javascript:alert(1)",
        "http://example.com/\r\nX-Injected: 1",
        "http://example.com/" + "x" * 100_000,
    ],
)
async def test_a_webhook_url_a_server_may_not_reach_is_refused(
    client: httpx.AsyncClient, url: str
) -> None:
    response = await client.post("/v0/agents", json={**WRITER, "webhook_url": url})

    assert_error(response, 400, "validation_error")
    assert (await client.get("/v0/agents/writer")).status_code == 404


async def test_an_allowed_network_and_a_public_name_are_registered(
    client: httpx.AsyncClient,
) -> None:
    for url in ("http://127.0.0.1:5001/webhook", "https://agents.example.com/hook"):
        response = await client.post("/v0/agents", json={**WRITER, "webhook_url": url})
        assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    "host", ["127.0.0.1:5432", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]"]
)
async def test_without_an_allow_list_loopback_is_refused_in_any_spelling(
    kernel: Kernel, clock: ManualClock, api_settings: Settings, host: str
) -> None:
    strict = replace(api_settings, webhook_allow="")
    app: ASGIApp = create_app(
        Kernel(kernel.store, strict, clock=clock.now, bus=MemoryBus()), strict
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as http:
        response = await http.post(
            "/v0/agents", json={**WRITER, "webhook_url": f"http://{host}/webhook"}
        )

    envelope = assert_error(response, 400, "validation_error")
    assert "REBUNO_WEBHOOK_ALLOW" in envelope["message"]
