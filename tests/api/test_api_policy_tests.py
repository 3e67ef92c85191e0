"""`POST /v0/policies/{agent_id}/test` (§35): written cases and recorded executions run through
a bundle with the kernel's own engine, the report's fields, the refusals in their order, and
that testing writes nothing; and `policy_hash` on the decision events real steps get (§35.6).
Both stores."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rebuno.kernel.domain.decision import StepRequest
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.principal import BOOTSTRAP
from rebuno.kernel.domain.records import Execution, Lease
from rebuno.kernel.service.executions import Labels
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.canonical import args_hash, canonical_args
from rebuno.protocol.enums import Decision, Idempotency, StepKind
from rebuno.protocol.times import format_timestamp
from tests.api.harness import AGENT, SECRET, assert_error, claim
from tests.rawsql import RawSql
from tests.support import ManualClock

ROUTE = f"/v0/policies/{AGENT}/test"
UNKNOWN = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"
SHELL = """\
rules:
  - id: allow-llm
    when: {step_kind: llm_call}
    then: {decision: allow}
  - id: allow-safe-shell
    when:
      target: shell_exec
      arguments:
        command: {regex: '^(ls|cat)( [^;&|]*)?$'}
    then: {decision: allow}
  - id: approve-other-shell
    when: {target: shell_exec}
    then: {decision: require_approval}
default_action: deny
"""
STRICT = """\
rules:
  - id: no-shell
    when: {target: shell_exec}
    then: {decision: deny, reason: no shell here}
  - id: review-search
    when: {target: web_search}
    then: {decision: require_approval}
default_action: allow
"""
ALLOW_ALL = "default_action: allow\n"
ALLOW_ALL_HASH = "0973bfcee70676a2626eaac4f1e6e0656c5dfaaef9fa86a6f8680fb60e020454"


def step(target: str, args: dict[str, Any] | None = None, kind: str = "tool_call") -> StepRequest:
    text = canonical_args(json.dumps(args))
    return StepRequest(
        StepKind(kind),
        target,
        None if args is None else text,
        args_hash(text),
        Idempotency.SAFE_TO_RETRY,
    )


async def run_steps(kernel: Kernel, execution: Execution, *steps: StepRequest) -> Lease:
    """Submits each step in the execution's first delivery, completing those that proceed."""
    lease = await claim(kernel, execution.id)
    for request in steps:
        decided = await kernel.submit_step(execution.id, AGENT, lease, request)
        if decided.decision is Decision.PROCEED:
            assert decided.step_id is not None
            await kernel.complete_step(execution.id, AGENT, decided.step_id, lease, '"ok"')
    return lease


