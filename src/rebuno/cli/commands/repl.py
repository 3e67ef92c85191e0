"""`rebuno repl`: the interactive shell, attached to a kernel that is already running.

Must not import anything under `rebuno.kernel`: it talks to a kernel over HTTP.
"""

from __future__ import annotations

import click

from rebuno.cli import repl as shell
from rebuno.cli.admin import InputError
from rebuno.cli.operations import error_message
from rebuno.cli.remote import DEFAULT_URL
from rebuno.sdk.errors import RebunoError


@click.command("repl")
@click.option(
    "--url",
    envvar="REBUNO_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The kernel's URL (env REBUNO_URL).",
)
@click.option(
    "--api-key",
    envvar="REBUNO_API_KEY",
    default="",
    help="Bearer token of a server-mode kernel (env REBUNO_API_KEY).",
)
def repl(url: str, api_key: str) -> None:
    """Open the interactive shell on a running kernel; quit leaves the kernel running."""
    try:
        shell.start(url, api_key=api_key, attached=True)
    except (RebunoError, InputError) as exc:
        raise click.ClickException(error_message(exc, url)) from None
