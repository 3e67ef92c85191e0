"""`rebuno exec ls|create|fork|get|watch|events|steps|step|cancel|stream`: executions, one
command at a time.

Must not import anything under `rebuno.kernel`: it talks to a kernel over HTTP.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import click

from rebuno.cli import operations, steps
from rebuno.cli.aliases import Aliased
from rebuno.cli.remote import Remote, remote_command
from rebuno.protocol.enums import ExecutionStatus

ID = click.argument("execution_id", metavar="ID")


@click.group("exec", cls=Aliased)
def executions() -> None:
    """Create, inspect, follow and cancel executions. IDs may be a unique prefix."""


@executions.command("ls")
@click.option("--agent", "agent_id", default="", help="Only this agent's executions.")
@click.option("--status", type=click.Choice([s.value for s in ExecutionStatus]), help="Filter.")
@click.option("--session", default="", help="Only this session's executions.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 200))
@remote_command
def ls(remote: Remote, agent_id: str, status: str | None, session: str, limit: int) -> None:
    """List the newest executions."""
    remote.run(
        lambda client, out: operations.list_executions(
            client, out, agent_id=agent_id, status=status or "", session=session, limit=limit
        )
    )


@executions.command("create")
@click.argument("agent_id", metavar="AGENT")
@click.argument("input_text", metavar="[JSON]", default="{}")
@click.option("--session", default="", help="A turn of this conversation (one runs at a time).")
@click.option("--parent", default="", help="The completed execution this one continues.")
@click.option("--idempotency-key", default="", help="Repeat creates under it make one execution.")
@click.option("--on-behalf-of", default="", help="The end user this execution is for.")
@remote_command
def create(
    remote: Remote,
    agent_id: str,
    input_text: str,
    session: str,
    parent: str,
    idempotency_key: str,
    on_behalf_of: str,
) -> None:
    """Start an execution of AGENT; JSON is its input (default {}, `-` reads stdin)."""
    value = _parse_input(sys.stdin.read() if input_text == "-" else input_text)
    remote.run(
        lambda client, out: operations.create_execution(
            client,
            out,
            agent_id,
            value,
            session=session,
            parent=parent,
            idempotency_key=idempotency_key,
            on_behalf_of=on_behalf_of,
        )
    )


@executions.command("fork")
@ID
@click.option("--at", "at_seq", required=True, type=click.IntRange(min=1), help="Event seq.")
@click.option("--session", default="", help="A new session for the fork.")
@click.option(
    "--policy",
    type=click.File("r"),
    help="A policy bundle (YAML) deciding the fork's live steps instead of the source's.",
)
@remote_command
def fork(
    remote: Remote, execution_id: str, at_seq: int, session: str, policy: TextIO | None
) -> None:
    """Rerun an execution: what it recorded up to event AT replays, the rest runs live."""
    bundle = policy.read() if policy is not None else ""
    remote.run(
        lambda client, out: operations.fork_execution(
            client, out, execution_id, at_seq, session, bundle
        )
    )


def _parse_input(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"the input is not valid JSON: {exc}") from None


@executions.command("get")
@ID
@remote_command
def get(remote: Remote, execution_id: str) -> None:
    """Show an execution: status, output, failure."""
    remote.run(lambda client, out: operations.show_execution(client, out, execution_id))


@executions.command("watch")
@ID
@click.option(
    "--interval", default=operations.WATCH_INTERVAL, show_default=True, help="Poll seconds."
)
@remote_command
def watch(remote: Remote, execution_id: str, interval: float) -> None:
    """Print events as they happen until the execution ends (JSON: one event per line).
    Exits 0 when it completed, 1 when it failed or was cancelled."""
    ended: list[str] = []

    async def follow(client: Any, out: Any) -> None:
        execution = await operations.watch_execution(client, out, execution_id, interval=interval)
        ended.append(execution.status.value)

    remote.run(follow)
    if ended and ended[0] != ExecutionStatus.COMPLETED.value:
        raise click.exceptions.Exit(1)


@executions.command("events")
@ID
@remote_command
def events(remote: Remote, execution_id: str) -> None:
    """Print the whole event log with payloads."""
    remote.run(lambda client, out: operations.show_events(client, out, execution_id))


@executions.command("steps")
@ID
@remote_command
def list_steps(remote: Remote, execution_id: str) -> None:
    """List the steps in proposal order, with one-line arguments and outcomes."""
    remote.run(lambda client, out: steps.list_steps(client, out, execution_id))


@executions.command("step")
@ID
@click.argument("step_id", metavar="STEP")
@remote_command
def show_step(remote: Remote, execution_id: str, step_id: str) -> None:
    """Show one step in full: arguments, result, error. STEP may be a unique prefix."""
    remote.run(lambda client, out: steps.show_step(client, out, execution_id, step_id))


@executions.command("cancel")
@ID
@remote_command
def cancel(remote: Remote, execution_id: str) -> None:
    """Cancel an execution."""
    remote.run(lambda client, out: operations.cancel_execution(client, out, execution_id))


@executions.command("stream")
@ID
@remote_command
def stream(remote: Remote, execution_id: str) -> None:
    """Print live output deltas until the execution ends (JSON: one delta per line)."""
    remote.run(lambda client, out: operations.stream_execution(client, out, execution_id))
