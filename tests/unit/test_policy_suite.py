"""`rebuno.kernel.policy.suite`: the hash vector of §35.6, cases as written (normalised or
refused by position), cases from a recorded execution (the first decision, no expectation for
the kernel's own), and what a run reports."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rebuno.kernel.domain import step as steps
from rebuno.kernel.domain.identity import policy_hash
from rebuno.kernel.domain.records import Event, Execution
from rebuno.kernel.policy import load_bundle
from rebuno.kernel.policy.suite import (
    CaseInvalid,
    PolicyCase,
    load_case_file,
    read_case,
    replay_cases,
    run_cases,
)
from rebuno.protocol.enums import PolicyAction, StepKind, StepStatus
from tests.store.builders import event, execution, step

BUNDLE = """\
rules:
  - id: deny-rm
    when: {target: shell, arguments: {command: {contains: rm}}}
    then: {decision: deny}
  - id: never
    when: {target: nothing}
    then: {decision: allow}
default_action: allow
"""


def test_the_hash_is_sha256_of_the_exact_bytes() -> None:
    assert policy_hash("default_action: allow\n") == (
        "0973bfcee70676a2626eaac4f1e6e0656c5dfaaef9fa86a6f8680fb60e020454"
    )
    assert policy_hash("default_action: allow") != policy_hash("default_action: allow\n")


def test_a_case_takes_its_defaults_and_canonical_args() -> None:
    case = read_case(1, {"target": "t", "args": {"b": 1, "a": "x"}}, "agent")

    assert case == PolicyCase(target="t", agent_id="agent", args='{"a":"x","b":1}')
    assert case.label == 't {"a":"x","b":1}'


def test_a_null_field_counts_as_absent() -> None:
    case = read_case(1, {"target": "t", "args": None, "kind": None, "expect": None}, "a")

    assert (case.args, case.kind, case.expect) == (None, StepKind.TOOL_CALL, None)


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ({"target": ""}, "case 3: missing target"),
        (
            {"target": "t", "expect_rules": "r"},
            "case 3: unknown field 'expect_rules' (did you mean 'expect_rule'?)",
        ),
        (
            {"target": "t", "zzz": 1},
            "case 3: unknown field 'zzz'"
            " (known: agent_id, args, expect, expect_rule, kind, name, target)",
        ),
        ({"target": "t", "name": 5}, "case 3: name must be a string"),
        ({"target": "t\x00"}, "case 3: target must not contain a NUL character"),
    ],
    ids=["empty-target", "close-misspelling", "unknown", "name-not-text", "nul"],
)
def test_a_case_that_cannot_run_is_refused_by_its_position(
    item: dict[str, object], problem: str
) -> None:
    with pytest.raises(CaseInvalid) as refused:
        read_case(3, item, "a")

    assert refused.value.problem == problem
    assert refused.value.message == f"validation error: {problem}"


def test_a_run_reports_each_result_and_the_rules_no_case_reached() -> None:
    bundle = load_bundle(BUNDLE)
    cases = [
        PolicyCase(target="shell", args='{"command":"rm x"}', expect=PolicyAction.DENY),
        PolicyCase(target="shell", args='{"command":"ls"}', expect_rule="deny-rm"),
    ]

    report = run_cases(bundle, "h", cases)

    assert [result.result.rule_id for result in report.results] == ["deny-rm", "default"]
    assert [result.failure for result in report.results] == [None, "rule default, want deny-rm"]
    assert (report.failed, report.unexercised_rules, report.policy_hash) == (1, ("never",), "h")


def test_a_missed_decision_is_reported_before_a_missed_rule() -> None:
    case = PolicyCase(
        target="shell", args='{"command":"rm"}', expect=PolicyAction.ALLOW, expect_rule="x"
    )

    [result] = run_cases(load_bundle(BUNDLE), "h", [case]).results

    assert result.failure == "deny, want allow"


def test_the_case_file_names_the_agent_of_cases_that_name_none() -> None:
    text = "agent_id: web\ncases:\n  - {target: a}\n  - {target: b, agent_id: ops}\n"

    loaded = load_case_file(text, "flag")

    assert [case.agent_id for case in loaded.cases] == ["web", "ops"]
    assert [case.agent_id for case in load_case_file("cases: [{target: a}]", "flag").cases] == [
        "flag"
    ]


def test_the_case_file_reads_yaml_1_2_scalars() -> None:
    loaded = load_case_file("cases:\n  - {target: t, args: {flag: yes, n: 010}}\n")

    assert loaded.cases[0].args == '{"flag":"yes","n":10}'


# -- replay --------------------------------------------------------------------------------------
def decision(source: Execution, seq: int, kind: str, step_id: str, **payload: object) -> Event:
    return event(source.id, seq, type=kind, payload=json.dumps({"step_id": step_id, **payload}))


def test_a_replayed_step_expects_its_first_decision_and_names_its_rule() -> None:
    source = execution("a1")
    held = step(source.id, 0, status=StepStatus.SUCCEEDED)
    events = [
        decision(source, 2, "step.awaiting_approval", held.step_id, rule_id="gate"),
        decision(source, 5, "step.allowed", held.step_id),
    ]

    [case] = replay_cases(source, [held], events)

    assert case == PolicyCase(
        target=held.target,
        agent_id="a1",
        kind=held.kind,
        args=held.args,
        expect=PolicyAction.REQUIRE_APPROVAL,
        execution_id=source.id,
        step_id=held.step_id,
        was_rule="gate",
    )


@pytest.mark.parametrize(
    "payload",
    [
        {"rule_id": steps.INDETERMINATE_RETRY_RULE, "error": {"reason": "x"}},
        {"rule_id": "llm-budget", "error": {"reason": steps.BUDGET_EXCEEDED_REASON}},
    ],
    ids=["indeterminate-retry", "budget-spent"],
)
def test_a_kernel_decision_expects_nothing(payload: dict[str, object]) -> None:
    source = execution("a1")
    denied = step(source.id, 0, status=StepStatus.DENIED)

    [case] = replay_cases(
        source, [denied], [decision(source, 2, "step.denied", denied.step_id, **payload)]
    )

    assert case.expect is None
    assert case.was_rule == payload["rule_id"]


def test_args_that_are_not_an_object_are_left_out_and_a_step_without_decision_expects_nothing() -> (
    None
):
    source = execution("a1")
    listed = replace(step(source.id, 0), args="[1,2]")

    [case] = replay_cases(source, [listed], [])

    assert (case.args, case.expect, case.was_rule) == (None, None, "")


def test_replayed_cases_follow_proposal_order() -> None:
    source = execution("a1")
    first, second = step(source.id, 0), step(source.id, 1)
    events = [
        decision(source, 3, "step.denied", second.step_id, rule_id="r2"),
        decision(source, 2, "step.allowed", first.step_id, rule_id="r1"),
    ]

    cases = replay_cases(source, [first, second], events)

    assert [(c.step_id, c.expect, c.was_rule) for c in cases] == [
        (first.step_id, PolicyAction.ALLOW, "r1"),
        (second.step_id, PolicyAction.DENY, "r2"),
    ]
