"""No test sleeps a fixed time to wait for something: it waits for a condition (the polls in
harness/polling.py are the one place that sleeps) or moves a manual clock. The harness the
tests share with the chaos suite and the benchmark is held to the same rule. A zero sleep, which
only yields to the event loop, is allowed where a comment on its line or the line above says
why. Reads the suites' source; imports nothing from rebuno."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HARNESS = TESTS.parent / "harness"
POLLS = HARNESS / "polling.py"


def sleeps(source: str) -> list[tuple[int, bool]]:
    """`(line, zero)` for each call of a function named `sleep`, whoever's it is."""
    found = [
        (node.lineno, _is_zero(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and _called(node.func) == "sleep"
    ]
    return sorted(found)


def unexplained(source: str) -> list[int]:
    """The lines of zero sleeps with no comment on their line or the line above."""
    commented = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    return [
        line
        for line, zero in sleeps(source)
        if zero and line not in commented and line - 1 not in commented
    ]


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_zero(call: ast.Call) -> bool:
    args = [*call.args, *(keyword.value for keyword in call.keywords)]
    return len(args) == 1 and isinstance(args[0], ast.Constant) and args[0].value == 0


def _suites() -> list[Path]:
    found = [*TESTS.rglob("*.py"), *HARNESS.rglob("*.py")]
    return sorted(path for path in found if path != POLLS)


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(TESTS.parent)}:{line}"


SAMPLE = """\
import asyncio
import time
from time import sleep


async def waits() -> None:
    await asyncio.sleep(0.05)
    time.sleep(1)
    sleep(delay)
    await asyncio.sleep(0)  # lets the other task run first
    # the waiter parks on the queue
    await asyncio.sleep(0)
    await asyncio.sleep(0)
"""


def test_the_check_finds_fixed_sleeps_and_unexplained_yields() -> None:
    assert sleeps(SAMPLE) == [
        (7, False),
        (8, False),
        (9, False),
        (10, True),
        (12, True),
        (13, True),
    ]
    assert unexplained(SAMPLE) == [13]


def test_no_test_sleeps_a_fixed_time() -> None:
    fixed = [
        _where(path, line)
        for path in _suites()
        for line, zero in sleeps(path.read_text())
        if not zero
    ]

    assert fixed == [], "wait with harness.polling's wait_until or poll_until, or a manual clock"


def test_each_yield_to_the_event_loop_says_why() -> None:
    silent = [_where(path, line) for path in _suites() for line in unexplained(path.read_text())]

    assert silent == [], "say in a comment why the test yields to the loop there"
