"""Human approvals gating a step (§15), with expiry by the background job."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from rebuno.kernel import background
from rebuno.kernel.domain.errors import Conflict, Forbidden, LeaseSuperseded
from rebuno.kernel.domain.principal import BOOTSTRAP
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import ApprovalStatus, Decision, ExecutionStatus, StepStatus
from tests.kernel.conftest import AGENT, Run, claim, redeliver, request
from tests.support import ManualClock

GATED = """
rules:
  - id: gate-shell
    when: {target: shell_exec}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 5m, message: "run a shell command?"}
"""
SHELL = request("shell_exec", '{"command": "ls"}')


@pytest.fixture
async def blocked(kernel: Kernel, run: Run) -> tuple[Run, str, str]:
    """A run whose `shell_exec` step waits for approval: (run, step id, approval id)."""
    await kernel.set_policy(AGENT, GATED)
    decision = await run.submit(SHELL)
    assert decision.decision is Decision.BLOCKED
    assert decision.step_id and decision.approval_id
    return run, decision.step_id, decision.approval_id


async def test_require_approval_blocks_execution_and_retires_its_dispatch(
    blocked: tuple[Run, str, str],
) -> None:
    run, _, approval_id = blocked

    approval = await run.kernel.get_approval(approval_id)
    assert approval.status is ApprovalStatus.PENDING
    assert approval.approvers == ("alice",)
    assert approval.message == "run a shell command?"
    assert (await run.execution()).status is ExecutionStatus.BLOCKED
    # Blocking retired the dispatch: the blocked attempt holds no live lease any more.
    with pytest.raises(LeaseSuperseded):
        await run.submit(request("other"))
    with pytest.raises(LeaseSuperseded):
        await run.kernel.heartbeat(run.execution_id, AGENT, run.lease)
    assert (await run.event_types())[-4:] == [
        "step.proposed",
        "step.awaiting_approval",
        "approval.requested",
        "execution.blocked",
    ]


async def test_granted_step_proceeds_once_on_the_resumed_run(
    kernel: Kernel, clock: ManualClock, blocked: tuple[Run, str, str]
) -> None:
    run, step_id, approval_id = blocked

    await kernel.grant_approval(approval_id, "alice", "looks fine", BOOTSTRAP)
    resumed = Run(kernel, run.execution_id, await claim(kernel, run.execution_id))
    first = await resumed.submit(SHELL)
    await resumed.complete(step_id, '"listing"')
    replayed = await (await redeliver(kernel, clock, resumed)).submit(SHELL)

    assert first.decision is Decision.PROCEED and first.step_id == step_id
    assert replayed.decision is Decision.REPLAY and replayed.result == '"listing"'
    assert (await kernel.get_approval(approval_id)).decided_by == "alice"
    assert (await run.execution()).status is ExecutionStatus.RUNNING


async def test_denied_approval_resumes_with_the_step_denied(
    kernel: Kernel, blocked: tuple[Run, str, str]
) -> None:
    run, step_id, approval_id = blocked

    await kernel.deny_approval(approval_id, "alice", "not today", BOOTSTRAP)
    resumed = Run(kernel, run.execution_id, await claim(kernel, run.execution_id))
    decision = await resumed.submit(SHELL)

    assert decision.decision is Decision.DENIED
    assert decision.reason == "not today"
    assert (await kernel.get_step(run.execution_id, step_id)).status is StepStatus.DENIED


async def test_approver_outside_the_list_is_forbidden(blocked: tuple[Run, str, str]) -> None:
    run, _, approval_id = blocked
    with pytest.raises(Forbidden):
        await run.kernel.grant_approval(approval_id, "mallory", "", BOOTSTRAP)
    assert (await run.kernel.get_approval(approval_id)).status is ApprovalStatus.PENDING


async def test_deciding_twice_is_a_conflict(blocked: tuple[Run, str, str]) -> None:
    run, _, approval_id = blocked
    await run.kernel.grant_approval(approval_id, "alice", "", BOOTSTRAP)
    with pytest.raises(Conflict):
        await run.kernel.deny_approval(approval_id, "alice", "", BOOTSTRAP)


async def test_expired_approval_denies_the_step_with_approval_timeout(
    kernel: Kernel, clock: ManualClock, blocked: tuple[Run, str, str]
) -> None:
    run, _, approval_id = blocked
    clock.advance(timedelta(minutes=5, seconds=1))

    assert await background.expire_approvals(kernel) == 1
    resumed = Run(kernel, run.execution_id, await claim(kernel, run.execution_id))
    decision = await resumed.submit(SHELL)

    assert (await kernel.get_approval(approval_id)).status is ApprovalStatus.EXPIRED
    assert decision.decision is Decision.DENIED and decision.reason == "approval_timeout"


async def test_grant_racing_expiry_resolves_exactly_once(
    kernel: Kernel, clock: ManualClock, blocked: tuple[Run, str, str]
) -> None:
    run, _, approval_id = blocked
    clock.advance(timedelta(minutes=6))

    outcomes = await asyncio.gather(
        kernel.grant_approval(approval_id, "alice", "", BOOTSTRAP),
        background.expire_approvals(kernel),
        return_exceptions=True,
    )

    resolutions = [t for t in await run.event_types() if t.startswith("approval.")]
    assert resolutions[0] == "approval.requested"
    assert len(resolutions) == 2, (resolutions, outcomes)
    assert (await run.event_types()).count("execution.resumed") == 1


async def test_cancel_expires_pending_approvals(blocked: tuple[Run, str, str]) -> None:
    run, step_id, approval_id = blocked

    await run.kernel.cancel_execution(run.execution_id)

    approval = await run.kernel.get_approval(approval_id)
    assert approval.status is ApprovalStatus.EXPIRED
    assert approval.rationale == "execution_cancelled"
    assert (await run.kernel.get_step(run.execution_id, step_id)).status is StepStatus.DENIED


@pytest.mark.parametrize("decide", ["grant", "deny"])
async def test_a_decision_at_or_after_the_timeout_resolves_the_approval_as_expired(
    blocked: tuple[Run, str, str], clock: ManualClock, decide: str
) -> None:
    run, step_id, approval_id = blocked
    clock.advance(timedelta(minutes=5))  # exactly `timeout_at`: the sweep has not run yet

    resolve = run.kernel.grant_approval if decide == "grant" else run.kernel.deny_approval
    with pytest.raises(Conflict, match="expired"):
        await resolve(approval_id, "alice", "looks fine", BOOTSTRAP)

    approval = await run.kernel.get_approval(approval_id)
    assert (approval.status, approval.decided_by) == (ApprovalStatus.EXPIRED, None)
    step = await run.kernel.get_step(run.execution_id, step_id)
    assert step.status is StepStatus.DENIED
    assert "approval_timeout" in (step.error or "")
    assert (await run.execution()).status is ExecutionStatus.RUNNING
    assert await background.expire_approvals(run.kernel) == 0  # nothing left for the sweep
