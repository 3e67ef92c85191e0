"""Request handling rules (§3.3, §5): the body cap, ids, lease headers, body validation."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp

from rebuno.kernel.api.body import OFF_LOOP_BYTES
from rebuno.kernel.api.routes import executions as executions_routes
from rebuno.kernel.domain.records import Execution
from rebuno.protocol.signing import sign_request
from tests.api.harness import AGENT, TOKEN, AgentClient, assert_error

LIMIT = 10 * 1024 * 1024
SEARCH = {"kind": "tool_call", "target": "web_search", "args": {"query": "x"}}


async def _chunks(total: int, size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        chunk = min(size, total - sent)
        sent += chunk
        yield b" " * chunk


# -- body cap -----------------------------------------------------------------------------


async def test_an_unauthenticated_body_is_refused_before_it_is_read(
    anon: httpx.AsyncClient, execution: Execution
) -> None:
    agent_route = await anon.post(
        f"/v0/executions/{execution.id}/steps", content=_chunks(LIMIT + 1)
    )
    client_route = await anon.post("/v0/executions", content=_chunks(LIMIT + 1))

    assert_error(agent_route, 401, "unauthorized")
    assert_error(client_route, 401, "unauthorized")


async def test_an_unknown_agent_is_refused_before_its_body_is_read(
    agent: AgentClient, execution: Execution
) -> None:
    stranger = replace(agent, agent_id="stranger")
    target = f"/v0/executions/{execution.id}/steps"
    headers = stranger.headers("POST", target, b"{}", None)

    response = await stranger.http.post(target, content=_chunks(LIMIT + 1), headers=headers)

    assert_error(response, 401, "unauthorized")


async def test_declared_oversize_body_of_a_known_agent_is_refused_unread(
    agent: AgentClient, execution: Execution
) -> None:
    target = f"/v0/executions/{execution.id}/steps"
    body = b"{" + b" " * LIMIT + b"}"

    response = await agent.http.post(
        target, content=body, headers=agent.headers("POST", target, body, None)
    )

    assert_error(response, 413, "payload_too_large")


async def test_chunked_oversize_body_is_refused_while_reading(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/executions", content=_chunks(LIMIT + 1))
    assert_error(response, 413, "payload_too_large")


async def test_oversize_create_writes_nothing(client: httpx.AsyncClient) -> None:
    body = b'{"agent_id": "researcher", "input": "' + b"x" * LIMIT + b'"}'
    assert_error(await client.post("/v0/executions", content=body), 413, "payload_too_large")
    assert (await client.get("/v0/executions")).json()["executions"] == []


async def test_body_at_the_limit_is_read(client: httpx.AsyncClient) -> None:
    prefix = b'{"agent_id": "researcher", "input": "'
    body = prefix + b"x" * (LIMIT - len(prefix) - 2) + b'"}'
    assert len(body) == LIMIT
    assert (await client.post("/v0/executions", content=body)).status_code == 201


# -- JSON bodies --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"", b"   ", b"{", b"[]", b'"text"', b'{"agent_id": "researcher"} extra', b'{"a": NaN}'],
)
async def test_unreadable_json_body_is_a_validation_error(
    client: httpx.AsyncClient, content: bytes
) -> None:
    response = await client.post("/v0/executions", content=content)
    assert_error(response, 400, "validation_error")


async def test_create_without_agent_id_is_a_validation_error(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/executions", json={"input": {}})
    assert_error(response, 400, "validation_error")


async def test_create_for_unknown_agent_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/executions", json={"agent_id": "ghost"})
    assert_error(response, 404, "not_found")


async def test_create_ignores_unknown_fields(client: httpx.AsyncClient) -> None:
    response = await client.post("/v0/executions", json={"agent_id": AGENT, "colour": "blue"})
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spawned_by", {"execution_id": "e", "step_id": "s"}),
    ],
)
async def test_create_refuses_extension_fields_it_cannot_honour(
    client: httpx.AsyncClient, field: str, value: object
) -> None:
    response = await client.post("/v0/executions", json={"agent_id": AGENT, field: value})
    assert_error(response, 400, "validation_error")


async def test_create_accepts_empty_extension_fields(client: httpx.AsyncClient) -> None:
    body = {"agent_id": AGENT, "session": "", "spawned_by": None, "on_behalf_of": ""}
    assert (await client.post("/v0/executions", json=body)).status_code == 201


# -- ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["not-a-uuid", "01937a6e2f1c7b3d9e4f5a6b7c8d9e0", "0" * 36])
async def test_non_uuid_execution_id_is_a_validation_error(
    client: httpx.AsyncClient, bad: str
) -> None:
    assert_error(await client.get(f"/v0/executions/{bad}"), 400, "validation_error")


async def test_non_uuid_execution_id_on_agent_route_is_a_validation_error(
    leased: AgentClient,
) -> None:
    response = await leased.post("/v0/executions/nope/steps", SEARCH)
    assert_error(response, 400, "validation_error")


async def test_execution_id_is_matched_case_insensitively(
    client: httpx.AsyncClient, execution: Execution
) -> None:
    response = await client.get(f"/v0/executions/{execution.id.upper()}")
    assert response.status_code == 200
    assert response.json()["id"] == execution.id


async def test_unknown_execution_is_not_found(client: httpx.AsyncClient) -> None:
    response = await client.get("/v0/executions/01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f")
    assert_error(response, 404, "not_found")


# -- lease headers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/steps", SEARCH),
        ("/steps/abc/complete", {"result": 1}),
        ("/steps/abc/fail", {"error": {"message": "x"}}),
        ("/heartbeat", None),
        ("/complete", {"output": 1}),
        ("/fail", {"error": "x"}),
    ],
)
async def test_mutating_agent_route_without_lease_is_a_validation_error(
    agent: AgentClient, execution: Execution, path: str, body: object
) -> None:
    response = await agent.post(f"/v0/executions/{execution.id}{path}", body, lease=None)
    assert_error(response, 400, "validation_error")


@pytest.mark.parametrize(
    ("dispatch_id", "attempt"),
    [
        ("not-a-uuid", "1"),
        ("01937a6e-3000-7000-8000-000000000001", "0"),
        ("01937a6e-3000-7000-8000-000000000001", "one"),
        ("01937a6e-3000-7000-8000-000000000001", "1.0"),
    ],
)
async def test_malformed_lease_headers_are_a_validation_error(
    agent: AgentClient, execution: Execution, dispatch_id: str, attempt: str
) -> None:
    target = f"/v0/executions/{execution.id}/heartbeat"
    headers = agent.headers("POST", target, b"", None)
    headers |= {"Rebuno-Dispatch-Id": dispatch_id, "Rebuno-Dispatch-Attempt": attempt}
    # Signed over the malformed values, so only their format is wrong.
    headers["Rebuno-Signature"] = sign_request(
        agent.secret, "POST", target, headers["Rebuno-Timestamp"], dispatch_id, attempt, b""
    )
    response = await agent.http.post(target, headers=headers)
    assert_error(response, 400, "validation_error")


async def test_lease_dispatch_id_is_matched_case_insensitively(
    leased: AgentClient, execution: Execution
) -> None:
    assert leased.lease is not None
    shouting = replace(leased.lease, dispatch_id=leased.lease.dispatch_id.upper())
    response = await leased.post(f"/v0/executions/{execution.id}/heartbeat", lease=shouting)
    assert response.status_code == 204


# -- step submissions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"target": "web_search"},
        {"kind": "shell", "target": "web_search"},
        {"kind": "TOOL_CALL", "target": "web_search"},
        {"kind": "tool_call", "idempotency": "exactly_once"},
        {"kind": "tool_call", "target": 7},
        {"kind": "tool_call", "resources": ["db"]},
    ],
)
async def test_invalid_step_submission_is_a_validation_error(
    leased: AgentClient, execution: Execution, body: dict[str, object]
) -> None:
    response = await leased.post(f"/v0/executions/{execution.id}/steps", body)
    assert_error(response, 400, "validation_error")


async def test_args_with_nan_are_a_validation_error(
    leased: AgentClient, execution: Execution
) -> None:
    content = b'{"kind": "tool_call", "target": "t", "args": {"x": NaN}}'
    response = await leased.post(f"/v0/executions/{execution.id}/steps", content=content)
    assert_error(response, 400, "validation_error")


async def test_submission_accepts_empty_resources_and_empty_idempotency(
    leased: AgentClient, execution: Execution
) -> None:
    body = {**SEARCH, "resources": [], "idempotency": "", "state": {"ignored": True}}
    response = await leased.post(f"/v0/executions/{execution.id}/steps", body)
    assert response.status_code == 200
    assert response.json()["decision"] == "proceed"


async def test_missing_and_null_args_name_the_same_step(
    leased: AgentClient, execution: Execution
) -> None:
    base = f"/v0/executions/{execution.id}/steps"
    first = await leased.post(base, {"kind": "local", "target": "now"})
    second = await leased.post(base, {"kind": "local", "target": "now", "args": None})
    steps = (await leased.get(base)).json()
    assert first.json()["decision"] == second.json()["decision"] == "proceed"
    assert [s["occurrence"] for s in steps] == [0, 1]
    assert {s["args_hash"] for s in steps} == {
        "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
    }
    assert all("args" not in s for s in steps)


async def test_step_completion_refuses_malformed_captures_and_records_refused_ones(
    leased: AgentClient, execution: Execution, client: httpx.AsyncClient
) -> None:
    decision = await leased.post(f"/v0/executions/{execution.id}/steps", SEARCH)
    step_id = decision.json()["step_id"]
    malformed = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/complete",
        {"result": 1, "captures": [{"key": "db", "generation": "1", "checkpoint_ref": "r"}]},
    )
    accepted = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/complete",
        {"result": 1, "captures": [{"key": "db", "generation": 1, "checkpoint_ref": "r"}]},
    )
    assert_error(malformed, 400, "validation_error")
    assert accepted.json() == {"decision": "recorded"}
    events = (await client.get(f"/v0/executions/{execution.id}/events")).json()
    assert events[-1]["type"] == "resource.checkpoint_failed"
    assert events[-1]["payload"]["error"] == "unknown_resource"


async def test_execution_failure_reason_must_be_a_string(
    leased: AgentClient, execution: Execution
) -> None:
    response = await leased.post(f"/v0/executions/{execution.id}/fail", {"error": {"m": 1}})
    assert_error(response, 400, "validation_error")


# -- stream producer --------------------------------------------------------------------------


async def _executing_step(leased: AgentClient, execution: Execution) -> str:
    response = await leased.post(f"/v0/executions/{execution.id}/steps", SEARCH)
    step_id: str = response.json()["step_id"]
    return step_id


async def test_stream_data_over_7000_utf8_bytes_is_too_large(
    leased: AgentClient, execution: Execution
) -> None:
    step_id = await _executing_step(leased, execution)
    target = f"/v0/executions/{execution.id}/steps/{step_id}/stream"
    at_limit = await leased.post(target, {"seq": 0, "data": "x" * 7000})
    over = await leased.post(target, {"seq": 1, "data": "é" * 3501})
    assert at_limit.status_code == 204
    assert_error(over, 413, "payload_too_large")


@pytest.mark.parametrize("seq", ["1", 1.5, None, 2**63])
async def test_stream_seq_must_be_a_64_bit_integer(
    leased: AgentClient, execution: Execution, seq: object
) -> None:
    step_id = await _executing_step(leased, execution)
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/stream", {"seq": seq, "data": "x"}
    )
    assert_error(response, 400, "validation_error")


async def test_stream_producer_needs_no_lease(leased: AgentClient, execution: Execution) -> None:
    step_id = await _executing_step(leased, execution)
    response = await leased.post(
        f"/v0/executions/{execution.id}/steps/{step_id}/stream", {"seq": 0, "data": "x"}, lease=None
    )
    assert response.status_code == 204


async def test_a_client_that_leaves_mid_body_is_no_error(
    app: ASGIApp, caplog: pytest.LogCaptureFixture
) -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"agent_id": "resea', "more_body": True},
        {"type": "http.disconnect"},
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v0/executions",
        "raw_path": b"/v0/executions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()), (b"host", b"kernel.test")],
        "server": ("kernel.test", 80),
        "client": ("127.0.0.1", 50000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    with caplog.at_level(logging.DEBUG):
        await app(scope, receive, send)

    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("client disconnected" in r.getMessage() for r in caplog.records)


async def test_a_large_body_is_parsed_off_the_event_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    parse = executions_routes._create_fields

    def recording(raw: bytes) -> Any:
        threads.append(threading.get_ident())
        return parse(raw)

    monkeypatch.setattr(executions_routes, "_create_fields", recording)
    small = {"agent_id": AGENT, "input": {"text": "x"}}
    large = {"agent_id": AGENT, "input": {"text": "x" * OFF_LOOP_BYTES}}

    for body in (small, large):
        assert (await client.post("/v0/executions", json=body)).status_code == 201

    loop_thread = threading.get_ident()
    assert threads[0] == loop_thread  # a small body is parsed in place
    assert threads[1] != loop_thread  # a large one on a worker thread
