"""`execution-input`: a delivery carries the execution's input, and the status the agent would
read once the delivery is acknowledged, when the input is small; a larger one is read over
the API as the standard protocol does."""

from __future__ import annotations

from dataclasses import dataclass, field

from rebuno.kernel.domain.dispatch import DeliveryOutcome
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.extensions import (
    EXECUTION_INPUT,
    MAX_CARRIED_INPUT,
    read_carried,
    sign_carried,
)
from tests.kernel.conftest import AGENT


@dataclass
class Recording:
    """A deliverer that answers 200 and keeps what each delivery offered and carried."""

    sent: list[tuple[tuple[str, ...], str | None, bytes]] = field(default_factory=list)

    async def deliver(
        self,
        url: str,
        secret: str,
        execution_id: str,
        body: bytes,
        timeout_seconds: float,
        *,
        extensions: tuple[str, ...] = (),
        carried: str | None = None,
    ) -> DeliveryOutcome:
        self.sent.append((extensions, carried, body))
        return DeliveryOutcome(ok=True)


async def delivered(kernel: Kernel, input_json: str) -> tuple[tuple[str, ...], str | None, bytes]:
    await kernel.create_execution(AGENT, input_json, None)
    recording = Recording()
    for claimed in await kernel.claim(10):
        await kernel.deliver(claimed, recording)
    [sent] = recording.sent
    return sent


async def test_a_small_input_travels_with_the_webhook(kernel: Kernel) -> None:
    extensions, value, body = await delivered(kernel, '{"topic":"durable agents"}')

    assert EXECUTION_INPUT in extensions and value is not None
    signature = sign_carried("s3cret", body, value)
    assert read_carried("s3cret", body, value, signature) == (
        "running",
        {"topic": "durable agents"},
    )


async def test_an_input_at_the_limit_travels_and_a_larger_one_does_not(kernel: Kernel) -> None:
    at_limit = '"' + "\u00e9" * ((MAX_CARRIED_INPUT - 2) // 2) + '"'
    over = '"' + "x" * (MAX_CARRIED_INPUT - 1) + '"'

    small, large = await delivered(kernel, at_limit), await delivered(kernel, over)

    assert len(at_limit.encode()) == MAX_CARRIED_INPUT and small[1] is not None
    assert len(over.encode()) == MAX_CARRIED_INPUT + 1
    assert EXECUTION_INPUT not in large[0] and large[1] is None
