"""A replica cut off from PostgreSQL by a partition that resets nothing (a blackhole: its
connections stay open, nothing gets through). While it holds the leader lock, it stops its
singleton job within seconds and the server ends its lock session once that session has been
idle long enough, so another replica leads again while the partition lasts, never at the same
time as the cut-off one. A statement it sent into the blackhole fails within the use bound
instead of waiting for the network to heal."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from chaos.cluster import Cut, Proxy
from harness.polling import wait_until
from rebuno.kernel.domain.errors import Unavailable
from rebuno.kernel.store.postgres import PostgresStore
from rebuno.kernel.store.postgres import store as store_module

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(60)]

KEY = "partition-leader"


@pytest.fixture
async def proxy(postgres_url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(postgres_url)
    relay = Proxy([(parts.hostname or "127.0.0.1", parts.port or 5432)])
    yield relay
    relay.heal()
    relay.close()


async def test_a_leader_cut_off_by_a_blackhole_stops_and_is_succeeded(
    postgres_url: str, proxy: Proxy
) -> None:
    parts = urlsplit(postgres_url)
    user = f"{parts.username}@" if parts.username else ""
    cut_off = PostgresStore(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}").geturl())
    survivor = PostgresStore(postgres_url)
    await cut_off.open()
    await survivor.open()
    job_ended = asyncio.Event()
    stopped: list[float] = []
    raised: list[bool] = []

    async def lead() -> None:
        with contextlib.suppress(Unavailable):
            async with cut_off.leader(KEY) as leading:
                assert leading
                try:
                    proxy.cut(Cut.BLACKHOLE)
                    cut_at.append(time.monotonic())
                    await asyncio.Event().wait()  # a job that would run for ever
                finally:
                    job_ended.set()
                    stopped.append(time.monotonic())
            raised.append(False)
        raised.append(True)

    async def survivor_leads() -> bool:
        async with survivor.leader(KEY) as leading:
            if leading:
                # Whoever holds the lock now, the cut-off replica's job is over.
                assert job_ended.is_set()
            return leading

    cut_at: list[float] = []
    leader = asyncio.create_task(lead())
    try:
        await wait_until(lambda: bool(cut_at), 10, "the lock to be taken and the link cut")
        await wait_until(survivor_leads, 20, "the survivor to take the lock")
        succeeded = time.monotonic()
        await wait_until(lambda: bool(raised), 20, "the cut-off replica to leave the block")
    finally:
        leader.cancel()
        await asyncio.gather(leader, return_exceptions=True)
        proxy.heal()
        await cut_off.close()
        await survivor.close()

    assert raised == [True], "leaving the block raised Unavailable"
    assert stopped[0] - cut_at[0] < 5
    assert succeeded - cut_at[0] < 10


async def test_a_statement_sent_into_a_blackhole_fails_within_the_use_bound(
    postgres_url: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "_USE_SECONDS", 1.0)
    parts = urlsplit(postgres_url)
    user = f"{parts.username}@" if parts.username else ""
    cut_off = PostgresStore(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}").geturl())
    await cut_off.open()
    try:
        await cut_off.ping()
        proxy.cut(Cut.BLACKHOLE)
        began = time.monotonic()
        with pytest.raises(Unavailable, match="no answer within 1 s"):
            # The pooled connection looks healthy: the statement is sent and nothing returns.
            await cut_off.get_execution("never-answered")
        waited = time.monotonic() - began
    finally:
        proxy.heal()
        await cut_off.close()

    # The bound, then psycopg's cancellation (up to 10 s when nothing gets through).
    assert waited < 1 + 10 + 2
