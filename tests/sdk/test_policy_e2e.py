"""Policy end to end: a kernel on loopback enforces an agent's bundle on the steps of a real SDK
agent served on loopback, on SQLite and on PostgreSQL. Denials, approvals granted, denied,
expired and raced against expiry, rate limits that park or refuse, token budgets metered from
the usage of recorded LLM calls, and RE2 predicates on adversarial arguments.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest

from harness.llm_provider import FakeProvider, openai_client
from harness.polling import wait_until
from rebuno import (
    Client,
    ConflictError,
    PolicyError,
    RateLimited,
    raise_for_refusal,
    step,
    tool,
)
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve
from rebuno.types import Approval, Event, ExecutionStatus
from tests.sdk.conftest import Harness
from tests.sdk.loopback import serving

NO_SHELL = """
default_action: allow
rules:
  - id: no-shell
    when: {target: shell}
    then: {decision: deny, reason: no shell access}
"""
SILENT_DENY = """
default_action: allow
rules:
  - id: quiet-no
    when: {target: shell}
    then: {decision: deny}
"""
DENY_BY_DEFAULT = "default_action: deny\n"
REVIEW_CHARGES = """
default_action: allow
rules:
  - id: review-charges
    when: {target: charge}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 1m, message: a charge waits}
"""
HASTY_REVIEW = """
default_action: allow
rules:
  - id: hasty-review
    when: {target: charge}
    then:
      decision: require_approval
      approval_config: {timeout: 200ms}
"""
RACING_REVIEW = """
default_action: allow
rules:
  - id: racing-review
    when: {target: charge}
    then:
      decision: require_approval
      approval_config: {timeout: 1s}
"""
SEARCH_PARKS = """
default_action: allow
rules:
  - id: search-quota
    when: {target: search}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 300ms, max_wait: 5s}
"""
SEARCH_REFUSES = """
default_action: allow
rules:
  - id: search-quota
    when: {target: search}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
"""
BUDGET = """
default_action: allow
rules:
  - id: llm-budget
    when: {step_kind: llm_call}
    then:
      decision: allow
      budget: {max_tokens: 20, on_exceed: ON_EXCEED}
