"""The agent's signed client for the kernel's agent routes (PROTOCOL §2.3, §5.2, §12, §16.1).

Every request is signed with the `v1=` request scheme; every write carries the lease
(`Rebuno-Dispatch-Id`, `Rebuno-Dispatch-Attempt`) the webhook was delivered under. Imports only
`rebuno.protocol`, httpx and the SDK's own models; never the kernel.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from rebuno.protocol import signing
from rebuno.sdk.errors import NetworkError, error_from_envelope
from rebuno.types import Execution, StepDecision


@dataclass(frozen=True, slots=True)
class Lease:
    """The delivery a handler runs under: `(dispatch_id, attempt)` and the lease period."""

    dispatch_id: str
    attempt: int
    timeout: float

    def headers(self) -> dict[str, str]:
        return {
            signing.DISPATCH_ID_HEADER: self.dispatch_id,
            signing.DISPATCH_ATTEMPT_HEADER: str(self.attempt),
        }


def encode_json(value: Any) -> bytes:
    """Encode a JSON body, refusing anything that is not plain JSON with a `TypeError`."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"value is not JSON-serializable: {exc}") from None


class KernelClient:
    """Signed HTTP calls from one agent to the kernel. The connection pool opens lazily."""

    def __init__(self, *, agent_id: str, secret: str, base_url: str, timeout: float) -> None:
        self.agent_id = agent_id
        self._secret = secret
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._http: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def get_execution(self, execution_id: str) -> Execution:
        response = await self._send("GET", f"/v0/executions/{execution_id}")
        return Execution.model_validate_json(response.content)

    async def submit_step(
        self,
        execution_id: str,
        lease: Lease,
        *,
        kind: str,
        target: str,
        args: Any,
        idempotency: str,
        completions: list[dict[str, Any]] | None = None,
    ) -> StepDecision:
        body = {"kind": kind, "target": target, "args": args, "idempotency": idempotency}
        if completions:
            body["completions"] = completions
        path = f"/v0/executions/{execution_id}/steps"
        response = await self._send("POST", path, body, lease)
        return StepDecision.model_validate_json(response.content)

    async def complete_step(
        self, execution_id: str, step_id: str, lease: Lease, result: Any
    ) -> None:
        path = f"/v0/executions/{execution_id}/steps/{step_id}/complete"
        await self._send("POST", path, {"result": result}, lease)

    async def fail_step(self, execution_id: str, step_id: str, lease: Lease, error: Any) -> None:
        path = f"/v0/executions/{execution_id}/steps/{step_id}/fail"
        await self._send("POST", path, {"error": error}, lease)

    async def stream_delta(
        self, execution_id: str, step_id: str, lease: Lease, *, seq: int, data: str
    ) -> None:
        path = f"/v0/executions/{execution_id}/steps/{step_id}/stream"
        await self._send("POST", path, {"seq": seq, "data": data}, lease)

    async def heartbeat(self, execution_id: str, lease: Lease) -> None:
        await self._send("POST", f"/v0/executions/{execution_id}/heartbeat", None, lease)

    async def complete_execution(
        self,
        execution_id: str,
        lease: Lease,
        output: Any,
        completions: list[dict[str, Any]] | None = None,
    ) -> None:
        body: dict[str, Any] = {"output": output}
        if completions:
            body["completions"] = completions
        await self._send("POST", f"/v0/executions/{execution_id}/complete", body, lease)

    async def fail_execution(
        self,
        execution_id: str,
        lease: Lease,
        error: str,
        completions: list[dict[str, Any]] | None = None,
    ) -> None:
        body: dict[str, Any] = {"error": error}
        if completions:
            body["completions"] = completions
        await self._send("POST", f"/v0/executions/{execution_id}/fail", body, lease)

    async def _send(
        self, method: str, path: str, body: Any = None, lease: Lease | None = None
    ) -> httpx.Response:
        content = b"" if body is None else encode_json(body)
        request = self._client().build_request(method, self._base_url + path, content=content)
        self._sign(request, content, lease)
        try:
            response = await self._client().send(request)
        except httpx.TransportError as exc:
            raise NetworkError(f"{method} {path}: {exc!r}") from exc
        if response.status_code >= 300:
            raise error_from_envelope(response.status_code, response.content)
        return response

    def _sign(self, request: httpx.Request, body: bytes, lease: Lease | None) -> None:
        timestamp = str(int(time.time()))
        dispatch_id, attempt = (lease.dispatch_id, str(lease.attempt)) if lease else ("", "")
        # The target must be the path and query exactly as they go on the request line.
        target = request.url.raw_path
        request.headers[signing.AGENT_ID_HEADER] = self.agent_id
        request.headers[signing.TIMESTAMP_HEADER] = timestamp
        request.headers["Content-Type"] = "application/json"
        if lease is not None:
            request.headers.update(lease.headers())
        request.headers[signing.SIGNATURE_HEADER] = signing.sign_request(
            self._secret, request.method, target, timestamp, dispatch_id, attempt, body
        )

    def _client(self) -> httpx.AsyncClient:
        # Created on first use so the pool belongs to the loop that serves the webhook.
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout)
        return self._http
