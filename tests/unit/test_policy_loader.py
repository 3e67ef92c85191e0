"""Loading policy bundles: YAML 1.2 parsing, validation (§14.3), ordering (§14.4), caching."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from textwrap import dedent

import pytest

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.policy import (
    ApprovalConfig,
    Budget,
    BundleCache,
    BundleInvalid,
    PolicyResult,
    RateLimit,
    load_bundle,
)
from rebuno.protocol.codes import ErrorCode
from rebuno.protocol.enums import PolicyAction, StepKind

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "policies"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def rule(then: str = "{decision: allow}", **fields: str) -> str:
    """One rule `r` as a YAML bundle, with extra rule fields given as flow YAML."""
    extra = "".join(f"\n    {name}: {value}" for name, value in fields.items())
    return f"rules:\n  - id: r{extra}\n    then: {then}\n"


def refusal_of(text: str) -> BundleInvalid:
    with pytest.raises(BundleInvalid) as caught:
        load_bundle(dedent(text))
    assert caught.value.code is ErrorCode.VALIDATION_ERROR
    return caught.value


def error_of(text: str) -> str:
    """The problem, without the `policy, line N:` that places it (tested on its own below)."""
    return refusal_of(text).problem


def first_result(text: str) -> PolicyResult:
    return load_bundle(dedent(text)).rules[0].result


# What loads


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda path: path.name)
def test_fixture_bundle_loads(path: Path) -> None:
    assert load_bundle(path.read_text()).rules


def yaml_blocks_of_policy_docs() -> list[str]:
    """The guide's bundles: its YAML blocks but the case files (`# name.policytest.yaml`)."""
    blocks = YAML_BLOCK.findall((ROOT / "docs" / "policy.md").read_text())
    return [block for block in blocks if ".policytest.yaml" not in block.partition("\n")[0]]


def test_policy_docs_have_examples() -> None:
    assert len(yaml_blocks_of_policy_docs()) >= 5


@pytest.mark.parametrize("block", yaml_blocks_of_policy_docs())
def test_every_yaml_block_of_policy_docs_loads(block: str) -> None:
    assert load_bundle(block).rules


def test_empty_mapping_is_a_deny_everything_bundle() -> None:
    policy = load_bundle("{}")

    assert (policy.rules, policy.default_action) == ((), PolicyAction.DENY)


def test_null_rules_and_null_fields_count_as_absent() -> None:
    policy = load_bundle("default_action: allow\nrules:\n")
    result = first_result(rule("{decision: deny, reason: null, rate_limit: null}", when="null"))

    assert policy.rules == ()
    assert result == PolicyResult(PolicyAction.DENY, "", "r")


def test_yaml_1_2_keeps_no_and_on_as_strings() -> None:
    policy = load_bundle(
        rule(when="{arguments: {answer: {one_of: [no, on, yes, off]}}}") + "default_action: allow\n"
    )

    assert policy.evaluate("agent", StepKind.TOOL_CALL, "t", '{"answer": "no"}').rule_id == "r"


@pytest.mark.parametrize(
    ("text", "duration"),
    [
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5s", timedelta(seconds=1.5)),
        ("500ms", timedelta(milliseconds=500)),
        ("250us", timedelta(microseconds=250)),
        ("250µs", timedelta(microseconds=250)),
        ("2h", timedelta(hours=2)),
        ("+45m", timedelta(minutes=45)),
    ],
)
def test_durations_use_go_syntax(text: str, duration: timedelta) -> None:
    result = first_result(
        rule(f"{{decision: allow, rate_limit: {{max_calls: 1, window: '{text}'}}}}")
    )

    assert result.rate_limit is not None
    assert result.rate_limit.window == duration


def test_rate_limit_defaults() -> None:
    result = first_result(rule("{decision: allow, rate_limit: {max_calls: 3, window: 10s}}"))

    assert result.rate_limit == RateLimit(3, timedelta(seconds=10), "execution", None, "allow")


