"""Kernel settings: flag > environment > default, Go durations, server-mode requirements."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from rebuno.kernel.config import DEV_DB_URL, Settings, load_settings, split_listen_addr
from rebuno.kernel.domain.errors import ValidationFailed

SERVER_ENV = {"REBUNO_DB_URL": "postgresql://db/rebuno", "REBUNO_BEARER_TOKEN": "tok"}


def test_dev_defaults_match_the_documented_table() -> None:
    settings = load_settings(dev=True, flags={}, env={})
    assert settings.dev is True
    assert settings.listen_addr == "127.0.0.1:8080"  # no bearer auth: loopback only
    assert settings.db_url == DEV_DB_URL
    assert settings.dispatch_lease_timeout == timedelta(minutes=2)
    assert settings.approval_timeout == timedelta(minutes=15)
    assert settings.deadline_timeout is None
    assert settings.accept_body_signatures is True
    assert settings.sse_keepalive == timedelta(seconds=15)


def test_flag_wins_over_environment_which_wins_over_default() -> None:
    env = {"REBUNO_LISTEN_ADDR": ":9000", "REBUNO_LOG_LEVEL": "debug"}
    settings = load_settings(dev=True, flags={"listen_addr": "127.0.0.1:9100"}, env=env)
    assert settings.listen_addr == "127.0.0.1:9100"
    assert settings.log_level == "debug"
    assert settings.log_format == "text"


def test_flag_given_as_none_falls_back_to_environment() -> None:
    settings = load_settings(
        dev=True, flags={"listen_addr": None}, env={"REBUNO_LISTEN_ADDR": ":1"}
    )
    assert settings.listen_addr == ":1"


def test_durations_use_go_syntax() -> None:
    env = {
        "REBUNO_DISPATCH_POLL_INTERVAL": "20ms",
        "REBUNO_DISPATCH_BACKOFF_BASE": "1.5s",
        "REBUNO_DISPATCH_BACKOFF_MAX": "1m30s",
        "REBUNO_DEADLINE_TIMEOUT": "2h",
        "REBUNO_SSE_KEEPALIVE": "50ms",
    }
    settings = load_settings(dev=True, flags={}, env=env)
    assert settings.dispatch_poll_interval == timedelta(milliseconds=20)
    assert settings.backoff_base == timedelta(seconds=1.5)
    assert settings.backoff_max == timedelta(seconds=90)
    assert settings.deadline_timeout == timedelta(hours=2)
    assert settings.sse_keepalive == timedelta(milliseconds=50)


def test_unparsable_environment_value_keeps_the_default_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"REBUNO_DISPATCH_TIMEOUT": "ten seconds", "REBUNO_DISPATCH_CONCURRENCY": "many"}
    with caplog.at_level(logging.WARNING):
        settings = load_settings(dev=True, flags={}, env=env)
    assert settings.dispatch_timeout == timedelta(seconds=30)
    assert settings.dispatch_concurrency == 8
    assert "REBUNO_DISPATCH_TIMEOUT" in caplog.text


def test_zero_dispatch_timeout_and_lease_mean_their_defaults() -> None:
    env = {"REBUNO_DISPATCH_TIMEOUT": "0", "REBUNO_DISPATCH_LEASE_TIMEOUT": "0s"}
    settings = load_settings(dev=True, flags={}, env=env)
    assert settings.dispatch_timeout == timedelta(seconds=30)
    assert settings.dispatch_lease_timeout == timedelta(minutes=2)


def test_zero_deadline_check_interval_is_kept() -> None:
    settings = load_settings(dev=True, flags={}, env={"REBUNO_DEADLINE_CHECK_INTERVAL": "0"})
    assert settings.deadline_check_interval == timedelta(0)


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("1", True), ("false", False)])
def test_booleans_accept_true_and_1(text: str, expected: bool) -> None:
    env = {"REBUNO_ACCEPT_BODY_SIGNATURES": text}
    assert load_settings(dev=True, flags={}, env=env).accept_body_signatures is expected


def test_a_server_refuses_body_signatures_unless_told_to() -> None:
    assert load_settings(dev=False, flags={}, env=SERVER_ENV).accept_body_signatures is False
    env = {**SERVER_ENV, "REBUNO_ACCEPT_BODY_SIGNATURES": "true"}
    assert load_settings(dev=False, flags={}, env=env).accept_body_signatures is True


def test_bad_flag_is_an_error_naming_the_flag() -> None:
    with pytest.raises(ValidationFailed, match="--listen-addr"):
        load_settings(dev=True, flags={"listen_addr": "nowhere"}, env={})


def test_bad_secret_flag_is_reported_without_its_value() -> None:
    with pytest.raises(ValidationFailed) as caught:
        load_settings(dev=True, flags={"db_url": "mysql://user:hunter2@db"}, env={})
    assert "hunter2" not in caught.value.message
    assert "--db-url" in caught.value.message


def test_server_without_database_url_is_refused() -> None:
    with pytest.raises(ValidationFailed) as caught:
        load_settings(dev=False, flags={"bearer_token": "tok"}, env={})
    assert caught.value.message == "REBUNO_DB_URL (--db-url) required in server mode"


def test_server_without_bearer_token_is_refused() -> None:
    with pytest.raises(ValidationFailed) as caught:
        load_settings(dev=False, flags={}, env={"REBUNO_DB_URL": "postgresql://db/x"})
    assert caught.value.message == "REBUNO_BEARER_TOKEN (--bearer-token) required in server mode"


def test_server_settings_come_from_the_environment() -> None:
    settings = load_settings(dev=False, flags={}, env=SERVER_ENV)
    assert settings.dev is False
    assert settings.bearer_token == "tok"
    assert settings.db_url == "postgresql://db/rebuno"


def test_server_listens_on_every_interface_by_default() -> None:
    assert load_settings(dev=False, flags={}, env=SERVER_ENV).listen_addr == ":8080"


def test_dev_ignores_a_configured_bearer_token() -> None:
    settings = load_settings(dev=True, flags={}, env={"REBUNO_BEARER_TOKEN": "tok"})
    assert settings.bearer_token is None


def test_replica_id_defaults_to_host_and_pid() -> None:
    settings = load_settings(dev=True, flags={}, env={})
    assert settings.replica_id
    assert settings.replica_id != Settings().replica_id


def test_typed_flag_values_are_accepted() -> None:
    flags = {"db_max_conns": 20, "otel_insecure": True, "otel_sample_rate": 0.25}
    settings = load_settings(dev=False, flags=flags, env=SERVER_ENV)
    assert settings.db_max_conns == 20
    assert settings.otel_insecure is True
    assert settings.otel_sample_rate == 0.25


@pytest.mark.parametrize(
    ("addr", "expected"),
    [(":8080", ("0.0.0.0", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:90", ("::1", 90))],
)
def test_listen_addr_splits_into_host_and_port(addr: str, expected: tuple[str, int]) -> None:
    assert split_listen_addr(addr) == expected


def test_workers_run_on_postgresql_only_and_dev_is_one_process() -> None:
    server = load_settings(dev=False, flags={"workers": "3"}, env=SERVER_ENV)
    assert server.workers == 3

    with pytest.raises(ValidationFailed, match="needs PostgreSQL"):
        load_settings(
            dev=False,
            flags={"workers": "2", "db_url": "sqlite:///kernel.db"},
            env=SERVER_ENV,
        )
    assert load_settings(dev=True, flags={}, env={"REBUNO_WORKERS": "4"}).workers == 1
