"""The execution context: one per dispatch, ambient through a ContextVar, behind `execution()`.

Every recording primitive (`@tool`, `wrap_tool`, `step()`, the LLM transport) goes through
`ExecutionContext.invoke_tool` or `begin_llm`, which submit the step and act on the kernel's
decision (docs/protocol.md §8). It also keeps the lease alive with heartbeats (§12.4). Imports only
`rebuno.protocol`, httpx-free SDK modules and the models; never the kernel.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, assert_never

from pydantic import BaseModel

from rebuno.protocol.canonical import args_hash, canonical_args
from rebuno.protocol.enums import COUNTED_DECISIONS, Decision, StepKind
from rebuno.sdk._kernel import Carried, Completion, KernelClient, Lease, Report, encode_json
from rebuno.sdk.errors import (
    APIError,
    Blocked,
    LeaseSuperseded,
    NetworkError,
    PolicyError,
    RateLimited,
    RebunoError,
    Terminated,
    ToolError,
)
from rebuno.types import Resource, StepDecision, StepResource

logger = logging.getLogger("rebuno")

_T = TypeVar("_T")
_HEARTBEAT_CAP = 30.0
# A carried completion waits at most this long for the handler's next kernel call before it
# is sent on its own, so a handler busy between steps does not leave a finished step looking
# unfinished for long.
CARRY_DELAY_SECONDS = 0.02
# At most this many wait at once (the kernel takes 1,000 per request).
MAX_CARRIED = 256
MAX_REQUEST_BYTES = 10 * 1024 * 1024
"""The kernel's cap on a request body."""
MAX_RECORDED_BYTES = MAX_REQUEST_BYTES - 64 * 1024
"""The largest result, arguments or output one request can still carry, with room for the
rest of its body. Carried outcomes never add up to more than this in one request."""

_DECISIONS = {member.value: member for member in Decision}
_Key = tuple[str, str, str]
"""A step's kind, target and hash of canonical args: what its occurrence counts."""

_current: ContextVar[ExecutionContext | None] = ContextVar("rebuno_execution", default=None)
_current_step: ContextVar[str | None] = ContextVar("rebuno_step", default=None)
"""The id of the recorded step whose body the current code runs in (for `subagent`)."""
_background: set[asyncio.Task[None]] = set()
_holding_effects: ContextVar[bool] = ContextVar("rebuno_effects", default=False)
"""The current code runs inside a step that holds the context's effects lock."""


