"""Dispatch rules (§12): the effective lease, retry backoff, the webhook body, and the
outcome of one delivery.

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import orjson

from rebuno.kernel.domain.records import Agent, Dispatch, Lease
from rebuno.protocol.enums import DispatchStatus
from rebuno.protocol.extensions import AgentInstance

MIN_AGENT_LEASE_SECONDS = 10.0
MAX_AGENT_LEASE_SECONDS = 7 * 24 * 3600.0
"""The longest lease an agent may ask for (a week): a larger value would push the lease's
expiry past what timestamps can hold and stop lease recovery."""


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    ok: bool
    detail: str = ""
    answered: bool = True
    """Whether the agent answered at all (False: no connection, a timeout, a bad URL)."""
    instance: AgentInstance | None = None
    """Who acknowledged it, when the agent named itself (`agent-instances`)."""


def owns(dispatch: Dispatch | None, lease: Lease) -> bool:
    """The strong lease check (§12.4) on a dispatch already read: `lease` names it, at its
    attempt, while it is in flight. The stores apply the same rule in their statements."""
    return (
        dispatch is not None
        and dispatch.id == lease.dispatch_id
        and dispatch.attempt == lease.attempt
        and dispatch.status is DispatchStatus.IN_FLIGHT
    )


def same_attempt(dispatch: Dispatch | None, lease: Lease) -> bool:
    """The weak lease check (§9, §16.1) on the dispatch the lease names, read from its
    execution: it is still at the lease's attempt, whatever its status."""
    return dispatch is not None and dispatch.attempt == lease.attempt


def lease_timeout_problem(value: float) -> str | None:
    """Why an agent's `lease_timeout_seconds` is refused, or None: it must be a finite
    number of seconds above zero and at most `MAX_AGENT_LEASE_SECONDS`."""
    if not math.isfinite(value) or value <= 0:
        return "lease_timeout_seconds must be a finite number of seconds above 0"
    if value > MAX_AGENT_LEASE_SECONDS:
        return f"lease_timeout_seconds must be at most {MAX_AGENT_LEASE_SECONDS:.0f} (a week)"
    return None


def effective_lease(agent: Agent, default: timedelta) -> float:
    """§12.3: the agent's own lease when set and at least 10 s, else the kernel default.

    A stored value that registration would refuse today (left by an older version) still
    gives a lease: one above a week counts as a week, and one that is not a number (NaN) as
    unset. The reaper's statements in both stores apply the same rule."""
    own = agent.lease_timeout_seconds
    if own is not None and own >= MIN_AGENT_LEASE_SECONDS:
        return min(own, MAX_AGENT_LEASE_SECONDS)
    return default.total_seconds()


@dataclass(frozen=True, slots=True)
class Webhook:
    """One signed webhook to POST (§6): to whom, signed with which secret, for which
    execution, its body, and how long to wait for the answer."""

    url: str
    secret: str = field(repr=False)
    execution_id: str
    body: bytes
    timeout_seconds: float
    extensions: tuple[str, ...] = ()
    """This kernel's own protocol extensions the delivery offers."""
    carried: str | None = None
    """The `Rebuno-Execution` value (`execution-input`) to send and sign, if any."""


class Deliverer(Protocol):
    """POSTs one signed webhook; any 2xx is `ok`. Never raises for a delivery failure."""

    async def deliver(self, webhook: Webhook) -> DeliveryOutcome: ...


def webhook_body(dispatch: Dispatch, lease_seconds: float) -> bytes:
    """Compact JSON with the four fields in the documented order; a whole lease is an int."""
    lease: int | float = (
        int(lease_seconds) if lease_seconds == int(lease_seconds) else lease_seconds
    )
    return orjson.dumps(
        {
            "execution_id": dispatch.execution_id,
            "dispatch_id": dispatch.id,
            "dispatch_attempt": dispatch.attempt,
            "lease_timeout_seconds": lease,
        }
    )


def backoff(
    attempt: int, base: timedelta, cap: timedelta, rand: Callable[[float, float], float]
) -> timedelta:
    """`min(base * 2^(attempt-1), cap)` plus uniform jitter in [0, 25 %); `rand(low, high)`
    draws it, like `random.uniform`, so the rule stays a function of its arguments."""
    delay = min(base.total_seconds() * 2 ** (attempt - 1), cap.total_seconds())
    return timedelta(seconds=delay + rand(0, 0.25 * delay))