@pytest.mark.parametrize("max_wait", ["0", "0s", "0ms"])
def test_zero_max_wait_means_refuse(max_wait: str) -> None:
    limits = f"{{max_calls: 1, window: 1s, max_wait: '{max_wait}'}}"

    result = first_result(rule(f"{{decision: allow, rate_limit: {limits}}}"))

    assert result.rate_limit is not None
    assert result.rate_limit.max_wait is None


@pytest.mark.parametrize("per_what", ["execution", "agent", "global"])
def test_per_what_accepts_its_three_scopes(per_what: str) -> None:
    limits = f"{{max_calls: 1, window: 1s, per_what: {per_what}, on_limiter_error: deny}}"

    result = first_result(rule(f"{{decision: deny, rate_limit: {limits}}}"))

    assert result.rate_limit is not None
    assert (result.rate_limit.per_what, result.rate_limit.on_limiter_error) == (per_what, "deny")


def test_budget_defaults_to_deny_on_exceed() -> None:
    result = first_result(rule("{decision: allow, budget: {max_tokens: 1}}"))

    assert result.budget == Budget(1, PolicyAction.DENY)


def test_empty_approval_config_means_anyone_and_defaults() -> None:
    result = first_result(
        rule("{decision: require_approval, approval_config: {approvers: [], message: ''}}")
    )

    assert result.approval == ApprovalConfig(None, None, None)


def test_empty_conditions_count_as_absent() -> None:
    policy = load_bundle(
        rule(when="{target: '', targets: [], agent_id: '', agent_ids: [], arguments: {}}")
    )

    assert policy.evaluate("anyone", StepKind.LLM_CALL, "x", None).rule_id == "r"


# What is refused, and how the message says so


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [", "invalid YAML: "),
        ("a: 1\na: 2\n", "invalid YAML: "),
        ("--- {}\n--- {}\n", "invalid YAML: "),
        ("rules: !!python/object:os.system x", "invalid YAML: "),
        ("", "the top level must be a mapping, not empty"),
        ("- id: r\n", "the top level must be a mapping, not a list"),
        ("deny", "the top level must be a mapping, not a string"),
        ("version: 1\n", "field 'version': unknown field"),
        ("rules: {id: r}\n", "field 'rules': must be a list, not a mapping"),
        (
            "default_action: [allow]\n",
            "field 'default_action': must be a string, not a list",
        ),
        (
            "default_action: true\n",
            "field 'default_action': must be a string, not a boolean (quote it)",
        ),
    ],
)
def test_malformed_document_is_refused(text: str, message: str) -> None:
    assert error_of(text).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [allow]", "rule #1: must be a mapping, not a string"),
        ("rules: [{then: {decision: allow}}]", "rule #1: field 'id': required"),
        (
            "rules: [{id: a, then: {decision: allow}}, {id: ''}]",
            "rule #2: field 'id': required",
        ),
        (
            "rules: [{id: 5}]",
            "rule #1: field 'id': must be a string, not an integer (quote it)",
        ),
        (
            "rules: [{id: a, then: {decision: allow}}, {id: a, then: {decision: deny}}]",
            "rule 'a': field 'id': duplicate id (rule #1 has it too)",
        ),
        (
            rule(description="x"),
            "rule 'r': field 'description': unknown field (known: id, priority, then, when)",
        ),
        (rule(when="[]"), "rule 'r': field 'when': must be a mapping, not a list"),
        (
            rule(when="{taget: x}"),
            "rule 'r': field 'when.taget': unknown field (did you mean 'target'?)",
        ),
        (
            "rules: [{id: r}]",
            "rule 'r': field 'then.decision': must be one of allow, deny, "
            "require_approval (missing)",
        ),
        (
            rule("{reason: x}"),
            "rule 'r': field 'then.decision': must be one of allow, deny, "
            "require_approval (missing)",
        ),
        (
            rule("{decision: permit}"),
            "rule 'r': field 'then.decision': must be one of allow, deny, "
            "require_approval (got 'permit')",
        ),
        (
            rule("{decision: no}"),
            "rule 'r': field 'then.decision': must be one of allow, deny, "
            "require_approval (got 'no')",
        ),
        (
            rule("{decision: deny, rule_id: x}"),
            "rule 'r': field 'then.rule_id': unknown field "
            "(known: approval_config, budget, decision, rate_limit, reason)",
        ),
        (
            rule("{decision: deny, reason: 5}"),
            "rule 'r': field 'then.reason': must be a string, not an integer (quote it)",
        ),
        (rule("allow"), "rule 'r': field 'then': must be a mapping, not a string"),
    ],
)
def test_malformed_rule_is_refused(text: str, message: str) -> None:
    assert error_of(text) == message


