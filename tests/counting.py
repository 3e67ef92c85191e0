"""A store that counts what a use case costs: `Counting` wraps a real store (never a mock of
one) and counts the transactions it opens, by kind, and its committed reads, by method.

Behaviour tests assert on these counts ("a replayed step costs one committed read and no
transaction") rather than on what a replica remembers, so they hold whether the kernel's
shortcuts are on or off and whatever form that memory takes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from rebuno.kernel.store.base import Store, Transaction, Unchanged

COMMITTED_READS = frozenset({"load_completion", "get_execution", "get_step", "list_steps"})


class Counting:
    """Delegates everything to `inner`; `transactions` counts `locked`, `optimistic` and
    `plain` transactions entered, `reads` the committed reads named in `COMMITTED_READS`."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.transactions: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    def reset(self) -> None:
        self.transactions.clear()
        self.reads.clear()

    @asynccontextmanager
    async def transaction(
        self, execution_id: str | None = None, unchanged: Unchanged | None = None
    ) -> AsyncIterator[Transaction]:
        kind = "plain" if execution_id is None else "optimistic" if unchanged else "locked"
        self.transactions[kind] += 1
        async with self.inner.transaction(execution_id, unchanged) as tx:
            yield tx

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in COMMITTED_READS:
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.reads[name] += 1
            return await attribute(*args, **kwargs)

        return counted


def counting(store: Store) -> tuple[Store, Counting]:
    """`store` wrapped, typed as a `Store` for the kernel and as `Counting` for the test."""
    wrapper = Counting(store)
    return cast(Store, wrapper), wrapper
