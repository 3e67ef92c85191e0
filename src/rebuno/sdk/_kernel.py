"""The agent's signed client for the kernel's agent routes (docs/protocol.md §2.3, §5.2, §12,
§16.1).

Every request is signed with the `v1=` request scheme; every write carries the lease
(`Rebuno-Dispatch-Id`, `Rebuno-Dispatch-Attempt`) the webhook was delivered under. The calls
go through the lean keep-alive pool of `rebuno._http`, since they are most of a durable step's
cost on the agent's side. Imports only `rebuno.protocol`, `rebuno._http`, the SDK's own modules
and models; never the kernel.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rebuno._http import Pool, Response, Timeout, TransportError
from rebuno.protocol import signing
from rebuno.protocol.extensions import EXTENSIONS_HEADER, STEP_OCCURRENCES, STEP_RECORDS, parse
from rebuno.sdk._wire import JSON, open_pool, segment, send
from rebuno.sdk.errors import APIError, ForbiddenError, NetworkError, UnauthorizedError
from rebuno.types import Execution, Resource, StepDecision

# One encoder for every body: json.dumps with options builds a fresh one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False)


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


@dataclass(frozen=True, slots=True)
class Completion:
    """A step's result waiting to travel with a later kernel call, already encoded as JSON."""

    step_id: str
    result: bytes


@dataclass(frozen=True, slots=True)
class Report:
    """A step that ran before it was submitted (`step-records`), waiting to travel with a
    later kernel call: its kind, target and arguments, and its result or error, as JSON."""

    kind: str
    target: str
    args: bytes
    result: bytes | None = None
    error: bytes | None = None


Carried = Completion | Report


def encode_json(value: Any) -> bytes:
    """Encode a JSON body, refusing anything that is not plain JSON with a `TypeError`."""
    try:
        return _ENCODER.encode(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"value is not JSON-serializable: {exc}") from None