@pytest.mark.parametrize(
    ("when", "message"),
    [
        (
            "{step_kind: tool}",
            "field 'when.step_kind': must be one of tool_call, llm_call, local (got 'tool')",
        ),
        (
            "{target: 'a['}",
            "field 'when.target': malformed glob 'a[': unterminated character class",
        ),
        ("{target: '[]'}", "field 'when.target': malformed glob '[]': bad character class"),
        ("{target: 'x\\'}", "field 'when.target': malformed glob 'x\\\\': trailing backslash"),
        ("{target: 5}", "field 'when.target': must be a string, not an integer (quote it)"),
        (
            "{targets: [ok, '[z']}",
            "field 'when.targets[1]': malformed glob '[z': unterminated character class",
        ),
        ("{targets: shell}", "field 'when.targets': must be a list of strings, not a string"),
        (
            "{targets: [1.5]}",
            "field 'when.targets[0]': must be a string, not a decimal number (quote it)",
        ),
        ("{agent_id: [a]}", "field 'when.agent_id': must be a string, not a list"),
        ("{agent_ids: a}", "field 'when.agent_ids': must be a list of strings, not a string"),
        ("{agent_ids: [a, {b: c}]}", "field 'when.agent_ids[1]': must be a string, not a mapping"),
        ("{arguments: [command]}", "field 'when.arguments': must be a mapping, not a list"),
        (
            "{arguments: {command: ls}}",
            "field 'when.arguments.command': must be a mapping, not a string",
        ),
        (
            "{arguments: {command: {}}}",
            "field 'when.arguments.command': needs at least one of equals, contains, one_of, regex",
        ),
        (
            "{arguments: {command: {equals: '', contains: '', regex: '', one_of: []}}}",
            "field 'when.arguments.command': needs at least one of equals, contains, one_of, regex",
        ),
        (
            "{arguments: {command: {matches: ls}}}",
            "field 'when.arguments.command.matches': unknown field "
            "(known: contains, equals, one_of, regex)",
        ),
        (
            "{arguments: {command: {equals: 5}}}",
            "field 'when.arguments.command.equals': must be a string, not an integer (quote it)",
        ),
        (
            "{arguments: {command: {contains: true}}}",
            "field 'when.arguments.command.contains': must be a string, not a boolean (quote it)",
        ),
        (
            "{arguments: {command: {one_of: [ls, 1]}}}",
            "field 'when.arguments.command.one_of[1]': must be a string, not an integer (quote it)",
        ),
        (
            "{arguments: {command: {regex: '(a'}}}",
            "field 'when.arguments.command.regex': invalid regular expression (RE2 syntax): "
            "missing ): (a",
        ),
        (
            "{arguments: {command: {regex: '(?=a)b'}}}",
            "field 'when.arguments.command.regex': invalid regular expression (RE2 syntax): "
            "invalid perl operator: (?=",
        ),
        (
            "{arguments: {command: {regex: '(a)\\1'}}}",
            "field 'when.arguments.command.regex': invalid regular expression (RE2 syntax): "
            "invalid escape sequence: \\1",
        ),
        ("{arguments: {1: {equals: x}}}", "field 'when.arguments.1': field names must be strings"),
    ],
)
def test_malformed_condition_is_refused(when: str, message: str) -> None:
    assert error_of(rule(when=when)) == f"rule 'r': {message}"


