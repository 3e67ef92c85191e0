"""`rebuno policy test` with case files (offline) and `--execution` (a kernel replays a
recorded execution), and `rebuno policy set` (§35.5): the table, the exit status, every
refusal as one line; and the examples' bundles, each covered by its case file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.polling import poll_until
from rebuno.cli.main import main
from tests.cli.conftest import GATED, Stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHELL = """\
rules:
  - id: allow-llm
    when: {step_kind: llm_call}
    then: {decision: allow}
  - id: allow-safe-shell
    when:
      target: shell_exec
      arguments:
        command: {regex: '^(ls|cat)( [^;&|]*)?$'}
    then: {decision: allow}
  - id: approve-other-shell
    when: {target: shell_exec}
    then: {decision: require_approval}
default_action: deny
"""
CASES = """\
agent_id: shell
cases:
  - name: safe
    target: shell_exec
    args: {command: ls /tmp}
    expect: allow
  - name: chained
    target: shell_exec
    args: {command: "ls; rm -rf /"}
    expect: deny
  - name: wrong rule
    target: shell_exec
    args: {command: cat f}
    expect_rule: approve-other-shell
"""


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    code = exited.value.code
    return code if isinstance(code, int) else 1


def lines(capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    captured = capsys.readouterr()
    return [line.rstrip() for line in captured.out.splitlines()], captured.err


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "shell.yaml"
    path.write_text(SHELL)
    return path


def write_cases(bundle: Path, text: str) -> Path:
    path = bundle.with_name("shell.policytest.yaml")
    path.write_text(text)
    return path


# -- the examples --------------------------------------------------------------------------
def example_bundles() -> list[Path]:
    """Every policy bundle of examples/: each YAML file that is neither the manifest nor a
    case file."""
    return sorted(
        path
        for path in EXAMPLES.glob("*.yaml")
        if path.name != "rebuno.yaml" and not path.name.endswith(".policytest.yaml")
    )


def test_the_examples_have_bundles_and_the_manifest_uses_them() -> None:
    assert [path.name for path in example_bundles()] == ["shell.yaml"]
    assert "policy_file: shell.yaml" in (EXAMPLES / "rebuno.yaml").read_text()


@pytest.mark.parametrize("path", example_bundles(), ids=lambda path: path.name)
def test_each_example_bundle_passes_its_case_file_and_every_rule_is_exercised(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "test", str(path), "--json"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0
    assert report["unexercised_rules"] == []
    assert all(result["expect"] for result in report["results"])


def test_a_wrong_expectation_on_an_example_fails_naming_the_case_and_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "shell.yaml"
    bundle.write_text((EXAMPLES / "shell.yaml").read_text())
    cases = (EXAMPLES / "shell.policytest.yaml").read_text()
    wrong = cases.replace(
        'args: { command: "rm -r /tmp/scratch" }\n    expect: require_approval',
        'args: { command: "rm -r /tmp/scratch" }\n    expect: allow',
    )
    assert wrong != cases
    (tmp_path / "shell.policytest.yaml").write_text(wrong)

    assert run(["policy", "test", str(bundle)]) == 1

    shown, _ = lines(capsys)
    [failed] = [line for line in shown if line.startswith("  FAIL")]
    assert failed.startswith("  FAIL  a deletion waits for a human  ")
    assert "require_approval, want allow" in failed
    assert failed.endswith("  other-commands-need-approval")
    assert shown[-1] == "  1 of 6 cases failed"


# -- the table -------------------------------------------------------------------------------
def test_the_table_shows_each_case_the_rules_never_reached_and_the_count(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cases(bundle, CASES)

    assert run(["policy", "test", str(bundle)]) == 1

    shown, err = lines(capsys)
    assert shown == [
        "  PASS  safe        allow                                            allow-safe-shell",
        "  FAIL  chained     require_approval, want deny                      approve-other-shell",
        "  FAIL  wrong rule  rule allow-safe-shell, want approve-other-shell  allow-safe-shell",
        "  rules never exercised: allow-llm",
        "  2 of 3 cases failed",
    ]
    assert err == ""


def test_all_cases_passing_exits_0(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_cases(bundle, "cases:\n  - {target: shell_exec, args: {command: ls}, expect: allow}\n")

    assert run(["policy", "test", str(bundle)]) == 0

    shown, _ = lines(capsys)
    assert shown[0] == '  PASS  shell_exec {"command":"ls"}  allow  allow-safe-shell'
    assert shown[-1] == "  1 case passed"


def test_a_long_label_is_cut_to_56_characters(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cases(bundle, f"cases:\n  - {{target: shell_exec, args: {{command: cat {'x' * 80}}}}}\n")

    assert run(["policy", "test", str(bundle)]) == 0

    shown, _ = lines(capsys)
    label = shown[0].split("  ")[2]
    assert len(label) == 56 and label.endswith("…")


def test_json_prints_the_report_and_still_exits_1_on_a_miss(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cases(bundle, CASES)

    assert run(["policy", "test", str(bundle), "--json"]) == 1

    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 2
    assert report["unexercised_rules"] == ["allow-llm"]
    assert len(report["policy_hash"]) == 64
    assert report["results"][0]["agent_id"] == "shell"


def test_a_case_s_agent_wins_over_the_file_s_and_the_file_s_over_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "ops.yaml"
    bundle.write_text(
        "rules:\n  - id: ops\n    when: {agent_id: ops}\n    then: {decision: allow}\n"
    )
    cases = tmp_path / "cases.yaml"
    cases.write_text("agent_id: web\ncases:\n  - {target: t, agent_id: ops}\n  - {target: t}\n")
    no_file_agent = tmp_path / "flag.yaml"
    no_file_agent.write_text("cases:\n  - {target: t}\n")

    assert (
        run(["policy", "test", str(bundle), "--cases", str(cases), "--json", "--agent-id", "x"])
        == 0
    )
    by_file = [r["agent_id"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert (
        run(
            [
                "policy",
                "test",
                str(bundle),
                "--cases",
                str(no_file_agent),
                "--json",
                "--agent-id",
                "ops",
            ]
        )
        == 0
    )
    by_flag = json.loads(capsys.readouterr().out)["results"]

    assert by_file == ["ops", "web"]
    assert (by_flag[0]["agent_id"], by_flag[0]["rule_id"]) == ("ops", "ops")


# -- refusals, each one line -------------------------------------------------------------------
def test_a_missing_default_case_file_names_it_and_the_alternatives(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "test", str(bundle)]) == 1

    expected = bundle.with_name("shell.policytest.yaml")
    assert capsys.readouterr().err == (
        f"error: no test cases: {expected} does not exist (write it, name another file with"
        " --cases, or probe one step with --target)\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no cases"),
        ("cases: []\n", "no cases"),
        ("agent_id: a\n", "no cases"),
        (
            "cases:\n  - {target: x, expects: allow}\n",
            "case 1: unknown field 'expects' (did you mean 'expect'?)",
        ),
        ("cases:\n  - {target: x}\n  - {name: n}\n", "case 2: missing target"),
        ("case:\n  - {target: x}\n", "unknown field 'case' (did you mean 'cases'?)"),
        ("cases: {target: x}\n", "cases must be a list"),
        (
            "cases:\n  - {target: x, expect: yes}\n",
            "case 1: expect must be one of allow, deny, require_approval (got 'yes')",
        ),
        ("cases: [\n", "line 2, column 1: invalid YAML: "),
    ],
    ids=[
        "empty",
        "empty-list",
        "no-cases-key",
        "misspelt-expect",
        "missing-target",
        "unknown-top-level",
        "cases-not-a-list",
        "yaml-1.2-yes",
        "not-yaml",
    ],
)
def test_a_case_file_that_cannot_run_is_one_error_line(
    bundle: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    cases = write_cases(bundle, text)

    assert run(["policy", "test", str(bundle)]) == 1

    err = capsys.readouterr().err
    assert err.startswith(f"error: {cases}: {message}")
    assert err.count("\n") == 1


def test_the_bundle_is_compiled_before_the_cases_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "bad.yaml"
    bundle.write_text("rules: 5\n")

    assert run(["policy", "test", str(bundle)]) == 1

    assert capsys.readouterr().err == (
        f"error: {bundle}: policy, line 1: field 'rules': must be a list, not an integer\n"
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--execution", "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"],
        ["--execution", "01937a6e", "--agent-id", "a"],
        ["--execution", "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f", "--agent-id", "a", "--target", "t"],
        ["--execution", "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f", "--agent-id", "a", "--cases", "c"],
        ["--args", "{}"],
        ["--target", "t", "--cases", "c"],
    ],
    ids=[
        "no-agent",
        "short-id",
        "with-target",
        "with-cases",
        "args-without-target",
        "probe-and-cases",
    ],
)
def test_flags_that_do_not_go_together_are_a_usage_error(
    bundle: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    assert run(["policy", "test", str(bundle), *flags]) == 2

    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_a_probe_still_prints_one_decision(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run(
            ["policy", "test", str(bundle), "--target", "shell_exec", "--args", '{"command": "rm"}']
        )
        == 0
    )

    shown, _ = lines(capsys)
    assert shown == ["decision: require_approval", "rule: approve-other-shell", "reason: -"]


# -- against a kernel: --execution and set -----------------------------------------------------
def create(stack: Stack, agent_id: str, body: dict[str, Any]) -> str:
    response = httpx.post(
        f"{stack.url}/v0/executions", json={"agent_id": agent_id, "input": body}, timeout=10
    )
    assert response.status_code == 201, response.text
    execution_id: str = response.json()["id"]
    return execution_id


def wait_for(stack: Stack, execution_id: str, status: str) -> None:
    def reached() -> bool:
        found = httpx.get(f"{stack.url}/v0/executions/{execution_id}", timeout=10).json()
        return bool(found["status"] == status)

    poll_until(reached, 20, f"execution {execution_id} to be {status}")


@pytest.fixture(scope="module")
def granted(stack: Stack) -> str:
    """A `gated` execution whose shell step was held by `review-shell`, then granted."""
    execution_id = create(stack, "gated", {"command": "ls"})
    wait_for(stack, execution_id, "blocked")
    [approval] = httpx.get(
        f"{stack.url}/v0/approvals", params={"execution_id": execution_id}, timeout=10
    ).json()
    grant = httpx.post(
        f"{stack.url}/v0/approvals/{approval['id']}/grant", json={"decided_by": "alice"}, timeout=10
    )
    assert grant.status_code == 204, grant.text
    wait_for(stack, execution_id, "completed")
    return execution_id


def replay(stack: Stack, bundle: Path, agent_id: str, execution_id: str, *flags: str) -> list[str]:
    argv = ["policy", "test", str(bundle), "--execution", execution_id, "--agent-id", agent_id]
    return [*argv, "--url", stack.url, *flags]


def test_replaying_through_the_bundle_that_decided_passes(
    stack: Stack, granted: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "gated.yaml"
    bundle.write_text(GATED.strip())

    assert run(replay(stack, bundle, "gated", granted)) == 0

    shown, _ = lines(capsys)
    assert shown == [
        '  PASS  shell_exec {"command":"ls"}  require_approval  review-shell',
        "  1 case passed",
    ]


def test_replaying_a_held_step_through_a_bundle_that_allows_it_fails(
    stack: Stack, granted: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "open.yaml"
    bundle.write_text("default_action: allow\n")

    assert run(replay(stack, bundle, "gated", granted, "--json")) == 1

    [result] = json.loads(capsys.readouterr().out)["results"]
    assert (result["expect"], result["was_rule"]) == ("require_approval", "review-shell")
    assert result["execution_id"] == granted and len(result["step_id"]) == 64
    assert result["failure"] == "allow, want require_approval"


def test_a_stricter_bundle_names_the_steps_it_would_deny(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    execution_id = create(stack, "greeter", {"name": "ada"})
    wait_for(stack, execution_id, "completed")
    bundle = tmp_path / "strict.yaml"
    bundle.write_text(
        "rules:\n  - id: no-shouting\n    when: {target: shout}\n"
        "    then: {decision: deny}\ndefault_action: allow\n"
    )

    assert run(replay(stack, bundle, "greeter", execution_id)) == 1

    shown, _ = lines(capsys)
    assert shown == [
        '  FAIL  shout {"text":"hello ada"}  deny, want allow  no-shouting',
        "  1 of 1 case failed",
    ]


def test_replaying_an_unknown_execution_is_one_error_line(
    stack: Stack, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "01937a6e-2f1c-7b3d-9e4f-5a6b7c8d9e0f"

    assert run(replay(stack, bundle, "gated", unknown)) == 1

    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith("(not_found)\n") and err.count("\n") == 1


def test_set_loads_a_bundle_onto_an_agent(
    stack: Stack, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "set", "streamer", str(bundle), "--url", stack.url]) == 0

    shown, _ = lines(capsys)
    assert shown == [f"  loaded {len(SHELL.encode())} bytes onto streamer"]
    agent = httpx.get(f"{stack.url}/v0/agents/streamer", timeout=10).json()
    assert agent["policy_bundle"] == SHELL
    httpx.post(f"{stack.url}/v0/policies/streamer", json={"bundle": ""}, timeout=10)


def test_set_refuses_a_bundle_that_does_not_compile_before_sending_it(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "bad.yaml"
    bundle.write_text("rules: 5\n")

    assert run(["policy", "set", "ghost", str(bundle), "--url", "http://127.0.0.1:9"]) == 1

    assert capsys.readouterr().err.startswith(f"error: {bundle}: policy, line 1")


def test_set_onto_an_unknown_agent_is_one_error_line(
    stack: Stack, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "set", "ghost", str(bundle), "--url", stack.url]) == 1

    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith("(not_found)\n")
