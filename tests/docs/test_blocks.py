"""How the docs test reads a document: fences, markers, transcripts and shown output. Pure
text; no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import blocks as blocks_module
from tests.docs.blocks import Action, blocks, output_pattern, transcript


@pytest.fixture
def document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(blocks_module, "ROOT", tmp_path)
    return tmp_path / "guide.md"


def test_a_marker_right_before_a_fence_decides_what_runs(document: Path) -> None:
    document.write_text(
        '<!-- docs: agent hello {"name": "Ada"} -->\n```python\nrun()\n```\n\n'
        "<!-- docs: covered by tests/e2e/test_x.py::test_y -->\n\n```sh\nmake bench\n```\n"
        "```json\n{}\n```\n```text\nanything\n```\n"
    )

    agent, covered, data, text = blocks("guide.md")

    assert (agent.action, agent.agent, agent.line) == (
        Action.AGENT,
        ("hello", '{"name": "Ada"}'),
        2,
    )
    assert (covered.action, covered.covered_by) == (
        Action.COVERED,
        ("tests/e2e/test_x.py", "test_y"),
    )
    assert (data.action, text.action) == (Action.JSON, Action.ILLUSTRATION)


def test_an_unknown_marker_is_an_error_naming_the_block(document: Path) -> None:
    document.write_text("<!-- docs: skip -->\n```sh\ntrue\n```\n")

    with pytest.raises(AssertionError, match=r"guide.md:2: unknown docs marker 'skip'"):
        _ = blocks("guide.md")[0].action


def test_a_block_naming_a_file_in_its_first_line_is_saved_under_that_name(document: Path) -> None:
    document.write_text("```yaml\n# shell.yaml\nrules: []\n```\n")

    assert blocks("guide.md")[0].saved_as == "shell.yaml"


def test_a_transcript_pairs_each_command_with_the_lines_after_it() -> None:
    commands = transcript(
        "$ rebuno policy test a.yaml \\\n    --target x\ndecision: deny\n\n$ true\n"
    )

    assert [(command.line, command.expected) for command in commands] == [
        ("rebuno policy test a.yaml \\\n    --target x", ["decision: deny"]),
        ("true", []),
    ]


def test_shown_output_stands_for_ids_times_and_widths_but_not_other_text() -> None:
    shown = output_pattern(
        [
            "ID      WEBHOOK   STATUS",
            "   1  01:18:59  created 01a22a08-a5e1-7545-b8f3-ef6141be5847 (0s ago)",
            "…",
            'output: {"greeting": …}',
        ]
    )

    printed = (
        "ID        WEBHOOK  STATUS\n"
        "   1  12:42:34  created 01a231a0-d97f-75fd-b9f4-ffbbb8c55368 (12s ago)\n"
        "more\nlines\n"
        'output: {"greeting": "Hello, Ada!"}\n'
    )
    assert shown.match(printed)
    assert not shown.match(printed.replace("created", "deleted"))
    assert not shown.match(printed + "an extra line\n")
