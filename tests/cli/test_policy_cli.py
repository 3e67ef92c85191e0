"""`rebuno policy check|test`, offline: every validation error names its rule and field; `test`
prints the decision, rule id and reason however the decision is reached; and every bundle and
command in docs/policy.md runs as written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from rebuno.cli.main import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"
R = "rules:\n  - id: r\n"
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
LIMITS = """
default_action: deny
rules:
  - id: pay-review
    when: {target: "payments.*"}
    then:
      decision: require_approval
      reason: payments are reviewed
      approval_config: {approvers: [alice, bob], timeout: 30m}
  - id: search-quota
    when: {target: web_search}
    then:
      decision: allow
      reason: searches are cheap
      rate_limit: {max_calls: 10, window: 1m, per_what: agent, max_wait: 30s}
  - id: llm-budget
    when: {step_kind: llm_call}
    then:
      decision: allow
      reason: within budget
      budget: {max_tokens: 200000, on_exceed: require_approval}
  - id: no-shell
    when: {target: shell}
    then: {decision: deny}
"""

# Each problem a bundle can have, and the exact message `policy check` prints for it.
INVALID = {
    "unknown-top-level-field": (
        "defaults: allow\n",
        "policy, line 1: field 'defaults': unknown field (did you mean 'default_action'?)",
    ),
    "rules-not-a-list": (
        "rules: {id: r}\n",
        "policy, line 1: field 'rules': must be a list, not a mapping",
    ),
    "top-level-not-a-mapping": (
        "- id: r\n",
        "policy, line 1: the top level must be a mapping, not a list",
    ),
    "rule-not-a-mapping": (
        "rules: [5]\n",
        "policy, line 1: rule #1: must be a mapping, not an integer",
    ),
    "rule-without-id": (
        "rules:\n  - then: {decision: deny}\n",
        "policy, line 2: rule #1: field 'id': required",
    ),
    "id-not-a-string": (
        "rules:\n  - id: 5\n    then: {decision: deny}\n",
        "policy, line 2: rule #1: field 'id': must be a string, not an integer (quote it)",
    ),
    "duplicate-id": (
        "rules:\n  - id: a\n    then: {decision: deny}\n  - id: a\n    then: {decision: allow}\n",
        "policy, line 4: rule 'a': field 'id': duplicate id (rule #1 has it too)",
    ),
    "unknown-rule-field": (
        R + "    then: {decision: deny}\n    unless: {}\n",
        "policy, line 4: rule 'r': field 'unless': unknown field (known: id, priority, then, when)",
    ),
    "unknown-when-field": (
        R + "    when: {taget: shell}\n    then: {decision: deny}\n",
        "policy, line 3: rule 'r': field 'when.taget': unknown field (did you mean 'target'?)",
    ),
    "unknown-predicate-field": (
        R + "    when: {arguments: {cmd: {matches: x}}}\n    then: {decision: deny}\n",
        "policy, line 3: rule 'r': field 'when.arguments.cmd.matches': unknown field"
        " (known: contains, equals, one_of, regex)",
    ),
    "unknown-rate-limit-field": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, burst: 2}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.burst': unknown field"
        " (known: max_calls, max_wait, on_limiter_error, per_what, window)",
    ),
    "when-not-a-mapping": (
        R + "    when: [shell]\n    then: {decision: deny}\n",
        "policy, line 3: rule 'r': field 'when': must be a mapping, not a list",
    ),
    "priority-missing-on-one-rule": (
        "rules:\n  - id: a\n    priority: 1\n    then: {decision: deny}\n"
        "  - id: b\n    then: {decision: allow}\n",
        "policy, line 5: rule 'b': field 'priority': missing, but rule 'a' has one;"
        " give every rule a priority, or none",
    ),
    "priority-given-on-one-rule": (
        "rules:\n  - id: a\n    then: {decision: deny}\n"
        "  - id: b\n    priority: 1\n    then: {decision: allow}\n",
        "policy, line 5: rule 'b': field 'priority': given, but rule 'a' has none;"
        " give every rule a priority, or none",
    ),
    "duplicate-priority": (
        "rules:\n  - id: a\n    priority: 1\n    then: {decision: deny}\n"
        "  - id: b\n    priority: 1\n    then: {decision: allow}\n",
        "policy, line 6: rule 'b': field 'priority': duplicate priority 1 (rule 'a' has it too)",
    ),
    "priority-as-a-string": (
        R + '    priority: "1"\n    then: {decision: deny}\n',
        "policy, line 3: rule 'r': field 'priority': must be an integer, not a string",
    ),
    "step-kind-outside-its-set": (
        R + "    when: {step_kind: tool}\n    then: {decision: deny}\n",
        "policy, line 3: rule 'r': field 'when.step_kind': must be one of tool_call, llm_call,"
        " local"
        " (got 'tool')",
    ),
    "decision-missing": (
        R + "    then: {reason: why}\n",
        "policy, line 3: rule 'r': field 'then.decision': must be one of allow, deny,"
        " require_approval"
        " (missing)",
    ),
    "decision-outside-its-set": (
        R + "    then: {decision: block}\n",
        "policy, line 3: rule 'r': field 'then.decision': must be one of allow, deny,"
        " require_approval"
        " (got 'block')",
    ),
    "yaml-1.2-yes-is-a-string": (
        R + "    then: {decision: yes}\n",
        "policy, line 3: rule 'r': field 'then.decision': must be one of allow, deny,"
        " require_approval"
        " (got 'yes')",
    ),
    "per-what-outside-its-set": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, per_what: user}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.per_what': must be one of execution,"
        " agent,"
        " global (got 'user')",
    ),
    "on-limiter-error-outside-its-set": (
        R + "    then:\n      decision: allow\n"
        "      rate_limit: {max_calls: 1, window: 1m, on_limiter_error: retry}\n",
        "policy, line 5: rule 'r': field 'then.rate_limit.on_limiter_error': must be one of allow,"
        " deny"
        " (got 'retry')",
    ),
    "on-exceed-outside-its-set": (
        R + "    then: {decision: allow, budget: {max_tokens: 5, on_exceed: allow}}\n",
        "policy, line 3: rule 'r': field 'then.budget.on_exceed': must be one of deny,"
        " require_approval"
        " (got 'allow')",
    ),
    "malformed-target-glob": (
        R + '    when: {target: "tools/[a-"}\n    then: {decision: deny}\n',
        "policy, line 3: rule 'r': field 'when.target': malformed glob 'tools/[a-': unterminated"
        " character class",
    ),
    "malformed-targets-glob": (
        R + '    when: {targets: [ok, "bad\\\\"]}\n    then: {decision: deny}\n',
        # The pattern is quoted as a Python literal: its one backslash prints as two.
        "policy, line 3: rule 'r': field 'when.targets[1]': malformed glob 'bad\\\\': trailing"
        " backslash",
    ),
    "regex-outside-re2": (
        R + '    when: {arguments: {cmd: {regex: "(?<=x)y"}}}\n    then: {decision: deny}\n',
        "policy, line 3: rule 'r': field 'when.arguments.cmd.regex': invalid regular expression"
        " (RE2 syntax): invalid perl operator: (?<=",
    ),
    "argument-without-constraint": (
        R + '    when: {arguments: {cmd: {equals: "", one_of: []}}}\n    then: {decision: deny}\n',
        "policy, line 3: rule 'r': field 'when.arguments.cmd': needs at least one of equals,"
        " contains,"
        " one_of, regex",
    ),
    "constraint-not-a-string": (
        R + "    when: {arguments: {n: {equals: 5}}}\n    then: {decision: deny}\n",
        "policy, line 3: rule 'r': field 'when.arguments.n.equals': must be a string, not an"
        " integer"
        " (quote it)",
    ),
    "max-calls-below-one": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 0, window: 1m}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.max_calls': must be an integer >= 1 (got"
        " 0)",
    ),
    "max-calls-missing": (
        R + "    then: {decision: allow, rate_limit: {window: 1m}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.max_calls': required: an integer >= 1",
    ),
    "max-calls-as-a-string": (
        R + '    then: {decision: allow, rate_limit: {max_calls: "5", window: 1m}}\n',
        "policy, line 3: rule 'r': field 'then.rate_limit.max_calls': must be an integer, not a"
        " string",
    ),
    "window-zero": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 0s}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.window': must be a positive duration",
    ),
    "window-missing": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.window': required: a Go duration such as"
        " '1m'",
    ),
    "window-bare-number": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 60}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.window': must be a Go duration string"
        " such as"
        " '30s', not an integer",
    ),
    "window-in-days": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 1d}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.window': invalid duration '1d': unknown"
        " unit"
        " 'd' (use ns, us, µs, ms, s, m or h)",
    ),
    "max-wait-negative": (
        R + "    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, max_wait: -1s}}\n",
        "policy, line 3: rule 'r': field 'then.rate_limit.max_wait': must not be negative",
    ),
    "max-tokens-below-one": (
        R + "    then: {decision: allow, budget: {max_tokens: 0}}\n",
        "policy, line 3: rule 'r': field 'then.budget.max_tokens': must be an integer >= 1 (got 0)",
    ),
    "approval-timeout-not-positive": (
        R + "    then: {decision: require_approval, approval_config: {timeout: 0s}}\n",
        "policy, line 3: rule 'r': field 'then.approval_config.timeout': must be a positive"
        " duration",
    ),
    "approver-not-a-string": (
        R + "    then: {decision: require_approval, approval_config: {approvers: [alice, 5]}}\n",
        "policy, line 3: rule 'r': field 'then.approval_config.approvers[1]': must be a string,"
        " not an"
        " integer (quote it)",
    ),
    "reason-as-a-number": (
        R + "    then: {decision: deny, reason: 404}\n",
        "policy, line 3: rule 'r': field 'then.reason': must be a string, not an integer (quote"
        " it)",
    ),
    "reason-as-a-boolean": (
        R + "    then: {decision: deny, reason: true}\n",
        "policy, line 3: rule 'r': field 'then.reason': must be a string, not a boolean (quote it)",
    ),
}


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    return code if isinstance(code, int) else 1


@pytest.fixture
def limits(tmp_path: Path) -> Path:
    path = tmp_path / "limits.yaml"
    path.write_text(LIMITS)
    return path


@pytest.mark.parametrize(("text", "message"), INVALID.values(), ids=INVALID.keys())
def test_check_names_the_rule_and_field_of_each_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(text)

    assert run(["policy", "check", str(path)]) == 1

    assert capsys.readouterr() == ("", f"error: {path}: {message}\n")


def test_check_reports_yaml_that_does_not_parse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text("rules: [\n")

    assert run(["policy", "check", str(path)]) == 1

    assert capsys.readouterr().err.startswith(
        f"error: {path}: policy, line 2, column 1: invalid YAML: expected the node content"
    )


@pytest.mark.parametrize(
    ("argv", "decision", "rule", "reason"),
    [
        (
            ["--target", "payments.refund"],
            "require_approval",
            "pay-review",
            "payments are reviewed",
        ),
        (["--target", "web_search"], "allow", "search-quota", "searches are cheap"),
        (["--kind", "llm_call", "--target", "gpt-4o"], "allow", "llm-budget", "within budget"),
        (["--target", "shell"], "deny", "no-shell", "policy_denied"),
        (["--kind", "local", "--target", "clock"], "allow", "local", "local step"),
        (["--target", "deploy"], "deny", "default", "no explicit allow rule matched"),
    ],
    ids=["approval", "rate-limited-allow", "budgeted-allow", "deny", "local", "default"],
)
def test_test_prints_decision_rule_and_reason(
    limits: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    decision: str,
    rule: str,
    reason: str,
) -> None:
    assert run(["policy", "test", str(limits), *argv]) == 0

    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines[:3] == [f"decision: {decision}", f"rule: {rule}", f"reason: {reason}".rstrip()]


@pytest.mark.parametrize(
    ("argv", "name", "start"),
    [
        (["--target", "payments.refund"], "approval", "by alice, bob, times out after "),
        (["--target", "web_search"], "rate limit", "10 per "),
        (
            ["--kind", "llm_call", "--target", "gpt-4o"],
            "token budget",
            "200000 tokens, then require_approval (not applied here)",
        ),
    ],
    ids=["approval", "rate-limit", "token-budget"],
)
def test_test_lists_the_limits_of_the_deciding_rule(
    limits: Path, capsys: pytest.CaptureFixture[str], argv: list[str], name: str, start: str
) -> None:
    assert run(["policy", "test", str(limits), *argv, "--json"]) == 0

    shown = json.loads(capsys.readouterr().out)["limits"]
    assert list(shown) == [name]
    assert shown[name].startswith(start)


def test_test_refuses_a_bundle_that_does_not_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(R + "    when: {taget: shell}\n    then: {decision: deny}\n")

    assert run(["policy", "test", str(path), "--target", "shell"]) == 1

    message = "policy, line 3: rule 'r': field 'when.taget': unknown field (did you mean 'target'?)"
    assert capsys.readouterr() == ("", f"error: {path}: {message}\n")


# -- docs/policy.md ------------------------------------------------------------------------

_YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
_CONSOLE_BLOCK = re.compile(r"```console\n(.*?)```", re.S)
_FILE_NAME = re.compile(r"# (\S+\.yaml)\n")


def doc_files() -> list[str]:
    """Every YAML block of the guide: bundles, and the case files named after them."""
    return _YAML_BLOCK.findall(DOC.read_text(encoding="utf-8"))


def doc_bundles() -> list[str]:
    """The guide's bundles: its YAML blocks but the case files."""
    return [text for text in doc_files() if not _is_case_file(text)]


