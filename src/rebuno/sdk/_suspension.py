"""Waiting for sub-agents (docs/protocol.md §25.8): the step bodies in flight, and the one
suspend that speaks for all of them once every one waits for a child.

A body that waits while another still runs must not suspend the execution under it: the
suspend is asked only when the last running body starts waiting or ends. Suspended, every
waiting body raises `Blocked` and the dispatch unwinds; not suspended (the children ended
already), each returns its step's recorded outcome. Imports only the SDK's own modules; never
the kernel.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk.errors import Blocked, ToolError


class Suspension:
    """The step bodies running in one dispatch, and how many of them wait for a child."""

    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch
        self._bodies = 0
        self._waiting = 0
        self._answer: asyncio.Future[bool] | None = None
        """The answer of the one suspend every waiting body shares."""

    def started(self) -> None:
        """A step body starts running."""
        self._bodies += 1

    def ended(self) -> None:
        """A step body ended: the others may all be waiting now."""
        self._bodies -= 1
        if self._answer is not None:  # checked here first: this runs after every step body
            self._suspend_when_all_wait()

    async def await_subagent(self, step_id: str) -> Any:
        """Waits for the sub-agent the step `step_id` started, from inside its body.

        Blocked: raises `Blocked`, and the rerun after the children ended replays the step.
        Not blocked: the step's recorded result, or a `ToolError` with its error.
        """
        self._waiting += 1
        try:
            if self._answer is None:
                self._answer = asyncio.get_running_loop().create_future()
            answer = self._answer
            self._suspend_when_all_wait()
            suspended = await asyncio.shield(answer)
        finally:
            self._waiting -= 1
        if suspended:
            raise self._dispatch.remember(Blocked())
        return await self._recorded(step_id)

    async def _recorded(self, step_id: str) -> Any:
        dispatch = self._dispatch
        step = await dispatch.call(dispatch.kernel.get_step(dispatch.execution_id, step_id))
        error = step.get("error")
        if error is not None:
            message = error.get("message") or error.get("reason") if isinstance(error, dict) else ""
            raise ToolError(str(message or error), step.get("target", ""), step_id)
        return step.get("result")

    def _suspend_when_all_wait(self) -> None:
        answer = self._answer
        if answer is None or answer.done() or self._waiting < self._bodies:
            return
        self._answer = None
        signal = self._dispatch.signal
        if signal is not None:  # the dispatch unwinds already: nothing to ask
            answer.set_result(isinstance(signal, Blocked))
            return
        task = asyncio.ensure_future(self._suspend())
        task.add_done_callback(lambda done: _settle(answer, done))

    async def _suspend(self) -> bool:
        dispatch = self._dispatch
        return await dispatch.call(dispatch.kernel.suspend(dispatch.execution_id, dispatch.lease))


def _settle(future: asyncio.Future[bool], done: asyncio.Future[bool]) -> None:
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif (exc := done.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())
