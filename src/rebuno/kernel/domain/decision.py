"""Step requests and the decisions the kernel answers them with (§4.6, §8).

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from rebuno.kernel.domain.records import RawJson
from rebuno.protocol.enums import Decision, Idempotency, StepKind


@dataclass(frozen=True, slots=True)
class StepRequest:
    """A step submission, already validated: `args` is canonical JSON text or None."""

    kind: StepKind
    target: str
    args: RawJson | None
    args_hash: str
    idempotency: Idempotency


@dataclass(frozen=True, slots=True)
class StepDecision:
    """The answer to a submission, a completion or a failure. Absent fields are None."""

    decision: Decision
    step_id: str | None = None
    result: RawJson | None = None
    error: RawJson | None = None
    approval_id: str | None = None
    reason: str | None = None
    rule_id: str | None = None
