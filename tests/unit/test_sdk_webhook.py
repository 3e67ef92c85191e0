"""The agent's webhook as a raw ASGI app: signature, body checks, routing, de-duplication.

Deliveries the webhook accepts run against a kernel URL nobody listens on; these tests look
only at what the webhook answers and which deliveries it admits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from rebuno import Agent
from rebuno.protocol.signing import sign_body
from rebuno.sdk._kernel import Lease
from rebuno.sdk._webhook import Deliveries, Delivery, parse_delivery

SECRET = "webhook-secret"
EXECUTION_ID = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"
DISPATCH_ID = "01937a6e-3000-7000-8000-000000000001"
DELIVERY: dict[str, Any] = {
    "execution_id": EXECUTION_ID,
    "dispatch_id": DISPATCH_ID,
    "dispatch_attempt": 1,
    "lease_timeout_seconds": 120,
}


@pytest.fixture
async def webhook() -> AsyncIterator[httpx.AsyncClient]:
    agent = Agent("hooked", secret=SECRET, base_url="http://127.0.0.1:9")
    agent.bind(_never_called)
    transport = httpx.ASGITransport(app=agent.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        yield http
    await agent.close()


async def _never_called() -> None:
    raise AssertionError("the handler must not run without a kernel")


def signed(payload: Any, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    return body, {"Rebuno-Signature": sign_body(secret, body)}


async def test_missing_signature_is_unauthorized(webhook: httpx.AsyncClient) -> None:
    response = await webhook.post("/webhook", content=json.dumps(DELIVERY))

    assert response.status_code == 401


@pytest.mark.parametrize(
    "signature",
    [
        sign_body("another-secret", json.dumps(DELIVERY).encode()),
        sign_body(SECRET, json.dumps(DELIVERY).encode()).upper(),
        "sha256=",
        "v1=" + "0" * 64,
    ],
    ids=["wrong-secret", "uppercase", "empty", "other-scheme"],
)
async def test_bad_signature_is_unauthorized(webhook: httpx.AsyncClient, signature: str) -> None:
    response = await webhook.post(
        "/webhook", content=json.dumps(DELIVERY), headers={"Rebuno-Signature": signature}
    )

    assert response.status_code == 401


async def test_signature_over_another_body_is_unauthorized(webhook: httpx.AsyncClient) -> None:
    _, headers = signed(DELIVERY)
    tampered = json.dumps({**DELIVERY, "dispatch_attempt": 9})

    response = await webhook.post("/webhook", content=tampered, headers=headers)

    assert response.status_code == 401


@pytest.mark.parametrize(
    "payload",
    [
        {"dispatch_id": DELIVERY["dispatch_id"]},
        {"execution_id": DELIVERY["execution_id"]},
        {"execution_id": "", "dispatch_id": "d"},
        ["not", "an", "object"],
        "plain text",
    ],
)
async def test_signed_body_without_ids_is_bad_request(
    webhook: httpx.AsyncClient, payload: Any
) -> None:
    body, headers = signed(payload)

    response = await webhook.post("/webhook", content=body, headers=headers)

    assert response.status_code == 400


async def test_signed_delivery_is_acknowledged(webhook: httpx.AsyncClient) -> None:
    body, headers = signed(DELIVERY)

    response = await webhook.post("/webhook", content=body, headers=headers)

    assert (response.status_code, response.json()) == (200, {"accepted": True})


async def test_repeated_delivery_is_acknowledged_but_not_run_again(
    webhook: httpx.AsyncClient,
) -> None:
    body, headers = signed(DELIVERY)

    first = await webhook.post("/webhook", content=body, headers=headers)
    again = await webhook.post("/webhook", content=body, headers=headers)

    assert first.json() == {"accepted": True}
    assert (again.status_code, again.json()) == (200, {"accepted": False})


async def test_other_paths_and_methods_are_refused(webhook: httpx.AsyncClient) -> None:
    assert (await webhook.post("/elsewhere")).status_code == 404
    wrong_method = await webhook.get("/webhook")
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")


async def test_unbound_agent_refuses_deliveries_for_redelivery() -> None:
    agent = Agent("unbound", secret=SECRET, base_url="http://127.0.0.1:9")
    body, headers = signed(DELIVERY)
    transport = httpx.ASGITransport(app=agent.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        response = await http.post("/webhook", content=body, headers=headers)

    assert response.status_code == 503


def test_agent_reads_secret_and_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBUNO_AGENT_SECRET", "from-env")
    monkeypatch.setenv("REBUNO_URL", "http://kernel.example")

    agent = Agent("env-agent")

    assert agent.agent_id == "env-agent"


def test_agent_without_secret_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REBUNO_AGENT_SECRET", raising=False)

    with pytest.raises(ValueError, match="REBUNO_AGENT_SECRET"):
        Agent("lonely", base_url="http://kernel.example")


def test_parse_delivery_reads_the_lease() -> None:
    delivery = parse_delivery(json.dumps({**DELIVERY, "lease_timeout_seconds": 7.5}).encode())

    assert delivery == Delivery(EXECUTION_ID, Lease(DISPATCH_ID, 1, 7.5))


def test_parse_delivery_defaults_missing_attempt_and_lease() -> None:
    delivery = parse_delivery(b'{"execution_id": "e", "dispatch_id": "d"}')

    assert delivery == Delivery("e", Lease("d", 1, 120.0))


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_newer_attempt_supersedes_the_running_one() -> None:
    deliveries = Deliveries()
    first = Delivery("e", Lease("d", 1, 120.0))
    running = asyncio.create_task(_forever())
    deliveries.admit(first)
    deliveries.started("e", running)

    run, superseded = deliveries.admit(Delivery("e", Lease("d", 2, 120.0)))

    assert (run, superseded) == (True, running)
    running.cancel()


async def test_other_dispatch_supersedes_and_older_attempt_is_ignored() -> None:
    deliveries = Deliveries()
    deliveries.admit(Delivery("e", Lease("d1", 3, 120.0)))

    older = deliveries.admit(Delivery("e", Lease("d1", 2, 120.0)))
    other = deliveries.admit(Delivery("e", Lease("d2", 1, 120.0)))

    assert older == (False, None)
    assert other == (True, None)
