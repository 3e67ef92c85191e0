"""The REPL transcripts of the documents are what the REPL prints: each is replayed in a real
pseudo-terminal, command by command, against the development environment the docs test uses.

A transcript is a block marked as covered by this test (a `<!-- docs: covered by
tests/docs/test_repl_transcript.py::test_the_repl_transcript_of_the_cli_guide_is_what_the_repl_prints
-->` comment, on one line) whose first line is `$ rebuno dev ...`, then the REPL's banner,
then `rebuno> ` commands, each followed by the output it prints, leaving out the kernel's log
lines. Output is compared as in console blocks (tests/docs/blocks.py `output_pattern`); the
ids a command printed replace the document's ids, and their prefixes, in later commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.docs import environment as env_module
from tests.docs.blocks import Action, Block, blocks, documents, output_pattern
from tests.docs.environment import Environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PROMPT = "rebuno> "
THIS_TEST = "test_the_repl_transcript_of_the_cli_guide_is_what_the_repl_prints"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}(?:-[0-9a-f]{4}-[0-9a-f]{12})?")
"""A UUID, or its short form (18 characters) as the CLI prints it."""


def transcripts() -> list[Block]:
    return [
        block
        for document in documents()
        for block in blocks(document)
        if block.action is Action.COVERED and block.covered_by[1] == THIS_TEST
    ]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Environment]:
    with env_module.started(tmp_path, kernel=False) as environment:
        yield environment


@pytest.mark.parametrize("block", transcripts(), ids=lambda block: block.where)
def test_the_repl_transcript_of_the_cli_guide_is_what_the_repl_prints(
    block: Block, running: Environment, tmp_path: Path
) -> None:
    lines = running.substitute(block.text).split("\n")
    assert lines[0] == "$ rebuno dev --config examples/rebuno.yaml", f"{block.where}: {lines[0]}"
    shell = _spawned(running, tmp_path)
    try:
        replayed = _replay(shell, _steps(lines[1:]))
    finally:
        if shell.isalive():
            shell.terminate(force=True)
    assert replayed == [], "\n\n".join(replayed)


def _steps(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """`(command, output)` pairs; the first has no command: it is the banner."""
    steps: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in lines:
        if line.startswith(PROMPT):
            steps.append((line.removeprefix(PROMPT), []))
        else:
            steps[-1][1].append(line)
    return steps


def _spawned(running: Environment, home: Path) -> pexpect.spawn[str]:
    command = [*env_module.KERNEL_COMMAND, "--listen-addr", f"127.0.0.1:{running.ports['kernel']}"]
    # Warnings only: a log line printed at the prompt makes the REPL draw the prompt again
    # below it, which would read here as the end of the next command's output.
    env = running.env({"HOME": str(home), "TERM": "xterm", "REBUNO_LOG_LEVEL": "warning"})
    return pexpect.spawn(
        command[0],
        command[1:],
        cwd=str(running.directory),
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(50, 200),
    )


def _replay(shell: pexpect.spawn[str], steps: list[tuple[str | None, list[str]]]) -> list[str]:
    """Types each command and compares what it printed; the differences, as messages."""
    ids: dict[str, str] = {}
    differences: list[str] = []
    for command, expected in steps:
        typed = _with_ids(command, ids) if command is not None else None
        if typed is not None:
            shell.sendline(typed)
        if typed in ("quit", "exit"):
            shell.expect(pexpect.EOF)
            continue
        shell.expect_exact(PROMPT)
        printed = _printed(str(shell.before), typed)
        if not output_pattern([line for line in expected if line.strip()]).match(printed):
            shown = "\n".join(expected)
            differences.append(f"rebuno> {typed}\nprinted:\n{printed}shown:\n{shown}")
        ids.update(zip(UUID.findall("\n".join(expected)), UUID.findall(printed), strict=False))
    return differences


def _printed(before: str, typed: str | None) -> str:
    """What a command printed: the terminal's text without control sequences, the kernel's log
    lines (which share the terminal), and the echo of the typed line."""
    lines = [ANSI.sub("", line).rstrip() for line in before.replace("\r\n", "\n").split("\n")]
    lines = [line for line in lines if not LOG_LINE.match(line)]
    while lines and lines[0].strip() in ("", typed):
        lines.pop(0)
    return "\n".join(lines).rstrip("\n") + "\n"


def _with_ids(command: str, ids: dict[str, str]) -> str:
    """The command with each prefix (8 characters or more) of a shown id replaced by the same
    prefix of the id the REPL printed in its place."""
    for shown, real in ids.items():
        for length in range(len(shown), 7, -1):
            if shown[:length] in command:
                command = command.replace(shown[:length], real[:length])
                break
    return command
