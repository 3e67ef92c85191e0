"""Policy bundles from YAML text: parse with YAML 1.2 scalar rules, validate every field
(§14.3), order the rules (§14.4) and compile them into a `Bundle`; plus a cache of compiled
bundles keyed by their text.

The first problem found raises `ValidationFailed` whose message names the rule and the field,
e.g. `policy: rule 'cap-llm': field 'then.rate_limit.window': ...`.

The only module of the policy package that reads YAML. Must not import the store, the
services or the API.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, NamedTuple, NoReturn

import re2
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.policy.engine import (
    ApprovalConfig,
    ArgumentPredicate,
    Budget,
    Bundle,
    PolicyResult,
    RateLimit,
    Rule,
    target_matcher,
)
from rebuno.kernel.policy.glob import GlobError, GlobMatcher
from rebuno.protocol.durations import parse_duration
from rebuno.protocol.enums import PolicyAction, StepKind

_TOP_KEYS: Final = frozenset({"default_action", "rules"})
_RULE_KEYS: Final = frozenset({"id", "priority", "when", "then"})
_WHEN_KEYS: Final = frozenset(
    {"step_kind", "target", "targets", "agent_id", "agent_ids", "arguments"}
)
_PREDICATE_KEYS: Final = frozenset({"equals", "contains", "one_of", "regex"})
_THEN_KEYS: Final = frozenset({"decision", "reason", "approval_config", "rate_limit", "budget"})
_APPROVAL_KEYS: Final = frozenset({"approvers", "timeout", "message"})
_RATE_LIMIT_KEYS: Final = frozenset(
    {"max_calls", "window", "per_what", "max_wait", "on_limiter_error"}
)
_BUDGET_KEYS: Final = frozenset({"max_tokens", "on_exceed"})

_DECISIONS: Final = tuple(action.value for action in PolicyAction)
_STEP_KINDS: Final = tuple(kind.value for kind in StepKind)
_PER_WHAT: Final = ("execution", "agent", "global")
_ON_LIMITER_ERROR: Final = ("allow", "deny")
_ON_EXCEED: Final = (PolicyAction.DENY.value, PolicyAction.REQUIRE_APPROVAL.value)
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)

_REGEX_OPTIONS: Final = re2.Options()
_REGEX_OPTIONS.log_errors = False
_REGEX_OPTIONS.never_capture = True


def load_bundle(text: str) -> Bundle:
    """Validate and compile a bundle; raises `ValidationFailed` on the first problem."""
    document = _parse_yaml(text)
    if not isinstance(document, dict):
        raise ValidationFailed(
            f"policy: the top level must be a mapping, not {_yaml_type(document)}"
        )
    top = _Section(document, owner="", path="", keys=_TOP_KEYS)
    default_action = top.string("default_action")
    rules = _order(_load_rules(top.raw("rules"), top))
    allow = PolicyAction.ALLOW if default_action == "allow" else PolicyAction.DENY
    return Bundle(rules, allow)


class BundleCache:
    """Compiled bundles keyed by their text, least recently used evicted first.

    Failures are remembered too: a stored bundle that no longer compiles would otherwise be
    recompiled for every step of that agent.
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._entries: OrderedDict[str, Bundle | ValidationFailed] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str) -> Bundle:
        """The compiled bundle for `text`; raises `ValidationFailed` if it does not compile."""
        entry = self._lookup(text)
        if entry is None:
            entry = _compile(text)
            self._remember(text, entry)
        if isinstance(entry, ValidationFailed):
            raise ValidationFailed(entry.message, entry.details)
        return entry

    def _lookup(self, text: str) -> Bundle | ValidationFailed | None:
        with self._lock:
            entry = self._entries.get(text)
            if entry is not None:
                self._entries.move_to_end(text)
            return entry

    def _remember(self, text: str, entry: Bundle | ValidationFailed) -> None:
        with self._lock:
            self._entries[text] = entry
            self._entries.move_to_end(text)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)