"""
RUNAWAY_REGEX = """
default_action: allow
rules:
  - id: no-runaway
    when:
      target: echo
      arguments:
        text: {regex: '(a+)+$'}
    then: {decision: deny, reason: only a's}
"""
RESOLUTIONS = frozenset({"approval.granted", "approval.denied", "approval.expired"})
ADVERSARIAL_SIZE = 100_000


@pytest.fixture
def kernel_settings(kernel_settings: Settings) -> Settings:
    # Approvals here time out after 200ms, so the expiry sweep must look often.
    return replace(kernel_settings, deadline_check_interval=timedelta(milliseconds=20))


@pytest.fixture
async def provider() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider()
    async with serving(fake) as url:
        yield fake, url + "/v1"


async def all_events(harness: Harness, execution_id: str) -> list[Event]:
    events: list[Event] = []
    while page := await harness.client.events(
        execution_id, after_seq=events[-1].event_seq if events else 0
    ):
        events.extend(page)
    return events


async def event_types(harness: Harness, execution_id: str) -> Counter[str]:
    return Counter(event.type for event in await all_events(harness, execution_id))


async def requested_approval(harness: Harness, execution_id: str) -> Approval:
    found: list[Approval] = []

    async def requested() -> bool:
        found[:] = await harness.client.list_approvals(status="all", execution_id=execution_id)
        return bool(found)

    await wait_until(requested, timeout=20, message=f"an approval for {execution_id}")
    return found[0]


def denial_of(error: PolicyError) -> dict[str, str]:
    return {"reason": error.reason, "rule_id": error.rule_id}


# -- deny ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bundle", "reason", "rule_id"),
    [
        (NO_SHELL, "no shell access", "no-shell"),
        (SILENT_DENY, "policy_denied", "quiet-no"),
    ],
    ids=["rule-reason", "no-reason"],
)
async def test_deny_reaches_the_handler_as_policy_error_with_rule_id(
    harness: Harness, bundle: str, reason: str, rule_id: str
) -> None:
    ran: list[str] = []

    async def process() -> dict[str, str]:
        try:
            await step("shell", lambda: ran.append("shell"))
        except PolicyError as denial:
            return {**denial_of(denial), "step_id": denial.step_id}
        return {}

    async with harness.serve("walled", process, policy=bundle):
        done = await harness.run("walled")

    [denied] = await harness.client.list_steps(done.id)
    assert done.output == {"reason": reason, "rule_id": rule_id, "step_id": denied.step_id}
    assert (denied.status, denied.error) == ("denied", {"reason": reason, "rule_id": rule_id})
    assert ran == []


async def test_denied_tool_call_returns_the_documented_string(harness: Harness) -> None:
    ran: list[str] = []

    @tool
    async def shell(command: str) -> str:
        ran.append(command)
        return "done"

    async def process() -> str:
        return str(await shell("rm -rf /"))

    async with harness.serve("shell-user", process, policy=NO_SHELL):
        done = await harness.run("shell-user")

    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == "shell not allowed. reason: no shell access"
    assert ran == []
    [denied] = [e for e in await all_events(harness, done.id) if e.type == "step.denied"]
    assert (denied.payload["target"], denied.payload["rule_id"]) == ("shell", "no-shell")


async def test_default_deny_refuses_unmatched_tools_but_allows_local_steps(
    harness: Harness,
) -> None:
    @tool
    async def shell(command: str) -> str:
        return "done"

    async def process() -> list[Any]:
        return [await step("clock", lambda: 7), await shell("ls")]

    async with harness.serve("locked-down", process, policy=DENY_BY_DEFAULT):
        done = await harness.run("locked-down")

    assert done.output == [7, "shell not allowed. reason: no explicit allow rule matched"]
    decided = [e for e in await all_events(harness, done.id) if e.type.startswith("step.")]
    rules = [(e.type, e.payload.get("rule_id")) for e in decided if e.payload.get("rule_id")]
    assert rules == [("step.allowed", "local"), ("step.denied", "default")]


async def test_unhandled_denial_fails_the_execution_with_the_rule_reason(
    harness: Harness,
) -> None:
    async def process() -> None:
        await step("shell", lambda: None)

    async with harness.serve("careless", process, policy=NO_SHELL):
        done = await harness.run("careless")

    assert done.status is ExecutionStatus.FAILED
    assert done.failure_reason == "policy_denied: no shell access"


async def test_bundle_replaced_over_http_decides_the_next_new_step(harness: Harness) -> None:
    async def process() -> str:
        return str(await step("shell", lambda: "ran"))

    async with harness.serve("converted", process):
        before = await harness.run("converted")
        async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
            answer = await http.post("/v0/policies/converted", json={"bundle": NO_SHELL})
        after = await harness.run("converted")

    assert answer.status_code == 204
    assert before.output == "ran"
    [allowed] = [e for e in await all_events(harness, before.id) if e.type == "step.allowed"]
    assert allowed.payload["rule_id"] == "permissive"
    assert after.failure_reason == "policy_denied: no shell access"


async def test_bundle_with_a_mistake_is_refused_naming_rule_and_field(harness: Harness) -> None:
    typo = "rules:\n  - id: cap\n    when: {taget: shell}\n    then: {decision: deny}\n"

    await harness.register("typo", "http://127.0.0.1:9/webhook")
    async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
        refused = await http.post("/v0/policies/typo", json={"bundle": typo})

    assert refused.status_code == 400
    assert refused.json()["code"] == "validation_error"
    assert refused.json()["message"] == (
        "policy, line 3: rule 'cap': field 'when.taget': unknown field (did you mean 'target'?)"
    )


# -- approvals ---------------------------------------------------------------------------


async def test_granted_approval_runs_the_step_exactly_once_and_the_run_completes(
    harness: Harness,
) -> None:
    charged: list[int] = []
    deliveries: list[int] = []

    @tool
    async def charge(cents: int) -> str:
        charged.append(cents)
        return f"charged {cents}"

    async def process(cents: int) -> str:
        deliveries.append(cents)
        return str(await charge(cents))

    async with harness.serve("merchant", process, policy=REVIEW_CHARGES):
        created = await harness.client.create("merchant", {"cents": 250})
        approval = await requested_approval(harness, created.id)
        assert charged == []
        await harness.client.grant_approval(approval.id, decided_by="alice", rationale="ok")
        done = await harness.client.wait(created.id, timeout=20)

    assert done.output == "charged 250"
    assert charged == [250]
    assert deliveries == [250, 250]
    assert (approval.message, approval.approvers) == ("a charge waits", ["alice"])
    decided = await harness.client.get_approval(approval.id)
    assert (decided.status, decided.decided_by, decided.rationale) == ("granted", "alice", "ok")
    types = await event_types(harness, created.id)
    assert types["approval.granted"] == types["execution.resumed"] == 1
    assert types["step.executing"] == types["step.succeeded"] == 1


@pytest.mark.parametrize(
    ("rationale", "reason"),
    [("not this month", "not this month"), ("", "approval_denied")],
    ids=["with-rationale", "without-rationale"],
)
async def test_denied_approval_resumes_the_run_with_the_step_denied(
    harness: Harness, rationale: str, reason: str
) -> None:
    charged: list[str] = []

    async def process() -> dict[str, str]:
        try:
            await step("charge", lambda: charged.append("charge"))
        except PolicyError as denial:
            return denial_of(denial)
        return {}

    async with harness.serve("refused", process, policy=REVIEW_CHARGES):
        created = await harness.client.create("refused")
        approval = await requested_approval(harness, created.id)
        await harness.client.deny_approval(approval.id, decided_by="alice", rationale=rationale)
        done = await harness.client.wait(created.id, timeout=20)

    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == {"reason": reason, "rule_id": ""}
    assert charged == []
    [denied] = await harness.client.list_steps(created.id)
    assert (denied.status, denied.error) == ("denied", {"reason": reason})
    types = await event_types(harness, created.id)
    assert types["approval.denied"] == types["execution.resumed"] == 1


async def test_expired_approval_resumes_the_run_with_the_step_denied(harness: Harness) -> None:
    charged: list[str] = []

    async def process() -> dict[str, str]:
        try:
            await step("charge", lambda: charged.append("charge"))
        except PolicyError as denial:
            return denial_of(denial)
        return {}

    async with harness.serve("forgotten", process, policy=HASTY_REVIEW):
        done = await harness.run("forgotten")

    assert done.output == {"reason": "approval_timeout", "rule_id": ""}
    assert charged == []
    [approval] = await harness.client.list_approvals(status="all", execution_id=done.id)
    assert (approval.status, approval.rationale) == ("expired", "timeout")
    types = await event_types(harness, done.id)
    assert types["approval.expired"] == types["execution.resumed"] == 1


async def test_expired_approval_reaches_a_tool_as_the_documented_string(
    harness: Harness,
) -> None:
    @tool
    async def charge(cents: int) -> str:
        return f"charged {cents}"

    async def process() -> str:
        return str(await charge(100))

    async with harness.serve("tool-forgotten", process, policy=HASTY_REVIEW):
        done = await harness.run("tool-forgotten")

    assert done.output == "charge not allowed. reason: approval_timeout"


async def test_grant_racing_expiry_resolves_each_approval_exactly_once(harness: Harness) -> None:
    # Grants land from 20ms before to 40ms after each approval's deadline while the expiry
    # sweep ticks every 20ms, so either side may win; whichever wins, it wins alone.
    offsets_ms = [-20, -10, -5, 0, 5, 10, 20, 40]
    charged: list[str] = []

    async def process(key: str) -> str:
        try:
            await step("charge", lambda: charged.append(key))
        except PolicyError as denial:
            return denial.reason
        return "charged"

    async with harness.serve("racer", process, policy=RACING_REVIEW):
        created = [await harness.client.create("racer", {"key": str(o)}) for o in offsets_ms]
        approvals = await requested_approvals(harness, [e.id for e in created])
        granted = await asyncio.gather(
            *(
                grant_at(harness, approvals[e.id], o)
                for e, o in zip(created, offsets_ms, strict=True)
            )
        )
        done = [await harness.client.wait(e.id, timeout=10) for e in created]

    for execution, won in zip(done, granted, strict=True):
        types = await event_types(harness, execution.id)
        resolved = {name: types[name] for name in RESOLUTIONS if types[name]}
        assert resolved == {"approval.granted" if won else "approval.expired": 1}, execution.id
        assert types["execution.resumed"] == 1, execution.id
        assert execution.output == ("charged" if won else "approval_timeout"), execution.id
    assert sorted(charged) == sorted(
        str(o) for o, won in zip(offsets_ms, granted, strict=True) if won
    )


async def requested_approvals(harness: Harness, execution_ids: list[str]) -> dict[str, Approval]:
    found: dict[str, Approval] = {}

    async def all_requested() -> bool:
        listed = await harness.client.list_approvals(status="all")
        found.update({a.execution_id: a for a in listed if a.execution_id in execution_ids})
        return len(found) == len(execution_ids)

    await wait_until(all_requested, timeout=20, message="every approval requested")
    return found


async def grant_at(harness: Harness, approval: Approval, offset_ms: int) -> bool:
    """Grants `approval` `offset_ms` after its deadline; False when the expiry won."""
    fire_at = datetime.fromisoformat(approval.timeout_at) + timedelta(milliseconds=offset_ms)
    await wait_until(lambda: datetime.now(UTC) >= fire_at, timeout=10, message="grant time")
    try:
        await harness.client.grant_approval(approval.id)
    except ConflictError:
        return False
    return True


@asynccontextmanager
async def kernel_on(settings: Settings) -> AsyncIterator[str]:
    """A kernel with these exact settings, for the test that needs a pool of one connection."""
    urls: list[str] = []
    task = asyncio.create_task(serve(settings, on_ready=urls.append), name="kernel")
    await wait_until(lambda: bool(urls) or task.done(), timeout=20, message="kernel ready")
    if task.done():
        task.result()
    try:
        yield urls[0]
    finally:
        task.cancel()
        await asyncio.wait({task}, timeout=10)


@pytest.mark.postgres
async def test_refused_approval_decision_leaves_the_postgres_kernel_answering(
    postgres_url: str,
) -> None:
    # One pooled connection and no timed background work: every statement below shares it.
    settings = Settings(
        dev=True,
        listen_addr="127.0.0.1:0",
        db_url=postgres_url,
        db_min_conns=1,
        db_max_conns=1,
        dispatch_poll_interval=timedelta(hours=1),
        deadline_check_interval=timedelta(0),
    )

    async def process() -> str:
        try:
            return str(await step("charge", lambda: "charged"))
        except PolicyError as denial:
            return denial.reason

    async with kernel_on(settings) as url, Client(base_url=url) as client:
        harness = Harness(url, client)
        async with harness.serve("decided", process, policy=REVIEW_CHARGES):
            created = await client.create("decided")
            approval = await requested_approval(harness, created.id)
            await client.deny_approval(approval.id, decided_by="alice", rationale="no")
            await client.wait(created.id, timeout=20)
            with pytest.raises(ConflictError):
                await client.grant_approval(approval.id, decided_by="alice")
            reads = [(await client.get_approval(approval.id)).status for _ in range(3)]

    assert reads == ["denied", "denied", "denied"]


# -- rate limits ---------------------------------------------------------------------------


async def test_rate_limit_with_max_wait_parks_and_the_run_completes_later(
    harness: Harness,
) -> None:
    searched: list[str] = []
    deliveries: list[str] = []

    @tool
    async def search(query: str) -> str:
        searched.append(query)
        return f"hit {query}"

    async def process() -> list[str]:
        deliveries.append("delivered")
        return [await search("a"), await search("b")]

    async with harness.serve("patient", process, policy=SEARCH_PARKS):
        done = await harness.run("patient")

    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == ["hit a", "hit b"]
    assert searched == ["a", "b"]
    assert len(deliveries) == 2
    [limited] = [e for e in await all_events(harness, done.id) if e.type == "step.rate_limited"]
    assert limited.payload["rule_id"] == "search-quota"
    assert limited.payload["error"]["reason"] == "rate_limit_exceeded"


async def test_rate_limit_without_max_wait_refuses_with_rate_limited(harness: Harness) -> None:
    searched: list[str] = []

    @tool
    async def search(query: str) -> str:
        searched.append(query)
        return f"hit {query}"

    async def process() -> dict[str, Any]:
        first = await search("a")
        try:
            await search("b")
        except RateLimited as refused:
            return {"first": first, "reason": refused.reason, "rule_id": refused.rule_id}
        return {}

    async with harness.serve("hasty", process, policy=SEARCH_REFUSES):
        done = await harness.run("hasty")

    assert done.output == {
        "first": "hit a",
        "reason": "rate_limit_exceeded",
        "rule_id": "search-quota",
    }
    assert searched == ["a"]
    assert len(await harness.client.list_steps(done.id)) == 1
    assert (await event_types(harness, done.id))["step.rate_limited"] == 1


async def test_unhandled_rate_limit_fails_the_execution_with_its_reason(
    harness: Harness,
) -> None:
    @tool
    async def search(query: str) -> str:
        return f"hit {query}"

    async def process() -> list[str]:
        return [await search("a"), await search("b")]

    async with harness.serve("greedy", process, policy=SEARCH_REFUSES):
        done = await harness.run("greedy")

    assert done.status is ExecutionStatus.FAILED
    assert done.failure_reason == "rate_limit_exceeded"


# -- token budgets -------------------------------------------------------------------------


async def ask(llm: openai.AsyncOpenAI, question: str) -> str:
    try:
        reply = await llm.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": question}]
        )
    except openai.APIError as exc:
        raise_for_refusal(exc)
        raise
    return reply.choices[0].message.content or ""


def budgeted_asker(base_url: str) -> Any:
    async def process() -> dict[str, Any]:
        answers: list[str] = []
        async with openai_client(base_url) as llm:
            try:
                for question in ("one", "two", "three"):
                    answers.append(await ask(llm, question))
            except PolicyError as denial:
                return {"answers": answers, "denied": denial.reason}
        return {"answers": answers}

    return process


async def test_token_budget_denies_once_recorded_usage_crosses_max_tokens(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    # Each provider answer reports 5 + 7 tokens: 0 and 12 spent are under 20, 24 is not.
    fake, base_url = provider
    bundle = BUDGET.replace("ON_EXCEED", "deny")

    async with harness.serve("thrifty", budgeted_asker(base_url), policy=bundle):
        done = await harness.run("thrifty")

    assert done.output == {
        "answers": ["reply #1 to one", "reply #2 to two"],
        "denied": "execution_token_budget_exceeded",
    }
    assert len(fake.calls) == 2
    first, second, third = await harness.client.list_steps(done.id)
    usage = {"input_tokens": 5, "output_tokens": 7}
    assert (first.usage, second.usage) == (usage, usage)
    assert third.error == {"reason": "execution_token_budget_exceeded", "rule_id": "llm-budget"}


async def test_token_budget_on_exceed_require_approval_runs_the_call_once_granted(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    fake, base_url = provider
    bundle = BUDGET.replace("ON_EXCEED", "require_approval")

    async with harness.serve("reviewed", budgeted_asker(base_url), policy=bundle):
        created = await harness.client.create("reviewed")
        approval = await requested_approval(harness, created.id)
        await harness.client.grant_approval(approval.id)
        done = await harness.client.wait(created.id, timeout=20)

    assert done.output == {"answers": ["reply #1 to one", "reply #2 to two", "reply #3 to three"]}
    assert len(fake.calls) == 3
    awaiting = [e for e in await all_events(harness, done.id) if e.type == "step.awaiting_approval"]
    assert [e.payload["rule_id"] for e in awaiting] == ["llm-budget"]


# -- RE2 -------------------------------------------------------------------------------------


async def test_regex_predicate_decides_a_100kb_adversarial_argument(harness: Harness) -> None:
    # `(a+)+$` backtracks exponentially on a run of a's followed by a mismatch; RE2 does not.
    @tool
    async def echo(text: str) -> int:
        return len(text)

    async def process() -> list[Any]:
        return [await echo("a" * ADVERSARIAL_SIZE + "!"), await echo("a" * ADVERSARIAL_SIZE)]

    async with harness.serve("echoer", process, policy=RUNAWAY_REGEX):
        done = await harness.run("echoer", timeout=60)

    assert done.output == [ADVERSARIAL_SIZE + 1, "echo not allowed. reason: only a's"]
