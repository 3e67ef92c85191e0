"""Our SDK uses the kernel's `step-records` extension: on an execution's first delivery, for an
agent without a policy, a `safe_to_retry` step runs at once and is reported with its outcome by
the agent's next kernel call, with the events a submission and a completion would have written.
A policy set while the run goes on ends the grant at the next answer."""

from __future__ import annotations

import asyncio

import httpx

from rebuno import ToolError, step, tool
from tests.sdk.conftest import Harness

NO_SHELL = """
default_action: allow
rules:
  - id: no-shell
    when: {target: shell}
    then: {decision: deny, reason: no shell access}
"""
STEP_EVENTS = ["step.proposed", "step.allowed", "step.executing", "step.succeeded"]


async def test_steps_are_reported_with_the_completion_and_keep_every_event(
    harness: Harness,
) -> None:
    async def handler() -> int:
        first: int = await step("add", lambda: 1)
        again: int = await step("add", lambda: 2)
        other: int = await step("other", lambda n: 4 * n, args={"n": 1})
        return first + again + other

    async with harness.serve("reporter", handler, durability="batched"):
        done = await harness.run("reporter")

    assert done.status == "completed" and done.output == 7
    steps = await harness.client.list_steps(done.id)
    assert [(s.target, s.status, s.result) for s in steps] == [
        ("add", "succeeded", 1),
        ("add", "succeeded", 2),
        ("other", "succeeded", 4),
    ]
    assert len({s.step_id for s in steps}) == 3
    events = await harness.client.events(done.id, limit=1000)
    for recorded in steps:
        mine = [e for e in events if e.payload.get("step_id") == recorded.step_id]
        assert [e.type for e in mine] == STEP_EVENTS
        assert mine[1].payload["rule_id"] == "permissive"
    # Nothing reached the kernel before the completion: every step event is of its transaction.
    completed = next(e for e in events if e.type == "execution.completed")
    step_events = [e for e in events if e.type.startswith("step.")]
    assert {e.occurred_at for e in step_events} == {completed.occurred_at}
    assert max(e.event_seq for e in step_events) < completed.event_seq


async def test_a_failing_step_is_reported_as_failed(harness: Harness) -> None:
    @tool
    async def flaky() -> str:
        raise ValueError("upstream said no")

    async def handler() -> str:
        try:
            await flaky()
        except ToolError as exc:
            return exc.message
        return "unreachable"

    async with harness.serve("unlucky", handler, durability="batched"):
        done = await harness.run("unlucky")

    assert done.status == "completed" and done.output == "upstream said no"
    [failed] = await harness.client.list_steps(done.id)
    assert failed.status == "failed"
    assert failed.error == {"message": "upstream said no", "type": "ValueError"}


async def test_a_policy_set_during_the_run_ends_the_grant(harness: Harness) -> None:
    policy_set = asyncio.Event()
    ran: list[str] = []

    def shell() -> str:
        ran.append("shell")
        return "ran"

    async def handler() -> str:
        await step("warmup", lambda: ran.append("warmup"))
        await policy_set.wait()
        # Submitted: its answer says the agent has a policy now, so the grant ends here.
        await step("checkpoint", lambda: None, idempotency="at_most_once")
        return str(await step("shell", shell))

    async with harness.serve("converted-midway", handler, durability="batched"):
        created = await harness.client.create("converted-midway")
        async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
            answer = await http.post("/v0/policies/converted-midway", json={"bundle": NO_SHELL})
        policy_set.set()
        done = await harness.client.wait(created.id, timeout=10)

    assert answer.status_code == 204
    assert done.failure_reason == "policy_denied: no shell access"
    assert ran == ["warmup"]
    targets = {s.target: s.status for s in await harness.client.list_steps(done.id)}
    assert targets == {"warmup": "succeeded", "checkpoint": "succeeded", "shell": "denied"}
