"""LLM calls through `http_client()` and the official `openai` client, against a real kernel and
a fake provider on loopback: record, replay, refusals, streamed answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from harness.llm_provider import FakeProvider, openai_client
from harness.polling import wait_until
from rebuno import PolicyError, http_client, raise_for_refusal, tool
from rebuno.types import ExecutionStatus, StreamDelta
from tests.sdk.conftest import Harness
from tests.sdk.loopback import serving

GATE_SEND = """
rules:
  - id: gate-send
    when: {step_kind: tool_call, target: send}
    then: {decision: require_approval}
default_action: allow
"""


@tool
async def send(text: str) -> str:
    return f"sent: {text}"


@pytest.fixture
async def provider() -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider()
    async with serving(fake) as url:
        yield fake, url + "/v1"


async def _approve_and_wait(harness: Harness, execution_id: str) -> Any:
    async def blocked() -> bool:
        return (await harness.client.get(execution_id)).status is ExecutionStatus.BLOCKED

    await wait_until(blocked, timeout=20, message="execution blocked")
    [approval] = await harness.client.list_approvals(execution_id=execution_id)
    await harness.client.grant_approval(approval.id, decided_by="alice")
    return await harness.client.wait(execution_id, timeout=20)


async def test_llm_call_is_recorded_then_replayed_without_the_provider(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    fake, base_url = provider
    replies: list[Any] = []

    async def process(question: str) -> str:
        async with openai_client(base_url) as llm:
            reply = await llm.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": question}]
            )
        replies.append(reply)
        return str(await send(reply.choices[0].message.content or ""))

    async with harness.serve("asker", process, policy=GATE_SEND):
        created = await harness.client.create("asker", {"question": "why?"})
        done = await _approve_and_wait(harness, created.id)

    assert len(fake.calls) == 1
    assert done.output == "sent: reply #1 to why?"
    assert [r.model_dump() for r in replies[1:]] == [replies[0].model_dump()]
    [llm_step, _] = await harness.client.list_steps(created.id)
    assert (llm_step.kind, llm_step.target, llm_step.args["model"]) == (
        "llm_call",
        "gpt-test",
        "gpt-test",
    )
    assert llm_step.result["status"] == 200
    assert llm_step.result["headers"] == {"content-type": "application/json"}


async def test_streamed_llm_call_is_teed_recorded_and_replayed_as_a_stream(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    fake, base_url = provider
    texts: list[str] = []

    async def process() -> str:
        async with openai_client(base_url) as llm:
            stream = await llm.chat.completions.create(
                model="gpt-stream", messages=[{"role": "user", "content": "tell"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        texts.append(text)
        return str(await send(text))

    async with harness.serve("streamer", process, policy=GATE_SEND):
        created = await harness.client.create("streamer")
        done = await _approve_and_wait(harness, created.id)

    assert texts == ["reply #1 to tell", "reply #1 to tell"]
    assert len(fake.calls) == 1
    assert done.output == "sent: reply #1 to tell"
    [llm_step, _] = await harness.client.list_steps(created.id)
    assert llm_step.result["headers"] == {"content-type": "text/event-stream"}
    assert llm_step.result["body"].endswith("data: [DONE]\n\n")


async def test_stream_deltas_reach_client_stream_in_slices(harness: Harness) -> None:
    fake = FakeProvider(reply_chars=4000, pieces=1)
    watched = asyncio.Event()

    async def process() -> int:
        async with serving(fake) as url, openai_client(url + "/v1") as llm:
            calls = 0
            # Deltas published before the watcher connects are lost by design; keep streaming.
            # At least once: a run delivered again (a lease lost on a busy machine) settles the
            # step its first attempt left executing, which may be the one watched.
            while calls == 0 or not watched.is_set():
                calls += 1
                stream = await llm.chat.completions.create(
                    model="gpt-long",
                    messages=[{"role": "user", "content": str(calls)}],
                    stream=True,
                )
                async for _ in stream:
                    pass
        return calls

    async with harness.serve("long-streamer", process):
        created = await harness.client.create("long-streamer")
        deltas = await _watch_one_step(harness, created.id, watched)
        done = await harness.client.wait(created.id, timeout=20)

    assert done.status is ExecutionStatus.COMPLETED
    # Fetched on its own: a step list leaves a result this large out (§5.2).
    step = await harness.client.get_step(created.id, deltas[0].step_id)
    body = step.result["body"]
    assert all(len(d.data) <= 1750 for d in deltas)
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    assert "".join(d.data for d in deltas) == body


async def _watch_one_step(
    harness: Harness, execution_id: str, watched: asyncio.Event
) -> list[StreamDelta]:
    """Deltas of the first step whose stream was seen from seq 0 through its end."""
    by_step: dict[str, list[StreamDelta]] = {}
    async for delta in harness.client.stream(execution_id):
        by_step.setdefault(delta.step_id, []).append(delta)
        complete = [d for d in by_step.values() if d[0].seq == 0 and "[DONE]" in d[-1].data]
        if complete:
            watched.set()
            return complete[0]
    raise AssertionError("stream ended")


async def test_denied_llm_call_surfaces_as_policy_error_through_openai(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    fake, base_url = provider
    policy = """