@pytest.mark.parametrize(
    ("then", "field", "problem"),
    [
        ("{approval_config: [alice]}", "approval_config", "must be a mapping, not a list"),
        ("{approval_config: {approver: [a]}}", "approval_config.approver", "unknown field"),
        (
            "{approval_config: {approvers: alice}}",
            "approval_config.approvers",
            "must be a list of strings, not a string",
        ),
        (
            "{approval_config: {timeout: 300}}",
            "approval_config.timeout",
            "must be a Go duration string such as '30s', not an integer",
        ),
        (
            "{approval_config: {timeout: 0s}}",
            "approval_config.timeout",
            "must be a positive duration",
        ),
        (
            "{approval_config: {timeout: -5m}}",
            "approval_config.timeout",
            "must be a positive duration",
        ),
        (
            "{approval_config: {timeout: 1d}}",
            "approval_config.timeout",
            "invalid duration '1d': unknown unit 'd'",
        ),
        (
            "{approval_config: {message: [a]}}",
            "approval_config.message",
            "must be a string, not a list",
        ),
        ("{rate_limit: 5}", "rate_limit", "must be a mapping, not an integer"),
        ("{rate_limit: {window: 1m}}", "rate_limit.max_calls", "required: an integer >= 1"),
        (
            "{rate_limit: {max_calls: 0, window: 1m}}",
            "rate_limit.max_calls",
            "must be an integer >= 1 (got 0)",
        ),
        (
            "{rate_limit: {max_calls: -2, window: 1m}}",
            "rate_limit.max_calls",
            "must be an integer >= 1 (got -2)",
        ),
        (
            "{rate_limit: {max_calls: '5', window: 1m}}",
            "rate_limit.max_calls",
            "must be an integer, not a string",
        ),
        (
            "{rate_limit: {max_calls: 2.5, window: 1m}}",
            "rate_limit.max_calls",
            "must be an integer, not a decimal number",
        ),
        (
            "{rate_limit: {max_calls: true, window: 1m}}",
            "rate_limit.max_calls",
            "must be an integer, not a boolean",
        ),
        (
            "{rate_limit: {max_calls: 99999999999999999999, window: 1m}}",
            "rate_limit.max_calls",
            "is too large (got 99999999999999999999)",
        ),
        (
            "{rate_limit: {max_calls: 5}}",
            "rate_limit.window",
            "required: a Go duration such as '1m'",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 60}}",
            "rate_limit.window",
            "must be a Go duration string such as '30s', not an integer",
        ),
        (
            "{rate_limit: {max_calls: 5, window: '60'}}",
            "rate_limit.window",
            "invalid duration '60': missing unit",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 0s}}",
            "rate_limit.window",
            "must be a positive duration",
        ),
        (
            "{rate_limit: {max_calls: 5, window: '0'}}",
            "rate_limit.window",
            "must be a positive duration",
        ),
        (
            "{rate_limit: {max_calls: 5, window: -1m}}",
            "rate_limit.window",
            "must be a positive duration",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 1w}}",
            "rate_limit.window",
            "invalid duration '1w': unknown unit 'w'",
        ),
        ("{rate_limit: {max_calls: 5, window: ''}}", "rate_limit.window", "invalid duration ''"),
        (
            "{rate_limit: {max_calls: 5, window: 1m, per_what: user}}",
            "rate_limit.per_what",
            "must be one of execution, agent, global (got 'user')",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 1m, max_wait: 30}}",
            "rate_limit.max_wait",
            "must be a Go duration string such as '30s', not an integer",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 1m, max_wait: -1s}}",
            "rate_limit.max_wait",
            "must not be negative",
        ),
        (
            "{rate_limit: {max_calls: 5, window: 1m, on_limiter_error: fail}}",
            "rate_limit.on_limiter_error",
            "must be one of allow, deny (got 'fail')",
        ),
        ("{rate_limit: {max_calls: 5, window: 1m, burst: 2}}", "rate_limit.burst", "unknown field"),
        ("{budget: {on_exceed: deny}}", "budget.max_tokens", "required: an integer >= 1"),
        ("{budget: {max_tokens: 0}}", "budget.max_tokens", "must be an integer >= 1 (got 0)"),
        ("{budget: {max_tokens: '100'}}", "budget.max_tokens", "must be an integer, not a string"),
        (
            "{budget: {max_tokens: 100, on_exceed: allow}}",
            "budget.on_exceed",
            "must be one of deny, require_approval (got 'allow')",
        ),
        ("{budget: {max_tokens: 100, tokens: 5}}", "budget.tokens", "unknown field"),
    ],
)
def test_malformed_outcome_is_refused(then: str, field: str, problem: str) -> None:
    text = rule("{decision: allow, " + then[1:])

    assert error_of(text).startswith(f"rule 'r': field 'then.{field}': {problem}")


