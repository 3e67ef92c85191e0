"""Every fenced block of README.md and docs/*.md runs as written, or is checked as what it is.

Each document gets its own development environment (tests/docs/environment.py): a `rebuno dev`
kernel started from examples/rebuno.yaml in a scratch copy of the repository, the example
agents and the LLM stub, started as the quick start starts them, on free loopback ports. The
documents name the default addresses (the kernel on 127.0.0.1:8080, agents on 5001-5003, the
stub on 5010); every block is run with those replaced by the ports in use. Blocks run in the
order of the document, in the scratch directory, so files persist from block to block; shell
variables do not (each block is its own bash).

What a block's fence says:

* `sh`, `bash`, `shell`: run with `bash -euo pipefail` and must exit 0. A line that starts a
  part of the environment (`make dev`, `rebuno dev --config examples/rebuno.yaml`,
  `python examples/<agent>.py`, `python examples/llm_stub.py`) is not run again: it is
  already running.
* `console`, or a shell block whose first line is a `$ ` prompt: a transcript. Each command
  runs, and its output (stdout and stderr) must match the lines shown after it, where `…`
  stands for any text in a line and a line holding only `…` for any lines. A command must
  exit 0, unless its shown output starts with `error:`, when it must fail.
* `python`: run to completion (exit 0) in a subprocess, against the kernel.
* `json`: must parse (`{…}` and `[…]` stand for elided content); a block of one document per
  line is JSON lines.
* `yaml`: must load; unless it is saved as a file (below), which the commands using it check, a
  manifest (top-level `agents`) loads through the kernel's manifest loader,
  with every `${VAR}` set and an allow-all bundle standing in for a `policy_file` the document
  does not provide; a policy bundle (top-level `rules` or `default_action`) through the policy
  loader.
* anything else (`text`, `http`, `nginx`, `promql`, none): an illustration, not checked.

A block whose first line is a comment naming a file (`# shell.yaml`) is also saved under that
name in the scratch directory when it is reached, so later blocks can use it.

A comment on the line before a fence changes what happens to the block:

* `<!-- docs: covered by tests/path/test_file.py::test_name -->`: not run here (it needs
  PostgreSQL, installs packages, runs the whole suite, ...); the named test must exist, and it
  is the one that proves the block.
* `<!-- docs: agent AGENT_ID {"json": "input"} -->` on a python block that serves an agent
  (`Agent(...).run(...)` never returns): the block is started in place of the example agent
  that serves AGENT_ID (on its port), given one execution with that input, which must complete;
  then the block is stopped, and the example agent is started again before the next block that
  is not an agent's.
* `<!-- docs: fragment -->` on a python block that is not a whole program: compiled only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.ports import free_port
from tests.docs import environment as env_module
from tests.docs.blocks import (
    ROOT,
    Action,
    Block,
    blocks,
    defines_test,
    documents,
    is_transcript,
    output_pattern,
    transcript,
)
from tests.docs.environment import Environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RUNS = {Action.SHELL, Action.PYTHON, Action.AGENT}
# Generous: on a loaded machine one `rebuno` command can take seconds to start.
BLOCK_TIMEOUT = 120.0
BASH = shutil.which("bash") or "/bin/bash"


@pytest.mark.parametrize("document", documents())
def test_document_runs_as_written(document: str, tmp_path: Path) -> None:
    found = blocks(document)
    if not any(block.action in RUNS for block in found):
        for block in found:
            _check(block, tmp_path, None)
        return
    failures: list[str] = []
    with env_module.started(tmp_path) as running:
        for block in found:
            try:
                _check(block, tmp_path, running)
            except Exception as exc:  # every block's failure is reported, not only the first
                failures.append(f"{block.where} ({block.language or 'no language'}): {exc!r}")
    assert not failures, "\n\n".join(failures)


def test_covered_blocks_name_existing_tests() -> None:
    missing = [
        f"{block.where}: {file}::{test}"
        for document in documents()
        for block in blocks(document)
        if block.action is Action.COVERED
        for file, test in [block.covered_by]
        if not defines_test(file, test)
    ]
    assert not missing, "these blocks name tests that do not exist:\n" + "\n".join(missing)


def test_make_targets_run_the_scripts() -> None:
    """`make dev`, `make test`, `make check` and `make bench` do what the README says: the
    scripts the developers and CI run, and, for `dev`, the very kernel this test starts."""
    recipes = {
        target: subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split("\n")
        for target in ("dev", "test", "check", "bench")
    }
    assert ".venv/bin/rebuno dev --config examples/rebuno.yaml" in recipes["dev"]
    for target in ("test", "check", "bench"):
        assert f"scripts/{target}" in recipes[target]
        assert (ROOT / "scripts" / target).stat().st_mode & 0o111


def test_the_readme_and_the_cli_guide_name_every_command() -> None:
    from rebuno.cli.main import rebuno

    readme = (ROOT / "README.md").read_text()
    [row] = [line for line in readme.split("\n") if line.startswith("| CLI |")]
    guide = (ROOT / "docs" / "cli.md").read_text()
    for name in rebuno.commands:
        assert f"`{name}`" in row or f"`rebuno {name}" in row, f"the README's CLI row: {name}"
        assert f"| `rebuno {name}" in guide, f"docs/cli.md's command table: {name}"


def test_server_runs_on_an_sqlite_file(tmp_path: Path) -> None:
    """docs/deployment.md's single node: `rebuno server` on an SQLite file (four slashes, an
    absolute path), with a bearer token and a manifest, serves the manifest's agents."""
    port = free_port()
    database = tmp_path / "var" / "kernel.db"
    database.parent.mkdir()
    command = [str(env_module.PYTHON), "-m", "rebuno.cli.main", "server"]
    command += ["--db-url", f"sqlite:///{database}", "--bearer-token", "change-me"]
    command += ["--listen-addr", f"127.0.0.1:{port}", "--config", "examples/rebuno.yaml"]
    env = {**os.environ, "REBUNO_WEBHOOK_ALLOW": "127.0.0.0/8"}
    kernel = env_module.Child(command, tmp_path / "server.log", ROOT, env)
    try:
        env_module.wait_healthy(kernel, f"http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/v0/agents"
        refused = httpx.get(url, timeout=5)
        agents = httpx.get(url, headers={"Authorization": "Bearer change-me"}, timeout=5)
    finally:
        kernel.stop()
    assert refused.status_code == 401
    assert sorted(agent["id"] for agent in agents.json()) == ["hello", "shell", "writer"]
    assert database.is_file()


def _check(block: Block, directory: Path, running: Environment | None) -> None:
    if block.saved_as:
        (directory / block.saved_as).write_text(block.text + "\n")
    match block.action:
        case Action.SHELL:
            assert running is not None
            running.examples_started()
            _run_shell(block, running)
        case Action.PYTHON:
            assert running is not None
            running.examples_started()
            _run_python(block, running)
        case Action.AGENT:
            assert running is not None
            _serve_agent(block, running)
        case Action.FRAGMENT:
            compile(block.text, block.where, "exec")
        case Action.JSON:
            _parse_json(block.text)
        case Action.YAML if block.saved_as:
            _load_yaml_syntax(block)
        case Action.YAML:
            _load_yaml(block, directory)
        case Action.COVERED | Action.ILLUSTRATION:
            pass


def _run_shell(block: Block, running: Environment) -> None:
    text = running.substitute(block.text)
    if is_transcript(text):
        for command in transcript(text):
            _run_command(command.line, command.expected, running)
        return
    lines = list(_logical_lines(text))
    for line in filter(_serves, lines):
        _serve_kernel(line, running)
    script = "\n".join(_not_run_here(line, running) for line in lines)
    returncode, output = _bash(script, running)
    assert returncode == 0, f"exit {returncode}:\n{output}"


def _run_command(line: str, expected: list[str], running: Environment) -> None:
    returncode, output = _bash(line, running)
    shown = "\n".join(expected)
    output = output if output.endswith("\n") or not output else f"{output}\n"
    where = f"$ {line}\nexit {returncode}, output:\n{output}shown:\n{shown}"
    if expected and expected[0].startswith("error:"):
        assert returncode != 0, f"the command should fail\n{where}"
    else:
        assert returncode == 0, f"the command failed\n{where}"
    assert output_pattern(expected).match(output), f"the output differs\n{where}"


def _bash(script: str, running: Environment) -> tuple[int, str]:
    """Runs `script` with bash in its own session; the whole session is killed when it
    outlives the block timeout, so nothing it started is left behind."""
    return _run([BASH, "-euo", "pipefail", "-c", script], running)


def _run(args: list[str], running: Environment) -> tuple[int, str]:
    with subprocess.Popen(
        args,
        cwd=running.directory,
        env=running.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as child:
        try:
            output, _ = child.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            output, _ = child.communicate()
            raise AssertionError(f"still running after {BLOCK_TIMEOUT}s:\n{output}") from None
        finally:
            _kill_session(child.pid)
    return child.returncode, output


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


_KERNEL_COMMAND = re.compile(r"^(?:\.venv/bin/)?rebuno (?:dev|server)\b")
_LISTEN_ADDR = re.compile(r"--listen-addr(?:=|\s+)\S+")


def _serves(line: str) -> bool:
    return bool(_KERNEL_COMMAND.match(line.strip()))


def _serve_kernel(line: str, running: Environment) -> None:
    """Starts a kernel command on a free port, waits until it is healthy, and stops it with
    SIGTERM, which it must take as a graceful stop (not needing the SIGKILL that follows a
    stop that takes too long)."""
    if running.already_running(_joined(line)):
        return
    port = free_port()
    command = _joined(line).split(" #", 1)[0]
    if _LISTEN_ADDR.search(command):
        command = _LISTEN_ADDR.sub(f"--listen-addr 127.0.0.1:{port}", command)
    else:
        command += f" --listen-addr 127.0.0.1:{port}"
    log = running.directory / f".kernel-{port}.log"
    kernel = env_module.Child(
        [BASH, "-c", f"exec {command}"], log, running.directory, running.env()
    )
    try:
        env_module.wait_healthy(kernel, f"http://127.0.0.1:{port}")
    finally:
        kernel.stop()
    stopped = kernel.proc.returncode in (0, -signal.SIGTERM)
    assert stopped, f"{command}: exit {kernel.proc.returncode} on SIGTERM:\n{kernel.output()}"


def _not_run_here(line: str, running: Environment) -> str:
    joined = _joined(line)
    if running.already_running(joined):
        return f": already running: {joined}"
    return f": served above: {joined}" if _serves(line) else line


def _joined(line: str) -> str:
    return re.sub(r"\\\n\s*", " ", line)


def _logical_lines(text: str) -> Iterator[str]:
    pending = ""
    for line in text.split("\n"):
        pending = f"{pending}\n{line}" if pending else line
        if not pending.endswith("\\"):
            yield pending
            pending = ""
    if pending:
        yield pending


def _run_python(block: Block, running: Environment) -> None:
    script = running.directory / f".block-{block.line}.py"
    script.write_text(running.substitute(block.text) + "\n")
    try:
        returncode, output = _run([str(env_module.PYTHON), script.name], running)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n(a block that serves an agent needs an `agent` marker)"
        ) from None
    assert returncode == 0, f"exit {returncode}:\n{output}"


def _serve_agent(block: Block, running: Environment) -> None:
    agent_id, payload = block.agent
    assert agent_id in running.ports, f"no example agent serves {agent_id}"
    script = running.directory / f".block-{block.line}.py"
    script.write_text(running.substitute(block.text) + "\n")
    running.agent_stopped(agent_id)
    log = running.directory / f".block-{block.line}.log"
    child = env_module.Child(
        [str(env_module.PYTHON), script.name], log, running.directory, running.env()
    )
    try:
        env_module.wait_listening(child, running.ports[agent_id], f"the block serving {agent_id}")
        final = running.run_execution(agent_id, json.loads(payload), BLOCK_TIMEOUT)
        assert final["status"] == "completed", f"the execution ended {final}:\n{child.output()}"
    finally:
        child.stop()


def _parse_json(text: str) -> None:
    text = text.replace("{…}", "{}").replace("[…]", "[]")
    try:
        json.loads(text)
    except ValueError:
        for line in filter(str.strip, text.split("\n")):
            json.loads(line)


class _AnyVariable(Mapping[str, str]):
    """Every environment variable is set, to a placeholder."""

    def __getitem__(self, name: str) -> str:
        return f"placeholder-{name.lower()}"

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _load_yaml_syntax(block: Block) -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(block.text)


def _load_yaml(block: Block, directory: Path) -> None:
    from rebuno.kernel.manifest import load_manifest
    from rebuno.kernel.policy.loader import load_bundle

    document = _load_yaml_syntax(block)
    if isinstance(document, dict) and "agents" in document:
        manifest = directory / f".manifest-{block.line}.yaml"
        manifest.write_text(block.text)
        for entry in document["agents"]:
            _stand_in_policy(entry, directory)
        load_manifest(str(manifest), env=_AnyVariable())
    elif isinstance(document, dict) and ("rules" in document or "default_action" in document):
        load_bundle(block.text)


def _stand_in_policy(entry: object, directory: Path) -> None:
    name = entry.get("policy_file") if isinstance(entry, dict) else None
    if not isinstance(name, str):
        return
    path = (directory / name).resolve()
    if path.is_relative_to(directory.resolve()) and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("default_action: allow\n")
