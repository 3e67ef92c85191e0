"""The recording transport for httpx: each JSON request made inside an execution becomes an
`llm_call` step (docs/protocol.md §19), so a re-dispatch replays the model's answer instead of
paying for it again.

Refusals come back as 403/429 answers carrying the `rebuno_refusal` marker rather than as
exceptions, because provider SDKs retry and rewrap exceptions raised inside their transport.
Streamed answers are teed: the caller reads them live, the kernel's stream side channel gets
batched deltas (§16.1), and the whole body is recorded at the end. Imports only httpx and the
SDK's own modules; never the kernel.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rebuno.protocol.enums import Decision
from rebuno.sdk._context import ExecutionContext, current
from rebuno.sdk.errors import (
    REFUSAL_TYPE,
    LeaseSuperseded,
    RebunoError,
    Terminated,
    refusal_message,
)
from rebuno.types import StepDecision

logger = logging.getLogger("rebuno")

_BATCH_INTERVAL = 0.05
_SLICE_CHARS = 1750
_REFUSAL_STATUS = {"rate_limited": 429, "lease_superseded": 409}
_REASONED = {"denied": "policy_denied", "rate_limited": "rate_limit_exceeded"}


def http_client(**kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` whose requests inside an execution are recorded as LLM steps.

    Hand it to a provider SDK; every keyword is passed on to `httpx.AsyncClient`. A
    `transport=` you pass is wrapped, so proxies and retries you configured keep working.

    Example:
        from openai import AsyncOpenAI
        llm = AsyncOpenAI(http_client=rebuno.http_client(timeout=60.0))
    """
    inner = kwargs.pop("transport", None)
    return httpx.AsyncClient(transport=RebunoTransport(inner), **kwargs)


