"""Real processes on loopback: kernels (`rebuno dev`, `rebuno server`) and any other child a
test, a chaos scenario or a benchmark starts (an agent, a worker).

Each child runs in its own session, so a SIGKILL takes down all it started, exactly like a
crash; every wait is bounded and polled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from harness.polling import poll_until
from harness.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""
# Short leases and quick retries, so a crash is recovered from in about a second; enough
# attempts that a restarted agent on a loaded machine is up before the retries run out.
FAST_RECOVERY = {
    "REBUNO_DISPATCH_LEASE_TIMEOUT": "1s",
    "REBUNO_DISPATCH_BACKOFF_BASE": "100ms",
    "REBUNO_DISPATCH_BACKOFF_MAX": "500ms",
    "REBUNO_DISPATCH_MAX_ATTEMPTS": "40",
}


class Process:
    """A child process whose output goes to a log file kept for failure messages; its
    environment is this process's with `env` on top (see `environment`)."""

    def __init__(
        self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.log = log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=self.environment(env),
            start_new_session=True,
        )

    @staticmethod
    def environment(env: Mapping[str, str] | None) -> dict[str, str]:
        """The child's whole environment; a subclass that must not inherit settings from
        this process's environment overrides it."""
        return {**os.environ, **(env or {})}

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
            wait_healthy(self.url, self)
        except BaseException:
            self.kill()  # never left running behind a failed start
            raise

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


def wait_healthy(url: str, process: Process | None = None, timeout: float = 20) -> None:
    """Returns once the kernel at `url` answers `GET /v0/health`; fails at once when
    `process`, the kernel's, exits first."""

    def healthy() -> bool:
        if process is not None and process.proc.poll() is not None:
            raise AssertionError(f"the kernel exited early:\n{process.output()}")
        try:
            return httpx.get(f"{url}/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    poll_until(healthy, timeout, f"the kernel on {url}")
