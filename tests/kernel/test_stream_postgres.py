"""The PostgreSQL stream bus (§16.3) on a real database: deltas cross bus instances (as they
cross replicas) in order, oversized or foreign payloads are dropped without stopping the flow,
and the listener comes back after its connection is killed. PostgreSQL only: the in-process bus
has its own tests in `tests/unit/test_stream_bus.py`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import psycopg
import pytest

from harness.polling import wait_until
from rebuno.kernel.stream.bus import Delta
from rebuno.kernel.stream.memory import MemorySubscription
from rebuno.kernel.stream.postgres import CHANNEL, MAX_PAYLOAD_BYTES, PostgresBus, decode, encode

Buses = Callable[[], AbstractAsyncContextManager[PostgresBus]]


@pytest.fixture
def running(postgres_url: str) -> Buses:
    @contextlib.asynccontextmanager
    async def start() -> AsyncIterator[PostgresBus]:
        bus = PostgresBus(postgres_url)
        task = asyncio.create_task(bus.run())
        try:
            yield bus
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bus.close()

    return start


def _delta(seq: int, data: str | None = None) -> Delta:
    return Delta(step_id="s1", seq=seq, data=f"chunk-{seq}" if data is None else data)


async def _until_flowing(
    sender: PostgresBus, subscription: MemorySubscription, seen: list[Delta]
) -> None:
    """Probes until a delta gets through: the listeners may still be connecting."""

    async def probed() -> bool:
        sender.publish("e1", _delta(0, "probe"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                seen.append(await anext(subscription))
        return bool(seen)

    await wait_until(probed, 10, "a probe delta to get through")


async def _drain_probes(subscription: MemorySubscription) -> Delta:
    while (delta := await anext(subscription)).data == "probe":
        pass
    return delta


def test_payload_round_trips_in_the_documented_shape() -> None:
    payload = encode("e1", _delta(3))
    assert payload == b'{"exec_id":"e1","delta":{"step_id":"s1","seq":3,"data":"chunk-3"}}'
    assert decode(payload.decode()) == ("e1", _delta(3))


@pytest.mark.parametrize("payload", ["not json", '{"exec_id": 1, "delta": {}}', "[]"])
def test_foreign_payload_is_refused(payload: str) -> None:
    with pytest.raises(ValueError, match="not a stream delta"):
        decode(payload)


@pytest.mark.postgres
async def test_deltas_published_on_one_bus_reach_subscribers_of_another_in_order(
    running: Buses,
) -> None:
    async with (
        running() as producer,
        running() as consumer,
        consumer.subscribe("e1") as subscription,
    ):
        await _until_flowing(producer, subscription, [])
        for seq in range(1, 21):
            producer.publish("e1", _delta(seq))
        received = [await _drain_probes(subscription)]
        received += [await anext(subscription) for _ in range(19)]
    assert received == [_delta(seq) for seq in range(1, 21)]


@pytest.mark.postgres
async def test_a_delta_over_the_notify_limit_is_dropped_and_the_next_flows(
    running: Buses, caplog: pytest.LogCaptureFixture
) -> None:
    # 7000 quotes pass the route's 7000-byte check but double when escaped.
    quotes = '"' * 7000
    assert len(encode("e1", _delta(1, quotes))) > MAX_PAYLOAD_BYTES
    async with running() as bus, bus.subscribe("e1") as subscription:
        await _until_flowing(bus, subscription, [])
        bus.publish("e1", _delta(1, quotes))
        bus.publish("e1", _delta(2))
        received = await _drain_probes(subscription)
    assert received == _delta(2)
    assert "exceed the NOTIFY limit" in caplog.text


@pytest.mark.postgres
async def test_a_foreign_notification_is_ignored(
    running: Buses, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with running() as bus, bus.subscribe("e1") as subscription:
        await _until_flowing(bus, subscription, [])
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify(%s, 'hello')", (CHANNEL,))
        bus.publish("e1", _delta(1))
        received = await _drain_probes(subscription)
    assert received == _delta(1)
    assert "ignoring a notification" in caplog.text


@pytest.mark.postgres
async def test_listener_and_publisher_reconnect_after_their_sessions_are_killed(
    running: Buses, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "rebuno.kernel.stream.postgres")
    async with running() as bus, bus.subscribe("e1") as subscription:
        await _until_flowing(bus, subscription, [])
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'rebuno-stream' AND datname = current_database()"
            )
            assert await cur.fetchone() == (2,)
        await _until_flowing(bus, subscription, [])
        bus.publish("e1", _delta(1))
        received = await _drain_probes(subscription)
    assert received == _delta(1)
    assert "stream listener lost PostgreSQL" in caplog.text
