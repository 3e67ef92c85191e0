"""What the agent tells its operator when it and its kernel do not fit together: a webhook
whose signature does not verify (one line per burst, not one per delivery), and the start-up
check, which asks the kernel once whether it is a Rebuno kernel and knows this agent before
the agent serves anything.
Imports only the standard library and the SDK's own modules.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rebuno.sdk._kernel import KernelClient, unreachable
from rebuno.sdk.errors import APIError, NetworkError, NotFoundError, UnauthorizedError

logger = logging.getLogger("rebuno")

CHECK_ENV = "REBUNO_CHECK_KERNEL"
SECRET_ENV = "REBUNO_AGENT_SECRET"
CHECK_TIMEOUT_SECONDS = 10.0
"""How long the start-up check waits for the kernel's two answers together."""
_REPORT_EVERY_SECONDS = 60.0
_PROBED_EXECUTION = "00000000-0000-0000-0000-000000000000"
"""An execution id no kernel gives out: reading it answers `404` once the signature verified."""
_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on", "")


def check_enabled(check_kernel: bool | None) -> bool:
    """`check_kernel` when given, else `REBUNO_CHECK_KERNEL` (on unless false, 0, no, off).
    Raises ValueError for another value."""
    if check_kernel is not None:
        return check_kernel
    value = os.environ.get(CHECK_ENV, "").strip().lower()
    if value not in _FALSE + _TRUE:
        raise ValueError(f"{CHECK_ENV} must be true or false, not {value!r}")
    return value not in _FALSE


def secret_source(given: str | None) -> str:
    """Where the agent's secret came from, as the messages name it."""
    return "the secret given as Agent(secret=...)" if given is not None else SECRET_ENV


class Throttle:
    """Lets one report through per period and counts the ones it held back."""

    def __init__(
        self,
        every: float = _REPORT_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every = every
        self._clock = clock
        self._last: float | None = None
        self._held = 0

    def allow(self) -> int | None:
        """None to hold this report back; else how many were held back since the last one."""
        now = self._clock()
        if self._last is not None and now - self._last < self._every:
            self._held += 1
            return None
        held, self._held, self._last = self._held, 0, now
        return held


def webhook_rejected(agent_id: str, source: str, signed: bool, held: int) -> str:
    """The line logged for webhooks refused with `401`: whose secret to compare with whose."""
    agent = repr(agent_id)
    what = "whose signature does not verify" if signed else "without a Rebuno-Signature header"
    line = (
        f"agent {agent} refused a webhook {what}: the kernel signs with the secret it registered"
        f" for {agent} (the manifest's or POST /v0/agents's `secret`), which must equal {source}"
    )
    if held:
        line += f" ({held} more refused since the last report)"
    return line


async def check_kernel(kernel: KernelClient) -> str | None:
    """Asks the kernel whether it is one and knows this agent. The problem in one line, or
    None. A kernel that answers but is unwell (its database is down, say) is no reason to
    stop: that is logged and the agent serves."""
    start = f"cannot start agent {kernel.agent_id!r}"
    where = f"{start}: the kernel at {kernel.base_url}"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            return await _check(kernel, start, where)
    except TimeoutError:
        return (
            f"{where} is unreachable: it did not answer within {CHECK_TIMEOUT_SECONDS:.0f} s;"
            " check REBUNO_URL or base_url="
        )
    except ValueError as exc:  # a URL no connection can be made to
        return f"{where} cannot be reached: {exc}; check REBUNO_URL or base_url="


async def _check(kernel: KernelClient, start: str, where: str) -> str | None:
    try:
        health = await kernel.health()
    except NetworkError as exc:
        return f"{where} is unreachable: {unreachable(exc)}; check REBUNO_URL or base_url="
    if health.status >= 500:
        _unwell(kernel, f"GET /v0/health answered {health.status}")
        return None
    if health.status != 200 or _json(health.body) != {"status": "ok"}:
        return (
            f"{where} is not a Rebuno kernel: GET /v0/health answered {health.status}"
            ' without {"status": "ok"}; check REBUNO_URL or base_url='
        )
    try:
        await kernel.get_execution(_PROBED_EXECUTION)
    except NotFoundError:
        return None  # the signature verified: the kernel knows this agent and its secret
    except UnauthorizedError as exc:
        return f"{start}: {exc.message}"
    except NetworkError as exc:
        return f"{where} is unreachable: {unreachable(exc)}"
    except APIError as exc:
        if exc.status_code >= 500:
            _unwell(kernel, str(exc))
            return None
        return f"{where} answered a signed read with {exc}; is it a Rebuno kernel?"
    return None


def _unwell(kernel: KernelClient, detail: str) -> None:
    logger.warning(
        "the kernel at %s is unwell (%s); agent %r serves anyway",
        kernel.base_url,
        detail,
        kernel.agent_id,
    )


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None