class RebunoTransport(httpx.AsyncBaseTransport):
    """An httpx transport that records JSON requests made inside an execution.

    Outside an execution, and for requests whose body is not JSON, it passes requests through
    untouched. The request body's `model` is the step's target.

    Args:
        inner: The transport that reaches the provider; a new `httpx.AsyncHTTPTransport`
            when omitted.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        context = current()
        body = _json_body(await request.aread()) if context is not None else None
        if context is None or body is None:
            return await self._inner.handle_async_request(request)
        target = body.get("model", "") if isinstance(body, dict) else ""
        return await self._record(context, request, str(target or ""), body)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _record(
        self, context: ExecutionContext, request: httpx.Request, target: str, body: Any
    ) -> httpx.Response:
        try:
            decision = await context.begin_llm(target, body)
        except LeaseSuperseded:
            return _refusal(request, "lease_superseded", "")
        except Terminated:
            return _refusal(request, "execution_terminal", "")
        if decision.decision == Decision.PROCEED:
            return await self._forward(context, request, decision.step_id)
        if decision.decision == Decision.REPLAY:
            return _replay(request, decision)
        context.refusal(decision)  # remembers Blocked / Terminated so the agent unwinds
        return _refusal(request, decision.decision, decision.reason)

    async def _forward(
        self, context: ExecutionContext, request: httpx.Request, step_id: str
    ) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
            if _is_event_stream(response):
                return _teed(context, request, response, step_id)
            content = await response.aread()
        except httpx.HTTPError as exc:
            await context.fail_llm(step_id, str(exc) or type(exc).__name__)
            raise
        await context.record_llm(step_id, _record_of(response, content))
        return _rebuilt(request, response.status_code, _content_type(response), content)


def _json_body(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def _content_type(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", ""))


def _is_event_stream(response: httpx.Response) -> bool:
    return _content_type(response).startswith("text/event-stream")


def _record_of(response: httpx.Response, content: bytes) -> dict[str, Any]:
    return {
        "status": response.status_code,
        "headers": {"content-type": _content_type(response)},
        "body": content.decode("utf-8", "replace"),
    }


def _rebuilt(
    request: httpx.Request, status: int, content_type: str, content: bytes
) -> httpx.Response:
    # Only status, type and body: a stale content-length or encoding would corrupt the body.
    headers = {"content-type": content_type} if content_type else {}
    if content_type.startswith("text/event-stream"):
        return httpx.Response(status, headers=headers, stream=_Replay(content), request=request)
    return httpx.Response(status, headers=headers, content=content, request=request)


def _replay(request: httpx.Request, decision: StepDecision) -> httpx.Response:
    record = decision.result
    if decision.error is not None or not isinstance(record, dict):
        error = decision.error if isinstance(decision.error, dict) else {}
        message = str(error.get("message") or "recorded LLM call failed")
        raise httpx.NetworkError(message, request=request)
    headers = record.get("headers") or {}
    content_type = str(headers.get("content-type", "")) if isinstance(headers, dict) else ""
    body = str(record.get("body") or "").encode("utf-8")
    return _rebuilt(request, int(record.get("status") or 200), content_type, body)


def _refusal(request: httpx.Request, decision: str, reason: str) -> httpx.Response:
    reason = reason or _REASONED.get(decision, "")
    message = refusal_message(decision, reason)
    body = {"error": {"type": REFUSAL_TYPE, "message": message, "code": decision}}
    # x-should-retry stops provider SDKs from retrying a refusal as if it were an outage.
    headers = {"x-should-retry": "false"}
    status = _REFUSAL_STATUS.get(decision, 403)
    return httpx.Response(status, json=body, headers=headers, request=request)


class _Replay(httpx.AsyncByteStream):
    def __init__(self, content: bytes) -> None:
        self._content = content

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._content


def _teed(
    context: ExecutionContext, request: httpx.Request, upstream: httpx.Response, step_id: str
) -> httpx.Response:
    headers = [
        (name, value)
        for name, value in upstream.headers.multi_items()
        if name.lower() not in ("content-length", "content-encoding", "transfer-encoding")
    ]
    stream = _Tee(context, upstream, step_id)
    return httpx.Response(upstream.status_code, headers=headers, stream=stream, request=request)


class _Tee(httpx.AsyncByteStream):
    """Passes the provider's bytes through as they arrive, and records the whole at the end.

    Readers often stop at the stream's `[DONE]` and iterate again (or close) to drain the
    rest, so every iteration continues the one upstream iterator, and closing early drains
    it: only a complete answer is ever recorded.
    """

    def __init__(self, context: ExecutionContext, upstream: httpx.Response, step_id: str) -> None:
        self._context = context
        self._upstream = upstream
        self._source: AsyncIterator[bytes] | None = None
        self._step_id = step_id
        self._parts: list[bytes] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._publisher = _DeltaPublisher(context, step_id)
        self._finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._source is None:
            self._source = self._upstream.aiter_bytes()
        try:
            async for chunk in self._source:
                self._parts.append(chunk)
                self._publisher.feed(self._decoder.decode(chunk))
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            await self._fail(exc)
            raise
        await self._complete()

    async def aclose(self) -> None:
        try:
            if not self._finished:
                async for _ in self:
                    pass
        except httpx.HTTPError as exc:
            # Already recorded as the step's failure; closing must not raise for it again.
            logger.warning(
                "stream of step_id=%s execution_id=%s failed while draining: %r",
                self._step_id,
                self._context.id,
                exc,
            )
        finally:
            await self._upstream.aclose()

    async def _complete(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._publisher.feed(self._decoder.decode(b"", final=True))
        await self._publisher.finish()
        record = _record_of(self._upstream, b"".join(self._parts))
        await self._context.record_llm(self._step_id, record)

    async def _fail(self, exc: BaseException) -> None:
        # A truncated answer must never be recorded as the call's result.
        if self._finished:
            return
        self._finished = True
        self._publisher.abort()
        try:
            message = f"stream ended early: {exc!r}"
            await asyncio.shield(self._context.fail_llm(self._step_id, message))
        except (RebunoError, asyncio.CancelledError) as failure:
            # The stream's own error matters more; losing this record only reruns the call.
            logger.warning(
                "could not record failed stream step_id=%s execution_id=%s: %r",
                self._step_id,
                self._context.id,
                failure,
            )


class _DeltaPublisher:
    """Sends a stream's text to the kernel in ~50 ms batches of at most 1750 characters."""

    def __init__(self, context: ExecutionContext, step_id: str) -> None:
        self._context = context
        self._step_id = step_id
        self._pending: list[str] = []
        self._ready = asyncio.Event()
        self._closed = False
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def feed(self, text: str) -> None:
        if not text:
            return
        self._pending.append(text)
        self._ready.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"rebuno-stream-{self._step_id}")

    async def finish(self) -> None:
        self._closed = True
        self._ready.set()
        if self._task is not None:
            await self._task

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            if not self._closed:
                await asyncio.sleep(_BATCH_INTERVAL)
            self._ready.clear()
            await self._flush()
            if self._closed and not self._pending:
                return

    async def _flush(self) -> None:
        text = "".join(self._pending)
        self._pending.clear()
        for start in range(0, len(text), _SLICE_CHARS):
            await self._publish(text[start : start + _SLICE_CHARS])

    async def _publish(self, data: str) -> None:
        seq, self._seq = self._seq, self._seq + 1
        try:
            await self._context.publish_llm_delta(self._step_id, seq, data)
        except RebunoError as exc:
            # Live deltas are a best-effort side channel; the recorded result is the truth.
            logger.warning(
                "stream delta dropped step_id=%s execution_id=%s: %s",
                self._step_id,
                self._context.id,
                exc,
            )
