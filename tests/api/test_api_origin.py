"""An execution's origin over HTTP, on both stores: idempotent create (§27.1), identity
(§27.2), an explicit parent, `state` on complete and `previous` (§24.2, §24.5), and retention
keeping the parents it must (§24.6)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rebuno.kernel import background
from rebuno.kernel.service.kernel import Kernel
from tests.api.harness import AGENT, SECRET, AgentClient, assert_error, claim
from tests.support import ManualClock

OTHER = "summariser"


@pytest.fixture
async def other_agent(kernel: Kernel) -> str:
    await kernel.register_agent(OTHER, "http://127.0.0.1:9/webhook", SECRET, None, None)
    return OTHER


async def create(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v0/executions", json={"agent_id": AGENT, **fields})


async def finish(
    kernel: Kernel, agent: AgentClient, execution_id: str, route: str, body: object
) -> None:
    """Delivers the execution's dispatch and ends it through the agent's route."""
    leased = replace(agent, lease=await claim(kernel, execution_id))
    response = await leased.post(f"/v0/executions/{execution_id}/{route}", body)
    assert response.status_code == 204, response.text


async def previous(agent: AgentClient, execution_id: str) -> object:
    response = await agent.get(f"/v0/executions/{execution_id}/previous")
    assert response.status_code == 200, response.text
    return response.json()


async def event_types(client: httpx.AsyncClient, execution_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v0/executions/{execution_id}/events")
    events: list[dict[str, Any]] = response.json()
    return events


# -- idempotent create ---------------------------------------------------------------------


async def test_a_repeated_key_answers_the_first_execution_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    first = await create(client, idempotency_key="k", input={"n": 1})
    again = await create(client, idempotency_key="k", input={"n": 2})

    assert first.status_code == again.status_code == 201
    assert "Rebuno-Idempotent-Replay" not in first.headers
    assert again.headers["Rebuno-Idempotent-Replay"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["input"] == {"n": 1}  # the first request's, not the repeat's
    assert again.json()["idempotency_key"] == "k"
    events = await event_types(client, first.json()["id"])
    assert [e["type"] for e in events].count("execution.created") == 1
    assert [e["type"] for e in events].count("dispatch.queued") == 1


async def test_a_key_is_scoped_to_its_agent(client: httpx.AsyncClient, other_agent: str) -> None:
    mine = await create(client, idempotency_key="k")
    theirs = await client.post(
        "/v0/executions", json={"agent_id": other_agent, "idempotency_key": "k"}
    )
    assert theirs.status_code == 201
    assert "Rebuno-Idempotent-Replay" not in theirs.headers
    assert theirs.json()["id"] != mine.json()["id"]


async def test_racing_creates_under_one_key_make_one_execution(
    client: httpx.AsyncClient, kernel: Kernel
) -> None:
    answers = await asyncio.gather(*(create(client, idempotency_key="race") for _ in range(12)))

    assert {answer.status_code for answer in answers} == {201}
    assert len({answer.json()["id"] for answer in answers}) == 1
    replays = [a for a in answers if a.headers.get("Rebuno-Idempotent-Replay") == "true"]
    assert len(replays) == 11
    listed = (await client.get("/v0/executions", params={"agent_id": AGENT})).json()
    assert len(listed["executions"]) == 1
    assert len(await kernel.claim(50)) == 1  # one dispatch among the twelve


async def test_retention_releases_the_key(
    client: httpx.AsyncClient, kernel: Kernel, clock: ManualClock
) -> None:
    first = (await create(client, idempotency_key="k")).json()["id"]
    await client.post(f"/v0/executions/{first}/cancel")
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)

    again = await create(client, idempotency_key="k")
    assert again.status_code == 201
    assert "Rebuno-Idempotent-Replay" not in again.headers
    assert again.json()["id"] != first


@pytest.mark.parametrize("field", ["idempotency_key", "on_behalf_of", "session"])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("   ", "blank"),
        ("x" * 257, "longer than 256 bytes"),
        ("é" * 129, "longer than 256 bytes"),  # 258 bytes of UTF-8 in 129 characters
        ("a\u0000b", "NUL"),
        (7, "must be a string"),
    ],
)
async def test_a_bad_label_is_refused_naming_its_field(
    client: httpx.AsyncClient, field: str, value: object, why: str
) -> None:
    envelope = assert_error(await create(client, **{field: value}), 400, "validation_error")
    assert field in envelope["message"]
    assert why in envelope["message"]


async def test_a_label_of_256_bytes_is_kept_as_sent(client: httpx.AsyncClient) -> None:
    label = " é" * 85 + "x"  # 256 bytes, surrounding whitespace kept
    response = await create(client, idempotency_key=label, on_behalf_of=label)
    assert response.status_code == 201
    assert response.json()["idempotency_key"] == label
    assert response.json()["on_behalf_of"] == label


# -- identity ------------------------------------------------------------------------------


async def test_the_creator_is_the_principal_never_the_body(client: httpx.AsyncClient) -> None:
    response = await create(client, on_behalf_of="user:42", created_by="mallory")
    body = response.json()
    assert body["created_by"] == "bootstrap"
    assert body["on_behalf_of"] == "user:42"
    assert body["subject_groups"] == []
    (created,) = [
        e for e in await event_types(client, body["id"]) if e["type"] == "execution.created"
    ]
    assert created["payload"]["created_by"] == "bootstrap"
    assert created["payload"]["on_behalf_of"] == "user:42"


# -- parent, state and previous ------------------------------------------------------------


async def test_previous_is_the_parents_state_then_its_output_then_null(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    with_state = (await create(client)).json()["id"]
    await finish(
        kernel, agent, with_state, "complete", {"output": {"answer": 1}, "state": {"turns": 1}}
    )
    without_state = (await create(client)).json()["id"]
    await finish(kernel, agent, without_state, "complete", {"output": {"answer": 3}})
    null_state = (await create(client)).json()["id"]
    await finish(kernel, agent, null_state, "complete", {"output": None, "state": None})

    first = (await create(client, parent_execution_id=with_state)).json()
    second = (await create(client, parent_execution_id=without_state)).json()
    third = (await create(client, parent_execution_id=null_state)).json()
    orphan = (await create(client)).json()

    assert first["parent_execution_id"] == with_state
    assert await previous(agent, first["id"]) == {"state": {"turns": 1}}
    assert await previous(agent, second["id"]) == {"state": {"answer": 3}}
    assert await previous(agent, third["id"]) == {"state": None}
    assert await previous(agent, orphan["id"]) == {"state": None}
    assert "parent_execution_id" not in orphan
    bearer = await client.get(f"/v0/executions/{first['id']}/previous")
    assert bearer.json() == {"state": {"turns": 1}}


async def test_state_is_kept_exactly_and_shown_nowhere_else(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    parent = (await create(client)).json()["id"]
    raw = b'{"output": 1, "state": {"big": 12345678901234567890, "f": 1.0}}'
    leased = replace(agent, lease=await claim(kernel, parent))
    done = await leased.request("POST", f"/v0/executions/{parent}/complete", content=raw)
    assert done.status_code == 204

    child = (await create(client, parent_execution_id=parent)).json()["id"]
    answer = await agent.get(f"/v0/executions/{child}/previous")
    assert b'{"big":12345678901234567890,"f":1.0}' in answer.content
    shown = await client.get(f"/v0/executions/{parent}")
    assert "state" not in shown.json()
    logged = (await client.get(f"/v0/executions/{parent}/events")).content
    assert b"12345678901234567890" not in logged


async def test_the_started_event_names_the_parent(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient
) -> None:
    parent = (await create(client)).json()["id"]
    await finish(kernel, agent, parent, "complete", {"output": None})
    child = (await create(client, parent_execution_id=parent)).json()["id"]
    leased = replace(agent, lease=await claim(kernel, child))
    await leased.post(f"/v0/executions/{child}/heartbeat")

    (started,) = [e for e in await event_types(client, child) if e["type"] == "execution.started"]
    assert started["payload"]["parent_execution_id"] == parent


async def test_a_parent_must_be_a_completed_execution_of_the_same_agent(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, other_agent: str
) -> None:
    failed = (await create(client)).json()["id"]
    await finish(kernel, agent, failed, "fail", {"error": "boom"})
    running = (await create(client)).json()["id"]
    theirs = (await client.post("/v0/executions", json={"agent_id": other_agent})).json()["id"]

    assert_error(await create(client, parent_execution_id=failed), 409, "conflict")
    assert_error(await create(client, parent_execution_id=running), 409, "conflict")
    assert_error(await create(client, parent_execution_id=theirs), 409, "conflict")
    unknown = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"
    assert_error(await create(client, parent_execution_id=unknown), 404, "not_found")
    assert_error(await create(client, parent_execution_id="xyz"), 400, "validation_error")


async def test_previous_of_another_agents_execution_is_forbidden(
    client: httpx.AsyncClient, agent: AgentClient, other_agent: str
) -> None:
    theirs = (await client.post("/v0/executions", json={"agent_id": other_agent})).json()["id"]
    assert_error(await agent.get(f"/v0/executions/{theirs}/previous"), 403, "forbidden")


async def test_retention_keeps_a_parent_while_an_execution_names_it(
    client: httpx.AsyncClient, kernel: Kernel, agent: AgentClient, clock: ManualClock
) -> None:
    parent = (await create(client)).json()["id"]
    await finish(kernel, agent, parent, "complete", {"output": None, "state": {"turns": 1}})
    child = (await create(client, parent_execution_id=parent)).json()["id"]
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)  # the parent is old and terminal; its child is live

    assert (await client.get(f"/v0/executions/{parent}")).status_code == 200
    assert await previous(agent, child) == {"state": {"turns": 1}}

    await client.post(f"/v0/executions/{child}/cancel")
    clock.advance(timedelta(hours=25))
    await background.sweep(kernel)
    await background.sweep(kernel)  # the child first; then nothing names the parent
    for gone in (child, parent):
        assert_error(await client.get(f"/v0/executions/{gone}"), 404, "not_found")
