"""The REPL of `rebuno dev`, and `rebuno repl` attached to a running kernel, driven in a real
pseudo-terminal against a real kernel and real agents: it talks to the kernel over HTTP while
the kernel keeps serving."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pexpect
import pytest

from harness.polling import poll_until
from harness.ports import free_port
from harness.processes import wait_healthy
from tests.cli.conftest import GATED
from tests.cli.harness import CLI, Process, child_env, kernel_args, start_agent, write_manifest

PROMPT = "rebuno> "
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@dataclass
class Agents:
    """The agents, and the port and manifest every test's kernel uses."""

    port: int
    manifest: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    directory = tmp_path_factory.mktemp("repl-agents")
    setup = Agents(free_port(), directory / "rebuno.yaml")
    ports = {"greeter": free_port(), "gated": free_port()}
    # `absent` is registered but never started: every delivery to it fails, and is logged.
    write_manifest(setup.manifest, {**ports, "absent": free_port()}, {"gated": GATED})
    running: list[Process] = []
    try:
        for agent_id, port in ports.items():
            log = directory / f"{agent_id}.log"
            # They start before, and outlive, the kernel each test starts on that port.
            running.append(start_agent(agent_id, port, setup.url, log, REBUNO_CHECK_KERNEL="false"))
        yield setup
    finally:
        for agent in running:
            agent.stop()


@dataclass
class Session:
    shell: pexpect.spawn[str]
    url: str
    home: Path

    def run(self, command: str) -> str:
        """Types a command and returns what it printed before the next prompt."""
        self.shell.sendline(command)
        self.shell.expect_exact(PROMPT)
        return str(self.shell.before)

    def kernel_serving(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v0/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def exit_status(self) -> int | None:
        self.shell.expect(pexpect.EOF)
        self.shell.close()
        status: int | None = self.shell.exitstatus
        return status


@pytest.fixture
def session(agents: Agents, tmp_path: Path) -> Iterator[Session]:
    args = kernel_args(agents.port, tmp_path / "kernel.db", agents.manifest, "--log-level", "warn")
    env = child_env({"HOME": str(tmp_path), "NO_COLOR": "1", "TERM": "xterm"})
    shell = pexpect.spawn(
        args[0], args[1:], env=env, encoding="utf-8", timeout=20, dimensions=(50, 200)
    )
    try:
        shell.expect_exact(PROMPT)
        yield Session(shell, agents.url, tmp_path)
    finally:
        if shell.isalive():
            shell.terminate(force=True)


def test_repl_creates_an_execution_and_watches_it_finish(session: Session) -> None:
    assert "greeter" in session.run("agents")
    created = session.run('exec create greeter {"name": "ada"}')
    execution_id = created.split("created ", 1)[1].split()[0]

    watched = session.run(f"exec watch {execution_id[:20]}")
    session.shell.sendline("quit")

    assert "execution.completed" in watched
    assert "status: completed" in watched
    assert 'output: {"greeting": "HELLO ADA"}' in watched
    assert session.exit_status() == 0
    assert not session.kernel_serving()
    history = (session.home / ".rebuno_repl_history").read_text()
    assert f"exec watch {execution_id[:20]}" in history


def test_an_approval_granted_from_the_repl_lets_the_execution_finish(session: Session) -> None:
    created = session.run('exec create gated {"command": "ls"}')
    execution_id = created.split("created ", 1)[1].split()[0]
    approvals: list[dict[str, str]] = []

    def requested() -> bool:
        approvals[:] = httpx.get(f"{session.url}/v0/approvals", timeout=2).json()
        return bool(approvals)

    poll_until(requested, 20, "the approval request")
    listed = session.run("approvals")
    shown = session.run(f"approvals get {approvals[0]['id'][:24]}")
    granted = session.run(f"approval grant {approvals[0]['id'][:24]} --by alice")
    watched = session.run(f"exec watch {execution_id}")
    step = session.run(f"exec step {execution_id} {approvals[0]['step_id'][:12]}")

    assert "shell_exec" in listed and '{"command": "ls"}' in listed
    assert "rule: review-shell" in shown and '"command": "ls"' in shown
    assert "status: succeeded" in step and '"ran ls"' in step
    assert f"granted {approvals[0]['id']}" in granted
    assert 'output: {"ran": "ran ls"}' in watched


def test_ctrl_c_clears_the_line_and_the_kernel_keeps_serving(session: Session) -> None:
    session.shell.send("exec ls")
    session.shell.expect_exact("exec ls")
    session.shell.sendintr()
    session.shell.expect_exact(PROMPT)

    assert session.kernel_serving()
    assert "no executions" in session.run("exec")
    session.shell.sendintr()
    assert session.exit_status() == 0
    assert not session.kernel_serving()


def test_ctrl_c_interrupts_a_watch_that_would_wait_forever(session: Session) -> None:
    created = session.run('exec create gated {"command": "pwd"}')
    execution_id = created.split("created ", 1)[1].split()[0]
    session.shell.sendline(f"exec watch {execution_id}")
    session.shell.expect_exact("execution.blocked")

    session.shell.sendintr()
    session.shell.expect_exact("interrupted")
    session.shell.expect_exact(PROMPT)

    assert session.kernel_serving()
    assert "blocked" in session.run(f"exec get {execution_id}")


def test_ctrl_c_reaches_a_shell_whose_parent_ignored_it(agents: Agents, tmp_path: Path) -> None:
    """A parent that ignores SIGINT passes that on; the shell answers Ctrl-C all the same."""
    args = kernel_args(agents.port, tmp_path / "kernel.db", agents.manifest, "--log-level", "warn")
    ignoring = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        " os.execv(sys.argv[1], sys.argv[1:])"
    )
    env = child_env({"HOME": str(tmp_path), "NO_COLOR": "1", "TERM": "xterm"})
    shell = pexpect.spawn(
        sys.executable,
        ["-c", ignoring, *args],
        env=env,
        encoding="utf-8",
        timeout=20,
        dimensions=(50, 200),
    )
    try:
        shell.expect_exact(PROMPT)
        session = Session(shell, agents.url, tmp_path)
        created = session.run('exec create gated {"command": "pwd"}')
        execution_id = created.split("created ", 1)[1].split()[0]
        shell.sendline(f"exec watch {execution_id}")
        shell.expect_exact("execution.blocked")
        shell.sendintr()
        shell.expect_exact("interrupted")
    finally:
        if shell.isalive():
            shell.terminate(force=True)


