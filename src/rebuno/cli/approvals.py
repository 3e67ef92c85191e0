"""What the CLI and the REPL show and do about approvals: the list (with the gated step's
kind, target and a one-line summary of its arguments), one approval in full, a decision.

The kernel's Approval names its step; the step's record (`GET …/steps/{step_id}`) gives the
kind, target and arguments, and the step's `step.awaiting_approval` event the rule. Imports
the SDK and the CLI's own modules; nothing of the kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rebuno.cli.admin import AdminClient
from rebuno.cli.operations import EVENTS_PAGE, dump, short_ids
from rebuno.cli.render import Output, age, one_line, relative
from rebuno.protocol.events import EventType
from rebuno.sdk.errors import NotFoundError
from rebuno.types import Approval, Step

STEP_READS = 8
"""At most this many step records are read at once for a list of approvals."""
ARGUMENTS_WIDTH = 60
"""Characters of a step's arguments a table shows, on one line."""


async def list_approvals(
    client: AdminClient, out: Output, *, status: str = "pending", execution: str = ""
) -> None:
    execution_id = await client.resolve_execution_id(execution) if execution else ""
    approvals = await client.list_approvals(status=status, execution_id=execution_id)
    steps = await _gated_steps(client, approvals)
    if out.json:
        out.json_value([_with_step(approval, steps) for approval in approvals])
        return
    shown = short_ids([a.id for a in approvals] + [a.execution_id for a in approvals])
    rows = [_approval_row(out, approval, steps.get(approval.id), shown) for approval in approvals]
    headers = ["ID", "EXECUTION", "STATUS", "KIND", "TARGET", "ARGUMENTS", "APPROVERS", "AGE"]
    out.table(headers, rows, empty=f"no {status} approvals")


async def _gated_steps(client: AdminClient, approvals: Sequence[Approval]) -> dict[str, Step]:
    """Each approval's step by approval id, read a few at a time."""
    limit = asyncio.Semaphore(STEP_READS)

    async def read(approval: Approval) -> Step | None:
        async with limit:
            return await _step_of(client, approval)

    found = await asyncio.gather(*(read(approval) for approval in approvals))
    return {a.id: step for a, step in zip(approvals, found, strict=True) if step is not None}


async def _step_of(client: AdminClient, approval: Approval) -> Step | None:
    try:
        return await client.get_step(approval.execution_id, approval.step_id)
    except NotFoundError:
        # An approval is written with its step; a missing one is shown as unknown, not fatal.
        return None


def _with_step(approval: Approval, steps: dict[str, Step]) -> dict[str, Any]:
    step = steps.get(approval.id)
    return {**dump(approval), "step": dump(step) if step is not None else None}


def _approval_row(
    out: Output, approval: Approval, step: Step | None, shown: dict[str, str]
) -> list[str]:
    return [
        shown[approval.id],
        shown[approval.execution_id],
        out.status(approval.status),
        step.kind if step else "?",
        step.target if step else "?",
        arguments_summary(step),
        ",".join(approval.approvers) if approval.approvers else "anyone",
        age(approval.created_at),
    ]


def arguments_summary(step: Step | None, width: int = ARGUMENTS_WIDTH) -> str:
    """A step's arguments on one line of at most `width` characters; `-` when it has none."""
    if step is None or step.args is None:
        return "-"
    return one_line(step.args, width)


async def show_approval(client: AdminClient, out: Output, ident: str) -> None:
    """One approval with its execution, step, arguments in full, rule, approvers and expiry."""
    approval = await client.get_approval(await client.resolve_approval_id(ident))
    step = await _step_of(client, approval)
    rule_id = await _rule_of(client, approval)
    if out.json:
        out.json_value({**dump(approval), "rule_id": rule_id, "step": dump(step) if step else None})
        return
    out.field("id", approval.id)
    out.field("status", out.status(approval.status))
    out.field("execution", approval.execution_id)
    out.field("step", approval.step_id)
    if step is not None:
        out.field("kind", step.kind)
        out.field("target", step.target or "-")
    out.field("rule", rule_id or "-")
    out.field("approvers", ", ".join(approval.approvers) if approval.approvers else "anyone")
    out.field("message", approval.message or "-")
    out.field("created", f"{approval.created_at} ({relative(approval.created_at)})")
    out.field("expires", f"{approval.timeout_at} ({relative(approval.timeout_at)})")
    _decision_fields(out, approval)
    out.field("arguments", "" if step is not None and step.args is not None else "-")
    if step is not None and step.args is not None:
        out.block(step.args)


def _decision_fields(out: Output, approval: Approval) -> None:
    if approval.decided_by:
        out.field("decided by", approval.decided_by)
    if approval.decided_at:
        out.field("decided", f"{approval.decided_at} ({relative(approval.decided_at)})")
    if approval.rationale:
        out.field("rationale", approval.rationale)


async def _rule_of(client: AdminClient, approval: Approval) -> str:
    """The rule that required the approval, from its step's `step.awaiting_approval` event."""
    after_seq = 0
    while True:
        page = await client.events(approval.execution_id, after_seq=after_seq, limit=EVENTS_PAGE)
        for event in page:
            payload = event.payload if isinstance(event.payload, dict) else {}
            if (
                event.type == EventType.STEP_AWAITING_APPROVAL
                and payload.get("step_id") == approval.step_id
            ):
                return str(payload.get("rule_id") or "")
        if len(page) < EVENTS_PAGE:
            return ""
        after_seq = page[-1].event_seq


async def decide_approval(
    client: AdminClient,
    out: Output,
    ident: str,
    *,
    grant: bool,
    decided_by: str = "",
    rationale: str = "",
) -> None:
    approval_id = await client.resolve_approval_id(ident)
    decide = client.grant_approval if grant else client.deny_approval
    await decide(approval_id, decided_by=decided_by, rationale=rationale)
    verb = "granted" if grant else "denied"
    if out.json:
        out.json_value({"id": approval_id, "status": verb})
        return
    out.line(f"{out.status(verb)} {approval_id}")
