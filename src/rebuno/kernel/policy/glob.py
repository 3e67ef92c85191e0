"""Glob patterns with the syntax of Go's `path.Match`, where `*` and `?` also match `/`.

Syntax: `*` any run of characters, `?` one character, `[...]` a class of characters and
ranges (`[^...]` negated), `\\` escapes the next character. A malformed pattern raises
`GlobError` when compiled, never when matched. Patterns become linear-time RE2 programs, so
no pattern can make a match slow.

Standard library and `re2` only; must not import the rest of rebuno.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final

import re2

GlobMatcher = Callable[[str], bool]

_ANY_RUN: Final = "(?s:.*)"
_ANY_CHAR: Final = "(?s:.)"
# An empty class (every range reversed, as in `[z-a]`) matches no character at all.
_NO_CHAR: Final = r"[^\x{0}-\x{10FFFF}]"

_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.never_capture = True


class GlobError(ValueError):
    """The pattern is malformed."""


def compile_glob(pattern: str) -> GlobMatcher:
    """Validate `pattern` and return a function telling whether a whole name matches it."""
    tokens = _tokenize(pattern)
    literal = _literal_prefix(tokens)
    if len(literal) == len(tokens):
        return partial(str.__eq__, "".join(literal))
    if len(literal) == len(tokens) - 1 and tokens[-1] is _ANY_RUN:
        prefix = "".join(literal)
        return lambda name: name.startswith(prefix)
    return _regex_matcher(tokens)


def glob_match(pattern: str, name: str) -> bool:
    """One-off match; raises `GlobError` for a malformed pattern."""
    return compile_glob(pattern)(name)


class _Literal(str):
    """A character that stands for itself (kept apart from the regex fragments)."""

    __slots__ = ()


def _literal_prefix(tokens: list[str]) -> list[str]:
    prefix: list[str] = []
    for token in tokens:
        if not isinstance(token, _Literal):
            break
        prefix.append(token)
    return prefix


def _regex_matcher(tokens: list[str]) -> GlobMatcher:
    parts = [_escape(t) if isinstance(t, _Literal) else t for t in tokens]
    program: Any = re2.compile("".join(parts), _OPTIONS)
    return lambda name: program.fullmatch(name) is not None


def _tokenize(pattern: str) -> list[str]:
    """Split the pattern into literal characters and regex fragments (Go's grammar)."""
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            if not tokens or tokens[-1] is not _ANY_RUN:
                tokens.append(_ANY_RUN)
            i += 1
        elif char == "?":
            tokens.append(_ANY_CHAR)
            i += 1
        elif char == "[":
            fragment, i = _parse_class(pattern, i + 1)
            tokens.append(fragment)
        elif char == "\\":
            if i + 1 >= len(pattern):
                raise GlobError(f"malformed glob {pattern!r}: trailing backslash")
            tokens.append(_Literal(pattern[i + 1]))
            i += 2
        else:
            tokens.append(_Literal(char))
            i += 1
    return tokens


def _parse_class(pattern: str, i: int) -> tuple[str, int]:
    """Parse a class whose `[` ends just before `i`; return its regex and the next index."""
    negated = i < len(pattern) and pattern[i] == "^"
    if negated:
        i += 1
    ranges: list[tuple[str, str]] = []
    while not (i < len(pattern) and pattern[i] == "]" and ranges):
        low, i = _class_char(pattern, i)
        high = low
        if pattern[i] == "-":
            high, i = _class_char(pattern, i + 1)
        ranges.append((low, high))
    return _class_regex(ranges, negated), i + 1


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    """One class member, possibly escaped; like Go, something must follow it."""
    if i >= len(pattern):
        raise GlobError(f"malformed glob {pattern!r}: unterminated character class")
    if pattern[i] in "-]":
        raise GlobError(f"malformed glob {pattern!r}: bad character class")
    if pattern[i] == "\\":
        i += 1
        if i >= len(pattern):
            raise GlobError(f"malformed glob {pattern!r}: trailing backslash")
    if i + 1 >= len(pattern):
        raise GlobError(f"malformed glob {pattern!r}: unterminated character class")
    return pattern[i], i + 1


def _class_regex(ranges: list[tuple[str, str]], negated: bool) -> str:
    members = "".join(
        _escape(low) if low == high else f"{_escape(low)}-{_escape(high)}"
        for low, high in ranges
        if low <= high
    )
    if not members:
        return _ANY_CHAR if negated else _NO_CHAR
    return f"[{'^' if negated else ''}{members}]"


def _escape(char: str) -> str:
    # Hex escapes keep the RE2 program ASCII, whatever the pattern contains.
    return char if char.isascii() and char.isalnum() else f"\\x{{{ord(char):X}}}"
