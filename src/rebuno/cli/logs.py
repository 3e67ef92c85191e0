"""Process-wide logging for the kernel commands: text or JSON lines on stderr.

Fields a record carries beyond the standard ones (`extra=`, or the `execution_id`, `step_id`
and `dispatch_id` the kernel attaches to everything logged while it serves a request or a
delivery) become JSON keys, or trailing `key=value` pairs in text.

Must not import anything under `rebuno.kernel`.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else was passed through `extra=` and is emitted.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The record's attributes that are not part of every `LogRecord`."""
    return {key: value for key, value in vars(record).items() if key not in _STANDARD}


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, then each extra field as ` key=value` (quoted when it has spaces)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = extra_fields(record)
        if not extras:
            return text
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in sorted(extras.items()))
        head, newline, traceback = text.partition("\n")
        return f"{head} {pairs}{newline}{traceback}"


def _text_value(value: object) -> str:
    text = str(value)
    if not text or any(character.isspace() or character in '"=' for character in text):
        return orjson.dumps(text).decode("utf-8")
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, extras, and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(extra_fields(record))
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode("utf-8")


def configure_logging(level: str, fmt: str) -> None:
    """Replaces the root handlers with one stderr handler in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(level, logging.INFO))
    # httpx logs every request at info: one line per webhook, and per REPL command. The
    # kernel logs the deliveries that matter (failures) itself; keep the rest for debug.
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    logging.getLogger("httpx").setLevel(quiet)
