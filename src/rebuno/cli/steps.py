"""What the CLI and the REPL show about an execution's steps: a table with one-line
arguments and outcomes, and one step in full (arguments, result and error as pretty JSON).

Step ids may be a unique prefix among the execution's steps. Imports the SDK and the CLI's
own modules; nothing of the kernel.
"""

from __future__ import annotations

from rebuno.cli.admin import AdminClient
from rebuno.cli.approvals import arguments_summary
from rebuno.cli.operations import dump, short_ids
from rebuno.cli.render import Output, one_line, relative
from rebuno.types import Step

STEP_SHORT_ID = 8
"""Step ids are hashes, with no shared time prefix: 8 characters tell them apart."""

OUTCOME_WIDTH = 40
"""Characters of a step's result or error a table shows, on one line."""


async def list_steps(client: AdminClient, out: Output, ident: str) -> None:
    """The execution's steps in the order they were proposed."""
    steps = await client.list_steps(await client.resolve_execution_id(ident))
    if out.json:
        out.json_value([dump(step) for step in steps])
        return
    shown = short_ids([step.step_id for step in steps], minimum=STEP_SHORT_ID)
    rows = [_step_row(out, step, shown) for step in steps]
    headers = ["STEP", "KIND", "TARGET", "STATUS", "ARGUMENTS", "OUTCOME"]
    out.table(headers, rows, empty="no steps")


def _step_row(out: Output, step: Step, shown: dict[str, str]) -> list[str]:
    return [
        shown[step.step_id],
        step.kind,
        step.target or "-",
        out.status(step.status),
        arguments_summary(step, 50),
        outcome_summary(out, step),
    ]


def outcome_summary(out: Output, step: Step) -> str:
    """The step's result, or its error in red, on one line; `-` when it has neither."""
    if step.error is not None:
        return out.style(one_line(step.error, OUTCOME_WIDTH), "red")
    if step.result is not None:
        return one_line(step.result, OUTCOME_WIDTH)
    return "-"


async def show_step(client: AdminClient, out: Output, ident: str, step_ident: str) -> None:
    """One step: kind, target, status, times, usage, its approvals, and its JSON in full."""
    execution_id = await client.resolve_execution_id(ident)
    step_id = await client.resolve_step_id(execution_id, step_ident)
    step = await client.get_step(execution_id, step_id)
    if out.json:
        out.json_value(dump(step))
        return
    approvals = await client.list_approvals(status="all", execution_id=execution_id)
    out.field("step", step.step_id)
    out.field("execution", step.execution_id)
    out.field("kind", step.kind)
    out.field("target", step.target or "-")
    out.field("status", out.status(step.status))
    out.field("occurrence", str(step.occurrence))
    out.field("idempotency", step.idempotency)
    for name, moment in (("started", step.started_at), ("completed", step.completed_at)):
        if moment:
            out.field(name, f"{moment} ({relative(moment)})")
    if step.usage:
        out.field("usage", ", ".join(f"{key} {value}" for key, value in step.usage.items()))
    for approval in (a for a in approvals if a.step_id == step.step_id):
        out.field("approval", f"{approval.id} ({out.status(approval.status)})")
    for name, value in (("arguments", step.args), ("result", step.result), ("error", step.error)):
        if value is not None:
            out.field(name, "")
            out.block(value)
