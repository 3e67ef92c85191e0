"""Real processes for end-to-end tests: kernels (`rebuno dev`, `rebuno server`) and agents,
on loopback.

Processes are killed with SIGKILL to simulate crashes; every wait is bounded and polled.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import venv
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.support import free_port, poll_until

ROOT = Path(__file__).resolve().parents[2]
# Short leases and quick retries, so a crash is recovered from in about a second; enough
# attempts that a restarted agent on a loaded machine is up before the retries run out.
FAST_RECOVERY = {
    "REBUNO_DISPATCH_LEASE_TIMEOUT": "1s",
    "REBUNO_DISPATCH_BACKOFF_BASE": "100ms",
    "REBUNO_DISPATCH_BACKOFF_MAX": "500ms",
    "REBUNO_DISPATCH_MAX_ATTEMPTS": "40",
}
COMPAT_ROOT = Path(os.environ.get("REBUNO_COMPAT_DIR", ROOT / ".cache" / "compat"))


class Process:
    """A child process whose output goes to a log file kept for failure messages."""

    def __init__(self, args: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            args,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, exactly like a crash."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


class Kernel(Process):
    """`rebuno dev` on a given SQLite file and manifest, on a free loopback port."""

    headers: Mapping[str, str] = {}

    def __init__(
        self,
        db: Path,
        manifest: Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        options = ["--db-url", f"sqlite:///{db}", "--config", str(manifest)]
        self._start("dev", options, log, env, port)

    def _start(
        self,
        mode: str,
        options: list[str],
        log: Path,
        env: Mapping[str, str] | None,
        port: int | None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "rebuno.cli.main", mode]
        args += ["--listen-addr", f"127.0.0.1:{self.port}", *options]
        super().__init__(args, log, env)
        try:
            poll_until(self._healthy, 20, f"the kernel on {self.url}\n{self.output()}")
        except BaseException:
            self.kill()  # never left running behind a failed start
            raise

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"kernel exited early:\n{self.output()}")
        try:
            return httpx.get(f"{self.url}/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str) -> Any:
        """The JSON answer to `GET path`."""
        response = httpx.get(f"{self.url}{path}", headers=self.headers, timeout=5)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: object) -> Any:
        """The JSON answer to `POST path` with `body`, or None for an empty one."""
        response = httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=5)
        response.raise_for_status()
        return response.json() if response.content else None

    def wait_for_status(
        self, execution_id: str, statuses: set[str], timeout: float
    ) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.get(f"/v0/executions/{execution_id}"))
            return found.get("status") in statuses

        poll_until(reached, timeout, f"execution {execution_id} to reach {statuses}")
        return found

    def events(self, execution_id: str) -> list[dict[str, Any]]:
        """The whole event log of one execution (paged), in `event_seq` order."""
        events: list[dict[str, Any]] = []
        while True:
            path = f"/v0/executions/{execution_id}/events?limit=1000&after_seq="
            page = self.get(path + str(events[-1]["event_seq"] if events else 0))
            assert isinstance(page, list)
            events.extend(page)
            if len(page) < 1000:
                return events


class Server(Kernel):
    """`rebuno server` (bearer auth on) on a database URL, on a free loopback port. Replicas
    are several of these on one PostgreSQL database."""

    def __init__(
        self,
        db_url: str,
        token: str,
        log: Path,
        *,
        manifest: Path | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.headers = {"Authorization": f"Bearer {token}"}
        options = ["--db-url", db_url, "--bearer-token", token]
        if manifest is not None:
            options += ["--config", str(manifest)]
        # The test agents' webhooks are on loopback, which a server refuses unless allowed.
        env = {"REBUNO_WEBHOOK_ALLOW": "127.0.0.0/8", **(env or {})}
        self._start("server", options, log, env, port)

    def ready(self) -> int:
        """The status code of `GET /v0/ready`."""
        return httpx.get(f"{self.url}/v0/ready", timeout=5).status_code


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
