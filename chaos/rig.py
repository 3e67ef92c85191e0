"""What the scenarios share: a kernel (`rebuno dev` in its own process, or served in this process
on a store or clock a scenario wraps), the program agent of `chaos/agent.py` in processes that a
scenario kills, the ledger those processes write, a stub model on loopback, and the checks of an
execution's event log.

Builds on the harness's processes and fake provider and the benchmark's percentiles; imports the
kernel only to serve it in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from bench.processes import fresh_store
from bench.stats import percentile
from harness.llm_provider import FakeProvider
from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import FAST_RECOVERY, ROOT, Kernel, Server
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve
from rebuno.kernel.store.base import Store
from rebuno.kernel.store.sqlite import SqliteStore

AGENT_ID, SECRET = "chaos", "chaos-secret"
AGENT_SCRIPT = ROOT / "chaos" / "agent.py"
CRASH_POINTS = ("before", "body", "after", "report")
"""Where the program agent's crash points kill it (chaos/agent.py)."""
TERMINAL = frozenset({"completed", "failed", "cancelled"})
STEP_TERMINAL_EVENTS = frozenset({"step.succeeded", "step.failed", "step.denied", "step.cancelled"})
ONCE_PER_STEP = frozenset(
    {"step.proposed", "step.allowed", "step.executing", "step.awaiting_approval"}
)
ONCE_PER_EXECUTION = frozenset(
    {"execution.created", "execution.started", "execution.completed", "execution.failed"}
)


