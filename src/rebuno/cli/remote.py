"""What the one-shot commands share: the `--url`, `--api-key` and `--json` options, one client
per run, and every failure as one `error: <message>` line with exit code 1.

Imports the SDK and the CLI's own modules; nothing of the kernel.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click

from rebuno.cli.admin import AdminClient, InputError
from rebuno.cli.operations import error_message
from rebuno.cli.render import Output
from rebuno.sdk.errors import RebunoError

DEFAULT_URL = "http://127.0.0.1:8080"
INTERRUPTED = 130

Operation = Callable[[AdminClient, Output], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Remote:
    """The kernel a command talks to, and how it prints."""

    url: str
    api_key: str
    json: bool

    def run(self, operation: Operation) -> None:
        """Runs `operation` with a fresh client; SDK and input errors become `error:` lines."""
        try:
            asyncio.run(self._call(operation))
        except (RebunoError, InputError) as exc:
            raise click.ClickException(error_message(exc, self.url)) from None
        except KeyboardInterrupt:
            raise click.exceptions.Exit(INTERRUPTED) from None

    async def _call(self, operation: Operation) -> None:
        async with AdminClient(self.url, self.api_key) as client:
            await operation(client, Output.to(json=self.json))


def remote_command(function: Callable[..., None]) -> Callable[..., None]:
    """Adds `--url`, `--api-key` and `--json` to a command, passed to it as `remote`."""

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
        help="Bearer token: a server's bootstrap token or a scoped key rbk_… (env REBUNO_API_KEY).",
    )
    @click.option("--json", "json_output", is_flag=True, help="Print JSON instead of text.")
    @functools.wraps(function)
    def wrapper(url: str, api_key: str, json_output: bool, **kwargs: Any) -> None:
        function(Remote(url, api_key, json_output), **kwargs)

    return wrapper
