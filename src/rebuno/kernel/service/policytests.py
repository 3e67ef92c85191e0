"""Testing a policy bundle (§35): written cases, or recorded executions replayed through it.

Evaluates with the kernel's own compiled bundles (`bundles`, the cache submissions use) and
`policy.suite`, which calls the engine that decides submitted steps. Only reads: no event,
rate token, approval or bundle is written, and nothing of the agent changes.
Must not import a concrete store backend, the API, httpx or another use-case module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.records import Execution
from rebuno.kernel.policy.engine import Bundle
from rebuno.kernel.policy.suite import (
    PolicyCase,
    PolicyReport,
    read_cases,
    replay_cases,
    run_cases,
)
from rebuno.kernel.service.context import Context
from rebuno.kernel.store.base import ExecutionFilter

REPLAYED_BY_DEFAULT = 100
REPLAYED_AT_MOST = 1000
_PAGE = 100


@dataclass(frozen=True, slots=True)
class ReplayedExecutions:
    """The agent's executions to replay, newest first: those of `session` (when given),
    stopping at the first created before `since`, at most `limit` of them."""

    session: str | None = None
    since: datetime | None = None
    limit: int = REPLAYED_BY_DEFAULT


@dataclass(frozen=True, slots=True)
class PolicyTest:
    """What `test_policy` runs: `bundle` ("" for the agent's own), and either written
    `cases` (JSON values, normalised here) or a replay source."""

    bundle: str = ""
    cases: Sequence[object] = ()
    execution_id: str | None = None
    executions: ReplayedExecutions | None = None


class PolicyTestUseCases(Context):
    async def test_policy(self, agent_id: str, test: PolicyTest) -> PolicyReport:
        """§35.1 in its order: the agent, the bundle, the cases, then evaluation."""
        agent = await self.store.get_agent(agent_id)
        text = test.bundle or agent.policy_bundle or ""
        if not text:
            raise ValidationFailed(
                f"validation error: agent {agent_id} has no policy bundle; send one in bundle"
            )
        bundle = self._compiled(text)
        if test.execution_id is not None and test.executions is not None:
            raise ValidationFailed("validation error: give execution_id or executions, not both")
        if test.execution_id is not None:
            cases = await self._replayed(agent_id, test.execution_id)
        elif test.executions is not None:
            cases = await self._replayed_executions(agent_id, test.executions)
        else:
            cases = read_cases(test.cases, agent_id)
        return run_cases(bundle, policy_hash(text), cases)

    def _compiled(self, text: str) -> Bundle:
        try:
            return self.bundles.get(text)
        except ValidationFailed as error:
            raise ValidationFailed(
                f"validation error: invalid policy bundle: {error.message}", error.details
            ) from None

    async def _replayed(self, agent_id: str, execution_id: str) -> list[PolicyCase]:
        history = await self.store.load_step_history(execution_id)
        if history.execution.agent_id != agent_id:
            raise ValidationFailed(
                f"validation error: execution {execution_id} belongs to agent"
                f" {history.execution.agent_id}, not {agent_id}"
            )
        return replay_cases(history.execution, history.steps, history.decisions)

    async def _replayed_executions(
        self, agent_id: str, selected: ReplayedExecutions
    ) -> list[PolicyCase]:
        cases: list[PolicyCase] = []
        for execution in await self._selected(agent_id, selected):
            history = await self.store.load_step_history(execution.id)
            cases += replay_cases(history.execution, history.steps, history.decisions)
        return cases

    async def _selected(self, agent_id: str, selected: ReplayedExecutions) -> list[Execution]:
        """Newest first (ids are time-ordered), page by page, until `since` or `limit`."""
        found: list[Execution] = []
        cursor: str | None = None
        while len(found) < selected.limit:
            flt = ExecutionFilter(
                agent_id=agent_id,
                session=selected.session,
                cursor=cursor,
                limit=min(_PAGE, selected.limit - len(found)),
                payload_limit=0,
            )
            page = await self.store.list_executions(flt)
            for execution in page.items:
                if selected.since is not None and execution.origin.created_at < selected.since:
                    return found
                found.append(execution)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        return found
