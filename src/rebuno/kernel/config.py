"""Typed kernel settings, read from flags, the environment (`REBUNO_*`) and defaults.

Precedence is flag > environment > default (§18.2). Durations use Go syntax (`500ms`, `2s`).
An environment value that does not parse is ignored with a warning, so a typo never stops a
replica from booting; a bad flag is an error. Must import only `rebuno.protocol` and the domain.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.webhook import Targets, parse_networks
from rebuno.protocol.durations import parse_duration

logger = logging.getLogger(__name__)

DEV_DB_URL = "sqlite:///.rebuno/dev.db"
LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
LOG_FORMATS = ("text", "json")
_DB_SCHEMES = ("postgresql://", "postgres://", "sqlite://")


@dataclass(frozen=True, slots=True)
class Settings:
    dev: bool = True
    listen_addr: str = ":8080"
    db_url: str = DEV_DB_URL
    bearer_token: str | None = None
    config_file: str | None = None
    db_max_conns: int | None = None
    db_min_conns: int | None = None
    log_level: str = "info"
    log_format: str = "text"
    otel_endpoint: str | None = None
    otel_sample_rate: float = 1.0
    otel_insecure: bool = False
    dispatch_max_attempts: int = 5
    dispatch_timeout: timedelta = timedelta(seconds=30)
    dispatch_concurrency: int = 8
    dispatch_lease_timeout: timedelta = timedelta(minutes=2)
    dispatch_poll_interval: timedelta = timedelta(milliseconds=250)
    backoff_base: timedelta = timedelta(seconds=1)
    backoff_max: timedelta = timedelta(seconds=30)
    deadline_timeout: timedelta | None = None
    deadline_check_interval: timedelta = timedelta(seconds=30)
    approval_timeout: timedelta = timedelta(minutes=15)
    cleanup_interval: timedelta = timedelta(minutes=10)
    retention: timedelta = timedelta(hours=24)
    leader_lock_key: str = "rebuno_scheduler_leader"
    accept_body_signatures: bool = True
    step_records: bool = True
    """Offer `step-records` (docs/extensions.md) on an execution's first delivery."""
    step_occurrences: bool = True
    """Offer `step-occurrences` (docs/extensions.md) on the other deliveries."""
    webhook_allow: str = ""
    """Comma-separated CIDR ranges webhooks may reach besides public addresses (loopback,
    link-local and private ones are refused otherwise; `rebuno dev` allows loopback)."""
    shortcuts: bool = True
    """Let a replica use what it remembers to skip work (service/shortcuts.py); `false`
    takes the ordinary way everywhere, with the same outcomes."""
    replica_id: str = field(default="")
    max_body_bytes: int = 10 * 1024 * 1024
    header_timeout: timedelta = timedelta(seconds=10)
    """How long a request's head may take to arrive; a slower connection is closed."""
    body_timeout: timedelta = timedelta(seconds=30)
    """How long reading a request's body may take; a slower one is answered 408."""
    max_connections: int = 4096
    """Connections and requests in progress at once; past it the kernel answers 503."""
    sse_keepalive: timedelta = timedelta(seconds=15)
    workers: int = 1
    """Kernel processes sharing the listening socket (PostgreSQL only; `rebuno server`)."""


# -- value parsers: text in, typed value out, ValueError with a reason otherwise -------------


def _text(value: str) -> str:
    return value


def _positive_int(value: str) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise ValueError("must be a positive integer")
    return int(text)


def _networks(value: str) -> str:
    parse_networks(value)
    return value


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError("must be true, 1, false or 0")


def _sample_rate(value: str) -> float:
    rate = float(value)
    if not 0.0 <= rate <= 1.0:
        raise ValueError("must be between 0 and 1")
    return rate


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return lowered

    return parse


def _positive_duration(value: str) -> timedelta:
    duration = parse_duration(value.strip())
    if duration <= timedelta(0):
        raise ValueError("must be a positive duration")
    return duration


def _duration(value: str) -> timedelta:
    return parse_duration(value.strip())


