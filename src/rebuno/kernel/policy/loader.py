"""Policy bundles from YAML text: parse with YAML 1.2 scalar rules, validate every field
(§14.3), order the rules (§14.4) and compile them into a `Bundle`; plus a cache of compiled
bundles keyed by their text.

The first problem found raises `BundleInvalid` (a `ValidationFailed`) whose message names the
line, the rule and the field, e.g. `policy, line 9: rule 'cap-llm': field
'then.rate_limit.window': ...`; an unknown field is refused with the closest known name, and a
YAML syntax error carries its line and column.

The only module of the policy package that reads YAML; the provisioning manifest borrows its
helpers for placing a problem in a YAML text (`yaml_place`, `yaml_error_place`,
`line_and_column`, `closest_key`). Must not import the store, the services or the API.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, NamedTuple, NoReturn

import re2
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.domain.identity import policy_hash
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

Location = tuple[str | int, ...]
"""Keys and list indexes from a YAML document's root to one of its nodes."""


class BundleInvalid(ValidationFailed):
    """The first problem of a bundle: `problem` names the rule and the field; `line` and
    `column` (1-based) place it in the bundle's text when they are known. `yaml_error` is the
    syntax error, if that is the problem, for a caller that places the text elsewhere."""

    def __init__(
        self,
        problem: str,
        line: int | None = None,
        column: int | None = None,
        yaml_error: YAMLError | None = None,
    ) -> None:
        super().__init__(f"policy{line_and_column(line, column)}: {problem}")
        self.problem = problem
        self.line = line
        self.column = column
        self.yaml_error = yaml_error


def line_and_column(line: int | None, column: int | None) -> str:
    """`, line 4, column 7` for a message; empty when the line is unknown."""
    if line is None:
        return ""
    return f", line {line}" + ("" if column is None else f", column {column}")


def load_bundle(text: str) -> Bundle:
    """Validate and compile a bundle; raises `BundleInvalid` on the first problem."""
    document = parse_yaml(text)
    try:
        return _compile_document(document)
    except _Refusal as refusal:
        place = yaml_place(text, refusal.location)
        raise BundleInvalid(refusal.problem, place.line if place else None) from None


def _compile_document(document: object) -> Bundle:
    if not isinstance(document, dict):
        raise _Refusal(f"the top level must be a mapping, not {_yaml_type(document)}", ())
    top = _Section(document, owner="", path="", keys=_TOP_KEYS, location=())
    default_action = top.string("default_action")
    rules = _order(_load_rules(top.raw("rules"), top))
    allow = PolicyAction.ALLOW if default_action == "allow" else PolicyAction.DENY
    return Bundle(rules, allow)


@dataclass(frozen=True, slots=True)
class YamlPlace:
    """Where a key (or a list item) starts in a YAML text, and the node it holds."""

    line: int
    column: int
    value: Node | None


def yaml_place(text: str, location: Location) -> YamlPlace | None:
    """Find `location` in `text` by composing it again: the key's (or item's) 1-based line and
    column, and its value's node. When the path ends early, the deepest part found (without a
    value); None when the text does not compose.

    Only called once a problem has been found, so a valid document is composed once.
    """
    try:
        # A fresh loader per call: ruamel's YAML objects are not safe to share across threads.
        node: Node | None = YAML(typ="safe", pure=True).compose(text)
    except (YAMLError, ValueError, TypeError, RecursionError):
        return None
    if node is None:
        return None
    mark = node.start_mark
    for step in location:
        found = _child(node, step)
        if found is None:
            return YamlPlace(mark.line + 1, mark.column + 1, None)
        start, node = found
        mark = start.start_mark
    return YamlPlace(mark.line + 1, mark.column + 1, node)


