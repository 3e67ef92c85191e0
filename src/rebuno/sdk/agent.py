"""`Agent`: the webhook the kernel delivers executions to, and the run of one dispatch.

The webhook is a raw ASGI app (no framework): it verifies the body signature in constant time,
acknowledges at once, and runs the handler in the background under an ambient execution
context, with heartbeats. The handler's outcome becomes `complete` or `fail`; the control-flow
signals (`Blocked`, `Terminated`, `LeaseSuperseded`) unwind quietly. Imports only
`rebuno.protocol`, httpx, pydantic and the SDK's own modules; uvicorn only inside `run()`;
never the kernel, never starlette.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

from rebuno.protocol import extensions, signing
from rebuno.protocol.extensions import (
    AGENT_INSTANCES,
    EXECUTION_HEADER,
    EXECUTION_INPUT,
    EXECUTION_SIGNATURE_HEADER,
    EXTENSIONS_HEADER,
    STEP_COMPLETIONS,
    STEP_OCCURRENCES,
    STEP_RECORDS,
)
from rebuno.sdk._carried import PayloadTooLarge, check_size
from rebuno.sdk._context import ExecutionContext, Result, jsonable
from rebuno.sdk._diagnostics import (
    Throttle,
    check_enabled,
    check_kernel,
    secret_source,
    webhook_rejected,
)
from rebuno.sdk._inputs import InputBinder
from rebuno.sdk._instance import Instance, configured_name
from rebuno.sdk._kernel import KernelClient, encode_json
from rebuno.sdk._metadata import Publication, Schema, checked_schema
from rebuno.sdk._webhook import Deliveries, Delivery, parse_delivery
from rebuno.sdk.errors import (
    Blocked,
    ForbiddenError,
    LeaseSuperseded,
    RebunoError,
    Terminated,
    UnauthorizedError,
    _InputInvalid,
    failure_reason,
    refusal_from,
)

logger = logging.getLogger("rebuno")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_MAX_WEBHOOK_BYTES = 64 * 1024
Durability = Literal["durable", "batched"]
"""How a step's record relates to its body: see `Agent`."""
_DURABILITIES: tuple[Durability, ...] = ("durable", "batched")
_QUIET = (Blocked, Terminated, LeaseSuperseded)
_ANNOUNCE_WAIT_SECONDS = 2.0


