"""The execution context: one per dispatch, ambient through a ContextVar, behind `execution()`.

Every recording primitive (`@tool`, `wrap_tool`, `step()`, the LLM transport) goes through
`ExecutionContext.invoke_tool` or `begin_llm`, which submit the step and act on the kernel's
decision (docs/protocol.md §8). The context is a façade over the dispatch's collaborators, each
in its own module: its standing with the kernel and the heartbeats that keep its lease (§12.4,
`_dispatch`), the outcomes that wait to be carried (`_carried`), the numbering of submissions
(`_numbering`), the registered resources (`_resources`), the suspension for sub-agents
(`_suspension`) and the submission itself (`_submission`). Imports only `rebuno.protocol`,
httpx-free SDK modules and the models; never the kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rebuno.protocol.enums import StepKind
from rebuno.sdk._carried import Carrier
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk._kernel import Carried, KernelClient, Lease, encode_json
from rebuno.sdk._numbering import Numbering
from rebuno.sdk._resources import Resources
from rebuno.sdk._submission import Submitter
from rebuno.sdk._suspension import Suspension
from rebuno.sdk.errors import Blocked, RebunoError, Terminated
from rebuno.types import StepDecision

_current: ContextVar[ExecutionContext | None] = ContextVar("rebuno_execution", default=None)


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
        self._dispatch = Dispatch(kernel, execution_id, lease)
        self._carrier = Carrier(self._dispatch, carry=carry_completions, report=report_steps)
        self._resources = Resources(self._dispatch, self._carrier)
        self._suspension = Suspension(self._dispatch)
        self._submitter = Submitter(
            self._dispatch,
            self._carrier,
            Numbering() if number_steps else None,
            self._resources,
            self._suspension,
        )

    @property
    def kernel_url(self) -> str:
        """The kernel this execution's agent talks to."""
        return self._dispatch.kernel.base_url

    async def previous(self) -> Any:
        """What this execution continues from: the `state` the execution before it in its
        conversation completed with (`Result`), else that execution's output; None when
        there is none."""
        return await self._dispatch.on_owner_loop(self._dispatch.kernel.previous_state(self.id))

    @property
    def lease(self) -> Lease:
        """The `(dispatch_id, attempt)` this handler was delivered under, with its period."""
        return self._dispatch.lease

    @property
    def dispatch_id(self) -> str:
        return self._dispatch.lease.dispatch_id

    @property
    def dispatch_attempt(self) -> int:
        return self._dispatch.lease.attempt

    @property
    def signal(self) -> Blocked | Terminated | None:
        """The `Blocked` or `Terminated` this dispatch unwinds with, once one was raised."""
        return self._dispatch.signal

    @property
    def superseded(self) -> bool:
        """The lease was lost to another delivery: nothing more is written."""
        return self._dispatch.superseded

    @property
    def kernel_unreachable(self) -> bool:
        """A kernel call failed without an answer (network, 5xx): the outcome of this run
        cannot be trusted to be recorded, so it ends quietly and the lease redelivers it."""
        return self._dispatch.kernel_unreachable

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
        submitter = self._submitter
        if (self._resources.opened or resources) and not self._resources.holding():
            async with self._resources.effects():  # a nested step runs inside this one
                return await submitter.invoke(kind, target, encoded, idempotency, run, resources)
        if self._carrier.reporting and idempotency == "safe_to_retry" and kind != StepKind.LLM_CALL:
            return await submitter.run_unsubmitted(kind, target, encoded, run)
        return await submitter.invoke(kind, target, encoded, idempotency, run)

    async def begin_llm(self, target: str, request: Any) -> StepDecision:
        """Submit an LLM request as an `llm_call` step and return the decision unacted."""
        args = encode_json(request)
        return await self._submitter.submit(StepKind.LLM_CALL, target, args, "safe_to_retry")

    async def record_llm(self, step_id: str, result: Any) -> None:
        """Record the provider's answer `{status, headers, body}` as the step's result."""
        await self._submitter.complete(step_id, encode_json(result))

    async def fail_llm(self, step_id: str, message: str) -> None:
        """Record that the provider call failed before any answer came back."""
        await self._submitter.fail(step_id, {"message": message})

    async def publish_llm_delta(self, step_id: str, seq: int, data: str) -> None:
        """Send a live chunk of a step's output to the kernel's stream side channel."""
        dispatch = self._dispatch
        send = dispatch.kernel.stream_delta(self.id, step_id, dispatch.lease, seq=seq, data=data)
        await dispatch.on_owner_loop(send)

    async def submit(self, kind: str, target: str, args: Any, idempotency: str) -> StepDecision:
        """Submit a step under this dispatch's lease; a lease loss is remembered. Completions
        waiting to be carried travel with it. `args` must be JSON (`TypeError` otherwise)."""
        return await self._submitter.submit(kind, target, encode_json(args), idempotency)

    def refusal(self, decision: StepDecision) -> RebunoError:
        """The exception for a decision that is neither proceed nor replay.

        `Blocked` and `Terminated` are remembered, so the dispatch unwinds even if the
        handler swallows them.
        """
        return self._submitter.refusal(decision)

    def take_completions(self) -> list[Carried]:
        """The completions waiting to be carried by the next kernel call, now handed over."""
        return self._carrier.take()

    def fits_beside(self, size: int) -> bool:
        """Whether what waits to be carried still fits in one request beside `size` bytes."""
        return self._carrier.fits_beside(size)

    async def flush_completions(self) -> None:
        """Sends waiting completions on their own. Best-effort: a completion that is lost
        only re-runs a `safe_to_retry` step on the next delivery."""
        await self._carrier.flush()

    async def heartbeat_until_cancelled(self, owner: asyncio.Task[Any]) -> None:
        """Renew the lease every `min(lease/3, 30 s)`; cancel `owner` once the lease is lost."""
        await self._dispatch.keep_lease(owner)

    async def open_resource(self, key: str, driver: Any, policy: Any) -> Any:
        """`rebuno.resource`: see there. Under the effects lock, once per delivery."""
        return await self._resources.open(key, driver, policy)

    async def checkpoint_on_completion(self) -> None:
        """Before the run completes: each resource whose policy captures on completion and
        that no checkpoint covers now is captured. Errors are logged; control flow stops."""
        await self._resources.checkpoint_on_completion()

    async def await_subagent(self, step_id: str) -> Any:
        """Waits for the sub-agent the step `step_id` started (§25.8): once every step body
        in flight waits for one, a single suspend asks the kernel to block the execution.
        Blocked: the dispatch unwinds, and the rerun after the children ended replays the
        step. Not blocked (they ended already): the step's recorded outcome."""
        return await self._suspension.await_subagent(step_id)

    @contextmanager
    def activate(self) -> Iterator[ExecutionContext]:
        """Make this the ambient context for the code run inside the block."""
        self._dispatch.loop = asyncio.get_running_loop()
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