class KernelClient:
    """Signed HTTP calls from one agent to the kernel. The connection pool opens lazily."""

    def __init__(
        self,
        *,
        agent_id: str,
        secret: str,
        base_url: str,
        timeout: float,
        secret_source: str = "the agent's secret",
    ) -> None:
        """`secret_source` names where the secret came from, for the messages of refusals."""
        self.agent_id = agent_id
        self.secret_source = secret_source
        self._secret = secret
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._pool: Pool | None = None

    @property
    def base_url(self) -> str:
        return self._base_url

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.aclose()

    async def announce_instance(self, instance: str, incarnation: str) -> None:
        """Tell the kernel this incarnation of `instance` started (`agent-instances`)."""
        body = encode_json({"instance": instance, "incarnation": incarnation})
        await self._send("POST", f"/v0/agents/{segment(self.agent_id)}/instances", body)

    async def publish_metadata(self, body: bytes) -> None:
        """`PUT /v0/agents/{id}/metadata` (§36.1): the agent's description and schemas, as
        a JSON object of all three members, sent without a lease."""
        await self._send("PUT", f"/v0/agents/{segment(self.agent_id)}/metadata", body)

    async def health(self) -> Response:
        """`GET /v0/health`, unsigned, whatever its status: the start-up check's first look.
        Raises `NetworkError` when no answer came."""
        pool = self._pool or self._open()
        target = pool.prefix + "/v0/health"
        try:
            return await pool.request("GET", target, [("Accept", "application/json")])
        except TransportError as exc:
            raise NetworkError(f"GET /v0/health: {exc!r}") from exc

    async def get_execution(self, execution_id: str) -> Execution:
        response = await self._send("GET", f"/v0/executions/{segment(execution_id)}")
        return Execution.model_validate_json(response.body)

    async def suspend(self, execution_id: str, lease: Lease) -> bool:
        """Blocks the execution while a step waits (docs/protocol.md §25.3); whether it did."""
        response = await self._send(
            "POST", f"/v0/executions/{segment(execution_id)}/suspend", b"", lease
        )
        return bool(json.loads(response.body)["suspended"])

    async def get_step(self, execution_id: str, step_id: str) -> dict[str, Any]:
        path = f"/v0/executions/{segment(execution_id)}/steps/{segment(step_id)}"
        response = await self._send("GET", path)
        step: dict[str, Any] = json.loads(response.body)
        return step

    async def previous_state(self, execution_id: str) -> Any:
        """What the execution continues from (docs/protocol.md §24.5), JSON-decoded."""
        response = await self._send("GET", f"/v0/executions/{segment(execution_id)}/previous")
        return json.loads(response.body).get("state")

    async def submit_step(
        self,
        execution_id: str,
        lease: Lease,
        *,
        kind: str,
        target: str,
        args: bytes,
        idempotency: str,
        completions: list[Carried] | None = None,
        ask_records: bool = False,
        occurrence: int | None = None,
        resources: Sequence[str] = (),
    ) -> tuple[StepDecision, bool]:
        """Submit a step whose `args` are already encoded with `encode_json`. With
        `ask_records`, also returns whether the kernel lets the `step-records` grant go on.
        An `occurrence` is sent under `step-occurrences`."""
        fields: dict[str, Any] = {"kind": kind, "target": target, "idempotency": idempotency}
        if resources:
            fields["resources"] = list(resources)
        asked = STEP_RECORDS if ask_records else None
        if occurrence is not None:
            fields["occurrence"] = occurrence
            asked = STEP_OCCURRENCES
        body = _body(fields, args=args, completions=_encoded(completions))
        path = f"/v0/executions/{segment(execution_id)}/steps"
        response = await self._send("POST", path, body, lease, asked)
        # Validation costs about what json.loads alone does here, so the model stays checked.
        return StepDecision.model_validate_json(response.body), _granted(response, ask_records)

    async def complete_step(
        self,
        execution_id: str,
        step_id: str,
        lease: Lease,
        result: bytes,
        captures: dict[str, Any] | None = None,
    ) -> None:
        """Record a step's result, already encoded with `encode_json`; `captures`: the
        `captures` and `capture_failures` members, when there are any (§33.6)."""
        path = _step_path(execution_id, step_id, "complete")
        await self._send("POST", path, _body(captures or {}, result=result), lease)

    async def fail_step(
        self,
        execution_id: str,
        step_id: str,
        lease: Lease,
        error: Any,
        captures: dict[str, Any] | None = None,
    ) -> None:
        path = _step_path(execution_id, step_id, "fail")
        await self._send("POST", path, encode_json({"error": error, **(captures or {})}), lease)

    async def register_resource(
        self, execution_id: str, lease: Lease, fields: dict[str, Any]
    ) -> Resource:
        """§33.2: registers a resource (or checks a registered one) and answers its view."""
        path = f"/v0/executions/{segment(execution_id)}/resources"
        response = await self._send("POST", path, encode_json(fields), lease)
        return Resource.model_validate_json(response.body)

    async def bind_resource(self, execution_id: str, lease: Lease, key: str, binding: Any) -> None:
        path = f"/v0/executions/{segment(execution_id)}/resources/{segment(key)}/binding"
        await self._send("POST", path, encode_json({"binding": binding}), lease)

    async def publish_checkpoints(
        self, execution_id: str, lease: Lease, captures: dict[str, Any]
    ) -> None:
        path = f"/v0/executions/{segment(execution_id)}/resources/checkpoints"
        await self._send("POST", path, encode_json(captures), lease)

    async def stream_delta(
        self, execution_id: str, step_id: str, lease: Lease, *, seq: int, data: str
    ) -> None:
        path = _step_path(execution_id, step_id, "stream")
        await self._send("POST", path, encode_json({"seq": seq, "data": data}), lease)

    async def heartbeat(
        self,
        execution_id: str,
        lease: Lease,
        completions: list[Carried] | None = None,
        ask_records: bool = False,
    ) -> bool:
        """Renew the lease; a kernel offering `step-records` also takes carried completions
        here. With `ask_records`, returns whether the grant goes on."""
        path = f"/v0/executions/{segment(execution_id)}/heartbeat"
        body = _body({}, completions=_encoded(completions)) if completions else b""
        response = await self._send(
            "POST", path, body, lease, STEP_RECORDS if ask_records else None
        )
        return _granted(response, ask_records)

    async def complete_execution(
        self,
        execution_id: str,
        lease: Lease,
        output: bytes,
        completions: list[Carried] | None = None,
        state: bytes | None = None,
    ) -> None:
        """`output` (and `state`, kept for the executions that continue this one) are encoded
        already (`encode_json`), as the caller checked their sizes."""
        body = _body({}, output=output, state=state, completions=_encoded(completions))
        path = f"/v0/executions/{segment(execution_id)}/complete"
        await self._send("POST", path, body, lease)

    async def fail_execution(
        self,
        execution_id: str,
        lease: Lease,
        error: str,
        completions: list[Carried] | None = None,
    ) -> None:
        body = _body({"error": error}, completions=_encoded(completions))
        path = f"/v0/executions/{segment(execution_id)}/fail"
        await self._send("POST", path, body, lease)

    async def _send(
        self,
        method: str,
        path: str,
        content: bytes = b"",
        lease: Lease | None = None,
        extension: str | None = None,
    ) -> Response:
        """`extension`: the one of ours the request asks for or uses, if any."""
        pool = self._pool or self._open()
        target = pool.prefix + path
        headers = self._signed(method, target, content, lease)
        if extension is not None:
            headers.append((EXTENSIONS_HEADER, extension))
        try:
            return await send(pool, method, target, headers, content, path)
        except (UnauthorizedError, ForbiddenError) as exc:
            # Said so that the log names what to fix; same class, so callers see no change.
            raise type(exc)(self.refusal(exc), exc.code, exc.status_code) from exc

    def _signed(
        self, method: str, target: str, body: bytes, lease: Lease | None
    ) -> list[tuple[str, str]]:
        timestamp = str(int(time.time()))
        headers = [
            (signing.AGENT_ID_HEADER, self.agent_id),
            (signing.TIMESTAMP_HEADER, timestamp),
            JSON,
        ]
        dispatch_id = attempt = ""
        if lease is not None:
            dispatch_id, attempt = lease.dispatch_id, str(lease.attempt)
            headers.append((signing.DISPATCH_ID_HEADER, dispatch_id))
            headers.append((signing.DISPATCH_ATTEMPT_HEADER, attempt))
        # The target is signed exactly as it goes on the request line.
        signature = signing.sign_request(
            self._secret, method, target, timestamp, dispatch_id, attempt, body
        )
        headers.append((signing.SIGNATURE_HEADER, signature))
        return headers

    def refusal(self, error: APIError) -> str:
        """One actionable line for the kernel refusing this agent's signed request."""
        agent = repr(self.agent_id)
        where = f"the kernel at {self._base_url}"
        if isinstance(error, ForbiddenError):
            return (
                f"{where} refused agent {agent} ({error.message}): the execution is another"
                f" agent's; check that the webhook URL registered for {agent} is this process's"
            )
        return (
            f"{where} refused agent {agent}'s signature ({error.message}): either it has no"
            f" agent {agent} registered, or its secret for {agent} (the manifest's or"
            f" POST /v0/agents's `secret`) differs from {self.secret_source}, or this"
            " machine's clock is more than 5 minutes off the kernel's"
        )

    def _open(self) -> Pool:
        # Opened on first use so the pool belongs to the loop that serves the webhook.
        self._pool = open_pool(self._base_url, self._timeout)
        return self._pool


