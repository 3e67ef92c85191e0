"""`Resources` (docs/protocol.md §33): a key is registered and bound once per delivery, the first
registration ends carrying, an uncovered resource under a policy is captured at once, a capture
that fails is reported beside the others, and effects take turns on one lock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.polling import wait_until
from rebuno import CheckpointPolicy
from rebuno.sdk import _carried
from rebuno.sdk._carried import Carrier
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Completion
from rebuno.sdk._resources import Resources
from rebuno.types import StepResource
from tests.sdk.conftest import Harness
from tests.sdk.context.conftest import idle, proceeding, statuses

REGISTER = "/v0/executions/{execution_id}/resources"


class Sandboxes:
    """A provider kept in memory: a sandbox is a dict, a checkpoint a copy of it."""

    driver_id = "test.sandboxes.v1"

    def __init__(self, broken: bool = False) -> None:
        self.created = 0
        self.snapshots: list[dict[str, Any]] = []
        self._broken = broken

    def create(self, checkpoint_ref: str | None = None) -> tuple[dict[str, Any], Any]:
        self.created += 1
        return {}, {"sandbox": self.created}

    def open(self, binding: Any) -> dict[str, Any]:
        return {}

    async def checkpoint(self, handle: dict[str, Any]) -> str:
        if self._broken:
            raise RuntimeError("disk full")
        self.snapshots.append(dict(handle))
        return f"snap-{len(self.snapshots)}"


async def test_the_first_registration_sends_what_waits_and_ends_carrying(
    harness: Harness, dispatch: Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_carried, "CARRY_DELAY_SECONDS", 3600.0)
    [step_id] = await proceeding(dispatch, 1)
    carrier = Carrier(dispatch, carry=True, report=True)
    await carrier.hold(Completion(step_id, b"1"))
    resources = Resources(dispatch, carrier)

    await resources.open("box", Sandboxes(), None)

    assert await statuses(harness, dispatch.execution_id) == {step_id: "succeeded"}
    assert (carrier.carry, carrier.reporting) == (False, False)


async def test_a_key_is_registered_and_bound_once_per_delivery(
    harness: Harness, dispatch: Dispatch
) -> None:
    resources = Resources(dispatch, Carrier(dispatch, carry=False, report=False))
    sandboxes = Sandboxes()
    before = await harness.answered("POST", REGISTER)

    first = await resources.open("box", sandboxes, None)
    async with resources.effects():  # a step holding the effects lock opens it again
        again = await resources.open("box", sandboxes, None)

    assert again is first
    assert sandboxes.created == 1
    assert await harness.answered("POST", REGISTER) - before == 1


async def test_an_uncovered_resource_under_a_policy_is_captured_at_once(
    harness: Harness, dispatch: Dispatch
) -> None:
    resources = Resources(dispatch, Carrier(dispatch, carry=False, report=False))
    sandboxes = Sandboxes()

    await resources.open("box", sandboxes, CheckpointPolicy(every_steps=2))

    events = await harness.client.events(dispatch.execution_id, limit=1000)
    checkpointed = [e.payload for e in events if e.type == "resource.checkpointed"]
    assert [(c["key"], c["generation"]) for c in checkpointed] == [("box", 0)]
    assert len(sandboxes.snapshots) == 1


async def test_a_capture_that_fails_is_reported_beside_the_others(dispatch: Dispatch) -> None:
    resources = Resources(dispatch, Carrier(dispatch, carry=False, report=False))
    await resources.open("box", Sandboxes(), None)
    await resources.open("disk", Sandboxes(broken=True), None)

    found = await resources.capture(
        [
            StepResource(key="box", generation=3, due=True),
            StepResource(key="disk", generation=5, due=True),
            StepResource(key="never-opened", generation=1, due=True),
        ]
    )

    assert found == {
        "captures": [{"key": "box", "generation": 3, "checkpoint_ref": "snap-1"}],
        "capture_failures": [{"key": "disk", "generation": 5, "error": "RuntimeError: disk full"}],
    }


async def test_nothing_to_capture_is_nothing_to_send() -> None:
    resources = Resources(idle(), Carrier(idle(), carry=False, report=False))

    assert await resources.capture([StepResource(key="box", generation=1, due=True)]) == {}


async def test_effects_take_turns_on_one_lock() -> None:
    resources = Resources(idle(), Carrier(idle(), carry=False, report=False))
    order: list[str] = []
    release = asyncio.Event()

    async def effect(name: str, gate: asyncio.Event) -> None:
        async with resources.effects():
            order.append(f"{name} in, holding={resources.holding()}")
            await gate.wait()
            order.append(f"{name} out")

    opened = asyncio.Event()
    opened.set()
    first = asyncio.create_task(effect("first", release))
    await wait_until(lambda: bool(order), message="the first effect holds the lock")
    second = asyncio.create_task(effect("second", opened))
    await asyncio.sleep(0)  # the second tries the lock while the first holds it
    release.set()
    await asyncio.gather(first, second)

    assert order == ["first in, holding=True", "first out", "second in, holding=True", "second out"]
    assert not resources.holding()
