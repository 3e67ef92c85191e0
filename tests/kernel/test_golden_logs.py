"""Whole event logs of typical executions (§11.3, §10.1), pinned by the fixtures in
tests/fixtures/logs: one `<name>.jsonl` per sequence, one event per line (`seq`, `type`,
`payload`). Each sequence is driven through the kernel's use cases, the deliveries through
its dispatch path with an in-process deliverer, on both stores, with the shortcuts on and off;
every way must write the same log.

What varies from run to run is replaced before comparing: an id (`execution_id`,
`dispatch_id`, `approval_id`, `step_id`) becomes `<kind-N>`, numbered by first appearance,
and a time (`*_at`) becomes `<time>`.

A fixture changes only on purpose, never by itself: `REBUNO_UPDATE_GOLDEN=1 .venv/bin/pytest
tests/kernel/test_golden_logs.py` rewrites every fixture from the logs this kernel writes. Run
it again without the variable, so every store and both settings of the shortcuts are compared
with what was written, and review the diff before committing it.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from rebuno.kernel.domain.dispatch import DeliveryOutcome, Webhook
from rebuno.kernel.domain.principal import BOOTSTRAP
from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Decision, Idempotency
from tests.kernel.conftest import AGENT, LEASE, Answering, Run, request
from tests.support import ManualClock

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
UPDATE = "REBUNO_UPDATE_GOLDEN"
ID_KINDS = {
    "execution_id": "execution",
    "parent_execution_id": "execution",
    "dispatch_id": "dispatch",
    "approval_id": "approval",
    "step_id": "step",
}
GATED = """
rules:
  - id: allow-search
    when: {target: web_search}
    then: {decision: allow}
  - id: gate-shell
    when: {target: shell_exec}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 5m}
"""
SEARCH = request("web_search", '{"query": "durable agents"}')
SHELL = request("shell_exec", '{"command": "ls"}')
CHARGE = request("charge_card", '{"amount": 5}', idempotency=Idempotency.AT_MOST_ONCE)

Line = dict[str, object]


class Normaliser:
    """Replaces what varies between runs by stable placeholders, the same value by the same
    placeholder throughout one log."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def value(self, key: str, value: object) -> object:
        if isinstance(value, dict):
            return {k: self.value(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(key, v) for v in value]
        if key.endswith("_at") and isinstance(value, str):
            return "<time>"
        kind = ID_KINDS.get(key)
        if kind is None or not isinstance(value, str):
            return value
        if value not in self._seen:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self._seen[value] = f"<{kind}-{self._counts[kind]}>"
        return self._seen[value]


async def log_of(kernel: Kernel, execution_id: str) -> list[Line]:
    normaliser = Normaliser()
    return [
        {
            "seq": event.event_seq,
            "type": event.type,
            "payload": normaliser.value("", json.loads(event.payload)),
        }
        for event in await kernel.list_events(execution_id, 0, 1000)
    ]


def assert_golden(name: str, log: list[Line]) -> None:
    path = LOGS / f"{name}.jsonl"
    if os.environ.get(UPDATE) == "1":
        LOGS.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed: parallel workers rewriting one fixture never interleave.
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text("".join(json.dumps(line) + "\n" for line in log), encoding="utf-8")
        partial.replace(path)
    assert path.exists(), f"no fixture {path.name}: record it with {UPDATE}=1"
    golden = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines()]
    assert log == golden, f"the log differs from {path.name} (on purpose? {UPDATE}=1)"


class Refusing:
    """A deliverer whose agent answers every webhook 503."""

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome:
        return DeliveryOutcome(ok=False, detail="agent answered 503")


async def delivered(kernel: Kernel, execution_id: str) -> Run:
    """Claims the execution's due dispatch and delivers it to an agent that answers 2xx: the
    agent's run under that dispatch's lease."""
    [claimed] = [c for c in await kernel.claim(10) if c.dispatch.execution_id == execution_id]
    await kernel.deliver(claimed, Answering())
    return Run(kernel, execution_id, Lease(claimed.dispatch.id, claimed.dispatch.attempt))


async def started(kernel: Kernel) -> Run:
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    return await delivered(kernel, execution.id)