def _body(fields: dict[str, Any], **encoded: bytes | None) -> bytes:
    """`fields` as a JSON object plus the members of `encoded`, whose values are JSON already:
    arguments and results are encoded once, to check them, and never again. A None is left out."""
    members = [encode_json(fields)[1:-1]] if fields else []
    members.extend(b'"%s": %s' % (name.encode(), value) for name, value in encoded.items() if value)
    return b"{" + b", ".join(members) + b"}"


def _encoded(completions: list[Carried] | None) -> bytes | None:
    if not completions:
        return None
    return b"[" + b", ".join(_item(each) for each in completions) + b"]"


def _item(carried: Carried) -> bytes:
    if isinstance(carried, Completion):
        return b'{"step_id": %s, "result": %s}' % (encode_json(carried.step_id), carried.result)
    fields = encode_json({"kind": carried.kind, "target": carried.target})[1:-1]
    if carried.error is not None:
        return b'{%s, "args": %s, "error": %s}' % (fields, carried.args, carried.error)
    return b'{%s, "args": %s, "result": %s}' % (fields, carried.args, carried.result)


def _granted(response: Response, asked: bool) -> bool:
    """Whether the answer to a request that asked for `step-records` lets the grant go on."""
    if not asked:
        return False
    name = EXTENSIONS_HEADER.lower().encode()
    return any(
        key == name and STEP_RECORDS in parse(value.decode("latin-1"))
        for key, value in response.headers
    )


def _step_path(execution_id: str, step_id: str, action: str) -> str:
    return f"/v0/executions/{segment(execution_id)}/steps/{segment(step_id)}/{action}"


def unreachable(error: NetworkError) -> str:
    """Why no answer came, in a few words: refused, a name that does not resolve, TLS, a
    timeout, or the transport's own words."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, Timeout):
            return f"it did not answer in time ({cause})"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused (is the kernel running, on that port?)"
        if isinstance(cause, socket.gaierror):
            return f"its host name does not resolve ({cause.strerror or cause})"
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return f"TLS failed ({cause})"
        if isinstance(cause, TimeoutError):
            return "connecting timed out"
        cause = cause.__cause__
    return str(error)
