"""What the tests against the official SDK (the published `rebuno` package) need: a Python
with it installed, and the kernels they run on, one `rebuno dev` or two `rebuno server`
replicas.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import venv
from collections.abc import Callable
from pathlib import Path

from harness.processes import FAST_RECOVERY, ROOT, Kernel, Server

COMPAT_ROOT = Path(os.environ.get("REBUNO_COMPAT_DIR", ROOT / ".cache" / "compat"))


def dev_or_replicas(
    mode: str, directory: Path, manifest: Path, token: str, postgres_url: Callable[[], str]
) -> list[Kernel]:
    """The kernels of a test that runs on both: `dev`, one `rebuno dev` on SQLite; otherwise
    two `rebuno server` replicas on the database `postgres_url()` makes. Both recover fast."""
    if mode == "dev":
        log = directory / "kernel.log"
        return [Kernel(directory / "kernel.db", manifest, log, env=FAST_RECOVERY)]
    url = postgres_url()
    replicas: list[Kernel] = []
    try:
        for i in range(2):
            log = directory / f"replica-{i}.log"
            replicas.append(Server(url, token, log, manifest=manifest, env=FAST_RECOVERY))
    except BaseException:
        # A replica left running would keep claiming dispatches in the database, which the
        # next test of this worker gets emptied (tests/pgfixtures.py).
        for replica in replicas:
            replica.kill()
        raise
    return replicas


def official_sdk_python(version: str) -> Path:
    """The interpreter of a virtual environment holding the official SDK `rebuno==version`,
    created on first use (from the package registry) and reused afterwards."""
    home = COMPAT_ROOT / f"rebuno-{version}"
    python = home / "bin" / "python"
    marker = home / ".installed"
    if marker.exists():
        return python
    COMPAT_ROOT.mkdir(parents=True, exist_ok=True)
    # Test workers run side by side: the first to get here builds it, the others wait.
    with (COMPAT_ROOT / f"rebuno-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            venv.create(home, with_pip=True, clear=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", f"rebuno=={version}"],
                check=True,
                timeout=600,
            )
            marker.touch()
    return python
