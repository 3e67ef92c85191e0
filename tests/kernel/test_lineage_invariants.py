"""Invariants of sessions and sub-agents held by the store and the decision core themselves,
on both stores (docs/protocol.md §24.3, §25): a session never has two admitted live
executions, whatever writes them; and a sub-agent's token use is its own, never its parent's
budget."""

from __future__ import annotations

import pytest

from rebuno.kernel.domain.errors import Conflict
from rebuno.kernel.service.executions import Labels
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.enums import Decision, StepKind
from tests.kernel.conftest import AGENT, Run, claim, request
from tests.kernel.test_policy import BUDGET

USAGE = '{"status":200,"body":"{\\"usage\\":{\\"prompt_tokens\\":80,\\"completion_tokens\\":30}}"}'


async def test_a_second_admitted_live_execution_of_a_session_is_refused(kernel: Kernel) -> None:
    holder = await kernel.create_execution(AGENT, "null", None, Labels(session="s"))
    waiter = await kernel.create_execution(AGENT, "null", None, Labels(session="s"))
    assert holder.admitted_at is not None and waiter.admitted_at is None

    # Past the service, as a faulty writer would: the partial unique index refuses it.
    with pytest.raises(Conflict):
        async with kernel.store.transaction(waiter.id) as tx:
            await tx.admit(waiter.id, kernel.clock(), None)

    assert (await kernel.get_execution(waiter.id)).admitted_at is None


async def test_a_sub_agents_tokens_do_not_count_toward_its_parents_budget(
    kernel: Kernel, run: Run
) -> None:
    await kernel.set_policy(AGENT, BUDGET)
    tool = await run.submit(request("delegate", '{"task": 1}'))
    child = await kernel.create_execution(
        AGENT, "null", None, Labels(spawned_by=(run.execution_id, tool.step_id or ""))
    )
    worker = Run(kernel, child.id, await claim(kernel, child.id))
    llm = request("gpt-4o", '{"n": 1}', kind=StepKind.LLM_CALL)
    spent = await worker.submit(llm)
    await worker.complete(spent.step_id or "", USAGE)  # 110 tokens: over the child's budget
    over = await worker.submit(request("gpt-4o", '{"n": 2}', kind=StepKind.LLM_CALL))

    parents = await run.submit(request("gpt-4o", '{"n": 3}', kind=StepKind.LLM_CALL))

    assert over.decision is Decision.DENIED  # the child's own budget is spent
    assert parents.decision is Decision.PROCEED  # the parent's is untouched
