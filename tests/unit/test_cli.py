"""The `rebuno` command line: version, one-line errors and their exit codes."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rebuno.cli.logs import JsonFormatter, configure_logging
from rebuno.cli.main import main, package_version


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """`rebuno` configures the root logger; give it back to pytest afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _no_rebuno_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REBUNO_DB_URL", "REBUNO_BEARER_TOKEN", "REBUNO_LISTEN_ADDR"):
        monkeypatch.delenv(name, raising=False)


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    return code if isinstance(code, int) else 1


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["version"]) == 0
    assert capsys.readouterr().out == f"rebuno {package_version()}\n"


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_flag_prints_the_package_version(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    assert run([flag]) == 0
    assert capsys.readouterr().out == f"rebuno, version {package_version()}\n"


def test_bare_rebuno_prints_its_help_and_no_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("Usage: rebuno")
    assert "error" not in printed.out + printed.err


def test_server_without_database_url_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["server", "--bearer-token", "t"]) == 2
    assert capsys.readouterr().err == "error: REBUNO_DB_URL (--db-url) required in server mode\n"


def test_server_without_bearer_token_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["server", "--db-url", "postgresql://db/x"]) == 2
    expected = "error: REBUNO_BEARER_TOKEN (--bearer-token) required in server mode\n"
    assert capsys.readouterr().err == expected


def test_bad_flag_value_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["dev", "--listen-addr", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--listen-addr" in err
    assert err.count("\n") == 1


def test_unknown_option_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["dev", "--frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--frobnicate" in err
    assert err.count("\n") == 1


def test_bad_manifest_exits_1_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["dev", "--db-url", f"sqlite:///{tmp_path}/k.db", "--listen-addr", "127.0.0.1:0"]
    assert run([*argv, "--config", str(tmp_path / "absent.yaml")]) == 1
    err = capsys.readouterr().err
    assert "error: cannot read manifest" in err
    assert "Traceback" not in err


def test_port_in_use_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["dev", "--db-url", f"sqlite:///{tmp_path}/k.db", "--listen-addr"]
        assert run([*argv, f"127.0.0.1:{port}"]) == 1
    assert f"error: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_json_log_lines_carry_level_logger_message_and_extras() -> None:
    record = logging.LogRecord("rebuno.kernel", logging.WARNING, __file__, 1, "hi %s", ("x",), None)
    record.execution_id = "e1"
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["message"]) == ("warning", "rebuno.kernel", "hi x")
    assert line["execution_id"] == "e1"


def test_configure_logging_sets_level_and_one_stderr_handler() -> None:
    configure_logging("warn", "json")
    root = logging.getLogger()
    assert root.level == logging.WARNING
    assert len(root.handlers) == 1
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
    assert isinstance(handler.formatter, JsonFormatter)
