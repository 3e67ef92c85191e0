"""Our protocol extensions `step-completions`, `step-records` and `step-occurrences` over HTTP:
completions and reported steps carried in the body of the next submission, heartbeat or
execution complete; the grant answered in a header only to an agent that asks; an agent's own
occurrence read only when it names the extension; malformed lists and numbers are refused."""

from __future__ import annotations

from dataclasses import replace

import httpx

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, AgentClient, assert_error

ASKING = {"Rebuno-Extensions": "step-records"}
NUMBERING = {"Rebuno-Extensions": "step-occurrences"}
REPORTED = {"kind": "local", "target": "roll", "args": {"sides": 6}, "result": 4}

SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "durable agents"}}


async def test_submission_carries_the_previous_steps_result(
    leased: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    first = (await leased.post(base, SEARCH)).json()

    second = await leased.post(
        base,
        {
            "kind": "local",
            "target": "next",
            "completions": [{"step_id": first["step_id"], "result": {"hits": 1.0}}],
        },
    )

    assert second.json()["decision"] == "proceed"
    step = (await client.get(f"{base}/{first['step_id']}")).json()
    assert (step["status"], step["result"]) == ("succeeded", {"hits": 1.0})


async def test_execution_complete_carries_a_failed_step(
    leased: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}"
    step = (await leased.post(f"{base}/steps", SEARCH)).json()

    done = await leased.post(
        f"{base}/complete",
        {"output": 1, "completions": [{"step_id": step["step_id"], "error": {"message": "x"}}]},
    )

    assert done.status_code == 204
    recorded = (await client.get(f"{base}/steps/{step['step_id']}")).json()
    assert (recorded["status"], recorded["error"]) == ("failed", {"message": "x"})


async def test_malformed_completions_are_refused(leased: AgentClient, execution: Execution) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    for completions in ({"step_id": "x"}, [{"step_id": "x"}], [{"result": 1}], [1]):
        response = await leased.post(base, {**SEARCH, "completions": completions})
        assert_error(response, 400, "validation_error")


async def test_heartbeat_records_reported_steps_and_answers_the_grant_when_asked(
    leased: AgentClient, client: httpx.AsyncClient, kernel: Kernel, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}"
    asking = replace(leased, extra_headers=ASKING)

    plain = await leased.post(f"{base}/heartbeat")
    asked = await asking.post(f"{base}/heartbeat", {"completions": [REPORTED]})
    await kernel.set_policy(AGENT, "default_action: allow\n")
    refused = await asking.post(f"{base}/steps", SEARCH)

    assert plain.status_code == 204 and "rebuno-extensions" not in plain.headers
    assert asked.status_code == 204 and asked.headers["rebuno-extensions"] == "step-records"
    assert refused.status_code == 200 and "rebuno-extensions" not in refused.headers
    [roll, search] = (await client.get(f"{base}/steps")).json()
    assert (roll["target"], roll["status"], roll["result"]) == ("roll", "succeeded", 4)
    assert search["status"] == "executing"


async def test_a_submission_without_policy_answers_the_grant(
    leased: AgentClient, execution: Execution
) -> None:
    asking = replace(leased, extra_headers=ASKING)

    answer = await asking.post(f"/v0/executions/{execution.id}/steps", SEARCH)

    assert answer.json()["decision"] == "proceed"
    assert answer.headers["rebuno-extensions"] == "step-records"
    assert "policy_free" not in answer.json()


async def test_malformed_reported_steps_are_refused(
    leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}"
    for item in (
        {**REPORTED, "kind": "llm_call"},
        {**REPORTED, "idempotency": "at_most_once"},
        {**REPORTED, "kind": "teleport"},
        {"kind": "local", "target": "roll"},
        {**REPORTED, "error": {"message": "x"}},
    ):
        response = await leased.post(f"{base}/complete", {"output": 1, "completions": [item]})
        assert_error(response, 400, "validation_error")
    assert (await leased.post(f"{base}/heartbeat", [REPORTED])).status_code == 400


async def test_an_occurrence_is_read_only_under_step_occurrences(
    leased: AgentClient, client: httpx.AsyncClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    numbering = replace(leased, extra_headers=NUMBERING)

    ignored = (await leased.post(base, {**SEARCH, "occurrence": 4})).json()
    numbered = (await numbering.post(base, {**SEARCH, "occurrence": 4})).json()

    assert ignored["decision"] == numbered["decision"] == "proceed"
    steps = (await client.get(base)).json()
    occurrences = {step["step_id"]: step["occurrence"] for step in steps}
    assert occurrences == {ignored["step_id"]: 0, numbered["step_id"]: 4}


async def test_a_malformed_occurrence_is_refused(leased: AgentClient, execution: Execution) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    numbering = replace(leased, extra_headers=NUMBERING)
    for occurrence in (-1, 1.5, "1", 2**31, True):
        response = await numbering.post(base, {**SEARCH, "occurrence": occurrence})
        assert_error(response, 400, "validation_error")
