"""Glob matching: Go `path.Match` syntax, with `*` and `?` also matching `/`."""

from __future__ import annotations

import pytest

from rebuno.kernel.policy.glob import GlobError, compile_glob, glob_match


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("shell", "shell"),
        ("gpt-*", "gpt-4o"),
        ("gpt-*", "gpt-"),
        ("*", ""),
        ("*", "anything at all"),
        ("files/*", "files/a/b.txt"),
        ("*.txt", "dir/sub/notes.txt"),
        ("a*b*c", "a-x-b-y-c"),
        ("a**b", "ab"),
        ("read_??", "read_me"),
        ("a?c", "a/c"),
        ("?", "é"),
        ("line*end", "line\nend"),
        ("a?b", "a\nb"),
        ("[abc]x", "bx"),
        ("[a-c]x", "cx"),
        ("[a-cx-z]", "y"),
        ("[^a-c]x", "dx"),
        ("[^a]", "/"),
        ("[^a]", "\n"),
        ("\\*", "*"),
        ("a\\?b", "a?b"),
        ("[\\]]", "]"),
        ("[\\-]", "-"),
        ("[a\\-z]", "-"),
        ("a]", "a]"),
        ("^x$", "^x$"),
        ("a.b", "a.b"),
        ("(x)+|y", "(x)+|y"),
        ("[é-ë]", "ê"),
        ("[^z-a]", "q"),
        ("tool_\\*_*", "tool_*_suffix"),
    ],
)
def test_pattern_matches_name(pattern: str, name: str) -> None:
    assert glob_match(pattern, name)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("shell", "shell2"),
        ("shell", "Shell"),
        ("gpt-*", "claude"),
        ("gpt-*", "xgpt-4"),
        ("?", ""),
        ("?", "ab"),
        ("read_??", "read_m"),
        ("[abc]x", "dx"),
        ("[^a-c]x", "bx"),
        ("\\*", "a"),
        ("a.b", "axb"),
        ("a*b*c", "a-x-b-y"),
        ("[z-a]", "m"),
        ("[z-a]", "z"),
        ("a\\*", "ab"),
    ],
)
def test_pattern_does_not_match_name(pattern: str, name: str) -> None:
    assert not glob_match(pattern, name)


@pytest.mark.parametrize(
    "pattern",
    [
        "[",
        "a[",
        "[]",
        "[]a]",
        "[a",
        "[a-",
        "[a-b",
        "[-a]",
        "[a-]",
        "[a-z-]",
        "[a-b-c]",
        "[^]",
        "[^",
        "\\",
        "abc\\",
        "[\\",
        "[a\\",
        "[\\]",
    ],
)
def test_malformed_pattern_is_rejected_at_compile(pattern: str) -> None:
    with pytest.raises(GlobError, match="malformed glob"):
        compile_glob(pattern)


def test_compiled_matcher_is_reusable() -> None:
    match = compile_glob("b_*")

    assert [match(name) for name in ("b_1", "a_1", "b_")] == [True, False, True]


def test_many_stars_match_long_name_without_backtracking() -> None:
    # A backtracking matcher needs exponential time here; RE2 answers at once.
    match = compile_glob("*a*a*a*a*a*a*a*a*a*b")

    assert not match("a" * 50_000)
