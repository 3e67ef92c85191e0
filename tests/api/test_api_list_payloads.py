"""Execution list pages leave large payloads out (§5.1): an input or output of more than
64 KiB is `null` in the page, named with its size under `omitted`, and carried in full by
`GET /v0/executions/{id}`."""

from __future__ import annotations

import httpx

from rebuno.kernel.domain.records import Execution
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import ExecutionFilter
from rebuno.types import Event, ExecutionPage
from tests.api.harness import AGENT, AgentClient

LIMIT = ExecutionFilter().payload_limit


def text_of(size: int) -> str:
    """A JSON string of exactly `size` bytes, quotes included."""
    return '"' + "a" * (size - 2) + '"'


async def test_a_large_input_is_left_out_of_the_page_and_kept_by_the_execution(
    kernel: Kernel, client: httpx.AsyncClient
) -> None:
    large = await kernel.create_execution(AGENT, text_of(10 * 1024 * 1024), None)
    small = await kernel.create_execution(AGENT, '{"topic": "x"}', None)

    page = (await client.get("/v0/executions")).json()
    whole = (await client.get(f"/v0/executions/{large.id}")).json()

    listed = {item["id"]: item for item in page["executions"]}
    assert listed[large.id]["input"] is None
    assert listed[large.id]["omitted"] == {"input": 10 * 1024 * 1024}
    assert listed[small.id]["input"] == {"topic": "x"}
    assert "omitted" not in listed[small.id]
    assert len(whole["input"]) == 10 * 1024 * 1024 - 2
    assert "omitted" not in whole


async def test_an_input_of_exactly_the_limit_stays_in_the_page(
    kernel: Kernel, client: httpx.AsyncClient
) -> None:
    at_limit = await kernel.create_execution(AGENT, text_of(LIMIT), None)
    over = await kernel.create_execution(AGENT, text_of(LIMIT + 1), None)

    listed = {e["id"]: e for e in (await client.get("/v0/executions")).json()["executions"]}

    assert len(listed[at_limit.id]["input"]) == LIMIT - 2
    assert listed[over.id]["omitted"] == {"input": LIMIT + 1}


async def test_a_size_counts_bytes_of_utf8(kernel: Kernel, client: httpx.AsyncClient) -> None:
    # Two bytes per character: fewer characters than the limit, more bytes.
    wide = await kernel.create_execution(AGENT, '"' + "é" * (LIMIT // 2) + '"', None)

    listed = (await client.get("/v0/executions")).json()["executions"]

    assert [e["omitted"] for e in listed if e["id"] == wide.id] == [{"input": LIMIT + 2}]


async def test_a_large_output_is_left_out_of_the_page(
    kernel: Kernel, client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    output = text_of(LIMIT * 2)
    content = b'{"output": ' + output.encode() + b"}"
    finished = await leased.request(
        "POST", f"/v0/executions/{execution.id}/complete", content=content
    )
    assert finished.status_code == 204, finished.text

    [item] = (await client.get("/v0/executions")).json()["executions"]
    whole = (await client.get(f"/v0/executions/{execution.id}")).json()

    assert item["status"] == "completed"
    assert "output" not in item
    assert item["omitted"] == {"output": LIMIT * 2}
    assert item["input"] == {"topic": "x"}
    assert len(whole["output"]) == LIMIT * 2 - 2


async def test_the_sdk_reads_what_a_page_left_out(
    kernel: Kernel, client: httpx.AsyncClient
) -> None:
    large = await kernel.create_execution(AGENT, text_of(LIMIT + 1), None)

    page = ExecutionPage.model_validate_json((await client.get("/v0/executions")).content)

    [listed] = page.executions
    assert (listed.id, listed.input, listed.omitted) == (large.id, None, {"input": LIMIT + 1})


async def test_a_step_list_leaves_large_payloads_out_and_the_step_keeps_them(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    large_args = b'{"kind": "tool_call", "target": "t", "args": ' + text_of(LIMIT + 1).encode()
    big = (await leased.request("POST", base, content=large_args + b"}")).json()["step_id"]
    small = (await leased.post(base, {"kind": "tool_call", "target": "t", "args": 1})).json()
    result = b'{"result": ' + text_of(LIMIT * 3).encode() + b"}"
    done = await leased.request("POST", f"{base}/{small['step_id']}/complete", content=result)
    assert done.status_code == 200, done.text

    listed = {step["step_id"]: step for step in (await client.get(base)).json()}
    whole = (await client.get(f"{base}/{big}")).json()

    assert "args" not in listed[big] and listed[big]["omitted"] == {"args": LIMIT + 1}
    assert listed[small["step_id"]]["args"] == 1
    assert "result" not in listed[small["step_id"]]
    assert listed[small["step_id"]]["omitted"] == {"result": LIMIT * 3}
    assert len(whole["args"]) == LIMIT - 1 and "omitted" not in whole


async def test_an_events_page_leaves_a_large_payload_out(
    client: httpx.AsyncClient, leased: AgentClient, execution: Execution
) -> None:
    content = b'{"output": ' + text_of(LIMIT * 2).encode() + b"}"
    finished = await leased.request(
        "POST", f"/v0/executions/{execution.id}/complete", content=content
    )
    assert finished.status_code == 204, finished.text

    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()

    [completed] = [e for e in events if e["type"] == "execution.completed"]
    assert completed["payload"] is None
    assert completed["omitted"]["payload"] > LIMIT * 2
    small = [e for e in events if e["type"] != "execution.completed"]
    assert small and all("omitted" not in e and e["payload"] for e in small)
    parsed = [Event.model_validate(e) for e in events]
    assert [e.omitted for e in parsed if e.omitted] == [completed["omitted"]]