def _duration_or(default: timedelta) -> Callable[[str], timedelta]:
    """A duration where zero or less means "use the default" (§18.2)."""

    def parse(value: str) -> timedelta:
        duration = parse_duration(value.strip())
        return duration if duration > timedelta(0) else default

    return parse


def _optional_duration(value: str) -> timedelta | None:
    duration = parse_duration(value.strip())
    return duration if duration > timedelta(0) else None


def _non_negative_duration(value: str) -> timedelta:
    duration = parse_duration(value.strip())
    if duration < timedelta(0):
        raise ValueError("must not be negative")
    return duration


DEV_LISTEN_ADDR = "127.0.0.1:8080"


def webhook_targets(settings: Settings) -> Targets:
    """The addresses this kernel's webhooks may reach (`webhook_allow`; loopback in dev)."""
    return Targets(parse_networks(settings.webhook_allow), loopback=settings.dev)


def split_listen_addr(addr: str) -> tuple[str, int]:
    """`host:port` to its parts; an empty host (`:8080`) means every interface."""
    host, colon, port = addr.strip().rpartition(":")
    if not colon or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError("must be HOST:PORT, for example :8080 or 127.0.0.1:8080")
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port)


def _listen_addr(value: str) -> str:
    split_listen_addr(value)
    return value.strip()


def _db_url(value: str) -> str:
    if not value.startswith(_DB_SCHEMES):
        raise ValueError("must start with postgresql:// or sqlite:///")
    return value


# -- the option table ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Option:
    name: str
    """The `Settings` field, also the key of the `flags` mapping."""
    env: str | None
    parse: Callable[[str], object]
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_OPTIONS = (
    _Option("listen_addr", "REBUNO_LISTEN_ADDR", _listen_addr),
    _Option("db_url", "REBUNO_DB_URL", _db_url, secret=True),
    _Option("bearer_token", "REBUNO_BEARER_TOKEN", _text, secret=True),
    _Option("config_file", None, _text),
    _Option("db_max_conns", "REBUNO_DB_MAX_CONNS", _positive_int),
    _Option("db_min_conns", "REBUNO_DB_MIN_CONNS", _positive_int),
    _Option("log_level", "REBUNO_LOG_LEVEL", _choice(LOG_LEVELS)),
    _Option("log_format", "REBUNO_LOG_FORMAT", _choice(LOG_FORMATS)),
    _Option("otel_endpoint", "REBUNO_OTEL_ENDPOINT", _text),
    _Option("otel_sample_rate", "REBUNO_OTEL_SAMPLE_RATE", _sample_rate),
    _Option("otel_insecure", "REBUNO_OTEL_INSECURE", _boolean),
    _Option("dispatch_max_attempts", "REBUNO_DISPATCH_MAX_ATTEMPTS", _positive_int),
    _Option("dispatch_timeout", "REBUNO_DISPATCH_TIMEOUT", _duration_or(timedelta(seconds=30))),
    _Option("dispatch_concurrency", "REBUNO_DISPATCH_CONCURRENCY", _positive_int),
    _Option(
        "dispatch_lease_timeout",
        "REBUNO_DISPATCH_LEASE_TIMEOUT",
        _duration_or(timedelta(minutes=2)),
    ),
    _Option("dispatch_poll_interval", "REBUNO_DISPATCH_POLL_INTERVAL", _positive_duration),
    _Option("backoff_base", "REBUNO_DISPATCH_BACKOFF_BASE", _positive_duration),
    _Option("backoff_max", "REBUNO_DISPATCH_BACKOFF_MAX", _positive_duration),
    _Option("deadline_timeout", "REBUNO_DEADLINE_TIMEOUT", _optional_duration),
    _Option("deadline_check_interval", "REBUNO_DEADLINE_CHECK_INTERVAL", _non_negative_duration),
    _Option("approval_timeout", "REBUNO_APPROVAL_TIMEOUT", _positive_duration),
    _Option("cleanup_interval", "REBUNO_CLEANUP_INTERVAL", _positive_duration),
    _Option("retention", "REBUNO_RETENTION", _duration),
    _Option("leader_lock_key", "REBUNO_LEADER_LOCK_KEY", _text),
    _Option("accept_body_signatures", "REBUNO_ACCEPT_BODY_SIGNATURES", _boolean),
    _Option("step_records", "REBUNO_STEP_RECORDS", _boolean),
    _Option("step_occurrences", "REBUNO_STEP_OCCURRENCES", _boolean),
    _Option("shortcuts", "REBUNO_SHORTCUTS", _boolean),
    _Option("webhook_allow", "REBUNO_WEBHOOK_ALLOW", _networks),
    _Option("header_timeout", "REBUNO_HEADER_TIMEOUT", _positive_duration),
    _Option("body_timeout", "REBUNO_BODY_TIMEOUT", _positive_duration),
    _Option("max_connections", "REBUNO_MAX_CONNECTIONS", _positive_int),
    _Option("sse_keepalive", "REBUNO_SSE_KEEPALIVE", _positive_duration),
    _Option("workers", "REBUNO_WORKERS", _positive_int),
)
_BY_NAME = {option.name: option for option in _OPTIONS}
_UNSET = object()


