"""The console's files (§40.1) hold together and need nothing from elsewhere: every file a
page or a module names exists in the package, nothing is loaded from another site, and no
page carries inline script or style that its Content-Security-Policy would block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rebuno.kernel.console.routes import STATIC

PAGES = sorted(STATIC.glob("*.html"))
MODULES = sorted(STATIC.glob("js/*.js"))
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_each_file_a_page_names_is_shipped(page: Path) -> None:
    text = page.read_text("utf-8")
    named = re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', text)

    assert named
    assert all((STATIC / one.removeprefix("/ui/static/")).is_file() for one in named)
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text) is None  # no inline script
    assert " style=" not in text


@pytest.mark.parametrize("module", MODULES, ids=lambda path: path.name)
def test_each_module_imports_only_shipped_modules(module: Path) -> None:
    text = module.read_text("utf-8")
    imported = re.findall(r'from "([^"]+)"', text)

    assert all(one.startswith("./") and (module.parent / one).is_file() for one in imported)


def test_nothing_is_fetched_from_another_site() -> None:
    for path in [*PAGES, *MODULES, STATIC / "console.css"]:
        urls = re.findall(r"https?://[^\s\"'`)]+", path.read_text("utf-8"))
        assert [url for url in urls if url != SVG_NAMESPACE] == [], path.name