class ExecutionContext:
    """What the SDK knows about the execution a handler is running for.

    Attributes:
        id: The execution id.
        agent_id: The agent the execution belongs to.
        input: The execution's input, as given to `Client.create`.
        status: The execution's status when the dispatch started.
    """

    def __init__(
        self,
        *,
        kernel: KernelClient,
        execution_id: str,
        lease: Lease,
        agent_id: str,
        input: Any = None,
        status: str = "running",
        carry_completions: bool = False,
        report_steps: bool = False,
        number_steps: bool = False,
    ) -> None:
        self.id = execution_id
        self.agent_id = agent_id
        self.input = input
        self.status = status
        self._kernel = kernel
        self._lease = lease
        self._loop: asyncio.AbstractEventLoop | None = None
        self.signal: Blocked | Terminated | None = None
        self.superseded = False
        self.kernel_unreachable = False
        """A kernel call failed without an answer (network, 5xx): the outcome of this run
        cannot be trusted to be recorded, so it ends quietly and the lease redelivers it."""
        self._carry = carry_completions or report_steps
        self._heartbeat_carries = report_steps
        self._reporting = report_steps
        """`step-records` holds: safe steps run first and are reported afterwards."""
        self._occurrences: dict[_Key, int] | None = {} if number_steps else None
        """`step-occurrences` holds: how many submissions of each key the kernel counted."""
        self._numbering: dict[_Key, tuple[asyncio.Lock, list[int]]] = {}
        self._carried: list[Carried] = []
        self._carried_bytes = 0
        self._carry_flush: asyncio.TimerHandle | None = None
        self._carried_at = 0.0
        self._bodies = 0
        """Step bodies running now, and how many of them wait for a sub-agent."""
        self._waiting_bodies = 0
        self._suspension: asyncio.Future[bool] | None = None
        """The answer of the one suspend every waiting body shares."""
        self._opened: dict[str, _Opened] = {}
        """The resources registered in this delivery, by key (§33.10)."""
        self._effects: asyncio.Lock | None = None
        """Held by `resource()` and, once a resource is registered, by every tool and step:
        their generations follow one another."""

    @property
    def kernel_url(self) -> str:
        """The kernel this execution's agent talks to."""
        return self._kernel.base_url

    async def previous(self) -> Any:
        """What this execution continues from: the `state` the execution before it in its
        conversation completed with (`Result`), else that execution's output; None when
        there is none."""
        return await self._on_owner_loop(self._kernel.previous_state(self.id))

    @property
    def lease(self) -> Lease:
        """The `(dispatch_id, attempt)` this handler was delivered under, with its period."""
        return self._lease

    @property
    def dispatch_id(self) -> str:
        return self._lease.dispatch_id

    @property
    def dispatch_attempt(self) -> int:
        return self._lease.attempt

    async def invoke_tool(
        self,
        target: str,
        args: Any,
        *,
        idempotency: str = "safe_to_retry",
        run: Callable[[], Any] | None = None,
        kind: str = StepKind.TOOL_CALL,
        resources: Sequence[str] = (),
    ) -> Any:
        """Submit one effect as a step and act on the decision.

        `proceed` runs `run()` (awaiting it when it returns an awaitable) and records its
        result; `replay` returns the recorded result or raises the recorded error as a
        `ToolError`; every other decision raises (`PolicyError`, `RateLimited`, `Blocked`,
        `Terminated`). `args` must be JSON: anything else raises `TypeError` before any call.
        `resources`: the registered resources the effect changes (§33.5).
        """
        encoded = encode_json(args)
        if (self._opened or resources) and not _holding_effects.get():
            async with self._effects_lock():
                token = _holding_effects.set(True)  # a nested step runs inside this one
                try:
                    return await self._invoke(kind, target, encoded, idempotency, run, resources)
                finally:
                    _holding_effects.reset(token)
        if self._reporting and idempotency == "safe_to_retry" and kind != StepKind.LLM_CALL:
            return await self._run_unsubmitted(kind, target, encoded, run)
        return await self._invoke(kind, target, encoded, idempotency, run)

    async def _invoke(
        self,
        kind: str,
        target: str,
        encoded: bytes,
        idempotency: str,
        run: Callable[[], Any] | None,
        resources: Sequence[str] = (),
    ) -> Any:
        decision = await self._submit(kind, target, encoded, idempotency, resources)
        match _decision(decision):
            case Decision.PROCEED:
                due = [entry for entry in decision.resources if entry.due]
                return await self._run_body(decision.step_id, target, run, idempotency, due)
            case Decision.REPLAY:
                return _replayed(decision, target)
            case _:
                raise self.refusal(decision)

    async def begin_llm(self, target: str, request: Any) -> StepDecision:
        """Submit an LLM request as an `llm_call` step and return the decision unacted."""
        return await self._submit(StepKind.LLM_CALL, target, encode_json(request), "safe_to_retry")

    async def record_llm(self, step_id: str, result: Any) -> None:
        """Record the provider's answer `{status, headers, body}` as the step's result."""
        record = encode_json(result)
        await self._guard(self._kernel.complete_step(self.id, step_id, self._lease, record))

    async def fail_llm(self, step_id: str, message: str) -> None:
        """Record that the provider call failed before any answer came back."""
        error = {"message": message}
        await self._guard(self._kernel.fail_step(self.id, step_id, self._lease, error))

    async def publish_llm_delta(self, step_id: str, seq: int, data: str) -> None:
        """Send a live chunk of a step's output to the kernel's stream side channel."""
        send = self._kernel.stream_delta(self.id, step_id, self._lease, seq=seq, data=data)
        await self._on_owner_loop(send)

    async def submit(self, kind: str, target: str, args: Any, idempotency: str) -> StepDecision:
        """Submit a step under this dispatch's lease; a lease loss is remembered. Completions
        waiting to be carried travel with it. `args` must be JSON (`TypeError` otherwise)."""
        return await self._submit(kind, target, encode_json(args), idempotency)

    async def _submit(
        self, kind: str, target: str, args: bytes, idempotency: str, resources: Sequence[str] = ()
    ) -> StepDecision:
        # `args` is encoded before the completions are taken, so a refused value loses none.
        if self._carried and not self.fits_beside(len(args)):
            await self.flush_completions()  # they would not fit beside these arguments
        send = partial(
            self._kernel.submit_step,
            self.id,
            self._lease,
            kind=kind,
            target=target,
            args=args,
            idempotency=idempotency,
            completions=self.take_completions(),
            resources=resources if kind != StepKind.LLM_CALL else (),
        )
        if self._occurrences is not None:
            key = (kind, target, args_hash(canonical_args(args)))
            decision, _ = await self._guard(self._submit_numbered(key, send))
            return decision
        asked = self._reporting
        decision, granted = await self._guard(send(ask_records=asked))
        if asked and not granted:
            self._reporting = False
        return decision

    async def _submit_numbered(
        self, key: _Key, send: Callable[..., Awaitable[tuple[StepDecision, bool]]]
    ) -> tuple[StepDecision, bool]:
        """`step-occurrences`: the submission carries its own occurrence (§7.3), counted here
        as the kernel would have. Submissions of one key go one at a time, as the kernel's
        lock would have taken them, so two at once never claim the same occurrence."""
        assert self._occurrences is not None
        lock, users = self._numbering.get(key) or self._numbering.setdefault(
            key, (asyncio.Lock(), [0])
        )
        users[0] += 1
        try:
            async with lock:
                occurrence = self._occurrences.get(key, 0)
                answer = await send(occurrence=occurrence)
                if _counted(answer[0]):
                    self._occurrences[key] = occurrence + 1
                return answer
        finally:
            users[0] -= 1
            if not users[0]:
                del self._numbering[key]

    async def _run_unsubmitted(
        self, kind: str, target: str, args: bytes, run: Callable[[], Any] | None
    ) -> Any:
        """`step-records`: the kernel has said no policy decides this agent's steps and none
        was recorded before this delivery, so a `safe_to_retry` step runs at once and is
        reported with its outcome by a later call. A crash before that only runs it again."""
        if self.signal is not None:
            raise self.signal
        if self.superseded:
            raise LeaseSuperseded("the lease of this delivery was superseded")
        try:
            result = await _call(run)
            recorded = _recorded(result)
            check_size("result", recorded)
        except (Blocked, Terminated, LeaseSuperseded):
            raise
        except Exception as exc:
            error = encode_json(_error_of(exc))
            await self._hold(Report(kind, target, args, error=error))
            raise ToolError(str(exc) or type(exc).__name__, target) from exc
        await self._hold(Report(kind, target, args, result=recorded))
        return result

    def take_completions(self) -> list[Carried]:
        """The completions waiting to be carried by the next kernel call, now handed over."""
        carried, self._carried = self._carried, []
        self._carried_bytes = 0
        return carried

    def fits_beside(self, size: int) -> bool:
        """Whether what waits to be carried still fits in one request beside `size` bytes."""
        return size + self._carried_bytes <= MAX_RECORDED_BYTES

    async def flush_completions(self) -> None:
        """Sends waiting completions on their own. Best-effort: a completion that is lost
        only re-runs a `safe_to_retry` step on the next delivery."""
        if self._heartbeat_carries:
            await self._flush_by_heartbeat()
            return
        for carried in self.take_completions():
            assert isinstance(carried, Completion)
            try:
                send = self._kernel.complete_step(
                    self.id, carried.step_id, self._lease, carried.result
                )
                await self._guard(send)
            except RebunoError as exc:
                logger.warning(
                    "could not record step_id=%s execution_id=%s: %s",
                    carried.step_id,
                    self.id,
                    exc,
                )
                return

    async def _flush_by_heartbeat(self) -> None:
        """Everything waiting, in one heartbeat, which also says whether `step-records` holds."""
        carried = self.take_completions()
        if not carried:
            return
        asked = self._reporting
        try:
            send = self._kernel.heartbeat(self.id, self._lease, carried, asked)
            if asked and not await self._guard(send):
                self._reporting = False
        except RebunoError as exc:
            logger.warning(
                "could not record %d steps of execution_id=%s: %s", len(carried), self.id, exc
            )

    async def _record(self, step_id: str, result: bytes, idempotency: str) -> None:
        if self._carry and idempotency == "safe_to_retry":
            await self._hold(Completion(step_id, result))
            return
        await self._guard(self._kernel.complete_step(self.id, step_id, self._lease, result))

    async def _hold(self, carried: Carried) -> None:
        """Keeps `carried` for the next kernel call, for at most `CARRY_DELAY_SECONDS`; a
        full list is sent at once, before the handler goes on."""
        loop = self._loop or asyncio.get_running_loop()
        size = _size(carried)
        if self._carried and not self.fits_beside(size):
            await self.flush_completions()  # one request never carries more than the kernel takes
        if not self._carried:
            self._carried_at = loop.time()
        self._carried.append(carried)
        self._carried_bytes += size
        if len(self._carried) >= MAX_CARRIED:
            await self.flush_completions()
        elif self._carry_flush is None:
            if loop is asyncio.get_running_loop():
                self._arm_flush()
            else:
                # A tool awaited on another thread's loop: the timer belongs to the owner's.
                loop.call_soon_threadsafe(self._arm_flush)

    def _arm_flush(self) -> None:
        if self._carry_flush is None:
            loop = self._loop or asyncio.get_running_loop()
            self._carry_flush = loop.call_later(CARRY_DELAY_SECONDS, self._flush_later)

    def _flush_later(self) -> None:
        # Taking the completions leaves this timer running, which spares setting and cancelling
        # one per step; when it fires it re-arms for the oldest completion still waiting.
        self._carry_flush = None
        if not self._carried:
            return
        assert self._loop is not None
        wait = self._carried_at + CARRY_DELAY_SECONDS - self._loop.time()
        if wait > 0:
            self._carry_flush = self._loop.call_later(wait, self._flush_later)
            return
        task = self._loop.create_task(self.flush_completions())
        _background.add(task)
        task.add_done_callback(_background.discard)

    def refusal(self, decision: StepDecision) -> RebunoError:
        """The exception for a decision that is neither proceed nor replay.

        `Blocked` and `Terminated` are remembered, so the dispatch unwinds even if the
        handler swallows them.
        """
        match _decision(decision):
            case Decision.DENIED:
                error: RebunoError = PolicyError(decision.reason or "policy_denied")
                error.rule_id = decision.rule_id
            case Decision.RATE_LIMITED:
                error = RateLimited(decision.reason or "rate_limit_exceeded")
                error.rule_id = decision.rule_id
            case Decision.BLOCKED | Decision.EXECUTION_BLOCKED:
                error = self._remember(Blocked())
            case Decision.EXECUTION_TERMINAL:
                error = self._remember(Terminated("the execution is terminal"))
            case Decision.PROCEED | Decision.REPLAY | Decision.RECORDED:
                error = RebunoError(f"unexpected step decision {decision.decision!r}")
            case unexpected:
                assert_never(unexpected)
        error.step_id = decision.step_id
        return error

    async def heartbeat_until_cancelled(self, owner: asyncio.Task[Any]) -> None:
        """Renew the lease every `min(lease/3, 30 s)`; cancel `owner` once the lease is lost."""
        interval = min(self._lease.timeout / 3, _HEARTBEAT_CAP)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._kernel.heartbeat(self.id, self._lease)
            except (LeaseSuperseded, Terminated):
                self.superseded = True
                owner.cancel()
                return
            except RebunoError as exc:
                # Best-effort: a missed renewal is retried next tick, well inside the lease.
                logger.warning("heartbeat failed for execution_id=%s: %s", self.id, exc)

    async def _run_body(
        self,
        step_id: str,
        target: str,
        run: Callable[[], Any] | None,
        idempotency: str,
        due: Sequence[StepResource] = (),
    ) -> Any:
        """Runs a proceeding step's body and records its outcome, with a capture of each
        resource `due` after it (§33.6)."""
        token = _current_step.set(step_id)
        self._bodies += 1
        try:
            result = await _call(run)
            recorded = _recorded(result)
            check_size("result", recorded)
        except (Blocked, Terminated, LeaseSuperseded):
            # A nested call unwinding the dispatch is no failure of this step: it stays open
            # and the next attempt decides it by its idempotency.
            raise
        except Exception as exc:
            captures = await self._capture(due)
            await self._fail_quietly(step_id, exc, captures)
            raise ToolError(str(exc) or type(exc).__name__, target, step_id) from exc
        finally:
            _current_step.reset(token)
            self._bodies -= 1
            self._suspend_when_all_wait()
        if due:
            captures = await self._capture(due)
            send = self._kernel.complete_step(self.id, step_id, self._lease, recorded, captures)
            await self._guard(send)
            return result
        await self._record(step_id, recorded, idempotency)
        return result

    def _effects_lock(self) -> asyncio.Lock:
        if self._effects is None:
            self._effects = asyncio.Lock()
        return self._effects

    async def open_resource(self, key: str, driver: Any, policy: Any) -> Any:
        """`rebuno.resource`: see there. Under the effects lock, once per delivery."""
        if _holding_effects.get():
            return await self._open_resource(key, driver, policy)
        async with self._effects_lock():
            return await self._open_resource(key, driver, policy)

    async def _open_resource(self, key: str, driver: Any, policy: Any) -> Any:
        opened = self._opened.get(key)
        if opened is not None:
            return opened.handle
        # Completions are no longer carried: captures travel with each outcome.
        await self.flush_completions()
        self._carry = self._reporting = self._heartbeat_carries = False
        fields = _registration(key, driver, policy)
        view = await self._guard(self._kernel.register_resource(self.id, self._lease, fields))
        if view.binding is not None:
            handle = await _driver_call(driver.open, view.binding)
        else:
            handle, binding = await _driver_call(driver.create, view.checkpoint_ref or None)
            await self._guard(self._kernel.bind_resource(self.id, self._lease, key, binding))
        self._opened[key] = _Opened(key, driver, handle, fields)
        if view.every_steps > 0 and not view.covered:
            baseline = [StepResource(key=key, generation=view.generation, due=True)]
            captures = await self._capture(baseline)
            if captures:
                await self._guard(self._kernel.publish_checkpoints(self.id, self._lease, captures))
        return handle

    async def checkpoint_on_completion(self) -> None:
        """Before the run completes: each resource whose policy captures on completion and
        that no checkpoint covers now is captured. Errors are logged; control flow stops."""
        for opened in list(self._opened.values()):
            try:
                register = self._kernel.register_resource(self.id, self._lease, opened.fields)
                view: Resource = await self._guard(register)
                if not (view.on_completion and not view.covered):
                    continue
                due = [StepResource(key=opened.key, generation=view.generation, due=True)]
                captures = await self._capture(due)
                if captures:
                    send = self._kernel.publish_checkpoints(self.id, self._lease, captures)
                    await self._guard(send)
            except (Blocked, Terminated, LeaseSuperseded):
                raise
            except RebunoError as exc:
                logger.warning(
                    "could not checkpoint resource %s of execution_id=%s: %s",
                    opened.key,
                    self.id,
                    exc,
                )

    async def _capture(self, due: Sequence[StepResource]) -> dict[str, Any]:
        """The `captures` and `capture_failures` of the resources `due`; empty when none."""
        captures: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for entry in due:
            opened = self._opened.get(entry.key)
            if opened is None:
                continue
            try:
                ref = await _driver_call(opened.driver.checkpoint, opened.handle)
                captures.append(
                    {"key": entry.key, "generation": entry.generation, "checkpoint_ref": str(ref)}
                )
            except Exception as exc:
                failures.append(
                    {"key": entry.key, "generation": entry.generation, "error": _describe(exc)}
                )
        found: dict[str, Any] = {}
        if captures:
            found["captures"] = captures
        if failures:
            found["capture_failures"] = failures
        return found

    async def await_subagent(self, step_id: str) -> Any:
        """Waits for the sub-agent the step `step_id` started (§25.8): once every step body
        in flight waits for one, a single suspend asks the kernel to block the execution.
        Blocked: the dispatch unwinds, and the rerun after the children ended replays the
        step. Not blocked (they ended already): the step's recorded outcome."""
        self._waiting_bodies += 1
        try:
            if self._suspension is None:
                self._suspension = asyncio.get_running_loop().create_future()
            suspension = self._suspension
            self._suspend_when_all_wait()
            suspended = await asyncio.shield(suspension)
        finally:
            self._waiting_bodies -= 1
        if suspended:
            raise self._remember(Blocked())
        step = await self._guard(self._kernel.get_step(self.id, step_id))
        error = step.get("error")
        if error is not None:
            message = error.get("message") or error.get("reason") if isinstance(error, dict) else ""
            raise ToolError(str(message or error), step.get("target", ""), step_id)
        return step.get("result")

    def _suspend_when_all_wait(self) -> None:
        suspension = self._suspension
        if suspension is None or suspension.done() or self._waiting_bodies < self._bodies:
            return
        self._suspension = None
        if self.signal is not None:  # the dispatch unwinds already: nothing to ask
            suspension.set_result(isinstance(self.signal, Blocked))
            return
        task = asyncio.ensure_future(self._suspend())
        task.add_done_callback(lambda done: _settle(suspension, done))

    async def _suspend(self) -> bool:
        return await self._guard(self._kernel.suspend(self.id, self._lease))

    async def _fail_quietly(
        self, step_id: str, exc: Exception, captures: dict[str, Any] | None = None
    ) -> None:
        error = _error_of(exc)
        try:
            send = self._kernel.fail_step(self.id, step_id, self._lease, error, captures)
            await self._guard(send)
        except RebunoError as failure:
            # The body's own error is what the caller needs; this one only loses the record.
            logger.warning(
                "could not record failure of step_id=%s execution_id=%s: %s",
                step_id,
                self.id,
                failure,
            )

    async def _guard(self, call: Coroutine[Any, Any, _T]) -> _T:
        try:
            if self._loop is None or self._loop is asyncio.get_running_loop():
                return await call
            return await self._on_owner_loop(call)
        except LeaseSuperseded:
            self.superseded = True
            raise
        except Terminated as exc:
            raise self._remember(exc) from None
        except (NetworkError, APIError) as exc:
            if exc.retryable:
                self.kernel_unreachable = True
            raise

    def _remember(self, signal: Blocked | Terminated) -> Blocked | Terminated:
        if self.signal is None:
            self.signal = signal
        return signal

    async def _on_owner_loop(self, call: Coroutine[Any, Any, _T]) -> _T:
        # A tool awaited on another thread's loop must not touch the owner loop's pool.
        running = asyncio.get_running_loop()
        if self._loop is None or self._loop is running:
            return await call
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        return await asyncio.wrap_future(future)

    @contextmanager
    def activate(self) -> Iterator[ExecutionContext]:
        """Make this the ambient context for the code run inside the block."""
        self._loop = asyncio.get_running_loop()
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)