def _compile(text: str) -> Bundle | ValidationFailed:
    try:
        return load_bundle(text)
    except ValidationFailed as error:
        return error


def _parse_yaml(text: str) -> object:
    try:
        # A fresh loader per call: ruamel's YAML objects are not safe to share across threads.
        document: object = YAML(typ="safe").load(text)
    except (YAMLError, ValueError, TypeError, RecursionError) as error:
        problem = " ".join(str(error).split()) or type(error).__name__
        raise ValidationFailed(f"policy: invalid YAML: {problem}") from error
    if (unsendable := _unsendable_text(document)) is not None:
        raise ValidationFailed(f"policy: invalid YAML: {unsendable}")
    return document


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _unsendable_text(document: object) -> str | None:
    """What makes a string of the document unfit to store or send, if one is: a NUL (which
    PostgreSQL text cannot hold) or a lone surrogate (which is not UTF-8), both of which a
    YAML escape (`"\\0"`, `"\\ud800"`) can put in a reason, a message or an approver."""
    pending: list[object] = [document]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a string holds a NUL character"
            if not item.isascii() and _SURROGATE.search(item):
                return "a string holds a lone surrogate"
        elif isinstance(item, dict | list) and id(item) not in seen:
            seen.add(id(item))  # an alias is walked once
            pending.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return None


def _failure(owner: str, field: str, problem: str) -> ValidationFailed:
    where = f"{owner}: " if owner else ""
    subject = f"field '{field}': " if field else ""
    return ValidationFailed(f"policy: {where}{subject}{problem}")


