"""The `rebuno` console script: the command line when the kernel's extras are installed, one
line saying how to install them when they are not (a base install is the SDK alone).

Imports only the standard library until it knows the CLI can load.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXTRAS_MISSING = 2
KERNEL_EXTRAS = frozenset(
    {
        "click",
        "starlette",
        "psycopg",
        "psycopg_pool",
        "re2",
        "ruamel",
        "orjson",
        "uuid_utils",
        "prometheus_client",
    }
)
"""The top-level packages of the `kernel` extra, so only their absence reads as "not
installed" (any other import error is a bug, and stays one)."""


def main(argv: Sequence[str] | None = None) -> None:
    try:
        from rebuno.cli.main import main as run
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in KERNEL_EXTRAS:
            raise
        print(
            f"error: the rebuno command needs the kernel's extras ({missing} is not installed):"
            " pip install 'rebuno[kernel]'",
            file=sys.stderr,
        )
        sys.exit(EXTRAS_MISSING)
    run(argv)
