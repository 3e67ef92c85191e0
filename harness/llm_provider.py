"""A fake OpenAI-compatible chat provider: the LLM edge the SDK's transport records, and the
official `openai` client that reaches it through `http_client()`.

Every reply names the call's ordinal (`reply #3 to ...`), so a second real call can never be
mistaken for a replay of the first. Serves JSON or, with `"stream": true`, server-sent events.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from harness.asgi import asgi_body, asgi_lifespan
from rebuno import http_client


def openai_client(base_url: str) -> openai.AsyncOpenAI:
    """An `openai` client whose requests go through the SDK's recording `http_client()`."""
    http = http_client()
    # openai annotates `http_client` with its own httpx2 client type only, but it checks at
    # run time for an httpx2 or an httpx `AsyncClient` and takes either; ours is httpx's.
    return openai.AsyncOpenAI(api_key="sk-test", base_url=base_url, http_client=http)  # type: ignore[arg-type]


class FakeProvider:
    """An ASGI app answering `POST /v1/chat/completions`; `calls` holds each request body."""

    def __init__(self, reply_chars: int = 0, pieces: int = 3) -> None:
        self.calls: list[dict[str, Any]] = []
        self._reply_chars = reply_chars
        self._pieces = pieces

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        request = json.loads(await asgi_body(receive))
        self.calls.append(request)
        text = self._reply(request)
        if request.get("stream"):
            await _respond(send, "text/event-stream", self._events(request, text))
        else:
            await _respond(send, "application/json", [json.dumps(self._completion(request, text))])

    def _reply(self, request: dict[str, Any]) -> str:
        prompt = request["messages"][-1]["content"] if request.get("messages") else ""
        text = f"reply #{len(self.calls)} to {prompt}"
        return text.ljust(self._reply_chars, ".")

    def _completion(self, request: dict[str, Any], text: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{len(self.calls)}",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        }

    def _events(self, request: dict[str, Any], text: str) -> list[str]:
        size = max(1, -(-len(text) // self._pieces))
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        chunks = [self._chunk(request, {"content": piece}, None) for piece in pieces]
        chunks.append(self._chunk(request, {}, "stop"))
        return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]

    def _chunk(
        self, request: dict[str, Any], delta: dict[str, Any], finish: str | None
    ) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{len(self.calls)}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": request["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }


async def _respond(send: Any, content_type: str, parts: list[str]) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for part in parts:
        await send({"type": "http.response.body", "body": part.encode(), "more_body": True})
    await send({"type": "http.response.body", "body": b""})
