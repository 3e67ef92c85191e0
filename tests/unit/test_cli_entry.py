"""The `rebuno` console script without the kernel's extras: one line saying what to install,
and only for their absence (any other import error is a bug, and stays one)."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from rebuno.cli import entry


def _without(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def importing(module: str, *args: Any, **kwargs: Any) -> Any:
        if module == "rebuno.cli.main":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)


def test_a_missing_kernel_extra_is_one_line_naming_the_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without("click", monkeypatch)

    with pytest.raises(SystemExit) as exited:
        entry.main(["version"])

    assert exited.value.code == entry.EXTRAS_MISSING
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "click" in err and "pip install 'rebuno[kernel]'" in err


def test_any_other_missing_module_is_not_mistaken_for_the_extras(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without("rebuno.cli.typo", monkeypatch)

    with pytest.raises(ModuleNotFoundError):
        entry.main(["version"])
