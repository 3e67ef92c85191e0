"""A real kernel (`rebuno dev`) with the test agents, shared by a module's tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.ports import free_port
from harness.processes import wait_healthy
from tests.cli.harness import Process, child_env, kernel_args, start_agent, write_manifest

GATED = """
rules:
  - id: review-shell
    when: {target: shell_exec}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], message: "run a shell command?"}
"""
AGENTS = ("greeter", "gated", "streamer")


@dataclass
class Stack:
    """A kernel and the agents of `tests/cli/agent.py`, on loopback ports."""

    url: str
    directory: Path
    kernel: Process
    agents: dict[str, Process] = field(default_factory=dict)

    def open_gate(self) -> None:
        """Lets the streamer's run finish (see `tests/cli/agent.py`)."""
        os.kill(self.agents["streamer"].proc.pid, signal.SIGUSR1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("cli")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ports = {agent_id: free_port() for agent_id in AGENTS}
    manifest = write_manifest(directory / "rebuno.yaml", ports, {"gated": GATED})
    args = kernel_args(port, directory / "kernel.db", manifest)
    kernel = Process(args, directory / "kernel.log", child_env())
    running = Stack(url, directory, kernel)
    try:
        wait_healthy(url, kernel)
        for agent_id, agent_port in ports.items():
            log = directory / f"{agent_id}.log"
            running.agents[agent_id] = start_agent(agent_id, agent_port, url, log)
        yield running
    finally:
        for agent in running.agents.values():
            agent.stop()
        kernel.stop()
