"""Policy evaluation: which rule decides a new step, and what it returns (§14.4-§14.6)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from textwrap import dedent, indent

import pytest

from rebuno.kernel.policy import (
    PERMISSIVE,
    ApprovalConfig,
    Budget,
    Bundle,
    PolicyResult,
    RateLimit,
    bundle_error,
    load_bundle,
)
from rebuno.protocol.enums import PolicyAction, StepKind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "policies"

TOOL = StepKind.TOOL_CALL
LLM = StepKind.LLM_CALL
LOCAL = StepKind.LOCAL


def bundle(text: str) -> Bundle:
    return load_bundle(dedent(text))


def fixture(name: str) -> Bundle:
    return load_bundle((FIXTURES / name).read_text())


def one_rule(when: str, args: object = None) -> str:
    """Evaluate a tool call against a bundle with one allow rule; return the deciding rule."""
    conditions = indent(dedent(when).strip(), " " * 6)
    policy = load_bundle(
        f"rules:\n  - id: r\n    when:\n{conditions}\n    then: {{decision: allow}}"
    )
    return policy.evaluate("agent", TOOL, "t", json.dumps(args)).rule_id


def reference_bundle() -> Bundle:
    """The §14.2 example, with a `targets` entry that `gpt-*` targets can also satisfy."""
    text = (FIXTURES / "reference_format.yaml").read_text()
    return load_bundle(text.replace('targets: ["a", "b_*"]', 'targets: ["a", "*-a"]'))


def decide(policy: Bundle, target: str, args: object = None, kind: StepKind = TOOL) -> str:
    return policy.evaluate("agent", kind, target, json.dumps(args)).rule_id


# Fallbacks


def test_agent_without_bundle_is_permissive() -> None:
    fields = (PERMISSIVE.action, PERMISSIVE.reason, PERMISSIVE.rule_id)

    assert fields == (PolicyAction.ALLOW, "no policy bundle", "permissive")


def test_bundle_error_denies_with_its_reason() -> None:
    result = bundle_error("policy_bundle_invalid")

    assert result == PolicyResult(PolicyAction.DENY, "policy_bundle_invalid", "bundle-error")


def test_unmatched_step_gets_default_deny() -> None:
    result = bundle("rules: []").evaluate("agent", TOOL, "anything", None)

    assert result == PolicyResult(PolicyAction.DENY, "no explicit allow rule matched", "default")


def test_unmatched_step_gets_default_allow() -> None:
    result = bundle("default_action: allow").evaluate("agent", LLM, "gpt-4o", None)

    assert result == PolicyResult(PolicyAction.ALLOW, "default allow", "default")


@pytest.mark.parametrize("value", ["deny", "Allow", "ALLOW", "yes", "no", "permit", '""'])
def test_default_action_other_than_allow_denies(value: str) -> None:
    result = bundle(f"default_action: {value}").evaluate("agent", TOOL, "t", None)

    assert (result.action, result.rule_id) == (PolicyAction.DENY, "default")


def test_unmatched_local_step_is_allowed_even_under_default_deny() -> None:
    result = bundle("default_action: deny").evaluate("agent", LOCAL, "step", None)

    assert result == PolicyResult(PolicyAction.ALLOW, "local step", "local")


def test_rule_matching_local_step_overrides_local_fallback() -> None:
    policy = bundle(
        """
        rules:
          - id: no-local
            when: {step_kind: local}
            then: {decision: deny}
        """
    )

    assert policy.evaluate("agent", LOCAL, "step", None).action is PolicyAction.DENY


# Order


def test_first_matching_rule_in_file_order_decides() -> None:
    policy = fixture("file_order.yaml")

    assert decide(policy, "shell") == "deny-shell"
    assert decide(policy, "payments.send") == "review-payments"
    assert decide(policy, "refunds.issue") == "review-payments"
    assert decide(policy, "web_search") == "allow-everything-else"


def test_rules_with_priorities_run_in_ascending_priority() -> None:
    policy = fixture("priorities.yaml")

    shell = policy.evaluate("researcher", TOOL, "shell", None)

    assert (shell.rule_id, shell.action, shell.reason) == (
        "deny-shell",
        PolicyAction.DENY,
        "no shell access",
    )
    assert decide(policy, "read_file") == "allow-tools"
    assert [rule.id for rule in policy.rules] == ["deny-shell", "allow-tools", "allow-llm"]


def test_negative_priorities_sort_first() -> None:
    policy = bundle(
        """
        rules:
          - {id: late, priority: 0, then: {decision: allow}}
          - {id: early, priority: -3, then: {decision: deny}}
        """
    )

    assert decide(policy, "x") == "early"


# Conditions


def test_empty_when_matches_every_step() -> None:
    policy = bundle(
        """
        rules:
          - id: all
            when: {}
            then: {decision: deny}
        """
    )

    assert {decide(policy, "a", kind=kind) for kind in StepKind} == {"all"}


def test_absent_when_matches_every_step() -> None:
    policy = bundle("rules: [{id: all, then: {decision: require_approval}}]")

    result = policy.evaluate("agent", LLM, "gpt", None)

    assert (result.rule_id, result.action) == ("all", PolicyAction.REQUIRE_APPROVAL)


@pytest.mark.parametrize(("kind", "expected"), [(TOOL, "r"), (LLM, "default"), (LOCAL, "local")])
def test_step_kind_matches_exactly(kind: StepKind, expected: str) -> None:
    policy = bundle("rules: [{id: r, when: {step_kind: tool_call}, then: {decision: allow}}]")

    assert decide(policy, "t", kind=kind) == expected


@pytest.mark.parametrize(
    ("pattern", "target", "matches"),
    [
        ("shell", "shell", True),
        ("shell", "shell2", False),
        ("gpt-*", "gpt-4o", True),
        ("gpt-*", "claude", False),
        ("mcp/*", "mcp/files/read", True),
        ("read_?", "read_/", True),
        ("a[b]", "ab", True),
        ("a[b]", "a[b]", True),
        ("a[b]", "a[c]", False),
    ],
)
def test_target_equals_or_glob_matches(pattern: str, target: str, matches: bool) -> None:
    policy = bundle(f"rules: [{{id: r, when: {{target: '{pattern}'}}, then: {{decision: allow}}}}]")

    assert (decide(policy, target) == "r") is matches


@pytest.mark.parametrize(("target", "expected"), [("a", "r"), ("b_1", "r"), ("c", "default")])
def test_any_of_targets_matches(target: str, expected: str) -> None:
    policy = bundle("rules: [{id: r, when: {targets: [a, 'b_*']}, then: {decision: allow}}]")

    assert decide(policy, target) == expected


@pytest.mark.parametrize(("target", "expected"), [("gpt-4", "r"), ("gpt-3", "default")])
def test_target_and_targets_must_both_match(target: str, expected: str) -> None:
    policy = bundle(
        "rules: [{id: r, when: {target: 'gpt-*', targets: ['*-4']}, then: {decision: allow}}]"
    )

    assert decide(policy, target) == expected


@pytest.mark.parametrize(
    ("agent", "expected"), [("researcher", "r"), ("Researcher", "default"), ("writer", "default")]
)
def test_agent_id_matches_exactly(agent: str, expected: str) -> None:
    policy = bundle("rules: [{id: r, when: {agent_id: researcher}, then: {decision: allow}}]")

    assert policy.evaluate(agent, TOOL, "t", None).rule_id == expected


@pytest.mark.parametrize(
    ("agent", "expected"), [("researcher", "r"), ("writer", "r"), ("editor", "default")]
)
def test_agent_ids_match_membership(agent: str, expected: str) -> None:
    policy = bundle(
        "rules: [{id: r, when: {agent_ids: [researcher, writer]}, then: {decision: allow}}]"
    )

    assert policy.evaluate(agent, TOOL, "t", None).rule_id == expected


@pytest.mark.parametrize(("agent", "expected"), [("writer", "r"), ("researcher", "default")])
def test_agent_id_and_agent_ids_must_both_match(agent: str, expected: str) -> None:
    policy = bundle(
        "rules: [{id: r, when: {agent_id: writer, agent_ids: [writer, x]},"
        " then: {decision: allow}}]"
    )

    assert policy.evaluate(agent, TOOL, "t", None).rule_id == expected


def test_all_conditions_must_hold_together() -> None:
    policy = reference_bundle()

    matching = policy.evaluate("researcher", LLM, "gpt-a", '{"command": "ls"}')
    wrong_kind = policy.evaluate("researcher", TOOL, "gpt-a", '{"command": "ls"}')

    assert (matching.rule_id, wrong_kind.rule_id) == ("cap-llm", "default")


# Arguments


@pytest.mark.parametrize(
    ("predicate", "value", "matches"),
    [
        ("{equals: ls}", "ls", True),
        ("{equals: ls}", "ls -la", False),
        ("{contains: rm}", "sudo rm -rf /", True),
        ("{contains: rm}", "ls", False),
        ("{one_of: [ls, pwd]}", "pwd", True),
        ("{one_of: [ls, pwd]}", "cd", False),
        ("{one_of: ['']}", "", True),
        ("{regex: 'rm\\s+-rf'}", "sudo rm  -rf /", True),
        ("{regex: '^ls$'}", "ls -la", False),
        ("{regex: 'l+'}", "hello", True),
        ("{regex: '(?i)^LS'}", "ls", True),
        ("{equals: ls, contains: s, one_of: [ls], regex: '^l'}", "ls", True),
        ("{equals: ls, contains: x}", "ls", False),
        ("{contains: s, regex: '^x'}", "ls", False),
        ("{equals: '', contains: s}", "ls", True),
    ],
)
def test_argument_predicate(predicate: str, value: str, matches: bool) -> None:
    assert (one_rule(f"arguments: {{command: {predicate}}}", {"command": value}) == "r") is matches


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1000000, "1e+06"),
        (5, "5"),
        (1.5, "1.5"),
        (12345678901234567890, "1.2345678901234567e+19"),
        (True, "true"),
        (None, "<nil>"),
        ([1, "x"], "[1 x]"),
        ({"b": 2, "a": "x"}, "map[a:x b:2]"),
    ],
)
def test_argument_values_compare_as_go_renders_them(value: object, text: str) -> None:
    when = f"arguments:\n  v:\n    equals: '{text}'"

    assert one_rule(when, {"v": value}) == "r"


def test_every_listed_argument_must_match() -> None:
    when = "arguments:\n  a: {equals: '1'}\n  b: {equals: '2'}"

    assert one_rule(when, {"a": 1, "b": 2}) == "r"
    assert one_rule(when, {"a": 1, "b": 3}) == "default"


def test_missing_argument_does_not_match() -> None:
    assert one_rule("arguments:\n  path: {contains: etc}", {"other": "/etc"}) == "default"


def test_only_top_level_keys_are_arguments() -> None:
    assert one_rule("arguments:\n  path: {equals: x}", {"nested": {"path": "x"}}) == "default"


@pytest.mark.parametrize("args_json", [None, "null", "[1]", '"s"', "3", "{not json", "{"])
def test_arguments_rule_does_not_match_args_that_are_not_an_object(
    args_json: str | None,
) -> None:
    policy = bundle(
        """
        default_action: allow
        rules:
          - id: r
            when: {arguments: {a: {one_of: ['<nil>', '']}}}
            then: {decision: deny}
        """
    )

    assert policy.evaluate("agent", TOOL, "t", args_json).rule_id == "default"


def test_invalid_args_do_not_matter_to_rules_without_arguments() -> None:
    policy = bundle("rules: [{id: r, when: {target: t}, then: {decision: allow}}]")

    assert policy.evaluate("agent", TOOL, "t", "{broken").rule_id == "r"


def test_argument_rule_that_fails_lets_later_rules_decide() -> None:
    policy = fixture("arguments.yaml")

    assert decide(policy, "shell", {"command": "rm -rf /tmp/x"}) == "no-recursive-delete"
    assert decide(policy, "shell", {"command": "pwd"}) == "read-only-shell"
    assert decide(policy, "shell", {"command": "cat x"}) == "shell-review"
    assert decide(policy, "fetch_page", {"max_bytes": 1000000}) == "big-pages"
    assert decide(policy, "fetch_page", {"max_bytes": 1000}) == "default"


def test_regex_on_adversarial_argument_answers_without_backtracking() -> None:
    policy = bundle(
        """
        default_action: allow
        rules:
          - id: evil
            when: {arguments: {text: {regex: '(a+)+$'}}}
            then: {decision: deny}
        """
    )
    args = json.dumps({"text": "a" * 100_000 + "!"})

    assert policy.evaluate("agent", TOOL, "t", args).rule_id == "default"


def test_lone_surrogates_in_target_and_args_do_not_break_matching() -> None:
    policy = bundle(
        """
        rules:
          - id: r
            when: {target: 'x*', arguments: {a: {regex: 'b$'}}}
            then: {decision: allow}
        """
    )

    assert policy.evaluate("agent", TOOL, "x\ud800", '{"a": "\\ud800b"}').rule_id == "r"


# Results


def test_result_carries_rule_limits_and_approval() -> None:
    result = reference_bundle().evaluate("researcher", LLM, "gpt-a", '{"command": "ls"}')

    assert result == PolicyResult(
        action=PolicyAction.ALLOW,
        reason="free text",
        rule_id="cap-llm",
        approval=ApprovalConfig(("alice", "bob"), timedelta(minutes=5), "shown to the approver"),
        rate_limit=RateLimit(5, timedelta(minutes=1), "execution", timedelta(minutes=5), "allow"),
        budget=Budget(200_000, PolicyAction.DENY),
    )


def test_rule_without_reason_or_limits_returns_bare_result() -> None:
    result = bundle("rules: [{id: plain, then: {decision: deny}}]").evaluate(
        "agent", TOOL, "t", None
    )

    assert result == PolicyResult(PolicyAction.DENY, "", "plain")


def test_deny_rule_keeps_its_rate_limit() -> None:
    result = fixture("limits.yaml").evaluate("agent", TOOL, "delete_file", None)

    assert result.action is PolicyAction.DENY
    assert result.rate_limit == RateLimit(
        1, timedelta(hours=1, minutes=30), "execution", None, "allow"
    )


def test_budget_rule_offers_approval_config() -> None:
    result = fixture("limits.yaml").evaluate("agent", LLM, "gpt-4o", None)

    assert result.budget == Budget(200_000, PolicyAction.REQUIRE_APPROVAL)
    assert result.approval == ApprovalConfig(
        ("alice",), None, "this execution has used its token budget"
    )


def test_evaluation_repeats_identically() -> None:
    policy = fixture("arguments.yaml")
    args = '{"command": "rm -r x"}'

    first = policy.evaluate("agent", TOOL, "shell", args)

    assert policy.evaluate("agent", TOOL, "shell", args) is first
