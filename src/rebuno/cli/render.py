"""How the CLI and the REPL print: aligned tables and colours on a terminal, plain text when
the output is piped, JSON for scripts.

Colour is used only when the stream is a terminal, `NO_COLOR` is unset or empty, and `TERM` is
not `dumb`. Imports nothing from the kernel.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from rebuno.protocol.times import parse_timestamp

_RESET = "\033[0m"
_STYLES = {
    "bold": "\033[1m",
    "dim": "\033[2m",
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "blue": "\033[34m",
    "magenta": "\033[35m",
    "cyan": "\033[36m",
}
_STATUS_STYLE = {
    "pending": "dim",
    "running": "cyan",
    "blocked": "magenta",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "granted": "green",
    "denied": "red",
    "expired": "yellow",
    "succeeded": "green",
    "awaiting_approval": "magenta",
    "executing": "cyan",
}


def wants_color(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    return stream.isatty()


@dataclass
class Output:
    """Where and how to print. `json` makes every operation print JSON instead of text."""

    stream: TextIO = field(default_factory=lambda: sys.stdout)
    color: bool = False
    json: bool = False

    @classmethod
    def to(cls, stream: TextIO | None = None, *, json: bool = False) -> Output:
        stream = stream or sys.stdout
        return cls(stream, color=wants_color(stream), json=json)

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def style(self, text: str, style: str) -> str:
        if not self.color or style not in _STYLES:
            return text
        return f"{_STYLES[style]}{text}{_RESET}"

    def status(self, status: str) -> str:
        return self.style(status, _STATUS_STYLE.get(status, ""))

    def field(self, name: str, value: str) -> None:
        """A `name: value` line of a detail view; `name:` alone heads a block below it."""
        label = self.style(name + ":", "bold")
        self.line(f"{label} {value}" if value else label)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> None:
        """Left-aligned columns two spaces apart; `empty` is printed when there is no row.

        Widths are measured on the plain text, so colouring a cell never breaks alignment.
        """
        if not rows:
            self.line(self.style(empty, "dim"))
            return
        plain = [[_strip(cell) for cell in row] for row in rows]
        widths = [max(len(h), *(len(row[i]) for row in plain)) for i, h in enumerate(headers)]
        self.line(self.style(_join(headers, headers, widths), "bold"))
        for row, text in zip(rows, plain, strict=True):
            self.line(_join(row, text, widths))

    def json_value(self, value: Any) -> None:
        self.line(json.dumps(value, indent=2, ensure_ascii=False))

    def block(self, value: Any, indent: str = "  ") -> None:
        """A JSON value in full, pretty-printed and indented under the line before it."""
        for text in json.dumps(value, indent=2, ensure_ascii=False).splitlines():
            self.line(indent + text)

    def json_line(self, value: Any) -> None:
        """One compact JSON document per line, for streams a script reads as they come."""
        self.line(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _strip(text: str) -> str:
    for code in (*_STYLES.values(), _RESET):
        text = text.replace(code, "")
    return text


def _join(cells: Sequence[str], plain: Sequence[str], widths: Sequence[int]) -> str:
    padded = [
        cell + " " * (width - len(text))
        for cell, text, width in zip(cells, plain, widths, strict=True)
    ]
    return "  ".join(padded).rstrip()


def one_line(value: Any, limit: int = 200) -> str:
    """A JSON value on one line, cut to `limit` characters with an ellipsis."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def age(timestamp: str, now: datetime | None = None) -> str:
    """`3s`, `4m`, `2h`, `5d` since an RFC 3339 timestamp; `-` when there is none."""
    seconds = _seconds_since(timestamp, now)
    return "-" if seconds is None else _span(max(seconds, 0))


def relative(timestamp: str, now: datetime | None = None) -> str:
    """`in 9m` for a time to come, `4m ago` for one past; `-` when there is none."""
    seconds = _seconds_since(timestamp, now)
    if seconds is None:
        return "-"
    return f"{_span(seconds)} ago" if seconds >= 0 else f"in {_span(-seconds)}"


def _seconds_since(timestamp: str, now: datetime | None) -> int | None:
    if not timestamp:
        return None
    try:
        return int(((now or datetime.now(UTC)) - parse_timestamp(timestamp)).total_seconds())
    except ValueError:
        return None


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
