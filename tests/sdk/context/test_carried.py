"""`Carrier`: outcomes wait for the dispatch's next kernel call, or go on their own once no call
came for `CARRY_DELAY_SECONDS`; a full list, or one that would outgrow a request, is sent before
the handler goes on; under `step-records` what waits goes in one heartbeat, whose answer says
whether the grant holds (docs/extensions.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pytest

from harness.polling import wait_until
from rebuno.sdk import _carried
from rebuno.sdk._carried import Carrier
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Completion, Report, encode_json
from tests.sdk.conftest import Harness
from tests.sdk.context.conftest import AGENT, idle, proceeding, statuses

COMPLETE = "/v0/executions/{execution_id}/steps/{step_id}/complete"
HEARTBEAT = "/v0/executions/{execution_id}/heartbeat"
DENY_ALL = "default_action: deny\n"


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer fires during the test: only the calls the test makes send anything."""
    monkeypatch.setattr(_carried, "CARRY_DELAY_SECONDS", 3600.0)


@pytest.mark.usefixtures("patient")
async def test_a_held_result_waits_for_the_next_call_that_takes_it(
    harness: Harness, dispatch: Dispatch
) -> None:
    [step_id] = await proceeding(dispatch, 1)
    carrier = Carrier(dispatch, carry=True, report=False)

    await carrier.hold(Completion(step_id, b'"done"'))

    assert await statuses(harness, dispatch.execution_id) == {step_id: "executing"}
    assert carrier.take() == [Completion(step_id, b'"done"')]
    assert carrier.take() == []


async def test_a_held_result_is_sent_on_its_own_once_no_call_came_for_the_delay(
    harness: Harness, dispatch: Dispatch
) -> None:
    [step_id] = await proceeding(dispatch, 1)
    carrier = Carrier(dispatch, carry=True, report=False)
    held_at = datetime.now().astimezone()

    await carrier.hold(Completion(step_id, b"1"))

    async def recorded() -> bool:
        return await statuses(harness, dispatch.execution_id) == {step_id: "succeeded"}

    await wait_until(recorded, message="the result sent on its own")
    events = await harness.client.events(dispatch.execution_id, limit=1000)
    succeeded = next(e for e in events if e.type == "step.succeeded")
    delay = timedelta(seconds=_carried.CARRY_DELAY_SECONDS)
    assert datetime.fromisoformat(succeeded.occurred_at) >= held_at + delay
    assert carrier.take() == []


async def test_a_result_a_call_took_is_not_sent_again_when_the_timer_fires(
    harness: Harness, dispatch: Dispatch
) -> None:
    taken, later = await proceeding(dispatch, 2)
    carrier = Carrier(dispatch, carry=True, report=False)
    before = await harness.answered("POST", COMPLETE)

    await carrier.hold(Completion(taken, b"1"))
    assert carrier.take() == [Completion(taken, b"1")]  # as a submission would carry it
    await carrier.hold(Completion(later, b"2"))

    async def later_recorded() -> bool:
        return (await statuses(harness, dispatch.execution_id))[later] == "succeeded"

    await wait_until(later_recorded, message="the result held after the call")
    assert (await statuses(harness, dispatch.execution_id))[taken] == "executing"
    assert await harness.answered("POST", COMPLETE) - before == 1


@pytest.mark.usefixtures("patient")
async def test_a_full_list_is_sent_before_the_handler_goes_on(
    harness: Harness, dispatch: Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_carried, "MAX_CARRIED", 3)
    step_ids = await proceeding(dispatch, 3)
    carrier = Carrier(dispatch, carry=True, report=False)

    for step_id in step_ids[:2]:
        await carrier.hold(Completion(step_id, b"0"))
    waiting = await statuses(harness, dispatch.execution_id)
    await carrier.hold(Completion(step_ids[2], b"0"))

    assert set(waiting.values()) == {"executing"}
    assert await statuses(harness, dispatch.execution_id) == dict.fromkeys(step_ids, "succeeded")
    assert carrier.take() == []


@pytest.mark.usefixtures("patient")
async def test_what_would_not_fit_beside_an_outcome_is_sent_before_it_is_held(
    harness: Harness, dispatch: Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_carried, "MAX_RECORDED_BYTES", 1000)
    first, second = await proceeding(dispatch, 2)
    carrier = Carrier(dispatch, carry=True, report=False)
    result = encode_json("x" * 600)

    await carrier.hold(Completion(first, result))
    crowded = carrier.crowds(len(result)), carrier.fits_beside(len(result))
    await carrier.hold(Completion(second, result))

    assert crowded == (True, False)
    assert await statuses(harness, dispatch.execution_id) == {
        first: "succeeded",
        second: "executing",
    }
    assert carrier.take() == [Completion(second, result)]


@pytest.mark.usefixtures("patient")
async def test_reports_travel_in_one_heartbeat_that_keeps_the_grant(
    harness: Harness, dispatch: Dispatch
) -> None:
    carrier = Carrier(dispatch, carry=False, report=True)
    args = encode_json({"sides": 6})
    error = encode_json({"message": "no dice", "type": "ValueError"})
    before = await harness.answered("POST", HEARTBEAT)

    await carrier.hold(Report("local", "roll", args, result=b"4"))
    await carrier.hold(Report("local", "roll", args, error=error))
    await carrier.flush()

    assert await harness.answered("POST", HEARTBEAT) - before == 1
    steps = await harness.client.list_steps(dispatch.execution_id)
    assert [(s.target, s.occurrence, s.status, s.result) for s in steps] == [
        ("roll", 0, "succeeded", 4),
        ("roll", 1, "failed", None),
    ]
    assert carrier.reporting and carrier.carry


@pytest.mark.usefixtures("patient")
async def test_a_heartbeat_answered_without_the_grant_ends_reporting(
    harness: Harness, dispatch: Dispatch
) -> None:
    carrier = Carrier(dispatch, carry=False, report=True)
    async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
        answer = await http.post(f"/v0/policies/{AGENT}", json={"bundle": DENY_ALL})

    await carrier.hold(Report("local", "roll", encode_json({}), result=b"4"))
    await carrier.flush()

    assert answer.status_code == 204
    assert not carrier.reporting
    assert carrier.carry  # a result still waits for the next call; only reports end


def test_a_stopped_carrier_carries_nothing() -> None:
    carrier = Carrier(idle(), carry=True, report=True)

    carrier.stop()

    assert (carrier.carry, carrier.reporting) == (False, False)