async def tool_call(run: Run) -> str:
    """One `safe_to_retry` call that policy allows, run to success; its step id."""
    decision = await run.submit(SEARCH)
    assert decision.decision is Decision.PROCEED and decision.step_id
    await run.complete(decision.step_id, '{"hits":3}')
    return decision.step_id


async def blocked(kernel: Kernel) -> tuple[Run, str]:
    """A run whose `shell_exec` waits for approval, after one allowed call; the approval."""
    await kernel.set_policy(AGENT, GATED)
    run = await started(kernel)
    await tool_call(run)
    decision = await run.submit(SHELL)
    assert decision.decision is Decision.BLOCKED and decision.approval_id
    return run, decision.approval_id


async def test_one_tool_call(kernel: Kernel) -> None:
    run = await started(kernel)
    await tool_call(run)
    await kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"answer":42}')

    assert_golden("one_tool_call", await log_of(kernel, run.execution_id))


async def test_approval_granted_and_the_run_resumed(kernel: Kernel) -> None:
    first, approval_id = await blocked(kernel)
    await kernel.grant_approval(approval_id, "alice", "looks fine", BOOTSTRAP)
    run = await delivered(kernel, first.execution_id)
    replayed = await run.submit(SEARCH)
    decision = await run.submit(SHELL)
    assert replayed.decision is Decision.REPLAY and decision.step_id
    await run.complete(decision.step_id, '"listing"')
    await kernel.complete_execution(run.execution_id, AGENT, run.lease, '{"answer":42}')

    assert_golden("approval_granted", await log_of(kernel, run.execution_id))


async def test_approval_denied_and_the_run_failed(kernel: Kernel) -> None:
    first, approval_id = await blocked(kernel)
    await kernel.deny_approval(approval_id, "alice", "not today", BOOTSTRAP)
    run = await delivered(kernel, first.execution_id)
    await run.submit(SEARCH)
    denied = await run.submit(SHELL)
    assert denied.decision is Decision.DENIED
    await kernel.fail_execution(run.execution_id, AGENT, run.lease, "shell_exec was denied")

    assert_golden("approval_denied", await log_of(kernel, run.execution_id))


async def test_failed_step_then_the_agent_fails_the_execution(kernel: Kernel) -> None:
    run = await started(kernel)
    decision = await run.submit(SEARCH)
    assert decision.step_id
    await run.fail(decision.step_id, '{"message":"search is down"}')
    await kernel.fail_execution(run.execution_id, AGENT, run.lease, "search is down")

    assert_golden("failed_step", await log_of(kernel, run.execution_id))


async def test_cancel_while_blocked_on_an_approval(kernel: Kernel) -> None:
    run, _ = await blocked(kernel)
    await kernel.cancel_execution(run.execution_id)

    assert_golden("cancelled_while_blocked", await log_of(kernel, run.execution_id))


async def test_deliveries_exhausted_while_pending(kernel: Kernel, clock: ManualClock) -> None:
    execution = await kernel.create_execution(AGENT, '{"topic":"x"}', None)
    for _ in range(kernel.settings.dispatch_max_attempts):
        [claimed] = await kernel.claim(10)
        await kernel.deliver(claimed, Refusing())
        clock.advance(kernel.settings.backoff_max)

    assert await kernel.claim(10) == []
    assert_golden("exhausted_while_pending", await log_of(kernel, execution.id))


async def test_at_most_once_step_orphaned_by_an_expired_lease(
    kernel: Kernel, clock: ManualClock
) -> None:
    """The agent died in the middle of a charge: the next attempt may not run it again (§13)."""
    first = await started(kernel)
    await tool_call(first)
    orphaned = await first.submit(CHARGE)
    assert orphaned.decision is Decision.PROCEED
    clock.advance(LEASE + timedelta(seconds=1))
    assert await kernel.store.reclaim_expired(clock.now(), LEASE) == 1
    run = await delivered(kernel, first.execution_id)
    await run.submit(SEARCH)
    indeterminate = await run.submit(CHARGE)
    assert indeterminate.decision is Decision.REPLAY and indeterminate.error
    await kernel.fail_execution(run.execution_id, AGENT, run.lease, "the charge may have run")

    assert_golden("orphaned_at_most_once", await log_of(kernel, run.execution_id))
