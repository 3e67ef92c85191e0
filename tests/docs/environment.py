"""The quick start's development environment, for the docs test and the examples' tests: a
`rebuno dev` kernel started from examples/rebuno.yaml, the example agents and the LLM stub, as
the README and the examples' docstrings start them, but on free loopback ports.

The documents are written for the default addresses (the kernel on 127.0.0.1:8080, the agents
on 5001-5003, the stub on 5010). `Environment.substitute` maps those to the ports in use here;
the environment runs in a scratch directory that mirrors the repository, with `examples/`
copied and substituted, so `examples/rebuno.yaml` there names the agents actually running.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.polling import poll_until
from harness.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(sys.executable)
KERNEL_PORT = 8080
STUB_PORT = 5010
TERMINAL = {"completed", "failed", "cancelled"}
# Each example agent: the agent id it serves, its default port and the settings its docstring
# gives it (the writer runs offline against the stub).
EXAMPLES = {
    "hello": ("hello_agent.py", 5001),
    "writer": ("openai_agent.py", 5002),
    "shell": ("shell_agent.py", 5003),
}
# The top-level entries of the repository a document's commands may refer to.
_MIRRORED = (".venv", "bench", "docs", "scripts", "src", "tests", "Makefile", "pyproject.toml")
_ADDRESS = re.compile(r"((?:127\.0\.0\.1|localhost):|\bport=)(\d+)\b")
_ENV_PREFIX = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Child:
    """A child process in its own session, its output kept in a log for failure messages."""

    def __init__(self, args: list[str], log: Path, cwd: Path, env: Mapping[str, str]) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)


@dataclass
class Environment:
    """A running development environment in `directory`; use `started()`."""

    directory: Path
    ports: dict[str, int]
    children: dict[str, Child]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['kernel']}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a document's commands run in: the kernel's URL, the venv's `bin`
        first on PATH, no colour, HOME inside the scratch directory (a command may write to
        `~`), and no REBUNO_* setting of the caller's."""
        base = {name: value for name, value in os.environ.items() if not name.startswith("REBUNO_")}
        path = f"{PYTHON.parent}{os.pathsep}{base.get('PATH', '')}"
        stub = f"http://127.0.0.1:{self.ports['stub']}/v1"
        return {
            **base,
            "PATH": path,
            "HOME": str(self.directory / "home"),
            "NO_COLOR": "1",
            "REBUNO_URL": self.url,
            "OPENAI_BASE_URL": stub,
            "OPENAI_API_KEY": "stub",
            "LLM_STUB_DELAY": "0.02",
            **(extra or {}),
        }

    def substitute(self, text: str) -> str:
        """`text` with the documents' default addresses replaced by the ones in use here."""
        defaults = {"kernel": KERNEL_PORT, "stub": STUB_PORT}
        defaults |= {agent: port for agent, (_, port) in EXAMPLES.items()}
        in_use = {str(default): str(self.ports[name]) for name, default in defaults.items()}

        def moved(match: re.Match[str]) -> str:
            return match[1] + in_use.get(match[2], match[2])

        # One pass over the whole numbers: replacing one address after another would rewrite
        # a port just put in whose digits begin with another default (50103 after 5010).
        return _ADDRESS.sub(moved, text)

    def already_running(self, command: str) -> bool:
        """Whether a shell command starts a part of this environment (the kernel the quick start
        runs, an example agent, the stub), which the docs test does not start twice."""
        command = _ENV_PREFIX.sub("", command.split(" #", 1)[0].strip())
        command = re.sub(r"^(?:\.venv/bin/)?(python3?|rebuno)\b", r"\1", command)
        return command in _RUNNING_COMMANDS

    def agent_started(self, agent_id: str) -> Child:
        """Starts the example agent `agent_id` (if it is not running) and waits for its port."""
        child = self.children.get(agent_id)
        if child is None or not child.alive():
            child = self._start_example(agent_id)
            self.children[agent_id] = child
        wait_listening(child, self.ports[agent_id], f"the example agent {agent_id}")
        return child

    def examples_started(self) -> None:
        """Starts every example agent that is not running (an agent block stopped it)."""
        for agent_id in EXAMPLES:
            self.agent_started(agent_id)

    def agent_stopped(self, agent_id: str) -> None:
        """Stops the example agent `agent_id`, so something else can serve its port."""
        child = self.children.pop(agent_id, None)
        if child is not None:
            child.stop()

    def run_execution(self, agent_id: str, payload: Any, timeout: float = 30) -> dict[str, Any]:
        """Creates an execution of `agent_id` and waits for it to end; its final state."""
        created = httpx.post(
            f"{self.url}/v0/executions", json={"agent_id": agent_id, "input": payload}, timeout=10
        )
        created.raise_for_status()
        path = f"{self.url}/v0/executions/{created.json()['id']}"
        state: dict[str, Any] = {}

        def ended() -> bool:
            state.update(httpx.get(path, timeout=10).json())
            return state.get("status") in TERMINAL

        poll_until(ended, timeout, f"the execution of {agent_id} to end")
        return state

    def stop(self) -> None:
        for child in reversed(self.children.values()):
            child.stop()

    def _start_example(self, agent_id: str) -> Child:
        script, _ = EXAMPLES[agent_id]
        # Started beside the kernel, not after it as the README's quick start does: the
        # agent's start-up check would find no kernel yet.
        env = self.env({"PORT": str(self.ports[agent_id]), "REBUNO_CHECK_KERNEL": "false"})
        log = self.directory / f".{agent_id}.log"
        return Child([str(PYTHON), f"examples/{script}"], log, self.directory, env)


