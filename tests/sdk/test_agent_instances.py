"""`agent-instances` with this SDK: an agent names itself in every acknowledgement, and a
restarted agent of the same instance announces itself, so the run the killed one held comes
back at once rather than after its (here 60 s) lease. Against a real kernel on both stores."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from typing import Any

import httpx
import pytest

from harness.polling import wait_until
from rebuno import Agent
from rebuno.protocol.extensions import (
    AGENT_INSTANCES,
    EXECUTION_HEADER,
    EXECUTION_INPUT,
    EXECUTION_SIGNATURE_HEADER,
    EXTENSIONS_HEADER,
    AgentInstance,
    carried,
    parse_instance,
    sign_carried,
)
from rebuno.protocol.signing import SIGNATURE_HEADER, sign_body
from tests.sdk.conftest import SECRET, Harness
from tests.sdk.loopback import free_socket, serving, url_of

LEASE_SECONDS = 60
REDELIVERY_TIMEOUT = 10.0
"""Far below the lease: a run that comes back within it did not wait for the lease."""


def _agent(harness: Harness, agent_id: str, instance: str | None) -> Agent:
    agent = Agent(agent_id, secret=SECRET, base_url=harness.kernel_url, instance=instance)
    harness.agents.append(agent)
    return agent


async def test_a_restarted_instance_gets_the_run_it_held_back_before_the_lease(
    harness: Harness,
) -> None:
    started = asyncio.Event()
    runs: list[str] = []

    async def handler(topic: str) -> dict[str, Any]:
        runs.append(topic)
        if len(runs) == 1:  # the first start dies in the middle of its run
            started.set()
            await asyncio.Event().wait()
        return {"topic": topic}

    first_socket = free_socket()
    await harness.register(
        "slotted", url_of(first_socket) + "/webhook", lease_timeout_seconds=LEASE_SECONDS
    )
    first = _agent(harness, "slotted", "slot-a")
    first.bind(handler)
    async with serving(first.app, first_socket):
        execution = await harness.client.create("slotted", input={"topic": "tea"})
        await wait_until(started.is_set, message="the first run started")
        await first.close()  # nothing more of this run reaches the kernel

    second_socket = free_socket()
    await harness.register(
        "slotted", url_of(second_socket) + "/webhook", lease_timeout_seconds=LEASE_SECONDS
    )
    second = _agent(harness, "slotted", "slot-a")
    second.bind(handler)
    async with serving(second.app, second_socket):
        done = await harness.client.wait(execution.id, timeout=REDELIVERY_TIMEOUT)

    assert done.status.value == "completed"
    assert done.output == {"topic": "tea"}
    assert runs == ["tea", "tea"]


async def test_an_agent_in_its_own_server_is_named_by_the_first_webhook(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REBUNO_AGENT_INSTANCE", raising=False)
    sock = free_socket()
    port = sock.getsockname()[1]
    await harness.register("named-late", url_of(sock) + "/webhook")
    agent = _agent(harness, "named-late", None)

    async def handler() -> str:
        return "ok"

    agent.bind(handler)
    async with serving(agent.app, sock):
        unnamed = agent.instance
        done = await harness.run("named-late")

    assert unnamed is None
    assert done.status.value == "completed"
    assert agent.instance == f"{socket.gethostname()}:{port}"


async def test_an_unreachable_kernel_costs_one_warning_and_every_ack_names_the_instance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed = free_socket()
    kernel_url = url_of(closed)
    closed.close()
    # Past start-up, which would refuse to serve with no kernel to check against.
    agent = Agent(
        "offline", secret=SECRET, base_url=kernel_url, instance="slot-a", check_kernel=False
    )

    async def handler() -> None:
        await asyncio.Event().wait()

    agent.bind(handler)
    caplog.set_level(logging.WARNING, logger="rebuno")
    try:
        async with serving(agent.app) as url, httpx.AsyncClient(base_url=url) as http:
            await wait_until(lambda: _announce_warnings(caplog) == 1, message="the warning")
            offered = await _webhook(http, (AGENT_INSTANCES, EXECUTION_INPUT))
            again = await _webhook(http, (AGENT_INSTANCES, EXECUTION_INPUT))
            not_offered = await _webhook(http, (EXECUTION_INPUT,))
    finally:
        await agent.close()

    assert [r.status_code for r in (offered, again, not_offered)] == [200, 200, 200]
    named = parse_instance(offered.headers.get("rebuno-agent-instance"))
    assert named is not None and named.name == "slot-a"
    assert str(uuid.UUID(named.incarnation)) == named.incarnation
    assert parse_instance(again.headers.get("rebuno-agent-instance")) == named
    assert "rebuno-agent-instance" not in not_offered.headers
    assert _announce_warnings(caplog) == 1


def test_every_start_is_a_new_incarnation() -> None:
    first = Agent("a", secret=SECRET, base_url="http://127.0.0.1:9", instance="slot-a")
    again = Agent("a", secret=SECRET, base_url="http://127.0.0.1:9", instance="slot-a")

    assert _instance(first) != _instance(again)
    assert _instance(first).name == _instance(again).name == "slot-a"


def _instance(agent: Agent) -> AgentInstance:
    header = agent._instance.header()
    assert header is not None
    parsed = parse_instance(header[1].decode())
    assert parsed is not None
    return parsed


def _announce_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum("could not announce" in record.getMessage() for record in caplog.records)


async def _webhook(http: httpx.AsyncClient, offered: tuple[str, ...]) -> httpx.Response:
    """A signed webhook for a new execution, carrying its input."""
    body = json.dumps(
        {
            "execution_id": str(uuid.uuid4()),
            "dispatch_id": str(uuid.uuid4()),
            "dispatch_attempt": 1,
            "lease_timeout_seconds": LEASE_SECONDS,
        }
    ).encode()
    value = carried("running", "null")
    headers = {
        SIGNATURE_HEADER: sign_body(SECRET, body),
        EXTENSIONS_HEADER: ", ".join(offered),
        EXECUTION_HEADER: value,
        EXECUTION_SIGNATURE_HEADER: sign_carried(SECRET, body, value),
    }
    return await http.post("/webhook", content=body, headers=headers)
