"""Our protocol extension `step-completions` over HTTP: completions carried in the body of
the next submission or of the execution's complete; malformed lists are refused."""

from __future__ import annotations

import httpx

from rebuno.kernel.domain.records import Execution
from tests.api.harness import AgentClient, assert_error

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
