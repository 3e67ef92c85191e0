"""The command table of `rebuno`, and `main`, the console entry point.

Every error leaves as one `error: <message>` line. Must not import anything under
`rebuno.kernel`; the commands reach the kernel through `rebuno.cli.launch`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import click

from rebuno.cli.aliases import Aliased
from rebuno.cli.commands.agents import agents
from rebuno.cli.commands.approvals import approvals
from rebuno.cli.commands.dev import dev
from rebuno.cli.commands.executions import executions
from rebuno.cli.commands.keys import key
from rebuno.cli.commands.policy import policy
from rebuno.cli.commands.repl import repl
from rebuno.cli.commands.server import server


def package_version() -> str:
    try:
        return version("rebuno")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


@click.group(cls=Aliased, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), "--version", "-V", prog_name="rebuno")
def rebuno() -> None:
    """Rebuno: a durable-execution kernel for AI agents."""


@rebuno.command("version")
def show_version() -> None:
    """Print the installed version."""
    click.echo(f"rebuno {package_version()}")


rebuno.add_command(dev)
rebuno.add_command(server)
rebuno.add_command(executions)
rebuno.add_command(agents)
rebuno.add_command(approvals)
rebuno.add_command(key)
rebuno.add_command(policy)
rebuno.add_command(repl)


def main(argv: Sequence[str] | None = None) -> None:
    """Runs `rebuno` and exits with its status."""
    try:
        outcome = rebuno.main(args=argv, prog_name="rebuno", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        # Bare `rebuno`: its help, as asked for, not an error.
        click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
        sys.exit(0)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(1)
    sys.exit(outcome if isinstance(outcome, int) else 0)


if __name__ == "__main__":
    main()
