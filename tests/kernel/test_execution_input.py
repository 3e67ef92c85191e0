"""`execution-input`: a delivery carries the execution's input, and the status the agent would
read once the delivery is acknowledged, when the input is small; a larger one is read over
the API as the standard protocol does."""

from __future__ import annotations

from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.extensions import (
    EXECUTION_INPUT,
    MAX_CARRIED_INPUT,
    read_carried,
    sign_carried,
)
from tests.kernel.conftest import AGENT, Answering, Sent


async def delivered(kernel: Kernel, input_json: str) -> Sent:
    await kernel.create_execution(AGENT, input_json, None)
    agent = Answering()
    for claimed in await kernel.claim(10):
        await kernel.deliver(claimed, agent)
    [sent] = agent.sent
    return sent


async def test_a_small_input_travels_with_the_webhook(kernel: Kernel) -> None:
    sent = await delivered(kernel, '{"topic":"durable agents"}')

    assert EXECUTION_INPUT in sent.extensions and sent.carried is not None
    signature = sign_carried("s3cret", sent.body, sent.carried)
    assert read_carried("s3cret", sent.body, sent.carried, signature) == (
        "running",
        {"topic": "durable agents"},
    )


async def test_an_input_at_the_limit_travels_and_a_larger_one_does_not(kernel: Kernel) -> None:
    at_limit = '"' + "\u00e9" * ((MAX_CARRIED_INPUT - 2) // 2) + '"'
    over = '"' + "x" * (MAX_CARRIED_INPUT - 1) + '"'

    small, large = await delivered(kernel, at_limit), await delivered(kernel, over)

    assert len(at_limit.encode()) == MAX_CARRIED_INPUT and small.carried is not None
    assert len(over.encode()) == MAX_CARRIED_INPUT + 1
    assert EXECUTION_INPUT not in large.extensions and large.carried is None
