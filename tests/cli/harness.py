"""Real processes for the CLI tests: `rebuno dev` or `rebuno server` on loopback, the agents of
`tests/cli/agent.py`, and `rebuno ...` one-shot commands run to completion.

Every wait is bounded and polled; processes are stopped with SIGTERM, then SIGKILL
(`harness.processes`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import processes
from harness.polling import poll_until

AGENT_SCRIPT = Path(__file__).with_name("agent.py")
SECRET = "agent-s3cret-value"
CLI = [sys.executable, "-m", "rebuno.cli.main"]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without any REBUNO_* setting that could leak in."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("REBUNO_")}
    return {**env, **(extra or {})}


class Process(processes.Process):
    """A child with exactly the environment it is given (built with `child_env`), so that no
    REBUNO_* setting of the test's own environment reaches it."""

    @staticmethod
    def environment(env: Mapping[str, str] | None) -> dict[str, str]:
        return dict(env or {})


def write_manifest(path: Path, agents: Mapping[str, int], policies: Mapping[str, str]) -> Path:
    """A manifest registering each agent id on its loopback port, with optional policies."""
    lines = ["agents:"]
    for agent_id, port in agents.items():
        lines += [
            f"  - id: {agent_id}",
            f"    webhook_url: http://127.0.0.1:{port}/webhook",
            f"    secret: {SECRET}",
        ]
        if agent_id in policies:
            lines.append("    policy: |")
            lines += [f"      {line}" for line in policies[agent_id].strip().splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return path


def kernel_args(port: int, db: Path, manifest: Path | None, *flags: str) -> list[str]:
    args = [*CLI, "dev", "--listen-addr", f"127.0.0.1:{port}", "--db-url", f"sqlite:///{db}"]
    if manifest is not None:
        args += ["--config", str(manifest)]
    return [*args, *flags]


def start_agent(agent_id: str, port: int, kernel_url: str, log: Path, **env: str) -> Process:
    agent = Process(
        [sys.executable, str(AGENT_SCRIPT)],
        log,
        child_env(
            {
                "AGENT_ID": agent_id,
                "PORT": str(port),
                "REBUNO_URL": kernel_url,
                "REBUNO_AGENT_SECRET": SECRET,
                **env,
            }
        ),
    )

    def listening() -> bool:
        if agent.proc.poll() is not None:
            raise AssertionError(f"agent exited early:\n{agent.output()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    poll_until(listening, 20, f"agent {agent_id} on port {port}")
    return agent


def rebuno(
    *args: str, url: str, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs `rebuno ARGS --url URL` to completion; `env` adds to its environment."""
    return subprocess.run(
        [*CLI, *args, "--url", url],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(env),
        check=False,
    )


def rebuno_json(*args: str, url: str) -> Any:
    result = rebuno(*args, "--json", url=url)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
