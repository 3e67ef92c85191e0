"""The agent runtime against a real kernel: outcomes, binding, replay, approvals, delivery."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from pydantic import BaseModel

from harness.polling import wait_until
from rebuno import Blocked, ToolError, execution, step, tool
from rebuno.protocol.signing import sign_body
from rebuno.types import Event, ExecutionStatus
from tests.sdk.conftest import SECRET, Harness

APPROVE_SEND = """
rules:
  - id: gate-send
    when: {step_kind: tool_call, target: send}
    then: {decision: require_approval}
default_action: allow
"""


@tool
async def add(a: int, b: int) -> int:
    return a + b


@tool("text.upper")
def upper(text: str) -> str:
    return text.upper()


async def test_agent_completes_execution_with_two_tools(harness: Harness) -> None:
    async def process(a: int, b: int, name: str) -> dict[str, Any]:
        return {"sum": await add(a, b), "name": await upper(name), "id": execution().id}

    async with harness.serve("hello", process):
        done = await harness.run("hello", {"a": 2, "b": 3, "name": "ada"})

    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == {"sum": 5, "name": "ADA", "id": done.id}
    steps = await harness.client.list_steps(done.id)
    assert [(s.kind, s.target, s.status, s.result) for s in steps] == [
        ("tool_call", "add", "succeeded", 5),
        ("tool_call", "text.upper", "succeeded", "ADA"),
    ]


class Order(BaseModel):
    item: str
    quantity: int = 1


async def test_pydantic_model_handler_receives_validated_input(harness: Harness) -> None:
    async def process(order: Order) -> dict[str, Any]:
        return {"item": order.item, "quantity": order.quantity}

    async with harness.serve("orders", process):
        done = await harness.run("orders", {"item": "tea", "quantity": "3"})

    assert done.output == {"item": "tea", "quantity": 3}


async def test_missing_input_field_fails_execution_without_calling_handler(
    harness: Harness,
) -> None:
    calls: list[str] = []

    async def process(prompt: str) -> str:
        calls.append(prompt)
        return prompt

    async with harness.serve("strict", process):
        done = await harness.run("strict", {"other": 1})

    assert done.status is ExecutionStatus.FAILED
    assert done.failure_reason.startswith("input_invalid: prompt")
    assert calls == []


async def test_handler_exception_fails_execution_with_its_message(harness: Harness) -> None:
    async def process() -> None:
        raise ValueError("the sky fell")

    async with harness.serve("faulty", process):
        done = await harness.run("faulty")

    assert done.status is ExecutionStatus.FAILED
    assert done.failure_reason == "agent_error: ValueError: the sky fell"


async def test_failing_tool_body_fails_execution_as_tool_error(harness: Harness) -> None:
    @tool
    async def explode() -> None:
        raise RuntimeError("kaboom")

    async def process() -> None:
        await explode()

    async with harness.serve("explosive", process):
        done = await harness.run("explosive")

    assert done.failure_reason == "tool_error: explode: kaboom"
    [recorded] = await harness.client.list_steps(done.id)
    assert recorded.status == "failed"
    assert recorded.error["message"] == "kaboom"


async def test_non_json_output_fails_execution(harness: Harness) -> None:
    async def process() -> object:
        return object()

    async with harness.serve("opaque", process):
        done = await harness.run("opaque")

    assert done.status is ExecutionStatus.FAILED
    assert "not JSON-serializable" in done.failure_reason


async def test_completed_tool_is_replayed_after_approval(harness: Harness) -> None:
    runs: list[str] = []

    @tool
    async def fetch(url: str) -> str:
        runs.append(url)
        return f"page at {url}"

    @tool
    async def send(text: str) -> str:
        return f"sent {text}"

    async def process(url: str) -> str:
        page = await fetch(url)
        return str(await send(page))

    async with harness.serve("gated", process, policy=APPROVE_SEND):
        created = await harness.client.create("gated", {"url": "https://example.org"})
        await _wait_status(harness, created.id, ExecutionStatus.BLOCKED)
        [approval] = await harness.client.list_approvals(execution_id=created.id)
        await harness.client.grant_approval(approval.id, decided_by="alice")
        done = await harness.client.wait(created.id, timeout=20)

    assert done.output == "sent page at https://example.org"
    assert runs == ["https://example.org"]


async def test_denied_approval_comes_back_as_tool_answer(harness: Harness) -> None:
    @tool
    async def send(text: str) -> str:
        return f"sent {text}"

    async def process() -> str:
        return str(await send("hi"))

    async with harness.serve("refused", process, policy=APPROVE_SEND):
        created = await harness.client.create("refused")
        await _wait_status(harness, created.id, ExecutionStatus.BLOCKED)
        [approval] = await harness.client.list_approvals(execution_id=created.id)
        await harness.client.deny_approval(approval.id, decided_by="bob", rationale="not today")
        done = await harness.client.wait(created.id, timeout=20)

    assert done.output == "send not allowed. reason: not today"


async def test_swallowed_blocked_still_parks_execution(harness: Harness) -> None:
    @tool
    async def send(text: str) -> str:
        return text

    swallowed: list[BaseException] = []

    async def process() -> str:
        try:
            await send("x")
        except Exception as exc:
            swallowed.append(exc)
        return "pretended to finish"

    async with harness.serve("sneaky", process, policy=APPROVE_SEND):
        created = await harness.client.create("sneaky")
        await _wait_status(harness, created.id, ExecutionStatus.BLOCKED)
        await wait_until(lambda: bool(swallowed))
        await harness.agents[0].join()
        still = await harness.client.get(created.id)

    assert isinstance(swallowed[0], Blocked)
    assert still.status is ExecutionStatus.BLOCKED


async def test_local_step_value_is_replayed_after_approval(harness: Harness) -> None:
    draws = iter([17, 99])
    seen: list[int] = []

    @tool
    async def send(text: str) -> str:
        return text

    async def process() -> str:
        number = await step("draw", lambda: next(draws))
        seen.append(number)
        return str(await send(f"lucky {number}"))

    async with harness.serve("lucky", process, policy=APPROVE_SEND):
        created = await harness.client.create("lucky")
        await _wait_status(harness, created.id, ExecutionStatus.BLOCKED)
        [approval] = await harness.client.list_approvals(execution_id=created.id)
        await harness.client.grant_approval(approval.id, decided_by="alice")
        done = await harness.client.wait(created.id, timeout=20)

    assert seen == [17, 17]
    assert done.output == "lucky 17"
    kinds = [s.kind for s in await harness.client.list_steps(done.id)]
    assert kinds == ["local", "tool_call"]


async def test_denied_local_step_fails_execution_with_policy_reason(harness: Harness) -> None:
    policy = """