def ms(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile of `values` (seconds), in milliseconds; 0 for no values."""
    return round(percentile(values, q) * 1000, 1) if values else 0.0


def write_manifest(path: Path, webhook_url: str) -> Path:
    path.write_text(
        f"agents:\n  - id: {AGENT_ID}\n    webhook_url: {webhook_url}\n    secret: {SECRET}\n"
    )
    return path


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def dev_kernel(workdir: Path, webhook_url: str, env: Mapping[str, str] | None = None) -> Kernel:
    """`rebuno dev` on a fresh SQLite file with short leases and quick retries (`env` may
    change them)."""
    manifest = write_manifest(workdir / "rebuno.yaml", webhook_url)
    settings = {**FAST_RECOVERY, **(env or {})}
    return Kernel(workdir / "kernel.db", manifest, workdir / "kernel.log", settings)


@contextlib.contextmanager
def kernel_on(
    store: str, workdir: Path, webhook_url: str, env: Mapping[str, str] | None = None
) -> Iterator[Kernel]:
    """A kernel with short leases and quick retries on a fresh store: `rebuno dev` on SQLite,
    or `rebuno server` on a new PostgreSQL database dropped afterwards. Stopped afterwards."""
    if store == "sqlite":
        kernel = dev_kernel(workdir, webhook_url, env)
        try:
            yield kernel
        finally:
            kernel.stop()
        return
    manifest = write_manifest(workdir / "rebuno.yaml", webhook_url)
    with fresh_store("postgres", workdir) as database:
        server = Server(
            database.url,
            "chaos-token",
            workdir / "kernel.log",
            manifest=manifest,
            env={**FAST_RECOVERY, **(env or {})},
        )
        try:
            yield server
        finally:
            server.stop()


def fast_settings(workdir: Path, webhook_url: str) -> Settings:
    """The settings `FAST_RECOVERY` stands for, for a kernel served in this process."""
    return Settings(
        dev=True,
        listen_addr="127.0.0.1:0",
        db_url=f"sqlite:///{workdir / 'kernel.db'}",
        config_file=str(write_manifest(workdir / "rebuno.yaml", webhook_url)),
        log_level="error",
        dispatch_lease_timeout=timedelta(seconds=1),
        dispatch_poll_interval=timedelta(milliseconds=20),
        backoff_base=timedelta(milliseconds=100),
        backoff_max=timedelta(milliseconds=500),
        dispatch_max_attempts=40,
    )


class InProcessKernel:
    """The kernel's own server on a thread of this process, so a scenario can hand it a
    wrapped store or a shifted clock. Its logging is quieted: the faults a scenario injects
    are logged as internal errors by design."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._urls: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._failure: BaseException | None = None
        options: dict[str, Any] = {"store": store} if store is not None else {}
        if clock is not None:
            options["clock"] = clock
        main = serve(settings, stop=self._stop, on_ready=self._urls.append, **options)
        self._quiet = _Quiet()
        self._thread = threading.Thread(target=self._run, args=(main,), daemon=True)
        self._thread.start()
        poll_until(lambda: bool(self._urls) or not self._thread.is_alive(), 20, "the kernel")
        if not self._urls:
            raise RuntimeError(f"the in-process kernel did not start: {self._failure!r}")
        self.url = self._urls[0]

    def _run(self, main: Any) -> None:
        try:
            self._loop.run_until_complete(main)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._loop.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._quiet.restore()


class _Quiet:
    def __init__(self) -> None:
        self._logger = logging.getLogger("rebuno")
        self._level = self._logger.level
        self._logger.setLevel(logging.CRITICAL)

    def restore(self) -> None:
        self._logger.setLevel(self._level)


def sqlite_store(workdir: Path) -> SqliteStore:
    return SqliteStore(str(workdir / "kernel.db"))


@contextlib.contextmanager
def stub_model() -> Iterator[tuple[FakeProvider, str]]:
    """An OpenAI-compatible chat model on loopback (`FakeProvider`): each reply names the
    call's ordinal, so a second real call is told apart from a replay of the first."""
    fake = FakeProvider()
    port = free_port()
    # Quiet: a kill mid-request leaves the stub a body cut short, which it logs as an error.
    config = uvicorn.Config(fake, host="127.0.0.1", port=port, log_level="critical", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="stub-model", daemon=True)
    thread.start()
    poll_until(lambda: server.started, 10, "the stub model")
    try:
        yield fake, f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Ledger:
    """The lines the program agents wrote (chaos/agent.py), in the order they were written."""

    path: Path

    def __post_init__(self) -> None:
        self.path.touch()

    def lines(self) -> list[dict[str, Any]]:
        text = self.path.read_text()
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


class Zygote:
    """The program agent as a zygote (`ZYGOTE=1`, chaos/agent.py): a process with everything
    imported that forks a fresh agent process on request, so a restart after a kill costs
    milliseconds, not an interpreter's start on a loaded machine."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **env, "ZYGOTE": "1"},
            start_new_session=True,
            text=True,
        )
        self._lock = threading.Lock()
        self._started: list[int] = []
        self.exited: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            what, pid = line.split()
            with self._lock:
                (self._started.append if what == "started" else self.exited.add)(int(pid))

    def start(self, armed: bool, log: Path) -> ForkedAgent:
        assert self.proc.stdin is not None
        with self._lock:
            known = len(self._started)
        self.proc.stdin.write(f"start {int(armed)} {log}\n")
        self.proc.stdin.flush()
        poll_until(lambda: len(self._started) > known, 10, "a forked agent")
        with self._lock:
            return ForkedAgent(self, self._started[known])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the zygote kills the children left and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@dataclass(frozen=True, slots=True)
class ForkedAgent:
    zygote: Zygote
    pid: int

    def alive(self) -> bool:
        return self.pid not in self.zygote.exited

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited within 15 s."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                poll_until(lambda: not self.alive(), 15, f"agent {self.pid} to stop")
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)


@dataclass
class Programs:
    """Program agents on one loopback port (one running at a time), forked by one zygote and
    writing one ledger, and a client of the kernel they run against."""

    workdir: Path
    kernel_url: str
    port: int
    provider_url: str = ""
    jitter_ms: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    """What the kernel's client routes need (a bearer token on `rebuno server`)."""
    agents: list[ForkedAgent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.workdir / "ledger.jsonl")
        self.marks = self.workdir / "marks"
        self.marks.mkdir(exist_ok=True)
        self.http = httpx.Client(base_url=self.kernel_url, headers=self.headers, timeout=10)
        env = {
            "REBUNO_URL": self.kernel_url,
            "REBUNO_AGENT_SECRET": SECRET,
            "AGENT_ID": AGENT_ID,
            "PORT": str(self.port),
            "LEDGER": str(self.ledger.path),
            "MARKS": str(self.marks),
            "PROVIDER_URL": self.provider_url,
            "JITTER_MS": str(self.jitter_ms),
        }
        self.zygote = Zygote(env, self.workdir / "zygote.log")

    def start_agent(self, armed: bool = False) -> ForkedAgent:
        """A program agent, listening once this returns; with `armed`, its crash points fire."""
        log = self.workdir / f"agent-{len(self.agents) + 1}.log"
        agent = self.zygote.start(armed, log)
        self.agents.append(agent)
        poll_until(lambda: listening(self.port) or not agent.alive(), 30, "the agent")
        return agent

    def create(self, program: dict[str, Any]) -> str:
        response = self.http.post("/v0/executions", json={"agent_id": AGENT_ID, "input": program})
        response.raise_for_status()
        return str(response.json()["id"])

    def execution(self, execution_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v0/executions/{execution_id}")
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def steps(self, execution_id: str) -> list[dict[str, Any]]:
        response = self.http.get(f"/v0/executions/{execution_id}/steps")
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found

    def events(self, execution_id: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while True:
            after = events[-1]["event_seq"] if events else 0
            path = f"/v0/executions/{execution_id}/events?limit=1000&after_seq={after}"
            response = self.http.get(path)
            response.raise_for_status()
            page: list[dict[str, Any]] = response.json()
            events.extend(page)
            if len(page) < 1000:
                return events

    def unfinished(self, ids: Sequence[str]) -> list[str]:
        return [i for i in ids if self.execution(i)["status"] not in TERMINAL]

    def wait_finished(self, ids: Sequence[str], timeout: float) -> list[str]:
        """Waits until every execution ended or `timeout` passed; those still running."""
        deadline = time.monotonic() + timeout
        left = list(ids)
        while (left := self.unfinished(left)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.zygote.close()
        self.http.close()


@dataclass(frozen=True, slots=True)
class LogFaults:
    """What an execution's event log must never hold."""

    double_terminal: int = 0
    """Steps with more than one terminal event."""
    duplicates: int = 0
    """Events that repeat one that may appear once (per step, per dispatch attempt, per
    execution)."""
    gaps: int = 0
    """Executions whose `event_seq` is not 1, 2, 3, ... with no gap."""

    def __add__(self, other: LogFaults) -> LogFaults:
        return LogFaults(
            self.double_terminal + other.double_terminal,
            self.duplicates + other.duplicates,
            self.gaps + other.gaps,
        )


def log_faults(events: Sequence[dict[str, Any]]) -> LogFaults:
    terminal: Counter[str] = Counter()
    seen: Counter[tuple[Any, ...]] = Counter()
    for event in events:
        kind, payload = event["type"], event["payload"]
        if kind in STEP_TERMINAL_EVENTS:
            terminal[payload["step_id"]] += 1
        if kind in ONCE_PER_STEP or kind in STEP_TERMINAL_EVENTS:
            seen[(kind, payload["step_id"])] += 1
        elif kind.startswith("dispatch."):
            seen[(kind, payload["dispatch_id"], payload["attempt"])] += 1
        elif kind in ONCE_PER_EXECUTION:
            seen[(kind,)] += 1
    seqs = [event["event_seq"] for event in events]
    return LogFaults(
        double_terminal=sum(1 for n in terminal.values() if n > 1),
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        gaps=int(seqs != list(range(1, len(seqs) + 1))),
    )


@dataclass
class Bodies:
    """The step bodies the ledger shows: every run of each op, in order, and the effects of
    `at_most_once` tools."""

    runs: dict[tuple[str, int], list[str]] = field(default_factory=lambda: defaultdict(list))
    once: Counter[tuple[str, int]] = field(default_factory=Counter)

    @classmethod
    def of(cls, ledger: Ledger) -> Bodies:
        bodies = cls()
        for line in ledger.lines():
            if line["ph"] == "start":
                bodies.runs[(line["e"], line["op"])].append(line["run"])
            elif line["ph"] == "effect" and line["kind"] == "once":
                bodies.once[(line["e"], line["op"])] += 1
        return bodies

    @property
    def total(self) -> int:
        return sum(len(runs) for runs in self.runs.values())

    @property
    def once_duplicates(self) -> int:
        """`at_most_once` effects beyond the first, over every op."""
        return sum(n - 1 for n in self.once.values() if n > 1)

    @property
    def safe_reruns(self) -> int:
        """Body runs beyond the first of the ops without an `at_most_once` effect."""
        return sum(len(runs) - 1 for key, runs in self.runs.items() if key not in self.once)

    def judge_output(self, execution_id: str, results: Sequence[dict[str, Any]]) -> Verdict:
        """Checks an execution's `results` against the ledger: each result names its own op,
        and the body run whose result was recorded is the op's last (a run after it re-ran
        a completed step)."""
        misrouted = reruns = 0
        for index, outcome in enumerate(results):
            ran = self.runs.get((execution_id, index), [])
            if outcome.get("op") != index or ("run" in outcome and outcome["run"] not in ran):
                misrouted += 1
            elif "run" in outcome:
                reruns += len(ran) - 1 - ran.index(outcome["run"])
        return Verdict(misrouted, reruns)


@dataclass
class Verdict:
    misrouted: int = 0
    """Results returned to another call than their own, or from no body run at all."""
    reruns: int = 0
    """Body runs after the run whose result was recorded."""

    def __iadd__(self, other: Verdict) -> Verdict:
        self.misrouted += other.misrouted
        self.reruns += other.reruns
        return self
