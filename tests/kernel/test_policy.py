"""Policy at submission time (§8.1, §14): deny, rule ids, rate limits (refuse and park) and
token budgets, evaluated once for a new step and never for a replay."""

from __future__ import annotations

from datetime import timedelta

from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Decision, ExecutionStatus, StepKind
from tests.kernel.conftest import AGENT, Run, claim, redeliver, request
from tests.support import ManualClock

DENY_SHELL = """
default_action: allow
rules:
  - id: no-rm
    when:
      target: shell_*
      arguments:
        command: {regex: 'rm\\s+-rf'}
    then: {decision: deny, reason: destructive command}
"""

LIMITED = """
default_action: allow
rules:
  - id: search-limit
    when: {target: web_search}
    then:
      decision: allow
      rate_limit: {max_calls: 2, window: 1m%s}
"""

BUDGET = """
default_action: allow
rules:
  - id: llm-budget
    when: {step_kind: llm_call}
    then:
      decision: allow
      budget: {max_tokens: 100}
"""


async def test_deny_rule_answers_denied_with_its_rule_id(kernel: Kernel, run: Run) -> None:
    await kernel.set_policy(AGENT, DENY_SHELL)

    denied = await run.submit(request("shell_exec", '{"command": "rm -rf /"}'))
    allowed = await run.submit(request("shell_exec", '{"command": "ls"}'))

    assert denied.decision is Decision.DENIED
    assert (denied.reason, denied.rule_id) == ("destructive command", "no-rm")
    assert allowed.decision is Decision.PROCEED
    events = await kernel.list_events(run.execution_id, 0, 1000)
    denial = next(e for e in events if e.type == "step.denied")
    assert '"rule_id":"no-rm"' in denial.payload


async def test_replay_is_never_re_evaluated(kernel: Kernel, clock: ManualClock, run: Run) -> None:
    first = await run.submit()
    await run.complete(first.step_id or "")
    await kernel.set_policy(AGENT, "default_action: deny\n")

    again = await (await redeliver(kernel, clock, run)).submit()

    assert again.decision is Decision.REPLAY


async def test_rate_limit_without_max_wait_refuses(kernel: Kernel, run: Run) -> None:
    await kernel.set_policy(AGENT, LIMITED % "")

    outcomes = [await run.submit(request(args=f'{{"q":{i}}}')) for i in range(3)]

    assert [d.decision for d in outcomes] == [
        Decision.PROCEED,
        Decision.PROCEED,
        Decision.RATE_LIMITED,
    ]
    assert outcomes[2].reason == "rate_limit_exceeded" and outcomes[2].step_id is None
    assert outcomes[2].rule_id == "search-limit"


async def test_rate_limit_with_max_wait_parks_and_redispatches(
    kernel: Kernel, clock: ManualClock, run: Run
) -> None:
    await kernel.set_policy(AGENT, LIMITED % ", max_wait: 5m")
    for i in range(2):
        await run.submit(request(args=f'{{"q":{i}}}'))

    parked = await run.submit(request(args='{"q":2}'))

    assert parked.decision is Decision.BLOCKED and parked.reason == "rate_limit_exceeded"
    assert (await run.execution()).status is not ExecutionStatus.BLOCKED
    assert await kernel.claim(10) == []
    clock.advance(timedelta(minutes=5))
    resumed = Run(kernel, run.execution_id, await claim(kernel, run.execution_id))
    retried = await resumed.submit(request(args='{"q":2}'))
    assert retried.decision is Decision.PROCEED


async def test_token_budget_turns_allow_into_deny_once_spent(kernel: Kernel, run: Run) -> None:
    await kernel.set_policy(AGENT, BUDGET)
    llm = request("gpt-4o", '{"n": 1}', kind=StepKind.LLM_CALL)
    first = await run.submit(llm)
    usage = (
        '{"status":200,"body":"{\\"usage\\":{\\"prompt_tokens\\":80,\\"completion_tokens\\":30}}"}'
    )
    await run.complete(first.step_id or "", usage)

    refused = await run.submit(request("gpt-4o", '{"n": 2}', kind=StepKind.LLM_CALL))

    assert first.decision is Decision.PROCEED
    assert refused.decision is Decision.DENIED
    assert refused.reason == "execution_token_budget_exceeded"
    step = await kernel.get_step(run.execution_id, first.step_id or "")
    assert (step.usage_input, step.usage_output) == (80, 30)
