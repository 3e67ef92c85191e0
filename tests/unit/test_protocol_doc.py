"""Every section the code and the docs cite (`§7.3`, `(§12.4)`) is a heading of docs/protocol.md,
so a citation always leads somewhere and a renumbered section cannot strand one."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
CITING = ("src", "tests", "docs", "bench", "README.md")
TEXT_SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".json", ".sql", ".toml", ".txt"})
# The section sign is spelled as an escape here so this file cites nothing itself.
SECTION = "\u00a7"
CITATION = re.compile(SECTION + r"([0-9]+(?:\.[0-9]+)*)")
HEADING = re.compile(r"^#{2,4} " + SECTION + r"([0-9]+(?:\.[0-9]+)*) \S", re.MULTILINE)


def headings(text: str) -> list[str]:
    """The section numbers of the `## §N Title` / `### §N.M Title` headings of `text`."""
    return HEADING.findall(text)


def citations(text: str) -> set[str]:
    return set(CITATION.findall(text))


def citing_files(root: Path = ROOT) -> Iterable[Path]:
    for name in CITING:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            if path.is_file() and path.suffix in TEXT_SUFFIXES and path != PROTOCOL:
                yield path


def unresolved(cited: dict[Path, set[str]], sections: Iterable[str]) -> list[str]:
    """`path: §N` for every citation with no heading, sorted."""
    known = set(sections)
    return sorted(
        f"{path.relative_to(ROOT)}: {SECTION}{number}"
        for path, numbers in cited.items()
        for number in numbers - known
    )


def cited_by_file() -> dict[Path, set[str]]:
    found = {path: citations(path.read_text(encoding="utf-8")) for path in citing_files()}
    return {path: numbers for path, numbers in found.items() if numbers}


def test_every_cited_section_is_a_heading_of_the_protocol_document() -> None:
    cited = cited_by_file()
    # The code cites dozens of sections; finding none would mean the scan itself broke.
    assert len({n for numbers in cited.values() for n in numbers}) > 20
    assert unresolved(cited, headings(PROTOCOL.read_text(encoding="utf-8"))) == []


def test_section_headings_are_unique() -> None:
    numbers = headings(PROTOCOL.read_text(encoding="utf-8"))
    assert len(numbers) == len(set(numbers))


def test_a_citation_of_a_missing_section_is_reported() -> None:
    source = ROOT / "src" / "rebuno" / "example.py"
    cited = {source: citations(f'"""Orphaned steps ({SECTION}13), see {SECTION}99.1."""')}
    known = headings(f"## {SECTION}13 Orphaned steps\n### {SECTION}99 Not this one\n")

    assert unresolved(cited, known) == [f"src/rebuno/example.py: {SECTION}99.1"]


def test_a_subsection_needs_its_own_heading() -> None:
    """Neither a section nor a longer-numbered sibling stands in for a subsection."""
    source = ROOT / "tests" / "example.py"
    cited = {source: citations(f"{SECTION}7.3, and {SECTION}7.31")}
    known = headings(f"## {SECTION}7 Step identity\n### {SECTION}7.31 Later\n")

    assert known == ["7", "7.31"]
    assert unresolved(cited, known) == [f"tests/example.py: {SECTION}7.3"]