def _child(node: Node, step: str | int) -> tuple[Node, Node] | None:
    """The key (or item) node and the value node for one step below `node`."""
    if isinstance(node, SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
        item: Node = node.value[step]
        return item, item
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if isinstance(key, ScalarNode) and key.value == str(step):
                return key, value
    return None


def yaml_error_place(
    error: YAMLError, first_line: int = 1, indent: int = 0
) -> tuple[str, int | None, int | None]:
    """A YAML error as one line of text, with its line and column when it has them. The text
    parsed starts on line `first_line` of its file, indented by `indent` (a block scalar)."""
    if not isinstance(error, MarkedYAMLError) or error.problem_mark is None:
        return " ".join(str(error).split()) or type(error).__name__, None, None
    mark = error.problem_mark
    problem = " ".join(str(error.problem or "syntax error").split())
    context = " ".join(str(error.context or "").split())
    start = error.context_mark
    if context and start is not None and start.line != mark.line:
        problem += f" ({context} that starts on line {start.line + first_line})"
    elif context:
        problem += f" ({context})"
    return problem, mark.line + first_line, mark.column + 1 + indent


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key `key` was most likely meant to be, if one is close enough."""
    matches = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


class BundleCache:
    """Compiled bundles keyed by their text, least recently used evicted first.

    Failures are remembered too: a stored bundle that no longer compiles would otherwise be
    recompiled for every step of that agent.
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Bundle | ValidationFailed, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, text: str) -> Bundle:
        """The compiled bundle for `text`; raises `ValidationFailed` if it does not compile."""
        entry = self._entry(text)[0]
        if isinstance(entry, ValidationFailed):
            raise ValidationFailed(entry.message, entry.details)
        return entry

    def hash_of(self, text: str) -> str:
        """`policy_hash(text)`, computed once per cached bundle rather than per step."""
        return self._entry(text)[1]

    def _entry(self, text: str) -> tuple[Bundle | ValidationFailed, str]:
        entry = self._lookup(text)
        if entry is None:
            entry = (_compile(text), policy_hash(text))
            self._remember(text, entry)
        return entry

    def _lookup(self, text: str) -> tuple[Bundle | ValidationFailed, str] | None:
        with self._lock:
            entry = self._entries.get(text)
            if entry is not None:
                self._entries.move_to_end(text)
            return entry

    def _remember(self, text: str, entry: tuple[Bundle | ValidationFailed, str]) -> None:
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


def parse_yaml(text: str) -> object:
    """A YAML document read with YAML 1.2 scalars, refused (`BundleInvalid`, placed when the
    parser says where) when it does not parse or holds text that could not be stored."""
    try:
        # A fresh loader per call: ruamel's YAML objects are not safe to share across threads.
        document: object = YAML(typ="safe").load(text)
    except YAMLError as error:
        problem, line, column = yaml_error_place(error)
        raise BundleInvalid(f"invalid YAML: {problem}", line, column, error) from error
    except (ValueError, TypeError, RecursionError) as error:
        problem = " ".join(str(error).split()) or type(error).__name__
        raise BundleInvalid(f"invalid YAML: {problem}") from error
    if (unsendable := _unsendable_text(document)) is not None:
        raise BundleInvalid(f"invalid YAML: {unsendable}")
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


class _Refusal(Exception):
    """A problem found while compiling, raised up to `load_bundle`, which adds its line."""

    def __init__(self, problem: str, location: Location) -> None:
        super().__init__(problem)
        self.problem = problem
        self.location = location


def _failure(owner: str, field: str, problem: str, location: Location) -> _Refusal:
    where = f"{owner}: " if owner else ""
    subject = f"field '{field}': " if field else ""
    return _Refusal(f"{where}{subject}{problem}", location)


def _unknown_field(key: str, keys: frozenset[str]) -> str:
    close = closest_key(key, keys)
    if close is not None:
        return f"unknown field (did you mean '{close}'?)"
    return f"unknown field (known: {', '.join(sorted(keys))})"


class _Section:
    """One YAML mapping under validation, at `location` in the document. A key holding null
    counts as absent."""

    def __init__(
        self,
        data: object,
        owner: str,
        path: str,
        keys: frozenset[str] | None,
        location: Location,
    ) -> None:
        self.owner = owner
        self.path = path
        self.location = location
        if not isinstance(data, dict):
            raise _failure(owner, path, f"must be a mapping, not {_yaml_type(data)}", location)
        for key in data:
            if not isinstance(key, str):
                raise self.refusal(repr(key), "field names must be strings")
            if keys is not None and key not in keys:
                raise self.refusal(key, _unknown_field(key, keys))
        self.data: dict[str, object] = data

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def refusal(self, key: str | None, problem: str, *more: str | int) -> _Refusal:
        if key is None:
            return _failure(self.owner, self.path, problem, self.location)
        field = self.field(key) + "".join(f"[{index}]" for index in more)
        return _failure(self.owner, field, problem, (*self.location, key, *more))

    def fail(self, key: str | None, problem: str, *more: str | int) -> NoReturn:
        raise self.refusal(key, problem, *more)

    def raw(self, key: str) -> object:
        return self.data.get(key)

    def section(self, key: str, keys: frozenset[str] | None) -> _Section | None:
        value = self.raw(key)
        if value is None:
            return None
        return _Section(value, self.owner, self.field(key), keys, (*self.location, key))

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
                self.fail(key, _not_a_string(item), index)
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
    location: Location