rules:
  - id: no-big-model
    when: {step_kind: llm_call, target: "gpt-big*"}
    then: {decision: deny, reason: too expensive}
default_action: allow
"""
    caught: list[PolicyError] = []

    async def process() -> str:
        try:
            async with openai_client(base_url) as llm:
                await llm.chat.completions.create(model="gpt-big-1", messages=[])
        except openai.PermissionDeniedError as exc:
            try:
                raise_for_refusal(exc)
            except PolicyError as denial:
                caught.append(denial)
        return "handled"

    async with harness.serve("frugal", process, policy=policy):
        done = await harness.run("frugal")

    assert done.output == "handled"
    assert [c.reason for c in caught] == ["too expensive"]
    assert fake.calls == []


async def test_unhandled_llm_denial_fails_execution_with_kernel_reason(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    _, base_url = provider
    policy = """
rules:
  - id: no-llm
    when: {step_kind: llm_call}
    then: {decision: deny, reason: no models today}
default_action: allow
"""

    async def process() -> None:
        async with openai_client(base_url) as llm:
            await llm.chat.completions.create(model="m", messages=[])

    async with harness.serve("modelless", process, policy=policy):
        done = await harness.run("modelless")

    assert done.failure_reason == "policy_denied: no models today"


async def test_llm_call_awaiting_approval_parks_even_if_handler_swallows_it(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    fake, base_url = provider
    policy = """
rules:
  - id: ask-first
    when: {step_kind: llm_call}
    then: {decision: require_approval}
default_action: allow
"""
    swallowed: list[Exception] = []

    async def process() -> str:
        try:
            async with openai_client(base_url) as llm:
                await llm.chat.completions.create(model="m", messages=[])
        except Exception as exc:
            swallowed.append(exc)
        return "moved on"

    async with harness.serve("patient", process, policy=policy) as agent:
        created = await harness.client.create("patient")
        await wait_until(lambda: bool(swallowed), timeout=20)
        await agent.join()
        state = await harness.client.get(created.id)

    assert state.status is ExecutionStatus.BLOCKED
    assert isinstance(swallowed[0], openai.PermissionDeniedError)
    assert fake.calls == []


async def test_transport_passes_through_outside_an_execution(
    provider: tuple[FakeProvider, str],
) -> None:
    fake, base_url = provider

    async with http_client() as http:
        response = await http.post(
            base_url + "/chat/completions", json={"model": "m", "messages": []}
        )

    assert response.json()["choices"][0]["message"]["content"] == "reply #1 to "
    assert len(fake.calls) == 1


async def test_non_json_request_inside_an_execution_is_not_recorded(
    harness: Harness, provider: tuple[FakeProvider, str]
) -> None:
    _, base_url = provider
    statuses: list[int] = []

    async def process() -> None:
        async with http_client() as http:
            response = await http.post(base_url + "/upload", content=b"\x00binary")
            statuses.append(response.status_code)

    async with harness.serve("uploader", process):
        done = await harness.run("uploader")

    assert done.status is ExecutionStatus.COMPLETED
    assert await harness.client.list_steps(done.id) == []
    assert statuses and isinstance(statuses[0], int)
    _ = httpx
