"""The test databases of `tests/pgfixtures.py`: a passing test's database is emptied and
handed to the worker's next test, a failed test's never is, so whatever the failed test left
running (a kernel still claiming dispatches, say) cannot reach the next test's rows.

Runs an inner pytest session, in a process of its own, on the real server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.processes import ROOT

pytestmark = pytest.mark.postgres

INNER = """
from pathlib import Path

SEEN = Path(__file__).with_name("seen")


def test_1_passes(postgres_url: str) -> None:
    SEEN.write_text(postgres_url)


def test_2_gets_the_passed_tests_database(postgres_url: str) -> None:
    assert postgres_url == SEEN.read_text()
    SEEN.write_text(postgres_url)
    raise AssertionError("fails on purpose")


def test_3_gets_another_database_than_the_failed_tests(postgres_url: str) -> None:
    assert postgres_url != SEEN.read_text()
"""


def test_a_failed_tests_database_is_not_handed_on(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the suite's own options
    plugins = ["tests.pgfixtures", "no:cacheprovider", "no:xdist", "no:asyncio"]
    args = [sys.executable, "-m", "pytest", "-q", "-ra", "-c", str(tmp_path / "pytest.ini")]
    args += [f"-p{plugin}" for plugin in plugins]
    done = subprocess.run(
        [*args, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert "1 failed, 2 passed" in done.stdout, done.stdout + done.stderr
    assert "fails on purpose" in done.stdout
    [failed] = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    assert "test_inner.py::test_2_gets_the_passed_tests_database" in failed
