"""Named column lists, and rows made of several of them.

Each table module of a backend names its table's columns once, in a tuple (`COLUMNS`): its
SELECT lists are built from it, and its one mapper, `to_record(row)`, unpacks a row into
variables of those names, in that order, never by index. A statement that reads several
records at once (a join, a locked read's function) hands back a row whose parts are such
lists one after the other: a `Layout` names the parts and cuts the row into them. A test
holds each list to the table the migrations build and each mapper to its list.
Must import only the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any

Columns = tuple[str, ...]


def names(text: str) -> Columns:
    """A column list written as SQL would list it, the names apart by spaces or commas."""
    return tuple(text.replace(",", " ").split())


def qualified(alias: str, columns: Columns) -> str:
    """The SELECT list of `columns`, each qualified by the table's alias."""
    return ", ".join(f"{alias}.{column}" for column in columns)


def prefixed(prefix: str, columns: Columns) -> Columns:
    """`columns` under the names a function's result gives them (`e_id`, `s_step_id`...)."""
    return tuple(prefix + column for column in columns)


class Layout:
    """A row made of consecutive parts, each a named column list."""

    __slots__ = ("_cuts", "names")

    def __init__(self, *parts: Columns) -> None:
        self.names: Columns = tuple(name for part in parts for name in part)
        """Every column of the row, in order: what the statement's result must name."""
        ends = list(accumulate((len(part) for part in parts), initial=0))
        # The last part runs to the end of the row, so a row longer than the layout fails
        # where that part is unpacked instead of losing its tail.
        cuts = [slice(start, end) for start, end in pairwise(ends)]
        cuts[-1] = slice(ends[-2], None)
        self._cuts = tuple(cuts)

    def split(self, row: Sequence[Any]) -> list[Sequence[Any]]:
        """The row's parts, in the order of the layout."""
        return [row[cut] for cut in self._cuts]


def found(part: Sequence[Any]) -> bool:
    """Whether an outer join found a record for this part of a row: not every column is NULL
    (a record's key never is)."""
    return any(value is not None for value in part)
