"""What an agent says when it and its kernel do not fit together: a refused webhook signature
is one actionable line per burst, the kernel refusing the agent's own requests names what to
check, and start-up refuses to serve, in one line, a kernel that is unreachable, is no Rebuno
kernel, or does not know the agent; unless the check is turned off."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import pytest

from harness.asgi import asgi_body, asgi_lifespan
from harness.polling import wait_until
from rebuno import Agent
from rebuno.protocol.signing import SIGNATURE_HEADER, sign_body
from rebuno.sdk._diagnostics import CHECK_ENV, Throttle
from tests.sdk.conftest import SECRET, Harness
from tests.sdk.loopback import free_socket, serving, url_of

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def start_up(agent: Agent) -> MutableMapping[str, Any]:
    """Drives the app's lifespan startup as a server would; its answer."""
    inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()

    async def lifespan() -> None:
        await agent.app({"type": "lifespan"}, inbox.get, outbox.put)

    task = asyncio.create_task(lifespan())
    await inbox.put({"type": "lifespan.startup"})
    answer = await asyncio.wait_for(outbox.get(), timeout=10)
    if answer["type"] == "lifespan.startup.complete":
        await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, timeout=10)
    return answer


def closed_url() -> str:
    sock = free_socket()
    url = url_of(sock)
    sock.close()
    return url


async def not_a_kernel(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await asgi_lifespan(receive, send)
        return
    await asgi_body(receive)
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"<h1>Not Found</h1>"})