def load_settings(*, dev: bool, flags: Mapping[str, object], env: Mapping[str, str]) -> Settings:
    """Build the settings of a `dev` or `server` kernel.

    `flags` maps `Settings` field names to the values given on the command line (None, or a
    missing key, means "not given"); `env` is usually `os.environ`.

    Raises:
        ValidationFailed: a flag that does not parse, or a server without a database URL or
            a bearer token.
    """
    unknown = sorted(set(flags) - set(_BY_NAME))
    if unknown:
        raise ValidationFailed(f"unknown setting {unknown[0]!r}")
    values: dict[str, Any] = {}
    for option in _OPTIONS:
        value = _from_flag(option, flags.get(option.name))
        if value is _UNSET:
            value = _from_env(option, env)
        if value is not _UNSET:
            values[option.name] = value
    return _finish(dev, values)


def _finish(dev: bool, values: dict[str, Any]) -> Settings:
    if dev:
        # Bearer auth is off in dev whatever the environment says (§18.1), and dev is one
        # process (its console reads the terminal).
        values.pop("bearer_token", None)
        values.pop("workers", None)
        # No bearer auth: reachable from this machine only, unless an address is given.
        values.setdefault("listen_addr", DEV_LISTEN_ADDR)
    else:
        # The `sha256=` scheme binds no route, lease or time, so a captured request verifies
        # anywhere for ever: a server takes it only when told to (agents on SDK 0.16.0).
        values.setdefault("accept_body_signatures", False)
        _require(values, "db_url", "REBUNO_DB_URL (--db-url) required in server mode")
        _require(
            values, "bearer_token", "REBUNO_BEARER_TOKEN (--bearer-token) required in server mode"
        )
    if values.get("workers", 1) > 1 and str(values.get("db_url", "")).startswith("sqlite"):
        raise ValidationFailed(
            "REBUNO_WORKERS (--workers) above 1 needs PostgreSQL: an SQLite store is written"
            " by one process"
        )
    values.setdefault("replica_id", default_replica_id())
    return dataclasses.replace(Settings(dev=dev), **values)


def _require(values: Mapping[str, object], name: str, message: str) -> None:
    if not values.get(name):
        raise ValidationFailed(message)


def _from_flag(option: _Option, value: object) -> object:
    if value is None:
        return _UNSET
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        return option.parse(text)
    except ValueError as exc:
        shown = "" if option.secret else f" {text!r}"
        raise ValidationFailed(f"invalid value{shown} for {option.flag}: {exc}") from None


def _from_env(option: _Option, env: Mapping[str, str]) -> object:
    if option.env is None:
        return _UNSET
    text = env.get(option.env, "")
    if not text:
        return _UNSET
    try:
        return option.parse(text)
    except ValueError as exc:
        shown = "" if option.secret else f"={text!r}"
        logger.warning("ignoring %s%s: %s; keeping the default", option.env, shown, exc)
        return _UNSET


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
