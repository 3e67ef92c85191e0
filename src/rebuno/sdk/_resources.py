"""The resources registered in one dispatch (docs/protocol.md §33), the delivery's side of
`rebuno.resource`: registration, the binding to the provider's resource, and the checkpoints
captured after the steps that change them and before the run completes.

Once a resource is registered, every tool and step holds the effects lock while it runs, so
their generations follow one another; outcomes are no longer carried, since captures travel
with each. Imports only the SDK's own modules and the models; never the kernel.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from rebuno.sdk._carried import Carrier
from rebuno.sdk._dispatch import Dispatch
from rebuno.sdk.errors import Blocked, LeaseSuperseded, RebunoError, Terminated
from rebuno.types import Resource, StepResource

logger = logging.getLogger("rebuno")

_holding_effects: ContextVar[bool] = ContextVar("rebuno_effects", default=False)
"""The current code runs inside a step that holds the dispatch's effects lock."""


@dataclass
class _Opened:
    """A resource registered in this delivery: its driver, handle and registration."""

    key: str
    driver: Any
    handle: Any
    fields: dict[str, Any]


class Resources:
    """The resources registered in one dispatch, by key, and the lock effects take turns on.

    Attributes:
        opened: The resources registered in this delivery, by key (§33.10); empty until one is.
    """

    def __init__(self, dispatch: Dispatch, carrier: Carrier) -> None:
        self.opened: dict[str, _Opened] = {}
        self._dispatch = dispatch
        self._carrier = carrier
        self._effects: asyncio.Lock | None = None

    @staticmethod
    def holding() -> bool:
        """Whether the current code runs inside a step that holds the effects lock."""
        return _holding_effects.get()

    @asynccontextmanager
    async def effects(self) -> AsyncIterator[None]:
        """Holds the effects lock for the block; a step nested inside runs under it."""
        async with self._lock():
            token = _holding_effects.set(True)
            try:
                yield
            finally:
                _holding_effects.reset(token)

    async def open(self, key: str, driver: Any, policy: Any) -> Any:
        """`rebuno.resource`: see there. Under the effects lock, once per delivery."""
        if _holding_effects.get():
            return await self._open(key, driver, policy)
        async with self._lock():
            return await self._open(key, driver, policy)

    async def _open(self, key: str, driver: Any, policy: Any) -> Any:
        opened = self.opened.get(key)
        if opened is not None:
            return opened.handle
        # Completions are no longer carried: captures travel with each outcome.
        await self._carrier.flush()
        self._carrier.stop()
        fields = _registration(key, driver, policy)
        dispatch = self._dispatch
        kernel, execution_id, lease = dispatch.kernel, dispatch.execution_id, dispatch.lease
        view = await dispatch.call(kernel.register_resource(execution_id, lease, fields))
        if view.binding is not None:
            handle = await _driver_call(driver.open, view.binding)
        else:
            handle, binding = await _driver_call(driver.create, view.checkpoint_ref or None)
            await dispatch.call(kernel.bind_resource(execution_id, lease, key, binding))
        self.opened[key] = _Opened(key, driver, handle, fields)
        if view.every_steps > 0 and not view.covered:
            baseline = [StepResource(key=key, generation=view.generation, due=True)]
            await self._publish(baseline)
        return handle

    async def checkpoint_on_completion(self) -> None:
        """Before the run completes: each resource whose policy captures on completion and
        that no checkpoint covers now is captured. Errors are logged; control flow stops."""
        dispatch = self._dispatch
        for opened in list(self.opened.values()):
            try:
                register = dispatch.kernel.register_resource(
                    dispatch.execution_id, dispatch.lease, opened.fields
                )
                view: Resource = await dispatch.call(register)
                if view.on_completion and not view.covered:
                    due = [StepResource(key=opened.key, generation=view.generation, due=True)]
                    await self._publish(due)
            except (Blocked, Terminated, LeaseSuperseded):
                raise
            except RebunoError as exc:
                logger.warning(
                    "could not checkpoint resource %s of execution_id=%s: %s",
                    opened.key,
                    dispatch.execution_id,
                    exc,
                )

    async def capture(self, due: Sequence[StepResource]) -> dict[str, Any]:
        """The `captures` and `capture_failures` of the resources `due`; empty when none."""
        captures: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for entry in due:
            opened = self.opened.get(entry.key)
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

    async def _publish(self, due: Sequence[StepResource]) -> None:
        """Captures `due` and publishes what it found, outside any step (§33.4)."""
        captures = await self.capture(due)
        if captures:
            dispatch = self._dispatch
            send = dispatch.kernel.publish_checkpoints(
                dispatch.execution_id, dispatch.lease, captures
            )
            await dispatch.call(send)

    def _lock(self) -> asyncio.Lock:
        if self._effects is None:
            self._effects = asyncio.Lock()
        return self._effects


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