class _Section:
    """One YAML mapping under validation. A key holding null counts as absent."""

    def __init__(self, data: object, owner: str, path: str, keys: frozenset[str] | None) -> None:
        self.owner = owner
        self.path = path
        if not isinstance(data, dict):
            raise _failure(owner, path, f"must be a mapping, not {_yaml_type(data)}")
        for key in data:
            if not isinstance(key, str):
                raise _failure(owner, self.field(repr(key)), "field names must be strings")
            if keys is not None and key not in keys:
                raise _failure(owner, self.field(key), "unknown field")
        self.data: dict[str, object] = data

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str | None, problem: str) -> NoReturn:
        raise _failure(self.owner, self.path if key is None else self.field(key), problem)

    def raw(self, key: str) -> object:
        return self.data.get(key)

    def section(self, key: str, keys: frozenset[str] | None) -> _Section | None:
        value = self.raw(key)
        return None if value is None else _Section(value, self.owner, self.field(key), keys)

    def string(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None or isinstance(value, str):
            return value
        self.fail(key, _not_a_string(value))

    def choice(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = self.string(key)
        if value is None and default is not None:
            return default
        if value is None or value not in allowed:
            got = "missing" if value is None else f"got {value!r}"
            self.fail(key, f"must be one of {', '.join(allowed)} ({got})")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.raw(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, f"must be a list of strings, not {_yaml_type(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{key}[{index}]", _not_a_string(item))
        return tuple(value)

    def integer(self, key: str, minimum: int) -> int:
        value = self.raw(key)
        if value is None:
            self.fail(key, f"required: an integer >= {minimum}")
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, not {_yaml_type(value)}")
        if value < minimum:
            self.fail(key, f"must be an integer >= {minimum} (got {value})")
        if value > _INT64_MAX:
            self.fail(key, f"is too large (got {value})")
        return value

    def duration(self, key: str) -> timedelta | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, f"must be a Go duration string such as '30s', not {_yaml_type(value)}")
        try:
            return parse_duration(value)
        except ValueError as error:
            self.fail(key, str(error))


def _not_a_string(value: object) -> str:
    scalar = isinstance(value, bool | int | float)
    return f"must be a string, not {_yaml_type(value)}" + (" (quote it)" if scalar else "")


def _yaml_type(value: object) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class _LoadedRule:
    rule: Rule
    priority: int | None


def _load_rules(value: object, top: _Section) -> list[_LoadedRule]:
    if value is None:
        return []
    if not isinstance(value, list):
        top.fail("rules", f"must be a list, not {_yaml_type(value)}")
    seen: dict[str, int] = {}
    return [_load_rule(item, number, seen) for number, item in enumerate(value, start=1)]


def _load_rule(item: object, number: int, seen: dict[str, int]) -> _LoadedRule:
    rule_id = _rule_id(item, number)
    owner = f"rule {rule_id!r}"
    if rule_id in seen:
        raise _failure(owner, "id", f"duplicate id (rule #{seen[rule_id]} has it too)")
    seen[rule_id] = number
    section = _Section(item, owner, "", _RULE_KEYS)
    has_priority = section.raw("priority") is not None
    priority = section.integer("priority", _INT64_MIN) if has_priority else None
    when = section.section("when", _WHEN_KEYS)
    then = section.section("then", _THEN_KEYS) or _Section({}, owner, "then", _THEN_KEYS)
    conditions = _conditions(when) if when is not None else _Conditions()
    return _LoadedRule(Rule(rule_id, _result(then, rule_id), *conditions), priority)


def _rule_id(item: object, number: int) -> str:
    owner = f"rule #{number}"
    if not isinstance(item, dict):
        raise _failure(owner, "", f"must be a mapping, not {_yaml_type(item)}")
    rule_id = item.get("id")
    if rule_id is None or rule_id == "":
        raise _failure(owner, "id", "required")
    if not isinstance(rule_id, str):
        raise _failure(owner, "id", _not_a_string(rule_id))
    return rule_id


class _Conditions(NamedTuple):
    """The `when` of a rule, in the order of `Rule`'s fields after `result`."""

    step_kind: StepKind | None = None
    targets: tuple[tuple[GlobMatcher, ...], ...] = ()
    agent_ids: tuple[frozenset[str], ...] = ()
    arguments: tuple[ArgumentPredicate, ...] = ()


def _conditions(when: _Section) -> _Conditions:
    kind = when.string("step_kind")
    if kind:
        when.choice("step_kind", _STEP_KINDS)
    targets = [group for group in (_target(when), _targets(when)) if group]
    agents = [frozenset(ids) for ids in (_agent(when), when.strings("agent_ids")) if ids]
    return _Conditions(
        step_kind=StepKind(kind) if kind else None,
        targets=tuple(targets),
        agent_ids=tuple(agents),
        arguments=_arguments(when.section("arguments", None)),
    )


def _agent(when: _Section) -> tuple[str, ...]:
    agent_id = when.string("agent_id")
    return (agent_id,) if agent_id else ()


def _target(when: _Section) -> tuple[GlobMatcher, ...]:
    pattern = when.string("target")
    return (_glob(when, "target", pattern),) if pattern else ()


def _targets(when: _Section) -> tuple[GlobMatcher, ...]:
    patterns = when.strings("targets")
    return tuple(_glob(when, f"targets[{i}]", pattern) for i, pattern in enumerate(patterns))


def _glob(when: _Section, key: str, pattern: str) -> GlobMatcher:
    try:
        return target_matcher(pattern)
    except GlobError as error:
        when.fail(key, str(error))


def _arguments(section: _Section | None) -> tuple[ArgumentPredicate, ...]:
    if section is None:
        return ()
    return tuple(
        _predicate(_Section(spec, section.owner, section.field(name), _PREDICATE_KEYS), name)
        for name, spec in section.data.items()
    )


def _predicate(section: _Section, name: str) -> ArgumentPredicate:
    equals = section.string("equals") or ""
    contains = section.string("contains") or ""
    one_of = section.strings("one_of")
    pattern = section.string("regex") or ""
    if not (equals or contains or one_of or pattern):
        section.fail(None, "needs at least one of equals, contains, one_of, regex")
    regex = _regex(section, pattern) if pattern else None
    return ArgumentPredicate(name, equals, contains, frozenset(one_of), regex)


def _regex(section: _Section, pattern: str) -> Callable[[str], bool]:
    try:
        program: Any = re2.compile(pattern, _REGEX_OPTIONS)
    except re2.error as error:
        detail = error.args[0] if error.args else ""
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        section.fail("regex", f"invalid regular expression (RE2 syntax): {text}")
    except UnicodeEncodeError:
        section.fail("regex", "invalid regular expression: not valid Unicode")
    return lambda value: program.search(value) is not None


def _result(then: _Section, rule_id: str) -> PolicyResult:
    decision = PolicyAction(then.choice("decision", _DECISIONS))
    reason = then.string("reason") or ""
    return PolicyResult(
        action=decision,
        reason=reason,
        rule_id=rule_id,
        approval=_approval(then.section("approval_config", _APPROVAL_KEYS)),
        rate_limit=_rate_limit(then.section("rate_limit", _RATE_LIMIT_KEYS)),
        budget=_budget(then.section("budget", _BUDGET_KEYS)),
    )


def _approval(section: _Section | None) -> ApprovalConfig | None:
    if section is None:
        return None
    approvers = section.strings("approvers")
    timeout = section.duration("timeout")
    if timeout is not None and timeout <= timedelta(0):
        section.fail("timeout", "must be a positive duration")
    message = section.string("message")
    return ApprovalConfig(approvers or None, timeout, message or None)


def _rate_limit(section: _Section | None) -> RateLimit | None:
    if section is None:
        return None
    max_calls = section.integer("max_calls", 1)
    window = section.duration("window")
    if window is None:
        section.fail("window", "required: a Go duration such as '1m'")
    if window <= timedelta(0):
        section.fail("window", "must be a positive duration")
    per_what = section.choice("per_what", _PER_WHAT, default="execution")
    max_wait = section.duration("max_wait")
    if max_wait is not None and max_wait < timedelta(0):
        section.fail("max_wait", "must not be negative")
    on_error = section.choice("on_limiter_error", _ON_LIMITER_ERROR, default="allow")
    return RateLimit(max_calls, window, per_what, max_wait or None, on_error)


def _budget(section: _Section | None) -> Budget | None:
    if section is None:
        return None
    max_tokens = section.integer("max_tokens", 1)
    on_exceed = section.choice("on_exceed", _ON_EXCEED, default=PolicyAction.DENY.value)
    return Budget(max_tokens, PolicyAction(on_exceed))


def _order(loaded: list[_LoadedRule]) -> list[Rule]:
    """All rules with a priority: ascending and unique. None: file order. Mixed: an error."""
    ranked = [(item.priority, item.rule) for item in loaded if item.priority is not None]
    if not ranked:
        return [item.rule for item in loaded]
    if len(ranked) != len(loaded):
        _mixed_priorities(loaded)
    owners: dict[int, str] = {}
    for priority, rule in ranked:
        if priority in owners:
            problem = f"duplicate priority {priority} (rule {owners[priority]!r} has it too)"
            raise _failure(f"rule {rule.id!r}", "priority", problem)
        owners[priority] = rule.id
    return [rule for _, rule in sorted(ranked, key=lambda pair: pair[0])]


def _mixed_priorities(loaded: list[_LoadedRule]) -> NoReturn:
    first = loaded[0]
    odd = next(item for item in loaded if (item.priority is None) != (first.priority is None))
    problem = (
        f"missing, but rule {first.rule.id!r} has one"
        if odd.priority is None
        else f"given, but rule {first.rule.id!r} has none"
    )
    raise _failure(
        f"rule {odd.rule.id!r}", "priority", f"{problem}; give every rule a priority, or none"
    )
