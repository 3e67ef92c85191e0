"""The in-process stream bus: fan-out per execution, bounded buffers, no replay."""

from __future__ import annotations

import asyncio

from rebuno.kernel.stream.bus import Delta, StreamBus
from rebuno.kernel.stream.memory import SUBSCRIBER_BUFFER, MemoryBus


def _delta(seq: int, step_id: str = "s1") -> Delta:
    return Delta(step_id=step_id, seq=seq, data=f"chunk-{seq}")


async def test_subscriber_receives_deltas_published_while_subscribed() -> None:
    bus: StreamBus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        bus.publish("e1", _delta(0))
        bus.publish("e1", _delta(1))
        received = [await anext(subscription), await anext(subscription)]
    assert received == [_delta(0), _delta(1)]


async def test_deltas_of_other_executions_are_not_delivered() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        bus.publish("e2", _delta(0))
        bus.publish("e1", _delta(7))
        assert await anext(subscription) == _delta(7)


async def test_deltas_published_before_subscribing_are_not_replayed() -> None:
    bus = MemoryBus()
    bus.publish("e1", _delta(0))
    async with bus.subscribe("e1") as subscription:
        bus.publish("e1", _delta(1))
        assert await anext(subscription) == _delta(1)


async def test_every_subscriber_of_an_execution_gets_each_delta() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as first, bus.subscribe("e1") as second:
        bus.publish("e1", _delta(3))
        assert await anext(first) == _delta(3)
        assert await anext(second) == _delta(3)


async def test_full_subscriber_drops_new_deltas_without_blocking() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        for seq in range(SUBSCRIBER_BUFFER + 10):
            bus.publish("e1", _delta(seq))
        received = [await anext(subscription) for _ in range(SUBSCRIBER_BUFFER)]
        bus.publish("e1", _delta(999))
        after_drain = await anext(subscription)
    assert [d.seq for d in received] == list(range(SUBSCRIBER_BUFFER))
    assert after_drain.seq == 999


async def test_leaving_a_subscription_unregisters_it() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1"):
        assert bus.subscriber_count("e1") == 1
    assert bus.subscriber_count("e1") == 0
    bus.publish("e1", _delta(0))


async def test_cancelled_wait_loses_no_delta() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        waiter = asyncio.ensure_future(anext(subscription))
        await asyncio.sleep(0)  # one turn of the loop: the waiter is now inside the queue's get
        waiter.cancel()
        bus.publish("e1", _delta(5))
        assert await anext(subscription) == _delta(5)