def test_ctrl_d_stops_the_kernel(session: Session) -> None:
    session.shell.sendeof()

    assert session.exit_status() == 0
    assert not session.kernel_serving()


def test_mistakes_are_reported_and_the_shell_goes_on(session: Session) -> None:
    assert "error: no execution id starts with 'nope'" in session.run("exec get nope")
    assert "error: unknown command 'frobnicate'" in session.run("frobnicate")
    assert "error: the input is not valid JSON" in session.run("exec create greeter {bad")
    assert "error: usage: agent get <id>" in session.run("agent get")
    assert "(not_found)" in session.run("agent get ghost")
    assert "exec watch <id>" in session.run("help")

    session.shell.sendline("exit")
    assert session.exit_status() == 0


def test_a_kernel_started_without_a_terminal_opens_no_repl(tmp_path: Path) -> None:
    # Standard input is not a terminal here: the kernel just serves, as under a supervisor.
    port = free_port()
    args = kernel_args(port, tmp_path / "kernel.db", None)
    kernel = Process(args, tmp_path / "kernel.log", child_env({"HOME": str(tmp_path)}))
    try:
        poll_until(lambda: "listening on" in kernel.output(), 20, "the kernel to listen")
        health = httpx.get(f"http://127.0.0.1:{port}/v0/health", timeout=2)
    finally:
        kernel.stop()

    assert health.status_code == 200
    assert PROMPT not in kernel.output()


def test_a_kernel_log_line_is_printed_above_the_prompt_and_the_typed_text_kept(
    session: Session,
) -> None:
    session.shell.send("exec l")
    session.shell.expect_exact("exec l")

    # A delivery to an agent that is not running fails, and the kernel logs it meanwhile.
    httpx.post(f"{session.url}/v0/executions", json={"agent_id": "absent"}, timeout=5)
    session.shell.expect_exact("delivery failed")
    session.shell.expect_exact("\n")
    session.shell.expect_exact(PROMPT + "exec l")
    listed = session.run("s")

    assert "absent" in listed
    session.shell.sendline("quit")
    assert session.exit_status() == 0


@pytest.fixture
def attached(agents: Agents, tmp_path: Path) -> Iterator[tuple[Session, Process]]:
    """`rebuno repl --url` in a terminal, on a kernel that serves without one."""
    args = kernel_args(agents.port, tmp_path / "kernel.db", agents.manifest)
    kernel = Process(args, tmp_path / "kernel.log", child_env({"HOME": str(tmp_path)}))
    env = child_env({"HOME": str(tmp_path), "NO_COLOR": "1", "TERM": "xterm"})
    try:
        wait_healthy(agents.url, kernel)
        shell = pexpect.spawn(
            CLI[0],
            [*CLI[1:], "repl", "--url", agents.url],
            env=env,
            encoding="utf-8",
            timeout=20,
            dimensions=(50, 200),
        )
        try:
            shell.expect_exact(PROMPT)
            yield Session(shell, agents.url, tmp_path), kernel
        finally:
            if shell.isalive():
                shell.terminate(force=True)
    finally:
        kernel.stop()


def test_repl_attaches_to_a_running_kernel_and_quitting_leaves_it_serving(
    attached: tuple[Session, Process],
) -> None:
    session, _ = attached
    created = session.run('exec create greeter {"name": "ida"}')
    execution_id = created.split("created ", 1)[1].split()[0]

    watched = session.run(f"exec watch {execution_id}")
    helped = session.run("help")
    session.shell.sendline("quit")

    assert 'output: {"greeting": "HELLO IDA"}' in watched
    assert "quit, exit                           leave the shell" in helped
    assert session.exit_status() == 0
    assert session.kernel_serving()


def test_repl_on_a_kernel_that_is_not_there_is_one_error_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = child_env({"HOME": str(tmp_path), "NO_COLOR": "1", "TERM": "xterm"})

    shell = pexpect.spawn(CLI[0], [*CLI[1:], "repl", "--url", url], env=env, encoding="utf-8")
    shell.expect(pexpect.EOF, timeout=20)
    shell.close()

    assert str(shell.before).startswith(f"error: cannot reach the kernel at {url}: ")
    assert len(str(shell.before).strip().splitlines()) == 1
    assert shell.exitstatus == 1
