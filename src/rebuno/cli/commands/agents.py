"""`rebuno agents ls|get|add|rm`: agent administration (§5.3), one command at a time.

Must not import anything under `rebuno.kernel`: it talks to a kernel over HTTP (reading a
manifest goes through `rebuno.cli.admin`).
"""

from __future__ import annotations

import click

from rebuno.cli import operations
from rebuno.cli.aliases import Aliased
from rebuno.cli.remote import Remote, remote_command


@click.group("agents", cls=Aliased)
def agents() -> None:
    """List, show, register and delete agents."""


@agents.command("ls")
@remote_command
def ls(remote: Remote) -> None:
    """List agents: id, webhook and policy size."""
    remote.run(operations.list_agents)


@agents.command("get")
@click.argument("agent_id", metavar="ID")
@remote_command
def get(remote: Remote, agent_id: str) -> None:
    """Show an agent and its policy bundle."""
    remote.run(lambda client, out: operations.show_agent(client, out, agent_id))


@agents.command("add")
@click.argument("manifest", type=click.Path(dir_okay=False))
@remote_command
def add(remote: Remote, manifest: str) -> None:
    """Register (upsert) every agent of a provisioning manifest."""
    remote.run(lambda client, out: operations.add_agents(client, out, manifest))


@agents.command("rm")
@click.argument("agent_id", metavar="ID")
@remote_command
def rm(remote: Remote, agent_id: str) -> None:
    """Delete an agent (refused while executions still reference it)."""
    remote.run(lambda client, out: operations.remove_agent(client, out, agent_id))
