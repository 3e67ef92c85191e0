"""`Client`: the bearer-authenticated caller of the kernel's client API (docs/protocol.md §5.1,
§5.3, §16.2): executions, their events and steps, approvals, and live output streams.

Requests go through the lean keep-alive pool of `rebuno._http`; only `stream` (server-sent
events, long-lived) goes through httpx, opened on first use. Errors come back as the SDK's
exceptions, chosen from the envelope's code. Imports only `rebuno._http`, httpx (for `stream`
and its TLS trust settings) and the SDK's own modules and models; never the kernel.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any, Self
from urllib.parse import quote, urlencode

import httpx

from rebuno._http import Pool, Response
from rebuno.sdk._wire import JSON, open_pool, segment, send
from rebuno.sdk.errors import NetworkError, error_from_envelope
from rebuno.types import Approval, Event, Execution, ExecutionPage, SpawnedBy, Step, StreamDelta

_WAIT_FIRST_DELAY = 0.05
_WAIT_MAX_DELAY = 1.0
# How long the kernel may hold the read of a live execution for `wait` (its long poll): 10 s,
# or less, so that the held request still ends inside the client's own request timeout.
_LONG_POLL = 10.0
_LONG_POLL_MARGIN = 1.0
# One compact encoder for every body: json.dumps with options builds a fresh one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class Client:
    """An async client for creating and inspecting executions and deciding approvals.

    Connections to the kernel open on first use and are kept alive between requests. They go
    straight to the kernel: proxy settings in the environment (`HTTPS_PROXY`, ...) are not
    used, while `SSL_CERT_FILE` and `SSL_CERT_DIR` are.

    Args:
        base_url: The kernel's URL; defaults to `REBUNO_URL`.
        api_key: Bearer token sent as `Authorization: Bearer ...`; defaults to `REBUNO_API_KEY`.
        timeout: Timeout in seconds of each request.

    Example:
        async with Client(base_url="http://127.0.0.1:8080") as client:
            execution = await client.create("hello", input={"name": "Ada"})
            done = await client.wait(execution.id, timeout=30)
    """

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 35.0
    ) -> None:
        base_url = base_url or os.environ.get("REBUNO_URL", "")
        if not base_url:
            raise ValueError("no kernel URL: pass base_url= or set REBUNO_URL")
        api_key = api_key if api_key is not None else os.environ.get("REBUNO_API_KEY", "")
        self._base_url = base_url.rstrip("/")
        self._headers = [("Authorization", f"Bearer {api_key}")] if api_key else []
        self._timeout = timeout
        self._pool: Pool | None = None
        self._http: httpx.AsyncClient | None = None
        self._closed = False

    async def close(self) -> None:
        """Close the connections; a closed client sends no more requests."""
        self._closed = True
        pool, self._pool = self._pool, None
        http, self._http = self._http, None
        if pool is not None:
            await pool.aclose()
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.close()

    async def create(
        self,
        agent_id: str,
        input: Any = None,
        *,
        session: str = "",
        parent_execution_id: str = "",
        idempotency_key: str = "",
        spawned_by: SpawnedBy | None = None,
        on_behalf_of: str = "",
    ) -> Execution:
        """Create an execution of `agent_id` on `input`; the kernel dispatches the agent.

        Args:
            session: The conversation this execution is a turn of: the turns of a session
                run one at a time, in creation order, and each continues the agent's last
                completed turn (its `previous()` reads that one's state).
            parent_execution_id: A completed execution of the same agent this one continues:
                its `previous()` reads that one's state. With a `session`, that session must
                be new (a branch).
            idempotency_key: Creates under a key the agent used before answer that execution
                (as it is now) instead of making another.
            on_behalf_of: The end user the caller acts for, recorded as given.
            spawned_by: Sub-agents; a kernel without them refuses it.
        """
        body: dict[str, Any] = {"agent_id": agent_id}
        if input is not None:
            body["input"] = input
        for name, value in (
            ("session", session),
            ("parent_execution_id", parent_execution_id),
            ("idempotency_key", idempotency_key),
            ("on_behalf_of", on_behalf_of),
        ):
            if value:
                body[name] = value
        if spawned_by is not None:
            body["spawned_by"] = spawned_by.model_dump()
        response = await self._request("POST", "/v0/executions", json=body)
        return Execution.model_validate_json(response.body)

    async def fork(
        self, execution_id: str, *, at_seq: int, session: str = "", policy_bundle: str = ""
    ) -> Execution:
        """A new execution of the same agent and input that replays what `execution_id`
        recorded up to its event `at_seq` and runs the rest live; in a new `session` if
        given, and decided by `policy_bundle` (YAML) instead of the source's policy."""
        body: dict[str, Any] = {"at_seq": at_seq}
        if session:
            body["session"] = session
        if policy_bundle:
            body["policy_bundle"] = policy_bundle
        path = f"/v0/executions/{segment(execution_id)}/fork"
        response = await self._request("POST", path, json=body)
        return Execution.model_validate_json(response.body)

    async def get(self, execution_id: str) -> Execution:
        """The execution's current state."""
        response = await self._request("GET", f"/v0/executions/{segment(execution_id)}")
        return Execution.model_validate_json(response.body)

    async def list(
        self,
        *,
        agent_id: str = "",
        status: str = "",
        session: str = "",
        cursor: str = "",
        limit: int = 50,
    ) -> ExecutionPage:
        """One page of executions, newest first, optionally filtered by agent, status and
        session."""
        params = _params(
            agent_id=agent_id, status=status, session=session, cursor=cursor, limit=limit
        )
        response = await self._request("GET", "/v0/executions", params=params)
        return ExecutionPage.model_validate_json(response.body)

    async def cancel(self, execution_id: str) -> None:
        """Cancel the execution. Raises `Terminated` when it already ended."""
        await self._request("POST", f"/v0/executions/{segment(execution_id)}/cancel")

    async def events(
        self, execution_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[Event]:
        """The execution's events with `event_seq > after_seq`, oldest first."""
        params = _params(after_seq=after_seq, limit=limit)
        path = f"/v0/executions/{segment(execution_id)}/events"
        response = await self._request("GET", path, params=params)
        return [Event.model_validate(item) for item in json.loads(response.body) or []]

    async def list_steps(self, execution_id: str, *, status: str = "") -> builtins.list[Step]:
        """The execution's steps; `status="terminal"` keeps only finished ones."""
        path = f"/v0/executions/{segment(execution_id)}/steps"
        response = await self._request("GET", path, params=_params(status=status))
        return [Step.model_validate(item) for item in json.loads(response.body) or []]

    async def get_step(self, execution_id: str, step_id: str) -> Step:
        """One step of the execution."""
        path = f"/v0/executions/{segment(execution_id)}/steps/{segment(step_id)}"
        response = await self._request("GET", path)
        return Step.model_validate_json(response.body)

    async def list_approvals(
        self, *, status: str = "pending", execution_id: str = ""
    ) -> builtins.list[Approval]:
        """Approvals with `status` (`all` for every one), optionally of one execution."""
        params = _params(status=status, execution_id=execution_id)
        response = await self._request("GET", "/v0/approvals", params=params)
        return [Approval.model_validate(item) for item in json.loads(response.body) or []]

    async def get_approval(self, approval_id: str) -> Approval:
        """One approval, whatever its status."""
        response = await self._request("GET", f"/v0/approvals/{segment(approval_id)}")
        return Approval.model_validate_json(response.body)

    async def grant_approval(
        self, approval_id: str, *, decided_by: str = "", rationale: str = ""
    ) -> None:
        """Grant the approval; the gated step proceeds when the execution is re-dispatched."""
        body = {"decided_by": decided_by, "rationale": rationale}
        await self._request("POST", f"/v0/approvals/{segment(approval_id)}/grant", json=body)

    async def deny_approval(
        self, approval_id: str, *, decided_by: str = "", rationale: str = ""
    ) -> None:
        """Deny the approval; the gated step comes back to the agent as a policy denial."""
        body = {"decided_by": decided_by, "rationale": rationale}
        await self._request("POST", f"/v0/approvals/{segment(approval_id)}/deny", json=body)

    # The documented API takes a timeout; it is applied with asyncio.timeout inside.
    async def wait(self, execution_id: str, *, timeout: float | None = None) -> Execution:  # noqa: ASYNC109
        """Wait until the execution is terminal and return it.

        This kernel holds the read of a live execution until it ends (a long poll), so the
        wait returns as soon as the execution does; against a kernel that answers at once,
        it polls, backing off gently.

        Raises:
            TimeoutError: `timeout` seconds passed first.
        """
        loop = asyncio.get_running_loop()
        delay = _WAIT_FIRST_DELAY
        path = f"/v0/executions/{segment(execution_id)}"
        held = min(_LONG_POLL, self._timeout - _LONG_POLL_MARGIN)
        hold = {"wait": f"{int(held * 1000)}ms"} if held >= _WAIT_FIRST_DELAY else {}
        async with asyncio.timeout(timeout):
            while True:
                asked = loop.time()
                response = await self._request("GET", path, params=hold)
                execution = Execution.model_validate_json(response.body)
                if execution.status.is_terminal:
                    return execution
                if loop.time() - asked < _WAIT_FIRST_DELAY:
                    # Answered at once while running: a kernel without the long poll.
                    await asyncio.sleep(delay)
                    delay = min(delay * 1.5, _WAIT_MAX_DELAY)

    async def stream(self, execution_id: str) -> AsyncIterator[StreamDelta]:
        """Yield the live output deltas of the execution's steps as they are published.

        Only deltas published after connecting arrive; the stream runs until you stop
        iterating. A gap in a step's `seq` means deltas were dropped: read the recorded step.

        Example:
            async for delta in client.stream(execution.id):
                print(delta.data, end="")
        """
        http = self._http or self._open_stream()
        timeout = httpx.Timeout(self._timeout, read=None)
        path = f"/v0/executions/{segment(execution_id)}/stream"
        try:
            async with http.stream("GET", path, timeout=timeout) as response:
                if response.status_code >= 300:
                    raise error_from_envelope(response.status_code, await response.aread())
                async for data in _sse_data(response.aiter_lines()):
                    yield StreamDelta.model_validate_json(data)
        except httpx.TransportError as exc:
            raise NetworkError(f"GET {path}: {exc!r}") from exc

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
    ) -> Response:
        """Send one request; `path` is escaped already, `params` are escaped here."""
        pool = self._pool or self._open()
        target = pool.prefix + path
        if params:
            target = f"{target}?{urlencode(params, quote_via=quote)}"
        headers, body = self._headers, b""
        if json is not None:
            headers, body = [*headers, JSON], _ENCODER.encode(json).encode()
        return await send(pool, method, target, headers, body, path)

    def _open(self) -> Pool:
        # Opened on first use, so the pool belongs to the loop that sends the requests.
        self._check_open()
        try:
            self._pool = open_pool(self._base_url, self._timeout)
        except ValueError as exc:
            # A URL no connection can be made to fails like an unreachable kernel.
            raise NetworkError(str(exc)) from exc
        return self._pool

    def _open_stream(self) -> httpx.AsyncClient:
        # Like the pool, the stream connects straight to the kernel, ignoring proxy settings.
        self._check_open()
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            headers=self._headers,
            timeout=self._timeout,
            verify=self._trust() or True,
            trust_env=False,
        )
        return self._http

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")

    def _trust(self) -> ssl.SSLContext | None:
        """For https, the CA bundle and `SSL_CERT_FILE`/`SSL_CERT_DIR` handling of httpx."""
        if not self._base_url.lower().startswith("https:"):
            return None
        return httpx.create_ssl_context()


def _params(**values: str | int) -> dict[str, str]:
    return {name: str(value) for name, value in values.items() if value not in ("", 0)}


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event; comments and other fields are skipped."""
    data: builtins.list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
