"""Acting as an agent by hand, on loopback: a webhook receiver that records the deliveries a
kernel POSTs (and can hold one open), and a signed client for the agent's calls back.

Everything here is thread-based and synchronous, like the process helpers beside it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from harness.polling import poll_until
from rebuno.protocol import signing

_HOLD_LIMIT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook the kernel POSTed: the lease the agent runs under."""

    execution_id: str
    dispatch_id: str
    attempt: int
    lease_timeout_seconds: float

    def headers(self) -> dict[str, str]:
        return {
            signing.DISPATCH_ID_HEADER: self.dispatch_id,
            signing.DISPATCH_ATTEMPT_HEADER: str(self.attempt),
        }


class WebhookReceiver:
    """An agent's webhook on a free loopback port. Verifies the signature, records the
    delivery, answers 200 and then calls `on_delivery` (on the request's own thread, after
    the answer, as an agent runs its handler in the background). With `hold_first`, the first
    delivery is recorded but left unanswered until `release()`."""

    def __init__(
        self,
        secret: str,
        *,
        on_delivery: Callable[[Delivery], None] | None = None,
        hold_first: bool = False,
    ) -> None:
        self._secret = secret
        self._on_delivery = on_delivery
        self._hold_next = hold_first
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self.held = threading.Event()
        self._released = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/webhook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def wait_for(
        self, condition: Callable[[list[Delivery]], bool], timeout: float, what: str
    ) -> list[Delivery]:
        poll_until(lambda: condition(self.deliveries), timeout, what)
        return self.deliveries

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    def _record(self, body: bytes, signature: str) -> tuple[Delivery | None, bool]:
        """The delivery (None when the request is not a valid webhook) and whether to hold."""
        if not signing.verify_body(self._secret, body, signature):
            return None, False
        fields = json.loads(body)
        delivery = Delivery(
            fields["execution_id"],
            fields["dispatch_id"],
            fields["dispatch_attempt"],
            fields["lease_timeout_seconds"],
        )
        with self._lock:
            self._deliveries.append(delivery)
            hold, self._hold_next = self._hold_next, False
        return delivery, hold

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                signature = self.headers.get(signing.SIGNATURE_HEADER) or ""
                delivery, hold = receiver._record(body, signature)
                if hold:
                    receiver.held.set()
                    receiver._released.wait(_HOLD_LIMIT_SECONDS)
                with contextlib.suppress(OSError):  # the sender may be dead by now
                    self.send_response(200 if delivery else 401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                if delivery and not hold and receiver._on_delivery:
                    receiver._on_delivery(delivery)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler


class AgentClient:
    """Signed agent-route calls (the `v1=` request scheme, the one every server accepts) to
    any replica."""

    def __init__(self, agent_id: str, secret: str) -> None:
        self._agent_id = agent_id
        self._secret = secret
        self._http = httpx.Client(timeout=10)

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        base_url: str,
        path: str,
        body: object = None,
        lease: Delivery | None = None,
    ) -> httpx.Response:
        content = b"" if body is None else json.dumps(body).encode()
        timestamp = str(int(time.time()))
        dispatch_id, attempt = (lease.dispatch_id, str(lease.attempt)) if lease else ("", "")
        signature = signing.sign_request(
            self._secret, "POST", path, timestamp, dispatch_id, attempt, content
        )
        headers = {
            "Content-Type": "application/json",
            signing.AGENT_ID_HEADER: self._agent_id,
            signing.TIMESTAMP_HEADER: timestamp,
            signing.SIGNATURE_HEADER: signature,
            **(lease.headers() if lease else {}),
        }
        return self._http.post(base_url + path, content=content, headers=headers)

    def submit(self, base_url: str, lease: Delivery, target: str, args: object) -> dict[str, Any]:
        path = f"/v0/executions/{lease.execution_id}/steps"
        body = {"kind": "tool_call", "target": target, "args": args}
        response = self.call(base_url, path, body, lease)
        response.raise_for_status()
        decision: dict[str, Any] = response.json()
        return decision