async def report_of(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(ROUTE, json=body)
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    return report


# -- §35.7 P1: written cases -------------------------------------------------------------------
async def test_written_cases_report_each_decision_and_each_miss(client: httpx.AsyncClient) -> None:
    cases = [
        {"name": "safe", "target": "shell_exec", "args": {"command": "ls /tmp"}, "expect": "allow"},
        {
            "name": "chained",
            "target": "shell_exec",
            "args": {"command": "ls; rm -rf /"},
            "expect": "deny",
        },
        {
            "name": "wrong rule",
            "target": "shell_exec",
            "args": {"command": "cat f"},
            "expect_rule": "approve-other-shell",
        },
    ]

    report = await report_of(client, {"bundle": SHELL, "cases": cases})

    assert report["failed"] == 2
    assert report["unexercised_rules"] == ["allow-llm"]
    first, second, third = report["results"]
    assert first == {
        "name": "safe",
        "agent_id": AGENT,
        "kind": "tool_call",
        "target": "shell_exec",
        "args": {"command": "ls /tmp"},
        "expect": "allow",
        "decision": "allow",
        "rule_id": "allow-safe-shell",
        "pass": True,
    }
    assert (second["decision"], second["rule_id"]) == ("require_approval", "approve-other-shell")
    assert second["failure"] == "require_approval, want deny"
    assert third["failure"] == "rule allow-safe-shell, want approve-other-shell"
    assert (second["pass"], third["pass"]) == (False, False)


async def test_a_case_gets_the_engine_s_reason_and_its_own_agent_and_kind(
    client: httpx.AsyncClient,
) -> None:
    cases = [
        {"target": "gpt-4o", "kind": "llm_call", "agent_id": "other"},
        {"target": "deploy"},
        {"target": "clock", "kind": "local"},
    ]

    report = await report_of(client, {"bundle": SHELL, "cases": cases})

    llm, default, local = report["results"]
    assert (llm["agent_id"], llm["kind"], llm["rule_id"]) == ("other", "llm_call", "allow-llm")
    assert "reason" not in llm
    assert (default["decision"], default["rule_id"]) == ("deny", "default")
    assert default["reason"] == "no explicit allow rule matched"
    assert (local["decision"], local["rule_id"]) == ("allow", "local")
    assert report["unexercised_rules"] == ["allow-safe-shell", "approve-other-shell"]
    assert report["failed"] == 0


async def test_the_report_carries_the_tested_bundle_s_hash(client: httpx.AsyncClient) -> None:
    report = await report_of(client, {"bundle": ALLOW_ALL, "cases": [{"target": "x"}]})

    assert report["policy_hash"] == ALLOW_ALL_HASH
    assert report["unexercised_rules"] == []


async def test_without_a_bundle_the_agent_s_stored_one_is_tested(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    await kernel.set_policy(AGENT, SHELL)

    report = await report_of(
        client, {"cases": [{"target": "shell_exec", "args": {"command": "rm"}}]}
    )

    assert report["results"][0]["rule_id"] == "approve-other-shell"


# -- §35.7 P3: refusals ------------------------------------------------------------------------
async def test_an_agent_without_a_bundle_needs_one_in_the_request(
    client: httpx.AsyncClient,
) -> None:
    assert_error(
        await client.post(ROUTE, json={"cases": [{"target": "x"}]}), 400, "validation_error"
    )


async def test_an_unknown_agent_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/policies/ghost/test", json={"bundle": ALLOW_ALL})
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"cases": [{"target": "x", "expects": "allow"}]}, "case 1: unknown field 'expects'"),
        ({"cases": [{"target": "x"}, {"args": {}}]}, "case 2: missing target"),
        ({"cases": [{"target": "x", "kind": "tool"}]}, "case 1: kind must be one of"),
        ({"cases": [{"target": "x", "expect": "block"}]}, "case 1: expect must be one of"),
        ({"cases": [{"target": "x", "args": [1]}]}, "case 1: args must be an object"),
        ({"cases": [{"target": 5}]}, "case 1: target must be a string"),
        ({"cases": ["x"]}, "case 1: must be an object"),
        ({"cases": {"target": "x"}}, "cases must be an array"),
        ({"execution_id": "not-a-uuid"}, "invalid execution_id"),
        ({"executions": {"limits": 5}}, "executions.limits: unknown field"),
        ({"executions": {"since": "yesterday"}}, "executions.since"),
        ({"execution_id": UNKNOWN, "executions": {}}, "not both"),
    ],
    ids=[
        "misspelt-key",
        "missing-target",
        "unknown-kind",
        "unknown-expect",
        "args-not-object",
        "target-not-text",
        "case-not-object",
        "cases-not-array",
        "bad-execution-id",
        "unknown-selector-key",
        "bad-since",
        "two-replay-sources",
    ],
)
async def test_a_malformed_request_is_refused_naming_what_is_wrong(
    client: httpx.AsyncClient, body: dict[str, Any], message: str
) -> None:
    response = await client.post(ROUTE, json={"bundle": ALLOW_ALL, **body})

    envelope = assert_error(response, 400, "validation_error")
    assert message in envelope["message"]


async def test_an_empty_body_is_refused(client: httpx.AsyncClient) -> None:
    assert_error(await client.post(ROUTE, content=b""), 400, "validation_error")


async def test_a_bundle_that_does_not_compile_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post(ROUTE, json={"bundle": "rules: 5\n", "cases": []})

    envelope = assert_error(response, 400, "validation_error")
    assert envelope["message"].startswith("validation error: invalid policy bundle: policy, line 1")