rules:
  - id: no-clock
    when: {step_kind: local, target: now}
    then: {decision: deny, reason: clocks are forbidden}
default_action: allow
"""

    async def process() -> float:
        return float(await step("now", lambda: 1.0))

    async with harness.serve("clockless", process, policy=policy):
        done = await harness.run("clockless")

    assert done.failure_reason == "policy_denied: clocks are forbidden"


async def test_failed_step_replays_as_tool_error(harness: Harness) -> None:
    failures: list[str] = []
    attempts = iter(["first", "second"])

    @tool
    async def send(text: str) -> str:
        return text

    def flaky() -> None:
        raise OSError(f"disk full ({next(attempts)})")

    async def process() -> str:
        try:
            await step("write", flaky)
        except ToolError as exc:
            failures.append(exc.message)
        return str(await send("done"))

    async with harness.serve("flaky", process, policy=APPROVE_SEND):
        created = await harness.client.create("flaky")
        await _wait_status(harness, created.id, ExecutionStatus.BLOCKED)
        [approval] = await harness.client.list_approvals(execution_id=created.id)
        await harness.client.grant_approval(approval.id, decided_by="alice")
        await harness.client.wait(created.id, timeout=20)

    assert failures == ["disk full (first)", "disk full (first)"]


async def test_webhook_is_acknowledged_while_handler_still_runs(harness: Harness) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def process() -> str:
        started.set()
        await release.wait()
        return "finally"

    async with harness.serve("slow", process):
        created = await harness.client.create("slow")
        await asyncio.wait_for(started.wait(), 10)

        async def acked() -> bool:
            events = await harness.client.events(created.id)
            return any(e.type == "dispatch.acked" for e in events)

        # The handler cannot finish before `release`: the ack came while it was running.
        await wait_until(acked, timeout=10, message="the delivery acknowledged")
        release.set()
        done = await harness.client.wait(created.id, timeout=10)

    assert done.output == "finally"


async def test_redelivery_is_ignored_and_newer_attempt_supersedes(harness: Harness) -> None:
    cancelled: list[int] = []
    started: list[int] = []

    async def process() -> None:
        run = len(started) + 1
        started.append(run)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(run)
            raise

    async with harness.serve("stuck", process) as agent:
        created = await harness.client.create("stuck")
        await wait_until(lambda: started == [1], timeout=10)
        dispatch_id = await _acked_dispatch(harness, created.id)
        transport = httpx.ASGITransport(app=agent.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            repeat = await _deliver(http, created.id, dispatch_id, attempt=1)
            newer = await _deliver(http, created.id, dispatch_id, attempt=2)
            await wait_until(lambda: cancelled == [1], timeout=10)

    assert repeat.json() == {"accepted": False}
    assert newer.json() == {"accepted": True}


async def _deliver(
    http: httpx.AsyncClient, execution_id: str, dispatch_id: str, attempt: int
) -> httpx.Response:
    body = json.dumps(
        {
            "execution_id": execution_id,
            "dispatch_id": dispatch_id,
            "dispatch_attempt": attempt,
            "lease_timeout_seconds": 120,
        }
    ).encode()
    headers = {"Rebuno-Signature": sign_body(SECRET, body)}
    response = await http.post("/webhook", content=body, headers=headers)
    response.raise_for_status()
    return response


async def _acked_dispatch(harness: Harness, execution_id: str) -> str:
    """The acknowledged dispatch. The kernel records the ack after the webhook's answer, so
    the handler may already be running before it is there."""
    acked: list[Event] = []

    async def recorded() -> bool:
        events = await harness.client.events(execution_id)
        acked[:] = [e for e in events if e.type == "dispatch.acked"]
        return bool(acked)

    await wait_until(recorded, timeout=10, message="the dispatch's ack")
    [ack] = acked
    return str(ack.payload["dispatch_id"])


async def _wait_status(harness: Harness, execution_id: str, status: ExecutionStatus) -> None:
    async def reached() -> bool:
        return (await harness.client.get(execution_id)).status is status

    await wait_until(reached, timeout=20, message=f"execution {status}")
