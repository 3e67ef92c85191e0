"""A rig: one kernel on a fresh store and the benchmark agent, plus the marks file the agent
writes (webhook arrivals, step bodies, finished loops). Every scenario gets its own rig, so no
scenario sees another's history.

Imports only the bench's own process helpers and the standard library.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import (
    DEFAULT_OPTIONS,
    TOKEN,
    AgentOptions,
    AgentProcess,
    Kernel,
    Store,
    fresh_store,
)
from bench.sizes import Sizes
from harness.ports import free_port


@dataclass(slots=True)
class Rig:
    store: Store
    kernel: Kernel
    agent: AgentProcess
    workdir: Path
    agent_port: int
    marks: Path
    options: AgentOptions
    restarts: int = 0
    _read: int = field(default=0)

    @property
    def token(self) -> str:
        return TOKEN

    @property
    def database(self) -> str:
        """The PostgreSQL database name ('' on SQLite)."""
        return self.store.url.rsplit("/", 1)[-1] if self.store.name == "postgres" else ""

    def start_agent(self, crash_at: int = 0) -> AgentProcess:
        """A new agent process with the rig's options (the old one must be dead or stopped);
        not yet listening."""
        self.restarts += 1
        log = self.workdir / f"agent-{self.restarts}.log"
        self.agent = AgentProcess(
            self.kernel.url, self.agent_port, self.marks, log, self.options, crash_at
        )
        return self.agent

    def new_marks(self) -> list[dict[str, Any]]:
        """The marks written since the last call (a torn last line waits for the next call)."""
        with self.marks.open("rb") as marks:
            marks.seek(self._read)
            data = marks.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def logs(self) -> str:
        return f"kernel log:\n{self.kernel.output()}\nagent log:\n{self.agent.output()}"


@contextlib.contextmanager
def rig(
    store_name: str,
    workdir: Path,
    kernel_env: Mapping[str, str],
    sizes: Sizes,
    policy: str | None = None,
    options: AgentOptions = DEFAULT_OPTIONS,
) -> Iterator[Rig]:
    """A kernel on a fresh `store_name` store and a listening agent built with `options`
    (registered with `policy`, if any); both stopped afterwards. On PostgreSQL,
    `sizes.pg_workers` above 1 runs the kernel as that many worker processes;
    `sizes.step_records` 0 turns the kernel's `step-records` extension off."""
    workdir.mkdir(parents=True, exist_ok=True)
    marks = workdir / "marks.jsonl"
    marks.touch()
    port = free_port()
    with fresh_store(store_name, workdir) as store:
        if store_name == "postgres" and sizes.pg_workers > 1:
            kernel_env = {**kernel_env, "REBUNO_WORKERS": str(sizes.pg_workers)}
        if not sizes.step_records:
            kernel_env = {**kernel_env, "REBUNO_STEP_RECORDS": "false"}
        kernel = Kernel(store, workdir, port, kernel_env, policy)
        try:
            agent = AgentProcess(kernel.url, port, marks, workdir / "agent-0.log", options)
            current = Rig(store, kernel, agent, workdir, port, marks, options)
            try:
                agent.wait_listening()
                yield current
            finally:
                current.agent.stop()
        finally:
            kernel.stop()
