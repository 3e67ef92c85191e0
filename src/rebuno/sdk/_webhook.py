"""Parsing and de-duplicating webhook deliveries (docs/protocol.md §6), apart from any I/O.

A delivery names an execution and the lease it runs under. At most one run per execution is
live: a repeat of an attempt already seen is ignored, a newer attempt or another dispatch
supersedes the older run. Imports only the standard library and the SDK's lease type.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rebuno.sdk._kernel import Lease

_DEFAULT_LEASE_SECONDS = 120.0
_REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook: the execution to run and the lease it was delivered under."""

    execution_id: str
    lease: Lease
    extensions: frozenset[str] = frozenset()
    """Protocol extensions the kernel offered on this webhook (`Rebuno-Extensions`)."""
    carried: tuple[str, Any] | None = None
    """The execution's status and input, when the webhook carried them (`execution-input`)
    under a valid signature."""


def parse_delivery(body: bytes) -> Delivery | None:
    """The delivery a webhook body describes, or None when it lacks the ids."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    execution_id = payload.get("execution_id")
    dispatch_id = payload.get("dispatch_id")
    if not (isinstance(execution_id, str) and execution_id):
        return None
    if not (isinstance(dispatch_id, str) and dispatch_id):
        return None
    attempt = _number(payload.get("dispatch_attempt"), 1)
    lease_seconds = _number(payload.get("lease_timeout_seconds"), _DEFAULT_LEASE_SECONDS)
    lease = Lease(dispatch_id, int(attempt), float(lease_seconds) or _DEFAULT_LEASE_SECONDS)
    return Delivery(execution_id, lease)


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return value


class Deliveries:
    """Decides, per execution, whether a delivery runs and which older run it supersedes."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, Lease] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def admit(self, delivery: Delivery) -> tuple[bool, asyncio.Task[None] | None]:
        """`(run, superseded)`: whether to run it, and the live run it replaces, if any."""
        previous = self._seen.get(delivery.execution_id)
        if previous is not None and _is_repeat(previous, delivery.lease):
            return False, None
        self._seen[delivery.execution_id] = delivery.lease
        self._seen.move_to_end(delivery.execution_id)
        while len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        return True, self._tasks.get(delivery.execution_id)

    def started(self, execution_id: str, task: asyncio.Task[None]) -> None:
        self._tasks[execution_id] = task
        task.add_done_callback(lambda done: self._finished(execution_id, done))

    def running(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    def _finished(self, execution_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(execution_id) is task:
            del self._tasks[execution_id]


def _is_repeat(previous: Lease, lease: Lease) -> bool:
    return previous.dispatch_id == lease.dispatch_id and lease.attempt <= previous.attempt
