"""`rebuno server`: the production kernel (§18.1), configured by flags and `REBUNO_*`.

Must not import anything under `rebuno.kernel` except through `rebuno.cli.launch`.
"""

from __future__ import annotations

import click


@click.command("server")
@click.option("--db-url", metavar="URL", help="postgresql://… or sqlite:///PATH (required).")
@click.option("--bearer-token", metavar="TOKEN", help="Client and admin token (required).")
@click.option("--listen-addr", metavar="ADDR", help="HTTP listen address (default :8080).")
@click.option("--config", "config_file", metavar="FILE", help="Provisioning manifest to load.")
@click.option("--db-max-conns", metavar="N", help="Connection pool maximum.")
@click.option("--db-min-conns", metavar="N", help="Connection pool minimum.")
@click.option("--log-level", metavar="LEVEL", help="debug, info, warn or error.")
@click.option("--log-format", metavar="FORMAT", help="text or json.")
@click.option("--otel-endpoint", metavar="URL", help="OTLP gRPC endpoint; empty = no tracing.")
@click.option("--otel-sample-rate", metavar="RATE", help="Trace sample rate, 0 to 1.")
@click.option("--otel-insecure", metavar="BOOL", help="Plain-text OTLP connection.")
@click.option("--workers", metavar="N", help="Kernel processes on this port (PostgreSQL only).")
def server(**flags: object) -> None:
    """Run a production kernel replica."""
    from rebuno.cli.launch import launch  # the kernel: only for the commands that run it

    launch(dev=False, flags=flags)
