"""`Kernel` is the composition of use cases that sit side by side: each derives from `Context`
alone, and no two define the same name, so none can quietly take another's method or state
through the composition (the import contract keeps their modules apart the same way)."""

from __future__ import annotations

import inspect

from rebuno.kernel.service.context import Context
from rebuno.kernel.service.kernel import Kernel

USE_CASES = [base for base in Kernel.__bases__ if base is not Context]


def test_every_use_case_derives_from_the_context_alone() -> None:
    assert len(USE_CASES) >= 10
    for use_case in USE_CASES:
        assert use_case.__bases__ == (Context,), use_case.__name__


def test_no_two_use_cases_define_the_same_name() -> None:
    owners: dict[str, str] = {}
    for use_case in USE_CASES:
        for name in vars(use_case):
            if name.startswith("__"):
                continue
            assert name not in owners, f"{use_case.__name__} and {owners[name]} both define {name}"
            assert not hasattr(Context, name), f"{use_case.__name__}.{name} hides Context's"
            owners[name] = use_case.__name__


def test_the_kernel_adds_only_its_readiness() -> None:
    own = {name for name, _ in inspect.getmembers(Kernel) if name in vars(Kernel)}
    assert {name for name in own if not name.startswith("__")} == {"ready"}
