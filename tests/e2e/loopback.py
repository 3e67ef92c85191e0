"""Loopback endpoints the kernel processes talk to in end-to-end tests: a webhook receiver that
records deliveries (and can hold one open), a signed agent client for acting as the agent, and
a TCP relay in front of PostgreSQL that can be cut and restored.

Everything here is thread-based and synchronous, like the process helpers beside it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from rebuno.protocol import signing
from tests.support import poll_until

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


class Relay:
    """A loopback TCP relay to `upstream`. `cut()` drops every relayed connection and refuses
    new ones, as a network partition or a stopped server would; `restore()` listens again on
    the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener was cut
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while this one was connecting
                    _close(client)
                    _close(upstream)
                    return
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
