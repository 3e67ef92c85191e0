"""`rebuno policy check|test`: offline validation and trial decisions on policy bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rebuno.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"
SHELL_RULES = """
default_action: allow
rules:
  - id: no-rm
    when:
      target: shell_exec
      arguments:
        command: {regex: '\\brm\\s+-[a-z]*r'}
    then: {decision: deny, reason: recursive deletion is not allowed}
  - id: ops-only
    when: {target: deploy, agent_id: ops}
    then: {decision: require_approval, approval_config: {approvers: [alice]}}
"""


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    return code if isinstance(code, int) else 1


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "shell.yaml"
    path.write_text(SHELL_RULES)
    return path


def test_check_of_a_valid_bundle_counts_its_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "check", str(FIXTURES / "arguments.yaml")]) == 0
    assert capsys.readouterr().out == "ok: 4 rules (default: allow)\n"


def test_check_names_the_rule_and_field_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n  - id: typo\n    then: {decison: deny}\n")

    assert run(["policy", "check", str(path)]) == 1

    error = capsys.readouterr().err
    assert error == f"error: {path}: policy: rule 'typo': field 'then.decison': unknown field\n"


def test_check_of_a_missing_file_fails_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nothing.yaml"

    assert run(["policy", "check", str(missing)]) == 1
    assert capsys.readouterr().err == f"error: cannot read {missing}: No such file or directory\n"


def test_test_prints_the_denying_rule_and_its_reason(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--kind", "tool_call", "--target", "shell_exec", "--args", '{"command": "rm -rf /"}']

    assert run(["policy", "test", str(bundle), *args]) == 0

    assert capsys.readouterr().out.splitlines() == [
        "decision: deny",
        "rule: no-rm",
        "reason: recursive deletion is not allowed",
    ]


def test_test_falls_back_to_the_default_when_no_rule_matches(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--target", "shell_exec", "--args", '{"command": "ls"}', "--json"]

    assert run(["policy", "test", str(bundle), *args]) == 0

    assert json.loads(capsys.readouterr().out) == {
        "decision": "allow",
        "rule_id": "default",
        "reason": "default allow",
    }


def test_test_matches_agent_conditions_only_for_that_agent(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["policy", "test", str(bundle), "--target", "deploy", "--json"]

    assert run([*base, "--agent-id", "ops"]) == 0
    for_ops = json.loads(capsys.readouterr().out)
    assert run([*base, "--agent-id", "web"]) == 0
    for_web = json.loads(capsys.readouterr().out)

    assert (for_ops["decision"], for_ops["rule_id"]) == ("require_approval", "ops-only")
    assert for_ops["limits"] == {"approval": "by alice"}
    assert for_web["rule_id"] == "default"


def test_test_rejects_arguments_that_are_not_json(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "test", str(bundle), "--args", "{oops"]) == 2
    assert capsys.readouterr().err.startswith("error: --args is not valid JSON")