# The quick start's kernel (`make dev`), as this module starts it.
KERNEL_COMMAND = [str(PYTHON), "-m", "rebuno.cli.main", "dev", "--config", "examples/rebuno.yaml"]
_RUNNING_COMMANDS = {
    "make dev",
    "rebuno dev --config examples/rebuno.yaml",
    "python examples/llm_stub.py",
    *(f"python examples/{script}" for script, _ in EXAMPLES.values()),
}


@contextlib.contextmanager
def started(directory: Path, *, kernel: bool = True) -> Iterator[Environment]:
    """Mirrors the repository into `directory`, starts the environment there, and stops it
    on leaving: `with started(tmp_path) as running: ...`. Without `kernel`, the caller
    starts the kernel (on `ports["kernel"]`, from `examples/rebuno.yaml`) itself."""
    ports = {name: free_port() for name in ("kernel", "stub", *EXAMPLES)}
    environment = Environment(directory, ports, {})
    _mirror(environment)
    try:
        _start(environment, kernel=kernel)
        yield environment
    finally:
        environment.stop()


def _mirror(environment: Environment) -> None:
    directory = environment.directory
    for name in _MIRRORED:
        if (ROOT / name).exists():
            (directory / name).symlink_to(ROOT / name)
    for source in sorted((ROOT / "examples").iterdir()):
        if source.is_file():
            target = directory / "examples" / source.name
            target.parent.mkdir(exist_ok=True)
            target.write_text(environment.substitute(source.read_text()))
    shutil.copy(ROOT / "README.md", directory / "README.md")
    (directory / "home").mkdir()


def _start(environment: Environment, *, kernel: bool) -> None:
    directory, env = environment.directory, environment.env()
    if kernel:
        command = [*KERNEL_COMMAND, "--listen-addr", f"127.0.0.1:{environment.ports['kernel']}"]
        environment.children["kernel"] = Child(command, directory / ".kernel.log", directory, env)
    stub_env = {**env, "PORT": str(environment.ports["stub"])}
    stub = [str(PYTHON), "examples/llm_stub.py"]
    environment.children["stub"] = Child(stub, directory / ".stub.log", directory, stub_env)
    for agent_id in EXAMPLES:
        environment.children[agent_id] = environment._start_example(agent_id)
    if kernel:
        wait_healthy(environment.children["kernel"], environment.url)
    wait_listening(environment.children["stub"], environment.ports["stub"], "the LLM stub")
    environment.examples_started()


def wait_healthy(kernel: Child, url: str) -> None:
    """Waits until the kernel `kernel` answers `GET /v0/health` on `url`."""

    def healthy() -> bool:
        if not kernel.alive():
            raise AssertionError(f"the kernel exited early:\n{kernel.output()}")
        try:
            return httpx.get(f"{url}/v0/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    poll_until(healthy, 30, f"the kernel on {url}")


def wait_listening(child: Child, port: int, what: str) -> None:
    def up() -> bool:
        if not child.alive():
            raise AssertionError(f"{what} exited early:\n{child.output()}")
        return listening(port)

    poll_until(up, 30, f"{what} on port {port}")