def execution() -> ExecutionContext:
    """Return the context of the execution the current code runs for.

    Raises:
        RuntimeError: when called outside a handler run by `Agent`.

    Example:
        async def process(prompt: str) -> dict:
            return {"execution_id": rebuno.execution().id}
    """
    context = _current.get()
    if context is None:
        raise RuntimeError("no active rebuno execution: call this inside an agent handler")
    return context


def _settle(future: asyncio.Future[bool], done: asyncio.Future[bool]) -> None:
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif (exc := done.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def current_step() -> str | None:
    """The id of the recorded step whose body is running, or None."""
    return _current_step.get()


async def previous() -> Any:
    """`execution().previous()`: what the current execution continues from.

    Example:
        async def chat(message: str) -> rebuno.Result:
            turns = (await rebuno.previous() or {}).get("turns", 0) + 1
            return rebuno.Result(output={"reply": message}, state={"turns": turns})
    """
    return await execution().previous()


@dataclass
class Result:
    """A handler's outcome with the `state` the next execution of its conversation reads
    through `previous()`; a handler returning anything else completes with that as output."""

    output: Any = None
    state: Any = None


def current() -> ExecutionContext | None:
    """The ambient context, or None outside an execution (the LLM transport passes through)."""
    return _current.get()


def jsonable(value: Any) -> Any:
    """`value` as it will be recorded: pydantic models dumped; non-JSON raises `TypeError`."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    encode_json(value)
    return value


def _recorded(value: Any) -> bytes:
    """`value` encoded as it will be recorded (see `jsonable`); the encoding is kept, so a
    result is encoded once."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return encode_json(value)


class PayloadTooLarge(ValueError):
    """A value no request to the kernel can carry: the step fails with it at once (and is
    recorded so), rather than being lost or run again on every redelivery."""


def check_size(what: str, encoded: bytes) -> None:
    """Raises `PayloadTooLarge` when `encoded` (a result or an output) can never be sent."""
    if len(encoded) > MAX_RECORDED_BYTES:
        raise PayloadTooLarge(
            f"payload_too_large: the {what} is {len(encoded)} bytes of JSON, over the"
            f" {MAX_RECORDED_BYTES} one request to the kernel can carry"
        )


def _size(carried: Carried) -> int:
    if isinstance(carried, Completion):
        return len(carried.result) + 100
    return len(carried.args) + len(carried.result or carried.error or b"") + 200


@dataclass
class _Opened:
    """A resource registered in this delivery: its driver, handle and registration."""

    key: str
    driver: Any
    handle: Any
    fields: dict[str, Any]


def _registration(key: str, driver: Any, policy: Any) -> dict[str, Any]:
    """The register request (§33.2), all six members; no policy is `every_steps: 0`."""
    return {
        "key": key,
        "driver_id": driver.driver_id,
        "configuration": getattr(driver, "configuration", None),
        "coverage_reuse": bool(getattr(driver, "coverage_reuse", False)),
        "every_steps": policy.every_steps if policy is not None else 0,
        "on_completion": policy.on_completion if policy is not None else False,
    }


async def _driver_call(method: Any, *args: Any) -> Any:
    """A driver method, sync or async."""
    result = method(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error_of(exc: Exception) -> dict[str, str]:
    """How a step body's exception is recorded."""
    return {"message": str(exc) or type(exc).__name__, "type": type(exc).__name__}


def _decision(decision: StepDecision) -> Decision:
    # A dict lookup is several times cheaper than calling the enum, on every step.
    known = _DECISIONS.get(decision.decision)
    if known is None:
        raise RebunoError(f"unknown step decision {decision.decision!r}")
    return known


def _counted(decision: StepDecision) -> bool:
    """Whether the kernel counted a submission's occurrence (§7.3): it names a step and was
    decided from it, or blocks on its approval."""
    if not decision.step_id:
        return False
    return decision.approval_id is not None or decision.decision in COUNTED_DECISIONS


def _replayed(decision: StepDecision, target: str) -> Any:
    if decision.error is None:
        return decision.result
    error = decision.error
    message = error.get("message") or error.get("reason") if isinstance(error, dict) else None
    raise ToolError(str(message or error), target, decision.step_id)


async def _call(run: Callable[[], Any] | None) -> Any:
    if run is None:
        return None
    result = run()
    if inspect.isawaitable(result):
        return await result
    return result