async def test_the_agent_is_looked_up_before_the_bundle_is_compiled(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v0/policies/ghost/test", json={"bundle": "rules: 5\n"})
    assert_error(response, 404, "not_found")


async def test_the_route_needs_the_bearer_token(anon: httpx.AsyncClient) -> None:
    response = await anon.post(ROUTE, json={"bundle": ALLOW_ALL})
    assert_error(response, 401, "unauthorized")


# -- §35.3 / P2: replaying recorded executions -------------------------------------------------
async def test_a_replayed_step_expects_its_first_decision_not_the_grant(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, SHELL)
    lease = await claim(kernel, execution.id)
    held = await kernel.submit_step(
        execution.id, AGENT, lease, step("shell_exec", {"command": "rm x"})
    )
    assert held.approval_id is not None
    await kernel.grant_approval(held.approval_id, "alice", "", BOOTSTRAP)

    report = await report_of(client, {"bundle": ALLOW_ALL, "execution_id": execution.id})

    [result] = report["results"]
    assert result["expect"] == "require_approval"
    assert result["was_rule"] == "approve-other-shell"
    assert (result["execution_id"], result["step_id"]) == (execution.id, held.step_id)
    assert result["args"] == {"command": "rm x"}
    assert (result["decision"], result["pass"]) == ("allow", False)
    assert result["failure"] == "allow, want require_approval"


async def test_a_stricter_bundle_reports_the_steps_it_would_deny_or_hold(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    await run_steps(
        kernel,
        execution,
        step("web_search", {"query": "q"}),
        step("shell_exec", {"command": "ls"}),
        step("gpt-4o", None, kind="llm_call"),
    )

    report = await report_of(client, {"bundle": STRICT, "execution_id": execution.id})

    changed = [
        (r["target"], r["decision"], r["rule_id"]) for r in report["results"] if not r["pass"]
    ]
    assert changed == [
        ("web_search", "require_approval", "review-search"),
        ("shell_exec", "deny", "no-shell"),
    ]
    assert report["failed"] == 2
    assert [r["expect"] for r in report["results"]] == ["allow", "allow", "allow"]
    assert [r["was_rule"] for r in report["results"]] == ["default"] * 3
    assert "args" not in report["results"][2]


async def test_replaying_through_the_bundle_that_decided_passes(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, SHELL)
    await run_steps(
        kernel,
        execution,
        step("shell_exec", {"command": "ls"}),
        step("deploy", {}),
        step("gpt-4o", None, kind="llm_call"),
    )

    report = await report_of(client, {"execution_id": execution.id})

    assert report["failed"] == 0
    assert [r["expect"] for r in report["results"]] == ["allow", "deny", "allow"]


async def test_replay_writes_nothing(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    await run_steps(kernel, execution, step("web_search", {"query": "q"}))
    before = await kernel.list_events(execution.id, 0, 1000)

    await report_of(client, {"bundle": STRICT, "execution_id": execution.id})
    await report_of(client, {"bundle": STRICT, "cases": [{"target": "web_search"}]})

    assert await kernel.list_events(execution.id, 0, 1000) == before
    assert (await kernel.get_agent(AGENT)).policy_bundle == ALLOW_ALL
    assert await kernel.list_approvals(None, execution.id) == []


async def test_replaying_an_unknown_execution_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.post(ROUTE, json={"bundle": ALLOW_ALL, "execution_id": UNKNOWN})
    assert_error(response, 404, "not_found")


async def test_replaying_another_agent_s_execution_is_refused(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    await kernel.register_agent("other", "http://127.0.0.1:9/webhook", SECRET, None, None)
    theirs = await kernel.create_execution("other", "{}", None)

    response = await client.post(ROUTE, json={"bundle": ALLOW_ALL, "execution_id": theirs.id})

    envelope = assert_error(response, 400, "validation_error")
    assert "belongs to agent other" in envelope["message"]


async def test_executions_are_replayed_newest_first_within_the_limit(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    made = []
    for target in ("first", "second", "third"):
        execution = await kernel.create_execution(AGENT, "{}", None)
        await run_steps(kernel, execution, step(target, {}))
        made.append(execution.id)

    report = await report_of(client, {"bundle": STRICT, "executions": {"limit": 2}})

    replayed = [(r["execution_id"], r["target"]) for r in report["results"]]
    assert replayed == [(made[2], "third"), (made[1], "second")]


async def test_executions_of_one_session_and_since_a_time_are_replayed(
    client: httpx.AsyncClient, kernel: Kernel, clock: ManualClock
) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    made: dict[str, str] = {}
    for target, session in (("old", "s1"), ("other", "s2"), ("new", "s1")):
        execution = await kernel.create_execution(AGENT, "{}", None, Labels(session=session))
        lease = await run_steps(kernel, execution, step(target, {}))
        await kernel.complete_execution(execution.id, AGENT, lease, "null")
        made[target] = execution.id
        clock.advance(timedelta(minutes=1))
    since = format_timestamp(clock.now() - timedelta(minutes=1, seconds=30))

    in_session = await report_of(client, {"bundle": STRICT, "executions": {"session": "s1"}})
    recent = await report_of(client, {"bundle": STRICT, "executions": {"since": since}})

    assert [r["target"] for r in in_session["results"]] == ["new", "old"]
    assert [r["target"] for r in recent["results"]] == ["new"]


# -- §35.6 / P4: policy_hash on decision events ------------------------------------------------
async def test_decisions_carry_the_hash_of_the_bundle_that_made_them(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    set_response = await client.post(f"/v0/policies/{AGENT}", json={"bundle": ALLOW_ALL})
    assert set_response.status_code == 204
    lease = await run_steps(kernel, execution, step("web_search", {"query": "q"}))
    await kernel.submit_step(execution.id, AGENT, lease, step("web_search", {"query": "q"}))

    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()

    allowed = [e["payload"] for e in events if e["type"] == "step.allowed"]
    assert len(allowed) == 2  # the second submission is a new occurrence, decided afresh
    assert all(p["rule_id"] == "default" for p in allowed)
    assert all(p["policy_hash"] == ALLOW_ALL_HASH for p in allowed)


async def test_permissive_decisions_and_grants_carry_no_hash(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, SHELL)
    lease = await claim(kernel, execution.id)
    held = await kernel.submit_step(
        execution.id, AGENT, lease, step("shell_exec", {"command": "rm x"})
    )
    assert held.approval_id is not None
    await kernel.grant_approval(held.approval_id, "alice", "", BOOTSTRAP)
    await kernel.set_policy(AGENT, "")
    lease = await claim(kernel, execution.id)
    await run_steps_on(kernel, execution, lease, step("web_search", {"query": "q"}))

    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()

    decisions = [
        (e["type"], e["payload"].get("rule_id"), e["payload"].get("policy_hash"))
        for e in events
        if e["type"] in ("step.allowed", "step.awaiting_approval")
    ]
    shell_hash = decisions[0][2]
    assert decisions == [
        ("step.awaiting_approval", "approve-other-shell", shell_hash),
        ("step.allowed", None, None),
        ("step.allowed", "permissive", None),
    ]
    assert shell_hash is not None and len(shell_hash) == 64


async def run_steps_on(
    kernel: Kernel, execution: Execution, lease: Lease, *steps: StepRequest
) -> None:
    for request in steps:
        decided = await kernel.submit_step(execution.id, AGENT, lease, request)
        assert decided.decision is Decision.PROCEED, decided


async def test_a_fork_s_own_bundle_hashes_its_decisions_and_copies_keep_the_source_s(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    await kernel.set_policy(AGENT, ALLOW_ALL)
    await run_steps(kernel, execution, step("x", {"n": 1}))
    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()
    at_seq = next(e["event_seq"] for e in events if e["type"] == "step.succeeded")
    strict = "default_action: deny\n"

    forked = await client.post(
        f"/v0/executions/{execution.id}/fork", json={"at_seq": at_seq, "policy_bundle": strict}
    )
    assert forked.status_code == 201, forked.text
    fork = await kernel.get_execution(forked.json()["id"])
    await run_steps(kernel, fork, step("y", {"n": 2}))

    log = (await client.get(f"/v0/executions/{fork.id}/events")).json()
    hashes = [
        (e["payload"]["target"], e["payload"].get("policy_hash"))
        for e in log
        if e["type"] in ("step.allowed", "step.denied")
    ]
    assert hashes == [("x", ALLOW_ALL_HASH), ("y", policy_hash(strict))]


async def test_a_rate_limit_refusal_carries_the_hash_of_its_bundle(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    limited = (
        "rules:\n  - id: once\n    when: {target: web_search}\n"
        "    then: {decision: allow, rate_limit: {max_calls: 1, window: 1h}}\n"
    )
    await kernel.set_policy(AGENT, limited)
    lease = await run_steps(kernel, execution, step("web_search", {"query": "q"}))
    refused = await kernel.submit_step(execution.id, AGENT, lease, step("web_search", {"q": 2}))
    assert refused.decision is Decision.RATE_LIMITED

    log = (await client.get(f"/v0/executions/{execution.id}/events")).json()

    [payload] = [e["payload"] for e in log if e["type"] == "step.rate_limited"]
    assert (payload["rule_id"], payload["policy_hash"]) == ("once", policy_hash(limited))


async def test_a_stored_bundle_that_no_longer_compiles_denies_with_its_hash(
    client: httpx.AsyncClient, kernel: Kernel, execution: Execution, raw_sql: RawSql
) -> None:
    broken = "rules: 5\n"
    await raw_sql("UPDATE agents SET policy_bundle = %s WHERE id = %s", broken, AGENT)
    lease = await claim(kernel, execution.id)

    denied = await kernel.submit_step(execution.id, AGENT, lease, step("x", {}))

    assert (denied.decision, denied.rule_id) == (Decision.DENIED, "bundle-error")
    log = (await client.get(f"/v0/executions/{execution.id}/events")).json()
    [payload] = [e["payload"] for e in log if e["type"] == "step.denied"]
    assert payload["policy_hash"] == policy_hash(broken)
