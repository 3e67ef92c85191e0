"""A tiny OpenAI-compatible chat-completions server, so the LLM example runs offline.

python examples/llm_stub.py        # http://127.0.0.1:5010/v1 (PORT changes the port)

It answers `POST /v1/chat/completions` with the same text for the same last user message,
whole or, when the request asks for `"stream": true`, as server-sent events: one chunk per
word, LLM_STUB_DELAY seconds apart (default 0.05), then `data: [DONE]`. Standard library only.
"""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY = float(os.environ.get("LLM_STUB_DELAY", "0.05"))


def answer(prompt: str) -> str:
    return (
        f"This is the local stub model answering {prompt!r}. Each word arrives as its own "
        "chunk, so a client following the execution sees the text grow while the step runs, "
        "and the kernel records the whole answer when the stream ends."
    )


def last_user_message(request: dict[str, object]) -> str:
    messages = request.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


def completion(model: str, text: str) -> dict[str, object]:
    message = {"role": "assistant", "content": text}
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage(text),
    }


def chunk(model: str, delta: dict[str, str], finish: str | None) -> dict[str, object]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage(text: str) -> dict[str, int]:
    words = len(text.split())
    return {"prompt_tokens": 0, "completion_tokens": words, "total_tokens": words}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "stub"}})
            return
        try:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = json.loads(body)
        except ValueError:
            self.send_json(400, {"error": {"message": "the body is not JSON", "type": "stub"}})
            return
        model = str(request.get("model", "stub"))
        text = answer(last_user_message(request))
        if request.get("stream"):
            self.send_stream(model, text)
        else:
            self.send_json(200, completion(model, text))

    def send_json(self, status: int, document: dict[str, object]) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def send_stream(self, model: str, text: str) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.send_event(chunk(model, {"role": "assistant", "content": ""}, None))
        for index, word in enumerate(text.split(" ")):
            time.sleep(DELAY)  # a model's pace, so the stream can be watched
            self.send_event(chunk(model, {"content": word if index == 0 else f" {word}"}, None))
        self.send_event(chunk(model, {}, "stop"))
        self.send_chunk(b"data: [DONE]\n\n")
        self.send_chunk(b"")

    def send_event(self, document: dict[str, object]) -> None:
        self.send_chunk(f"data: {json.dumps(document)}\n\n".encode())

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the agent's and the kernel's logs tell the story


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "5010"))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"llm stub on http://127.0.0.1:{port}/v1", flush=True)
    server.serve_forever()
