"""Operational routes (§5.4): liveness and readiness answer without credentials."""

from __future__ import annotations

import httpx

from rebuno.kernel.store.base import Store


async def test_health_is_always_ok(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/v0/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_ready_when_the_database_answers(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/v0/ready")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


async def test_unavailable_when_the_database_does_not_answer(
    store: Store, anon: httpx.AsyncClient
) -> None:
    await store.close()
    response = await anon.get("/v0/ready")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable"}


async def test_health_after_the_database_went_away_is_still_ok(
    store: Store, anon: httpx.AsyncClient
) -> None:
    await store.close()
    assert (await anon.get("/v0/health")).status_code == 200
