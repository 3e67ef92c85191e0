"""`step-occurrences` (docs/extensions.md): the agent numbers its submissions as the kernel
would have (docs/protocol.md §7.3), so a replayed step is answered from one read.

A step's occurrence is how many submissions of its key (kind, target, hash of canonical args)
the kernel counted before it in the delivery. Submissions of one key go one at a time, as the
kernel's lock would have taken them, so two at once never claim the same occurrence. Imports
only `rebuno.protocol` and the models; never the kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rebuno.protocol.canonical import args_hash, canonical_args
from rebuno.protocol.enums import COUNTED_DECISIONS
from rebuno.types import StepDecision

Key = tuple[str, str, str]
"""A step's kind, target and hash of canonical args: what its occurrence counts."""
Answer = tuple[StepDecision, bool]
"""A submission's decision, and whether the `step-records` grant goes on."""


class Numbering:
    """How many submissions of each key the kernel counted in this delivery."""

    def __init__(self) -> None:
        self._counted: dict[Key, int] = {}
        self._queues: dict[Key, tuple[asyncio.Lock, list[int]]] = {}
        """The lock each key's submissions take turns on, and how many use it now."""

    async def submit(
        self, kind: str, target: str, args: bytes, send: Callable[..., Awaitable[Answer]]
    ) -> Answer:
        """`send(occurrence=...)` with the submission's own occurrence; the count advances
        when the kernel counted it."""
        key = (kind, target, args_hash(canonical_args(args)))
        lock, users = self._queues.get(key) or self._queues.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                occurrence = self._counted.get(key, 0)
                answer = await send(occurrence=occurrence)
                if counted(answer[0]):
                    self._counted[key] = occurrence + 1
                return answer
        finally:
            users[0] -= 1
            if not users[0]:
                del self._queues[key]


def counted(decision: StepDecision) -> bool:
    """Whether the kernel counted a submission's occurrence (§7.3): it names a step and was
    decided from it, or blocks on its approval."""
    if not decision.step_id:
        return False
    return decision.approval_id is not None or decision.decision in COUNTED_DECISIONS
