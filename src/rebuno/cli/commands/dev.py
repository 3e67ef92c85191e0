"""`rebuno dev`: a development kernel on SQLite with bearer auth off (§18.1).

Must not import anything under `rebuno.kernel` except through `rebuno.cli.launch`.
"""

from __future__ import annotations

import click


@click.command("dev")
@click.option("--config", "config_file", metavar="FILE", help="Provisioning manifest to load.")
@click.option("--listen-addr", metavar="ADDR", help="HTTP listen address (default 127.0.0.1:8080).")
@click.option("--db-url", metavar="URL", help="Database URL (default sqlite:///.rebuno/dev.db).")
@click.option("--log-level", metavar="LEVEL", help="debug, info, warn or error.")
@click.option("--log-format", metavar="FORMAT", help="text or json.")
def dev(**flags: object) -> None:
    """Run a development kernel: embedded SQLite, no bearer auth, HMAC still enforced."""
    from rebuno.cli.launch import launch  # the kernel: only for the commands that run it

    launch(dev=True, flags=flags)