def _is_case_file(text: str) -> bool:
    named = _FILE_NAME.match(text)
    return named is not None and named.group(1).endswith(".policytest.yaml")


def doc_sessions() -> list[tuple[str, str]]:
    """Each `$ rebuno ...` command of the guide's console blocks with the output it shows."""
    sessions: list[tuple[str, str]] = []
    for block in _CONSOLE_BLOCK.findall(DOC.read_text(encoding="utf-8")):
        for chunk in block.split("$ ")[1:]:
            command, _, output = chunk.partition("\n")
            sessions.append((command, output))
    return sessions


@pytest.mark.parametrize(
    "bundle", doc_bundles(), ids=[f"example-{n}" for n in range(1, len(doc_bundles()) + 1)]
)
def test_every_bundle_in_the_policy_guide_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bundle: str
) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(bundle)

    assert run(["policy", "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


@pytest.mark.parametrize(
    ("command", "output"), doc_sessions(), ids=[command for command, _ in doc_sessions()]
)
def test_every_command_in_the_policy_guide_prints_what_it_shows(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    output: str,
) -> None:
    for bundle in doc_files():
        named = _FILE_NAME.match(bundle)
        if named:
            (tmp_path / named.group(1)).write_text(bundle)
    monkeypatch.chdir(tmp_path)
    program, *argv = shlex.split(command)

    code = run(argv)

    captured = capsys.readouterr()
    shown = [line.rstrip() for line in (captured.out + captured.err).splitlines()]
    assert (program, code) == ("rebuno", 1 if output.startswith("error:") else 0)
    assert shown == output.splitlines()


def test_the_policy_guide_shows_commands_to_try_its_bundles() -> None:
    assert len(doc_sessions()) >= 2


# -- check and test on a shell-rules bundle and the shared fixtures --------------------------
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
    assert error == (
        f"error: {path}: policy, line 3: rule 'typo': field 'then.decison': unknown field"
        " (did you mean 'decision'?)\n"
    )


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
