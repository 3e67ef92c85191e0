"""Drives the ASGI app the way clients and agents do: a bearer client and signing agents."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import httpx

from rebuno.kernel.domain.records import Lease
from rebuno.kernel.service.kernel import Kernel
from rebuno.protocol.signing import sign_body, sign_request
from tests.support import ManualClock

AGENT = "researcher"
SECRET = "s3cret"
TOKEN = "test-token"
BASE_URL = "http://kernel.test"


class _Own(Enum):
    LEASE = "own lease"


OWN_LEASE = _Own.LEASE


def encode(body: object) -> bytes:
    """What Python SDKs send: `json.dumps` with its default separators."""
    return json.dumps(body).encode("utf-8")


@dataclass
class AgentClient:
    """Signs every request as the agent would: `v1=` (SDK 0.29) or `sha256=` (SDK 0.16)."""

    http: httpx.AsyncClient
    clock: ManualClock
    agent_id: str = AGENT
    secret: str = SECRET
    scheme: str = "v1"
    lease: Lease | None = None
    skew_seconds: int = 0
    extra_headers: dict[str, str] = field(default_factory=dict)

    def headers(self, method: str, target: str, body: bytes, lease: Lease | None) -> dict[str, str]:
        headers = {"Rebuno-Agent-Id": self.agent_id, "Content-Type": "application/json"}
        dispatch_id, attempt = (
            ("", "") if lease is None else (lease.dispatch_id, str(lease.attempt))
        )
        if lease is not None:
            headers["Rebuno-Dispatch-Id"] = dispatch_id
            headers["Rebuno-Dispatch-Attempt"] = attempt
        if self.scheme == "v1":
            timestamp = str(int(self.clock.now().timestamp()) + self.skew_seconds)
            headers["Rebuno-Timestamp"] = timestamp
            headers["Rebuno-Signature"] = sign_request(
                self.secret, method, target, timestamp, dispatch_id, attempt, body
            )
        else:
            headers["Rebuno-Signature"] = sign_body(self.secret, body)
        return {**headers, **self.extra_headers}

    async def request(
        self,
        method: str,
        target: str,
        body: object = None,
        *,
        content: bytes | None = None,
        lease: Lease | _Own | None = OWN_LEASE,
    ) -> httpx.Response:
        """Signs and sends; `lease` defaults to the client's own, None sends no lease."""
        raw = content if content is not None else (b"" if body is None else encode(body))
        used = self.lease if isinstance(lease, _Own) else lease
        headers = self.headers(method, target, raw, used)
        return await self.http.request(method, target, content=raw, headers=headers)

    async def get(self, target: str) -> httpx.Response:
        return await self.request("GET", target, lease=None)

    async def post(self, target: str, body: object = None, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", target, body, **kwargs)


async def claim(kernel: Kernel, execution_id: str) -> Lease:
    """Claims the execution's due dispatch, as the dispatch loop does before delivering."""
    for claimed in await kernel.claim(10):
        if claimed.dispatch.execution_id == execution_id:
            return Lease(claimed.dispatch.id, claimed.dispatch.attempt)
    raise AssertionError(f"no due dispatch for execution {execution_id}")


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is the §3.1 envelope with this status and code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    envelope: dict[str, Any] = response.json()
    assert envelope["code"] == code
    assert isinstance(envelope["message"], str)
    assert set(envelope) <= {"code", "message", "details"}
    return envelope


async def issue_key(bootstrap: httpx.AsyncClient, name: str, *scopes: str) -> tuple[str, str]:
    """A new scoped API key (§34.3) issued with the bootstrap token: its id and its token."""
    response = await bootstrap.post("/v0/api-keys", json={"name": name, "scopes": list(scopes)})
    assert response.status_code == 201, response.text
    body = response.json()
    return str(body["id"]), str(body["token"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
