"""`docs/sdk.md` documents every public name with an example, and its examples are valid Python;
the ones that need no kernel are run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rebuno
import rebuno.mcp

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
STANDALONE = [b for b in BLOCKS if "assert " in b and "run(" not in b]


@pytest.mark.parametrize("name", [*rebuno.__all__, *rebuno.mcp.__all__])
def test_every_public_name_is_documented(name: str) -> None:
    assert re.search(rf"\b{re.escape(name)}\b", DOC.read_text()), name


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_example_compiles(index: int) -> None:
    compile(BLOCKS[index], f"docs/sdk.md example {index}", "exec")


@pytest.mark.parametrize("index", range(len(STANDALONE)))
def test_examples_without_a_kernel_run(index: int) -> None:
    exec(compile(STANDALONE[index], f"docs/sdk.md example {index}", "exec"), {})
