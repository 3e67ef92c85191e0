"""The processes a benchmark run needs, on loopback: a kernel (`rebuno dev` on an SQLite file or
`rebuno server` on a fresh PostgreSQL database) and the benchmark agent.

Each runs in its own session, so a SIGKILL takes it down exactly like a crash. Imports only
the standard library, httpx, psycopg and `harness.ports` (for `free_port`, whose ports no
outgoing connection can take); never the kernel or the SDK.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from harness.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-secret"
TOKEN = "bench-token"
AGENT_ID = "bench"
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def poll(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Process:
    """A child process in its own session; its output goes to a log file."""

    def __init__(self, args: list[str], log: Path, env: Mapping[str, str]) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_port(self, port: int, timeout: float = 30) -> None:
        """Returns once something accepts connections on loopback `port`; fails if this
        process exits first."""

        def listening() -> bool:
            if not self.alive():
                raise RuntimeError(f"{self.log.name}: exited early:\n{self.output()}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        poll(listening, timeout, f"a server on port {port}", interval=0.02)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush."""
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


@dataclass(frozen=True, slots=True)
class Store:
    """Where a kernel keeps its log: `name` is `sqlite` or `postgres`; `url` its database URL."""

    name: str
    url: str


class Kernel(Process):
    """A kernel on `store`, on a free loopback port, with the bench agent provisioned."""

    def __init__(
        self,
        store: Store,
        workdir: Path,
        agent_port: int,
        env: Mapping[str, str],
        policy: str | None = None,
    ) -> None:
        """`policy`: the agent's policy bundle, if it has one."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        manifest = workdir / "rebuno.yaml"
        entry = (
            f"agents:\n  - id: {AGENT_ID}\n"
            f"    webhook_url: http://127.0.0.1:{agent_port}/webhook\n"
            f"    secret: {SECRET}\n"
        )
        if policy is not None:
            (workdir / "policy.yaml").write_text(policy)
            entry += "    policy_file: policy.yaml\n"
        manifest.write_text(entry)
        mode = ["dev"] if store.name == "sqlite" else ["server", "--bearer-token", TOKEN]
        if store.name != "sqlite":
            # The bench agent's webhook is on loopback, which a server refuses unless allowed.
            env = {**env, "REBUNO_WEBHOOK_ALLOW": "127.0.0.0/8"}
        args = [sys.executable, "-m", "rebuno.cli.main", *mode, "--db-url", store.url]
        args += ["--listen-addr", f"127.0.0.1:{self.port}", "--config", str(manifest)]
        args += ["--log-level", "warn"]
        super().__init__(args, workdir / "kernel.log", env)
        poll(self._healthy, 30, f"the kernel on {self.url}", interval=0.05)

    def _healthy(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"the kernel exited early:\n{self.output()}")
        try:
            return httpx.get(f"{self.url}/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """What the benchmark agent passes to `Agent`: `durability` (`""` leaves the SDK's
    default) and `instance` (`""`: none)."""

    durability: str = ""
    instance: str = ""


DEFAULT_OPTIONS = AgentOptions()


class AgentProcess(Process):
    """The benchmark agent (`python -m bench.agent`) serving its webhook on `port`."""

    def __init__(
        self,
        kernel_url: str,
        port: int,
        marks: Path,
        log: Path,
        options: AgentOptions,
        crash_at: int = 0,
    ) -> None:
        env = {
            "REBUNO_URL": kernel_url,
            "REBUNO_AGENT_SECRET": SECRET,
            "BENCH_AGENT_ID": AGENT_ID,
            "BENCH_PORT": str(port),
            "BENCH_MARKS": str(marks),
            "BENCH_CRASH_AT": str(crash_at),
            "BENCH_DURABILITY": options.durability,
            "BENCH_INSTANCE": options.instance,
        }
        super().__init__([sys.executable, "-m", "bench.agent"], log, env)
        self.port = port

    def wait_listening(self, timeout: float = 30) -> None:
        self.wait_for_port(self.port, timeout)


@contextlib.contextmanager
def fresh_store(name: str, workdir: Path) -> Iterator[Store]:
    """An empty database: a new SQLite file, or a new database on the local PostgreSQL that is
    dropped afterwards."""
    if name == "sqlite":
        yield Store("sqlite", f"sqlite:///{workdir / 'kernel.db'}")
        return
    database = f"rebuno_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        yield Store("postgres", _with_database(PG_ADMIN_URL, database))
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _with_database(url: str, database: str) -> str:
    base, _, query = url.partition("?")
    base = base.rsplit("/", 1)[0]
    return f"{base}/{database}" + (f"?{query}" if query else "")
