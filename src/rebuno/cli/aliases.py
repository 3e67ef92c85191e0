"""Command groups that also answer to other spellings of their commands: the reference CLI's
(`agent` for `agents`, `approval` for `approvals`, `list` for `ls`, `delete` for `rm`)."""

from __future__ import annotations

import click

SPELLINGS = {
    "agent": "agents",
    "approval": "approvals",
    "keys": "key",
    "list": "ls",
    "delete": "rm",
}


class Aliased(click.Group):
    """A group whose commands also answer to the spellings of `SPELLINGS`."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, SPELLINGS.get(cmd_name, cmd_name))