def _load_rules(value: object, top: _Section) -> list[_LoadedRule]:
    if value is None:
        return []
    if not isinstance(value, list):
        top.fail("rules", f"must be a list, not {_yaml_type(value)}")
    seen: dict[str, int] = {}
    return [_load_rule(item, number, seen) for number, item in enumerate(value, start=1)]


def _load_rule(item: object, number: int, seen: dict[str, int]) -> _LoadedRule:
    location: Location = ("rules", number - 1)
    rule_id = _rule_id(item, number, location)
    owner = f"rule {rule_id!r}"
    if rule_id in seen:
        problem = f"duplicate id (rule #{seen[rule_id]} has it too)"
        raise _failure(owner, "id", problem, (*location, "id"))
    seen[rule_id] = number
    section = _Section(item, owner, "", _RULE_KEYS, location)
    has_priority = section.raw("priority") is not None
    priority = section.integer("priority", _INT64_MIN) if has_priority else None
    when = section.section("when", _WHEN_KEYS)
    then = section.section("then", _THEN_KEYS) or _Section(
        {}, owner, "then", _THEN_KEYS, (*location, "then")
    )
    conditions = _conditions(when) if when is not None else _Conditions()
    rule = Rule(rule_id, _result(then, rule_id), *conditions)
    return _LoadedRule(rule, priority, location)


def _rule_id(item: object, number: int, location: Location) -> str:
    owner = f"rule #{number}"
    if not isinstance(item, dict):
        raise _failure(owner, "", f"must be a mapping, not {_yaml_type(item)}", location)
    rule_id = item.get("id")
    if rule_id is None or rule_id == "":
        raise _failure(owner, "id", "required", location)
    if not isinstance(rule_id, str):
        raise _failure(owner, "id", _not_a_string(rule_id), (*location, "id"))
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
    return tuple(_glob(when, "targets", pattern, i) for i, pattern in enumerate(patterns))


def _glob(when: _Section, key: str, pattern: str, *index: int) -> GlobMatcher:
    try:
        return target_matcher(pattern)
    except GlobError as error:
        when.fail(key, str(error), *index)


def _arguments(section: _Section | None) -> tuple[ArgumentPredicate, ...]:
    if section is None:
        return ()
    return tuple(
        _predicate(section.section(name, _PREDICATE_KEYS) or _no_predicate(section, name), name)
        for name in section.data
    )


def _no_predicate(arguments: _Section, name: str) -> NoReturn:
    arguments.fail(name, "must be a mapping, not empty")


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
    ranked = [item for item in loaded if item.priority is not None]
    if not ranked:
        return [item.rule for item in loaded]
    if len(ranked) != len(loaded):
        _mixed_priorities(loaded)
    owners: dict[int, str] = {}
    for item in ranked:
        priority, rule = item.priority or 0, item.rule
        if priority in owners:
            problem = f"duplicate priority {priority} (rule {owners[priority]!r} has it too)"
            raise _failure(f"rule {rule.id!r}", "priority", problem, (*item.location, "priority"))
        owners[priority] = rule.id
    return [item.rule for item in sorted(ranked, key=lambda item: item.priority or 0)]


def _mixed_priorities(loaded: list[_LoadedRule]) -> NoReturn:
    first = loaded[0]
    odd = next(item for item in loaded if (item.priority is None) != (first.priority is None))
    problem = (
        f"missing, but rule {first.rule.id!r} has one"
        if odd.priority is None
        else f"given, but rule {first.rule.id!r} has none"
    )
    raise _failure(
        f"rule {odd.rule.id!r}",
        "priority",
        f"{problem}; give every rule a priority, or none",
        (*odd.location, "priority"),
    )