# Where the problem is: the message places it by line (and column, for a YAML syntax error)

PLACED = """\
default_action: deny
rules:
  - id: reads
    when:
      step_kind: tool_call
      targets: [read_file, list_dir]
    then:
      decision: allow
  - id: writes
    when:
      target: write_file
    then:
      decision: require_approval
      approval_config:
        approvers: [alice]
"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "  - id: writes\n",
            "  - id: writes\n    efect: deny\n",
            "policy, line 10: rule 'writes': field 'efect': unknown field "
            "(known: id, priority, then, when)",
        ),
        (
            "      target: write_file\n",
            "      taget: write_file\n",
            "policy, line 11: rule 'writes': field 'when.taget': unknown field "
            "(did you mean 'target'?)",
        ),
        (
            "      decision: require_approval\n",
            "      decison: require_approval\n",
            "policy, line 13: rule 'writes': field 'then.decison': unknown field "
            "(did you mean 'decision'?)",
        ),
        (
            "        approvers: [alice]\n",
            "        aprovers: [alice]\n",
            "policy, line 15: rule 'writes': field 'then.approval_config.aprovers': "
            "unknown field (did you mean 'approvers'?)",
        ),
        (
            "default_action: deny\n",
            "default_acton: deny\n",
            "policy, line 1: field 'default_acton': unknown field (did you mean 'default_action'?)",
        ),
    ],
)
def test_unknown_field_names_its_line_and_the_closest_known_field(
    old: str, new: str, message: str
) -> None:
    assert refusal_of(PLACED.replace(old, new)).message == message


def test_a_misspelt_field_never_loads_as_if_absent() -> None:
    # `efect: deny` read as absent would leave the rule without its decision; it is refused.
    text = PLACED.replace("      decision: allow\n", "      efect: deny\n")

    refusal = refusal_of(text)

    assert (refusal.line, refusal.problem) == (
        8,
        "rule 'reads': field 'then.efect': unknown field "
        "(known: approval_config, budget, decision, rate_limit, reason)",
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "[read_file, list_dir]",
            "[read_file, 5]",
            "policy, line 6: rule 'reads': field 'when.targets[1]': must be a string, "
            "not an integer (quote it)",
        ),
        (
            "      decision: allow\n",
            "      decision: maybe\n",
            "policy, line 8: rule 'reads': field 'then.decision': must be one of allow, deny, "
            "require_approval (got 'maybe')",
        ),
        (
            "  - id: writes\n",
            "  - id: reads\n",
            "policy, line 9: rule 'reads': field 'id': duplicate id (rule #1 has it too)",
        ),
        ("  - id: writes\n", "  - priority: 1\n", "policy, line 9: rule #2: field 'id': required"),
    ],
)
def test_any_refused_field_names_its_line(old: str, new: str, message: str) -> None:
    assert refusal_of(PLACED.replace(old, new)).message == message


def test_a_priority_conflict_names_the_line_of_the_second_rule() -> None:
    text = "rules:\n  - id: a\n    priority: 1\n    then: {decision: deny}\n" + (
        "  - id: b\n    priority: 1\n    then: {decision: allow}\n"
    )

    assert refusal_of(text).message == (
        "policy, line 6: rule 'b': field 'priority': duplicate priority 1 (rule 'a' has it too)"
    )


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("rules:\n  - id: a\n    then: {decision: deny\n", 4, 1),
        ("rules:\n  - id: a\n   then: {decision: deny}\n", 3, 4),
        ("default_action: deny\ndefault_action: allow\n", 2, 1),
        ('rules:\n  - id: "a\n', 3, 1),
    ],
)
def test_yaml_syntax_error_names_its_line_and_column(text: str, line: int, column: int) -> None:
    refusal = refusal_of(text)

    assert (refusal.line, refusal.column) == (line, column)
    assert refusal.message.startswith(f"policy, line {line}, column {column}: invalid YAML: ")
    assert "\n" not in refusal.message


# Priorities


def test_priorities_must_all_be_given_or_none() -> None:
    text = """
        rules:
          - {id: a, priority: 1, then: {decision: allow}}
          - {id: b, then: {decision: deny}}
        """

    assert error_of(text) == (
        "rule 'b': field 'priority': missing, but rule 'a' has one; "
        "give every rule a priority, or none"
    )


def test_priority_on_a_later_rule_only_is_refused() -> None:
    text = """
        rules:
          - {id: a, then: {decision: allow}}
          - {id: b, priority: 2, then: {decision: deny}}
        """

    assert error_of(text) == (
        "rule 'b': field 'priority': given, but rule 'a' has none; "
        "give every rule a priority, or none"
    )


def test_duplicate_priorities_are_refused() -> None:
    text = """
        rules:
          - {id: a, priority: 3, then: {decision: allow}}
          - {id: b, priority: 1, then: {decision: allow}}
          - {id: c, priority: 3, then: {decision: deny}}
        """

    assert (
        error_of(text) == "rule 'c': field 'priority': duplicate priority 3 (rule 'a' has it too)"
    )


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        ("'1'", "must be an integer, not a string"),
        ("1.5", "must be an integer, not a decimal number"),
    ],
)
def test_priority_must_be_an_integer(priority: str, message: str) -> None:
    assert error_of(rule(priority=priority)) == f"rule 'r': field 'priority': {message}"


def test_single_rule_with_priority_loads() -> None:
    assert [r.id for r in load_bundle(rule(priority="7")).rules] == ["r"]


def test_first_problem_in_file_order_is_reported() -> None:
    text = """
        rules:
          - {id: a, when: {target: '['}, then: {decision: allow}}
          - {id: b, then: {decision: maybe}}
        """

    assert error_of(text).startswith("rule 'a': field 'when.target'")


# The cache


def test_cache_returns_the_same_compiled_bundle_for_the_same_text() -> None:
    cache = BundleCache()
    text = rule()

    assert cache.get(text) is cache.get(text)
    assert len(cache) == 1


def test_cache_evicts_the_least_recently_used_bundle() -> None:
    cache = BundleCache(max_entries=2)
    first, second, third = (rule(f"{{decision: allow, reason: r{n}}}") for n in range(3))
    kept = cache.get(first)
    cache.get(second)
    cache.get(first)

    cache.get(third)

    assert len(cache) == 2
    assert cache.get(first) is kept


def test_cache_refuses_a_bad_bundle_every_time() -> None:
    cache = BundleCache()
    text = rule("{decision: maybe}")

    messages = []
    for _ in range(2):
        with pytest.raises(ValidationFailed) as caught:
            cache.get(text)
        messages.append(caught.value.message)

    assert messages == [refusal_of(text).message] * 2
    assert len(cache) == 1


def test_cache_needs_room_for_one_bundle() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BundleCache(max_entries=0)