class Agent:
    """Serves the webhook of one agent and runs its handler once per dispatch.

    Args:
        agent_id: The agent's id as registered with the kernel.
        secret: The HMAC secret shared with the kernel; defaults to `REBUNO_AGENT_SECRET`.
        base_url: The kernel's URL; defaults to `REBUNO_URL`.
        webhook_path: The path the kernel POSTs deliveries to.
        kernel_timeout: Timeout in seconds of each call to the kernel.
        durability: `"durable"` (the default): every step is recorded by the kernel before its
            body runs, and its outcome before the handler's next effect runs, so after a crash
            no step whose body returned before the next one was submitted runs again.
            `"batched"` opts in to running `safe_to_retry` steps of a first delivery before
            recording them, when the kernel offers it (`step-records`): fewer requests, but a
            crash re-runs every step not yet reported (docs/extensions.md says what it costs).
        instance: The name of this process slot, the same each time the process restarts and
            different for every other process serving this agent (`agent-instances`); defaults
            to `REBUNO_AGENT_INSTANCE`, else `<hostname>:<port>` once the port is known. A
            restarted agent announces its new start, and the kernel redelivers at once what
            the killed one held instead of waiting for its lease.
        check_kernel: Whether start-up (`run()`, or the ASGI app's lifespan startup) first
            asks the kernel whether it is reachable, is a Rebuno kernel and knows this agent
            and its secret, and refuses to start otherwise, with one line saying why; defaults
            to `REBUNO_CHECK_KERNEL` (on unless `false`). Turn it off for an agent that may
            start before its kernel.
        description: What the agent does, published to the kernel with the JSON Schemas of
            its input and output (see `publish_metadata`) and shown by `GET /v0/agents/{id}`.
        output_schema: The JSON Schema of the handler's output: a dict, or a pydantic model
            class whose schema is sent. The input schema comes from the handler's signature.

    Example:
        agent = Agent("hello", secret="dev-secret", base_url="http://127.0.0.1:8080")

        async def process(name: str) -> dict:
            return {"greeting": f"hello {name}"}

        agent.run(process, port=5001)
    """

    def __init__(
        self,
        agent_id: str,
        *,
        secret: str | None = None,
        base_url: str | None = None,
        webhook_path: str = "/webhook",
        kernel_timeout: float = 35.0,
        durability: Durability = "durable",
        instance: str | None = None,
        check_kernel: bool | None = None,
        description: str | None = None,
        output_schema: Schema | None = None,
    ) -> None:
        if not agent_id:
            raise ValueError("agent_id must be a non-empty string")
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {_DURABILITIES}, not {durability!r}")
        source = secret_source(secret)
        secret = secret if secret is not None else os.environ.get("REBUNO_AGENT_SECRET", "")
        base_url = base_url or os.environ.get("REBUNO_URL", "")
        if not secret:
            raise ValueError("no agent secret: pass secret= or set REBUNO_AGENT_SECRET")
        if not base_url:
            raise ValueError("no kernel URL: pass base_url= or set REBUNO_URL")
        self.agent_id = agent_id
        self.webhook_path = webhook_path
        self.durability = durability
        self._secret = secret
        self._check = check_enabled(check_kernel)
        self._kernel = KernelClient(
            agent_id=agent_id,
            secret=secret,
            base_url=base_url,
            timeout=kernel_timeout,
            secret_source=source,
        )
        self._refused = Throttle()
        self._instance = Instance(self._kernel, configured_name(instance))
        self._metadata = Publication(
            self._kernel, description, checked_schema(output_schema, "output_schema"), self._schema
        )
        self._handler: Callable[..., Any] | None = None
        self._binder: InputBinder | None = None
        self._deliveries = Deliveries()

    @property
    def description(self) -> str | None:
        return self._metadata.description

    @property
    def output_schema(self) -> Schema | None:
        return self._metadata.output_schema

    async def publish_metadata(self) -> None:
        """Publish the description and the input and output schemas to the kernel, and wait
        for it. The app publishes once by itself, at its lifespan start-up or else on the
        first webhook; this awaits that publication (starting it if need be). Only a kernel
        that could not be reached is asked again, on the next webhook; a refusal is logged
        and not retried until the process restarts. Never raises for the kernel's answer."""
        await self._metadata.start()

    def _schema(self) -> dict[str, Any] | None:
        return self._binder.json_schema() if self._binder is not None else None

    @property
    def instance(self) -> str | None:
        """This process's instance name, once known (see `instance=`)."""
        return self._instance.name

    def bind(self, process: Callable[..., Any]) -> None:
        """Attach the handler; its signature decides how the execution input is passed."""
        self._binder = InputBinder(process)
        self._handler = process

    @property
    def app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The ASGI app serving the webhook, for mounting in any ASGI server.

        Its lifespan startup checks the kernel (see `check_kernel=`), then announces the
        instance to the kernel when its name is known (else the first webhook does, once it
        learnt the port); its shutdown calls `close()`.
        """
        return _App(self)

    def run(self, process: Callable[..., Any], *, host: str = "0.0.0.0", port: int = 5000) -> None:
        """Bind `process` and serve the webhook with uvicorn until interrupted. Blocks. The
        process is the agent's own, so what start-up allocated is frozen out of the garbage
        collector's view first: otherwise the first full collection walks every imported
        module in the middle of the first runs. Exits with one line when the start-up check
        (`check_kernel=`) finds the kernel unfit."""
        import uvicorn

        self.bind(process)
        if self._check:
            problem = asyncio.run(self._checked_kernel())
            if problem is not None:
                raise SystemExit(problem)
            self._check = False  # done: the lifespan need not ask again
        config = uvicorn.Config(self.app, host=host, port=port, lifespan="on", interface="asgi3")
        # Listening before the lifespan starts: uvicorn would open the port only after it,
        # and the redelivery the start-up announcement triggers must not find it closed.
        sock = config.bind_socket()
        sock.listen(config.backlog)
        self._instance.serving_on(sock.getsockname()[1])
        gc.collect()
        gc.freeze()
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: an interrupt ends it
            uvicorn.Server(config).run(sockets=[sock])

    async def _checked_kernel(self) -> str | None:
        """The start-up check on a loop of its own: the pool it opened is closed after it."""
        try:
            return await check_kernel(self._kernel)
        finally:
            await self._kernel.aclose()

    async def join(self) -> None:
        """Wait for every handler run in flight to finish."""
        while tasks := self._deliveries.running():
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel the handler runs in flight and close the connection to the kernel."""
        tasks = self._deliveries.running()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._instance.close()
        await self._metadata.close()
        await self._kernel.aclose()

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path != self.webhook_path:
            await _respond(send, 404, {"error": "not found"})
        elif scope.get("method") != "POST":
            await _respond(send, 405, {"error": "method not allowed"}, allow="POST")
        else:
            await self._webhook(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                problem = await check_kernel(self._kernel) if self._check else None
                if problem is not None:
                    await self._kernel.aclose()
                    await send({"type": "lifespan.startup.failed", "message": problem})
                    return
                await send({"type": "lifespan.startup.complete"})
                # In the background, once the server is told it may open its port.
                self._instance.announce()
                self._metadata.start()
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _webhook(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            await _respond(send, 413, {"error": "payload too large"})
            return
        signature = _header(scope, signing.SIGNATURE_HEADER)
        if signature is None or not signing.verify_body(self._secret, body, signature):
            held = self._refused.allow()
            if held is not None:
                source = self._kernel.secret_source
                logger.error(webhook_rejected(self.agent_id, source, signature is not None, held))
            await _respond(send, 401, {"error": "invalid signature"})
            return
        delivery = parse_delivery(body)
        if delivery is not None:
            offered = extensions.parse(_header(scope, EXTENSIONS_HEADER))
            carried = None
            if EXECUTION_INPUT in offered:
                # Unsigned or altered, it is ignored: the run reads the execution instead.
                value = _header(scope, EXECUTION_HEADER)
                signed = _header(scope, EXECUTION_SIGNATURE_HEADER)
                carried = extensions.read_carried(self._secret, body, value, signed)
            delivery = dataclasses.replace(delivery, extensions=offered, carried=carried)
        if delivery is None:
            await _respond(send, 400, {"error": "execution_id and dispatch_id are required"})
        elif self._handler is None:
            # Refused, not acknowledged: the kernel redelivers once a handler is bound.
            await _respond(send, 503, {"error": "no handler bound: call agent.bind(process)"})
        else:
            self._metadata.start()
            named = await self._named(scope, delivery)
            await _respond(send, 200, {"accepted": self._accept(delivery)}, named)

    async def _named(self, scope: Scope, delivery: Delivery) -> list[tuple[bytes, bytes]]:
        """The acknowledgement's `Rebuno-Agent-Instance` header, when the kernel offers the
        extension. An instance named only now (the server's port) is announced first."""
        if AGENT_INSTANCES not in delivery.extensions:
            return []
        instance = self._instance
        if instance.name is None:
            server = scope.get("server")
            instance.serving_on(server[1] if server else None)
        announcement = instance.announce()
        if announcement is not None and not announcement.done():
            # Bounded: a kernel slow to answer it must not make this delivery time out.
            await asyncio.wait({announcement}, timeout=_ANNOUNCE_WAIT_SECONDS)
        header = instance.header()
        return [] if header is None else [header]

    def _accept(self, delivery: Delivery) -> bool:
        run, superseded = self._deliveries.admit(delivery)
        if run:
            if superseded is not None:
                superseded.cancel()
            coroutine = self._dispatch(delivery, superseded)
            task = asyncio.create_task(coroutine, name=f"rebuno-dispatch-{delivery.execution_id}")
            self._deliveries.started(delivery.execution_id, task)
        return run

    async def _dispatch(self, delivery: Delivery, superseded: asyncio.Task[None] | None) -> None:
        if superseded is not None:
            # The older run must finish unwinding before this one writes anything.
            await asyncio.gather(superseded, return_exceptions=True)
        reporting = self.durability == "batched" and STEP_RECORDS in delivery.extensions
        context = ExecutionContext(
            kernel=self._kernel,
            execution_id=delivery.execution_id,
            lease=delivery.lease,
            agent_id=self.agent_id,
            carry_completions=STEP_COMPLETIONS in delivery.extensions,
            report_steps=reporting,
            # One of the two per delivery: steps reported after they ran are counted by the
            # kernel, so a delivery that reports them numbers none.
            number_steps=not reporting and STEP_OCCURRENCES in delivery.extensions,
        )
        try:
            await self._run(context, delivery.carried)
        except asyncio.CancelledError:
            if not context.superseded:
                raise
        except (UnauthorizedError, ForbiddenError) as exc:
            # Its message says what to fix; a traceback would only bury it.
            logger.error("dispatch of execution_id=%s stopped: %s", delivery.execution_id, exc)
        except Exception:
            logger.exception("dispatch of execution_id=%s failed", delivery.execution_id)

    async def _run(self, context: ExecutionContext, carried: tuple[str, Any] | None) -> None:
        """`carried`: the status and input the webhook carried, which spare reading them."""
        if carried is None:
            execution = await self._kernel.get_execution(context.id)
            if execution.status.is_terminal:
                return
            carried = execution.status.value, execution.input
        context.status, context.input = carried
        try:
            assert self._binder is not None
            call = self._binder.bind(context.input)
        except _InputInvalid as exc:
            await self._finish(context, error=exc)
            return
        with context.activate():
            outcome, error = await self._call_handler(context, call.kwargs)
        await self._finish(context, output=outcome, error=error)

    async def _call_handler(
        self, context: ExecutionContext, kwargs: dict[str, Any]
    ) -> tuple[Any, BaseException | None]:
        assert self._handler is not None
        owner = asyncio.current_task()
        assert owner is not None
        heartbeat = asyncio.create_task(context.heartbeat_until_cancelled(owner))
        try:
            result = self._handler(**kwargs)
            if inspect.isawaitable(result):
                result = await result
            await context.checkpoint_on_completion()
            if isinstance(result, Result):
                return Result(jsonable(result.output), jsonable(result.state)), None
            return jsonable(result), None
        except Exception as exc:
            return None, exc
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _finish(
        self, context: ExecutionContext, *, output: Any = None, error: BaseException | None = None
    ) -> None:
        if context.superseded or context.kernel_unreachable:
            # The kernel could not record this run's outcome; the lease brings it back.
            return
        if context.signal is not None:
            await context.flush_completions()
            return
        signal = refusal_from(error) if error is not None else None
        if isinstance(signal, _QUIET) or isinstance(error, _QUIET):
            await context.flush_completions()
            return
        state: bytes | None = None
        if error is None:
            if isinstance(output, Result):
                output, state = output.output, _state(output.state)
            encoded = encode_json(output)
            try:
                check_size("output", encoded)
                if state is not None:
                    check_size("state", state)
            except PayloadTooLarge as exc:
                error = exc  # the execution fails: no redelivery could ever complete it
            size = len(encoded) + len(state or b"")
            if error is None and not context.fits_beside(size):
                await context.flush_completions()  # they would not fit beside the output
        carried = context.take_completions()
        try:
            if error is None:
                await self._kernel.complete_execution(
                    context.id, context.lease, encoded, carried, state
                )
            else:
                reason = failure_reason(signal or error)
                logger.warning("execution_id=%s failed: %s", context.id, reason, exc_info=error)
                await self._kernel.fail_execution(context.id, context.lease, reason, carried)
        except _QUIET:
            return
        except RebunoError as exc:
            logger.warning("could not finish execution_id=%s: %s", context.id, exc)


def _state(value: Any) -> bytes | None:
    """A `Result`'s state as sent: None (no state) is left out."""
    return None if value is None else encode_json(value)


class _App:
    """The ASGI 3 callable; a plain object so servers detect the interface unambiguously."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._agent._asgi(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_WEBHOOK_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    values = [value for key, value in scope.get("headers", []) if key.lower() == wanted]
    if len(values) != 1:
        return None
    return bytes(values[0]).decode("latin-1")


async def _respond(
    send: Send,
    status: int,
    payload: dict[str, Any],
    extra: list[tuple[bytes, bytes]] | None = None,
    allow: str = "",
) -> None:
    body = json.dumps(payload).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if allow:
        headers.append((b"allow", allow.encode()))
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
