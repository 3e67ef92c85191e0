"""The fenced blocks of the project's Markdown documents, and what the docs test does with each.

Pure text work: no processes, no kernel. See tests/docs/test_docs_run.py for the conventions.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"sh", "bash", "shell", "console"}
PYTHON = {"python", "py"}
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")
_SAVED_AS = re.compile(r"^(?:#|//)\s*(?P<name>[\w.-]+\.(?:ya?ml|json|py|sh|txt))\s*$")
_COVERED = re.compile(r"^covered by (?P<file>tests/[\w/.-]+\.py)::(?P<test>[\w:]+)$")
_AGENT = re.compile(r"^agent (?P<agent>[\w.-]+)(?: (?P<input>.+))?$")


class Action(StrEnum):
    """What the docs test does with a block."""

    SHELL = "shell"  # run with bash, or as a `$ ` transcript whose output is compared
    PYTHON = "python"  # run to completion in a subprocess against the kernel
    AGENT = "agent"  # served in place of an example agent, given one execution to finish
    FRAGMENT = "fragment"  # Python that is not a whole program: compiled only
    JSON = "json"  # parsed
    YAML = "yaml"  # loaded; a manifest or a policy bundle through the kernel's loader
    COVERED = "covered"  # run by the named test instead
    ILLUSTRATION = "illustration"  # text, http, nginx, ...: not checked


@dataclass(frozen=True)
class Block:
    """One fenced block of a document."""

    document: str  # relative to the repository, e.g. docs/cli.md
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: str  # the body of a `<!-- docs: ... -->` comment right before the fence, or ""

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def saved_as(self) -> str | None:
        """The file name the block's first line gives it (`# shell.yaml`), if any."""
        first = self.text.split("\n", 1)[0]
        match = _SAVED_AS.match(first)
        return match.group("name") if match else None

    @property
    def action(self) -> Action:
        if self.marker:
            return _marked_action(self)
        if self.language in SHELL:
            return Action.SHELL
        if self.language in PYTHON:
            return Action.PYTHON
        if self.language == "json":
            return Action.JSON
        if self.language in ("yaml", "yml"):
            return Action.YAML
        return Action.ILLUSTRATION

    @property
    def covered_by(self) -> tuple[str, str]:
        """`(file, test)` of a `covered by` marker."""
        match = _COVERED.match(self.marker)
        assert match, f"{self.where}: not a `covered by` marker: {self.marker!r}"
        return match.group("file"), match.group("test")

    @property
    def agent(self) -> tuple[str, str]:
        """`(agent id, JSON input)` of an `agent` marker; the input defaults to `{}`."""
        match = _AGENT.match(self.marker)
        assert match, f"{self.where}: not an `agent` marker: {self.marker!r}"
        return match.group("agent"), match.group("input") or "{}"


def _marked_action(block: Block) -> Action:
    if _COVERED.match(block.marker):
        return Action.COVERED
    if block.marker == "fragment" and block.language in PYTHON:
        return Action.FRAGMENT
    if _AGENT.match(block.marker) and block.language in PYTHON:
        return Action.AGENT
    raise AssertionError(
        f"{block.where}: unknown docs marker {block.marker!r}: use `covered by tests/...py::test`,"
        " or, on a python block, `fragment` or `agent <agent id> [JSON input]`"
    )


def documents() -> list[str]:
    """README.md and every docs/*.md, relative to the repository."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [str(path.relative_to(ROOT)) for path in paths]


def blocks(document: str) -> list[Block]:
    """The fenced blocks of one document, in order."""
    lines = (ROOT / document).read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = _closing(lines, index, opening.group("fence"), document)
        language = opening.group("info").strip().split(" ")[0].lower()
        body = "\n".join(
            line.removeprefix(opening.group("indent")) for line in lines[index + 1 : end]
        )
        found.append(Block(document, index + 1, language, body, _marker(lines, index)))
        index = end + 1
    return found


def _closing(lines: list[str], start: int, fence: str, document: str) -> int:
    for index in range(start + 1, len(lines)):
        stripped = lines[index].strip()
        if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
            return index
    raise AssertionError(f"{document}:{start + 1}: the fenced block is never closed")


def _marker(lines: list[str], fence: int) -> str:
    index = fence - 1
    while index >= 0 and not lines[index].strip():
        index -= 1
    match = _MARKER.match(lines[index]) if index >= 0 else None
    return match.group("body") if match else ""


def defines_test(file: str, test: str) -> bool:
    """Whether `file` (relative to the repository) defines the test `test` (`test_x` or
    `TestClass::test_x`)."""
    path = ROOT / file
    if not path.is_file():
        return False
    names = test.split("::")
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for name in names:
        found = [
            node
            for node in scope
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == name
        ]
        if not found:
            return False
        scope = found[0].body
    return True


@dataclass(frozen=True)
class Command:
    """One `$ ` command of a console transcript, and the output shown after it."""

    line: str
    expected: list[str]


def transcript(text: str) -> list[Command]:
    """The commands of a console block. A command may continue over lines ending in `\\`."""
    commands: list[Command] = []
    pending: list[str] = []
    for line in text.split("\n"):
        if pending and pending[-1].endswith("\\"):
            pending.append(line)
        elif line.startswith("$ "):
            if pending:
                commands.append(Command("\n".join(pending), []))
            pending = [line[2:]]
        elif commands or pending:
            if pending:
                commands.append(Command("\n".join(pending), []))
                pending = []
            commands[-1].expected.append(line)
    if pending:
        commands.append(Command("\n".join(pending), []))
    for command in commands:
        while command.expected and not command.expected[-1].strip():
            command.expected.pop()
    return commands


def is_transcript(text: str) -> bool:
    """Whether a shell block is written as a transcript: its first line is a `$ ` prompt."""
    return text.lstrip("\n").startswith("$ ")


_PLACEHOLDERS = (
    # An execution or approval id, a date-time, a clock time, an age: any of its kind.
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "[0-9a-f-]{36}"),
    # A short id (its first 18 characters, longer where two would look alike).
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}\b"),
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f-]{4,}",
    ),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"), r"[0-9T:.Z-]+"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), r"\d\d:\d\d:\d\d"),
    (re.compile(r"\(\d+[smhd] ago\)"), r"\(\d+[smhd] ago\)"),
)


def output_pattern(expected: list[str]) -> re.Pattern[str]:
    """A pattern for a command's whole output, as the document shows it: `…` stands for any
    text within a line, and a line holding only `…` for any number of lines; an id (a UUID, or
    its 18-character short form), a date-time, a clock time and an age like `(3s ago)` stand
    for any of their kind; runs of spaces match any run of spaces (table columns widen with
    longer values); trailing spaces are ignored."""
    parts: list[str] = []
    for line in expected:
        if line.strip() == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            pieces = (_line_pattern(piece) for piece in line.rstrip().split("…"))
            parts.append("[^\n]*?".join(pieces) + r"[ \t]*\n")
    return re.compile("".join(parts) + r"\Z")


def _line_pattern(text: str) -> str:
    pattern = ""
    while text:
        found = [
            (match.start(), match, sub)
            for regex, sub in _PLACEHOLDERS
            if (match := regex.search(text))
        ]
        if not found:
            return pattern + _spaced(text)
        start, match, sub = min(found, key=lambda item: item[0])
        pattern += _spaced(text[:start]) + sub
        text = text[match.end() :]
    return pattern


def _spaced(text: str) -> str:
    return "[ \t]+".join(re.escape(piece) for piece in re.split(r" {2,}", text))
