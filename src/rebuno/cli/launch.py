"""Starting a kernel from a subcommand: settings, logging, then the server until it stops
(`rebuno dev` on a terminal runs it beside the REPL, see `rebuno.cli.console`).

Failures become one `error: <message>` line on stderr: exit code 2 for a usage problem (a bad
flag, a missing server requirement), 1 for a runtime one (a bad manifest, a port in use, a
database that cannot be opened). Must not import anything under `rebuno.kernel` other than
`config`, `server` and the error types they raise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import click

from rebuno.cli import console
from rebuno.cli.logs import configure_logging
from rebuno.kernel import server
from rebuno.kernel.config import load_settings
from rebuno.kernel.domain.errors import KernelError

USAGE_ERROR = 2
RUNTIME_ERROR = 1
INTERRUPTED = 130


def fail(message: str, code: int) -> click.exceptions.Exit:
    click.echo(f"error: {message}", err=True)
    return click.exceptions.Exit(code)


def launch(*, dev: bool, flags: Mapping[str, object]) -> None:
    try:
        settings = load_settings(dev=dev, flags=flags, env=os.environ)
    except KernelError as exc:
        raise fail(exc.message, USAGE_ERROR) from None
    configure_logging(settings.log_level, settings.log_format)
    try:
        if dev and console.interactive():
            console.run(settings)
        else:
            server.run(settings)
    except KernelError as exc:
        raise fail(exc.message, RUNTIME_ERROR) from None
    except OSError as exc:
        raise fail(_describe(exc), RUNTIME_ERROR) from None
    except KeyboardInterrupt:
        raise click.exceptions.Exit(INTERRUPTED) from None


def _describe(exc: OSError) -> str:
    if exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror or str(exc)