async def unwell_kernel(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Healthy, but every other answer is a 503, as when the kernel's database is down."""
    if scope["type"] == "lifespan":
        await asgi_lifespan(receive, send)
        return
    await asgi_body(receive)
    healthy = scope["path"] == "/v0/health"
    body = b'{"status": "ok"}' if healthy else b'{"code": "unavailable", "message": "db down"}'
    headers = [(b"content-type", b"application/json")]
    await send(
        {"type": "http.response.start", "status": 200 if healthy else 503, "headers": headers}
    )
    await send({"type": "http.response.body", "body": body})


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused a webhook" in r.getMessage()]


async def test_a_webhook_that_does_not_verify_is_one_actionable_line_per_burst(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="rebuno")
    agent = Agent("diag", secret=SECRET, base_url=harness.kernel_url, check_kernel=False)
    agent.bind(lambda: None)
    harness.agents.append(agent)
    sock = free_socket()
    # The kernel holds another secret for the agent than the agent has.
    async with httpx.AsyncClient(base_url=harness.kernel_url) as http:
        body = {"id": "diag", "webhook_url": url_of(sock) + "/webhook", "secret": "other"}
        (await http.post("/v0/agents", json=body)).raise_for_status()
    async with serving(agent.app, sock):
        created = await harness.client.create("diag")
        failed = await harness.client.wait(created.id, timeout=20)

    assert failed.failure_reason == "dispatch_exhausted"
    events = await harness.client.events(created.id, limit=100)
    reasons = [e.payload["reason"] for e in events if e.type == "dispatch.failed"]
    assert len(reasons) == 5 and set(reasons) == {"agent answered 401"}
    [line] = refusals(caplog)  # five refusals, one line
    assert "agent 'diag' refused a webhook whose signature does not verify" in line
    assert "secret it registered for 'diag'" in line
    assert "must equal the secret given as Agent(secret=...)" in line


def test_repeated_reports_wait_for_the_period_and_count_what_they_held_back() -> None:
    now = [0.0]
    throttle = Throttle(every=60, clock=lambda: now[0])

    first = throttle.allow()
    held = [throttle.allow() for _ in range(3)]
    now[0] = 61
    after = throttle.allow()

    assert (first, held, after) == (0, [None] * 3, 3)


async def test_the_secret_from_the_environment_is_named_as_such(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="rebuno")
    monkeypatch.setenv("REBUNO_AGENT_SECRET", SECRET)
    agent = Agent("env-diag", base_url=closed_url(), check_kernel=False)
    agent.bind(lambda: None)
    body = b'{"execution_id": "e", "dispatch_id": "d"}'
    try:
        async with serving(agent.app) as url, httpx.AsyncClient(base_url=url) as http:
            signed = {SIGNATURE_HEADER: sign_body("not-the-secret", body)}
            wrong = await http.post("/webhook", content=body, headers=signed)
            unsigned = await http.post("/webhook", content=body)
    finally:
        await agent.close()

    assert (wrong.status_code, unsigned.status_code) == (401, 401)
    [line] = refusals(caplog)
    assert line.endswith("must equal REBUNO_AGENT_SECRET")


async def test_the_kernel_refusing_the_agents_requests_names_what_to_check(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rebuno")
    # The webhook verifies (same secret), but the agent signs as an id the kernel has not.
    agent = Agent("ghost", secret=SECRET, base_url=harness.kernel_url, check_kernel=False)
    agent.bind(lambda: {"done": True})
    harness.agents.append(agent)
    sock = free_socket()
    await harness.register("diag", url_of(sock) + "/webhook")
    async with serving(agent.app, sock):
        created = await harness.client.create("diag")

        def finishing() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if created.id in r.getMessage() and "refused agent 'ghost'" in r.getMessage()
            ]

        await wait_until(lambda: bool(finishing()), timeout=10, message="the refusal logged")

    [line] = finishing()
    assert f"the kernel at {harness.kernel_url} refused agent 'ghost''s signature" in line
    assert "no agent 'ghost' registered" in line
    assert "differs from the secret given as Agent(secret=...)" in line


async def test_start_up_passes_for_a_kernel_that_knows_the_agent(harness: Harness) -> None:
    await harness.register("known", "http://127.0.0.1:9/webhook")
    agent = Agent("known", secret=SECRET, base_url=harness.kernel_url)

    assert (await start_up(agent))["type"] == "lifespan.startup.complete"


async def test_start_up_fails_for_an_agent_the_kernel_does_not_know(harness: Harness) -> None:
    agent = Agent("stranger", secret=SECRET, base_url=harness.kernel_url)

    answer = await start_up(agent)

    assert answer["type"] == "lifespan.startup.failed"
    assert answer["message"].startswith(
        f"cannot start agent 'stranger': the kernel at {harness.kernel_url} refused agent"
        " 'stranger''s signature"
    )


async def test_start_up_fails_for_a_server_that_is_no_rebuno_kernel() -> None:
    async with serving(not_a_kernel) as url:
        answer = await start_up(Agent("a", secret=SECRET, base_url=url + "/api"))

    assert answer["type"] == "lifespan.startup.failed"
    assert answer["message"] == (
        f"cannot start agent 'a': the kernel at {url}/api is not a Rebuno kernel:"
        ' GET /v0/health answered 404 without {"status": "ok"}; check REBUNO_URL or base_url='
    )


async def test_start_up_fails_for_an_unreachable_kernel_unless_the_check_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = closed_url()
    refused = await start_up(Agent("a", secret=SECRET, base_url=url))
    monkeypatch.setenv(CHECK_ENV, "false")
    unchecked = await start_up(Agent("a", secret=SECRET, base_url=url))

    assert refused["type"] == "lifespan.startup.failed"
    assert refused["message"] == (
        f"cannot start agent 'a': the kernel at {url} is unreachable: the connection was"
        " refused (is the kernel running, on that port?); check REBUNO_URL or base_url="
    )
    assert unchecked["type"] == "lifespan.startup.complete"


async def test_a_host_name_that_does_not_resolve_is_named() -> None:
    answer = await start_up(Agent("a", secret=SECRET, base_url="http://no-such-host.invalid"))

    assert "is unreachable: its host name does not resolve" in answer["message"]


def test_run_exits_with_one_line_when_the_kernel_is_unreachable() -> None:
    url = closed_url()
    script = (
        "from rebuno import Agent\n"
        f"Agent('a', secret='s', base_url={url!r}).run(lambda: None, host='127.0.0.1', port=0)\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"cannot start agent 'a': the kernel at {url} is unreachable: the connection was"
        " refused (is the kernel running, on that port?); check REBUNO_URL or base_url="
    ]


async def test_start_up_goes_on_past_a_kernel_that_answers_but_is_unwell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rebuno")
    async with serving(unwell_kernel) as url:
        answer = await start_up(Agent("a", secret=SECRET, base_url=url))

    assert answer["type"] == "lifespan.startup.complete"
    assert any(f"the kernel at {url} is unwell" in r.getMessage() for r in caplog.records)
