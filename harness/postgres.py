"""A private PostgreSQL cluster: initdb into a temporary directory, on a port of its own, with
trust auth on loopback. Never the shared server other tests use, so it can be stopped and
restarted under running kernels.

Needs PostgreSQL's server tools (`initdb`, `pg_ctl`); `pg_bindir` says whether they are here.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from harness.ports import free_port

OWNER = "postgres"
"""initdb refuses to run as root; the cluster belongs to this OS user when we are root."""


class Cluster:
    """A PostgreSQL cluster of its own in `root`, on loopback `port`, trust auth."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self._bindir = bindir
        self._data = root / "data"
        self._root = root
        self.port = port

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self._run("initdb", "-D", str(self._data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self) -> None:
        self._pg_ctl("-m", "fast", "restart")

    def _pg_ctl(self, *command: str) -> None:
        options = f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self._root / "server.log")
        self._run("pg_ctl", "-D", str(self._data), "-l", log, "-o", options, "-w", *command)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "stop")

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self._bindir / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", OWNER, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)


def pg_bindir() -> Path | None:
    """Where `initdb` and `pg_ctl` are, or None when PostgreSQL's server tools are missing."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


@contextlib.contextmanager
def private_cluster(bindir: Path, prefix: str = "rebuno-pg-") -> Iterator[Cluster]:
    """A cluster of its own in a new temporary directory, started, on a free port; stopped
    (immediately) and removed afterwards."""
    # Not under a test's or a scenario's directory: when we are root the cluster belongs to
    # another user, who must be able to reach it, and such a directory is private to root.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(root, OWNER, OWNER)
    cluster = Cluster(bindir, root, free_port())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # never started
            cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
