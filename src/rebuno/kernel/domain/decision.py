"""Step requests and the decisions the kernel answers them with (§4.6, §8).

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from rebuno.kernel.domain.records import RawJson
from rebuno.kernel.domain.resource import StepResource
from rebuno.protocol.enums import Decision, Idempotency, StepKind


@dataclass(frozen=True, slots=True)
class StepRequest:
    """A step submission, already validated: `args` is canonical JSON text or None."""

    kind: StepKind
    target: str
    args: RawJson | None
    args_hash: str
    idempotency: Idempotency
    resources: tuple[str, ...] = ()
    """The resources it declares (§33.5); not part of its identity."""


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
    policy_free: bool = False
    """The agent had no policy when this was decided, so its `step-records` grant holds on.
    Never rendered in the body."""
    resources: tuple[StepResource, ...] = ()
    """A `proceed`: the resources the step touches, at their new generations (§33.5)."""


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """A step's result (or error) an agent of ours sends along with its next request.

    The kernel's own extension `step-completions`: a `safe_to_retry` step's completion may
    travel with the agent's next submission or execution complete/fail, in the same
    transaction, instead of costing a request and a commit of its own. Losing it in a crash
    only re-runs a step that is safe to re-run.
    """

    step_id: str
    result: RawJson | None = None
    error: RawJson | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step an agent of ours ran before telling the kernel, reported with its outcome.

    The kernel's own extension `step-records`: while an execution's first delivery runs for an
    agent without a policy, the kernel lets that agent run `safe_to_retry` steps without asking
    first and record them afterwards, carried like completions. Losing the report in a crash
    only re-runs steps that are safe to re-run; the kernel gives them ids and events exactly as
    if each had been submitted and completed in turn.
    """

    request: StepRequest
    result: RawJson | None = None
    error: RawJson | None = None


Carried = StepOutcome | StepRecord
"""What an agent's request may carry before its own business, in the order it happened."""
