"""How the CLI prints: colour only on a terminal without NO_COLOR, aligned tables, short ids
that stay unique."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TextIO

import pytest

from rebuno.cli.operations import short_ids
from rebuno.cli.render import Output, age, one_line, wants_color


@pytest.fixture
def terminal() -> Iterator[TextIO]:
    """The writing end of a real pseudo-terminal."""
    leader, follower = os.openpty()
    stream = os.fdopen(follower, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


def test_colour_is_used_on_a_terminal(terminal: TextIO) -> None:
    assert wants_color(terminal, {"TERM": "xterm"})


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_or_a_dumb_terminal_turns_colour_off(
    terminal: TextIO, env: dict[str, str]
) -> None:
    assert not wants_color(terminal, env)


def test_output_that_is_not_a_terminal_is_plain() -> None:
    assert not wants_color(io.StringIO(), {"TERM": "xterm"})


def test_tables_align_on_the_text_not_on_the_colour_codes() -> None:
    stream = io.StringIO()
    out = Output(stream, color=True)

    out.table(
        ["ID", "STATUS", "AGE"], [["a", out.status("completed"), "3s"], ["bb", "x", "4m"]], "-"
    )

    plain = [
        line.replace("\033[32m", "").replace("\033[0m", "").replace("\033[1m", "")
        for line in stream.getvalue().splitlines()
    ]
    assert plain == ["ID  STATUS     AGE", "a   completed  3s", "bb  x          4m"]


def test_short_ids_are_18_characters_and_grow_until_they_are_unique() -> None:
    same_moment = [
        "01a22a08-67db-7763-9828-c67a81c44d15",
        "01a22a08-920d-7029-8d2a-d7619f9cd562",
        "01a22a08-920d-7029-8d3b-d7619f9cd562",
    ]
    alone = "0f000000-0000-7000-8000-000000000000"

    shown = short_ids([*same_moment, alone])

    assert shown[alone] == "0f000000-0000-7000"
    assert shown[same_moment[0]] == "01a22a08-67db-7763"
    assert shown[same_moment[1]] == "01a22a08-920d-7029-8d2"
    assert shown[same_moment[2]] == "01a22a08-920d-7029-8d3"


def test_one_line_cuts_long_values_with_an_ellipsis() -> None:
    cut = one_line({"a": "x" * 300}, 20)

    assert (len(cut), cut[:7], cut[-1]) == (20, '{"a": "', "…")
    assert one_line("two\nlines") == "two lines"


def test_age_reads_rfc3339_timestamps() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    assert age("2026-01-01T11:58:00Z", now) == "2m"
    assert age("2025-12-30T12:00:00.5Z", now) == "1d"
    assert age("", now) == "-"
