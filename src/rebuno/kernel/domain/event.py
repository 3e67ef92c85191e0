"""Building events: sequence numbers allocated under the execution lock, payload shapes of §11.

Must not import anything outside `rebuno.protocol` and the domain (orjson is only an encoder).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from rebuno.kernel.domain.records import Dispatch, Event, Execution, RawJson, Step
from rebuno.protocol.events import EventType


class Raw:
    """Marks JSON text to splice into a payload as a value, not as a string."""

    __slots__ = ("text",)

    def __init__(self, text: RawJson) -> None:
        self.text = text


def encode_payload(fields: dict[str, Any]) -> RawJson:
    """Compact JSON of a payload; `Raw` values are embedded as JSON, `None` values omitted."""
    out = {k: orjson.Fragment(v.text) if isinstance(v, Raw) else v for k, v in fields.items()}
    return orjson.dumps({k: v for k, v in out.items() if v is not None}).decode()


class EventBatch:
    """The events one transaction appends to one execution; they share `occurred_at`.

    `event_seq` continues from the execution's `last_event_seq`. This is only safe because
    the batch is built under the execution's lock; the (execution_id, event_seq) key makes a
    violation of that rule fail loudly instead of forking the log.
    """

    __slots__ = ("events", "execution_id", "last_seq", "now")

    def __init__(self, execution: Execution, now: datetime) -> None:
        self.execution_id = execution.id
        self.last_seq = execution.last_event_seq
        self.now = now
        self.events: list[Event] = []

    @property
    def next_seq(self) -> int:
        return self.last_seq + 1

    def add(self, event_type: EventType, fields: dict[str, Any]) -> None:
        self.add_encoded(event_type, encode_payload(fields))

    def add_encoded(self, event_type: str, payload: RawJson) -> None:
        """An event whose payload is JSON text already (a fork's copy of another log's)."""
        self.last_seq += 1
        self.events.append(Event(self.execution_id, self.last_seq, event_type, payload, self.now))

    def execution(self, event_type: EventType, execution: Execution, **extra: Any) -> None:
        """An `execution.*` event; it names the execution's session when it has one (§24.7)."""
        fields = {"execution_id": execution.id, "status": execution.status.value, **extra}
        if execution.origin.session is not None:
            fields["session"] = execution.origin.session
        self.add(event_type, fields)

    def step(
        self,
        event_type: EventType,
        step: Step,
        *,
        rule_id: str = "",
        error: RawJson | None = None,
        usage: dict[str, int] | None = None,
        policy_hash: str | None = None,
        touched: dict[str, object] | None = None,
    ) -> None:
        """`policy_hash`: of the bundle that decided, on a decision the policy made (§35.6).
        `touched`: a live step's `resources` and `generations` (§33.5), when it has any."""
        omit_empty_target = event_type in (EventType.STEP_DENIED, EventType.STEP_RATE_LIMITED)
        fields: dict[str, Any] = {"step_id": step.step_id, "step_type": step.kind.value}
        if step.target or not omit_empty_target:
            fields["target"] = step.target
        fields["rule_id"] = rule_id or None
        fields["error"] = Raw(error) if error is not None else None
        fields["usage"] = usage
        fields["policy_hash"] = policy_hash
        if touched:
            fields.update(touched)
        self.add(event_type, fields)

    def dispatch(
        self,
        event_type: EventType,
        dispatch: Dispatch,
        status: str,
        reason: str | None = None,
        redelivery: str | None = None,
    ) -> None:
        """`reason`: why a delivery failed (the agent's status, refused, timed out, ...);
        `redelivery`: why this attempt delivers the execution again (`lease_expired`)."""
        self.add(
            event_type,
            {
                "dispatch_id": dispatch.id,
                "execution_id": dispatch.execution_id,
                "status": status,
                "attempt": dispatch.attempt,
                "reason": reason,
                "redelivery": redelivery,
            },
        )

    def approval(
        self,
        event_type: EventType,
        approval_id: str,
        step_id: str,
        status: str,
        decided_by: str | None = None,
        rationale: str | None = None,
        asserted_by: str | None = None,
    ) -> None:
        self.add(
            event_type,
            {
                "approval_id": approval_id,
                "step_id": step_id,
                "execution_id": self.execution_id,
                "status": status,
                "decided_by": decided_by or None,
                "rationale": rationale or None,
                "asserted_by": asserted_by,
            },
        )
