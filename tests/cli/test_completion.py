"""Shell completion of the installed `rebuno` script, through click's `_REBUNO_COMPLETE`
variable: the script each shell sources, and the words it completes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.harness import child_env

ENTRY_POINT = Path(sys.executable).with_name("rebuno")


def complete(shell: str, words: str, cword: int) -> list[str]:
    """The completions `rebuno` offers for the word at `cword` of `words`, in bash's form."""
    result = subprocess.run(
        [str(ENTRY_POINT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(
            {"_REBUNO_COMPLETE": f"{shell}_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o nosort -F"),
        ("zsh", "#compdef rebuno"),
        ("fish", "complete --no-files"),
    ],
)
def test_the_installed_script_prints_each_shells_completion_script(shell: str, marker: str) -> None:
    result = subprocess.run(
        [str(ENTRY_POINT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env({"_REBUNO_COMPLETE": f"{shell}_source"}),
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert marker in result.stdout
    assert "_REBUNO_COMPLETE" in result.stdout


def test_completion_offers_the_commands_and_their_subcommands() -> None:
    assert complete("bash", "rebuno ", 1) == [
        "agents", "approvals", "dev", "exec", "key", "policy", "repl", "server", "version"
    ]  # fmt: skip
    assert complete("bash", "rebuno approvals ", 2) == ["deny", "get", "grant", "ls"]
    assert complete("bash", "rebuno key ", 2) == ["create", "ls", "revoke", "rotate"]
    assert "steps" in complete("bash", "rebuno exec st", 2)
    assert complete("bash", "rebuno approvals ls --status ", 4) == [
        "pending", "granted", "denied", "expired", "all"
    ]  # fmt: skip
