"""`rebuno approvals ls|get|grant|deny` (also spelt `approval`): human decisions on gated
steps (§15), with the step each one gates.

Must not import anything under `rebuno.kernel`: it talks to a kernel over HTTP.
"""

from __future__ import annotations

import os

import click

from rebuno.cli import approvals as operations
from rebuno.cli.aliases import Aliased
from rebuno.cli.remote import Remote, remote_command

KEY_TOKEN_PREFIX = "rbk_"
STATUSES = ("pending", "granted", "denied", "expired", "all")


@click.group("approvals", cls=Aliased)
def approvals() -> None:
    """List, inspect, grant and deny approvals (also: approval). IDs may be a unique prefix."""


@approvals.command("ls")
@click.option("--status", default="pending", show_default=True, type=click.Choice(STATUSES))
@click.option("--execution", default="", metavar="ID", help="Only this execution's approvals.")
@remote_command
def ls(remote: Remote, status: str, execution: str) -> None:
    """List approvals, oldest first, with the gated step's kind, target and arguments."""
    remote.run(
        lambda client, out: operations.list_approvals(
            client, out, status=status, execution=execution
        )
    )


@approvals.command("get")
@click.argument("approval_id", metavar="ID")
@remote_command
def get(remote: Remote, approval_id: str) -> None:
    """Show an approval in full: execution, step, arguments, rule, approvers, expiry."""
    remote.run(lambda client, out: operations.show_approval(client, out, approval_id))


def _decision(grant: bool) -> click.Command:
    verb = "grant" if grant else "deny"

    @click.command(verb)
    @click.argument("approval_id", metavar="ID")
    @click.option(
        "--by",
        "decided_by",
        default=None,
        help="Who decides (checked against approvers); default $USER, or with a scoped key"
        " (rbk_…) the key's own name.",
    )
    @click.option("--reason", "--rationale", "rationale", default="", help="Why, kept with it.")
    @remote_command
    def decide(remote: Remote, approval_id: str, decided_by: str | None, rationale: str) -> None:
        if decided_by is None:
            # A scoped key decides as its own name (§34.5): naming $USER could only be refused.
            scoped = remote.api_key.startswith(KEY_TOKEN_PREFIX)
            decided_by = "" if scoped else os.environ.get("USER", "")
            if not decided_by and not scoped:
                raise click.ClickException("--by is required when $USER is unset")
        remote.run(
            lambda client, out: operations.decide_approval(
                client, out, approval_id, grant=grant, decided_by=decided_by, rationale=rationale
            )
        )

    decide.help = f"{verb.capitalize()} a pending approval."
    return decide


approvals.add_command(_decision(grant=True))
approvals.add_command(_decision(grant=False))
