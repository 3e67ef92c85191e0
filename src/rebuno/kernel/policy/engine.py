"""Compiled policy rules and the results they produce (§14.4-§14.6).

`loader.load_bundle` turns YAML into a `Bundle`; `Bundle.evaluate` picks the first rule whose
`when` matches a new step. Everything is precompiled at load, so evaluation only compares
strings and runs linear-time RE2 programs.

Must not import yaml (only the loader reads YAML), the store, the services or the API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rebuno.kernel.policy.glob import GlobMatcher, compile_glob
from rebuno.kernel.policy.render import go_string, parse_arguments, render_value
from rebuno.protocol.enums import PolicyAction, StepKind


@dataclass(frozen=True, slots=True)
class ApprovalConfig:
    """Who may decide (None: anyone), how long the approval waits, what the approver reads."""

    approvers: tuple[str, ...] | None
    timeout: timedelta | None
    message: str | None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket of `max_calls` per `window`, keyed by `per_what` (§14.7)."""

    max_calls: int
    window: timedelta
    per_what: str  # "execution" | "agent" | "global"
    max_wait: timedelta | None  # None: refuse instead of parking
    on_limiter_error: str  # "allow" | "deny"


@dataclass(frozen=True, slots=True)
class Budget:
    """Turns an `allow` into `on_exceed` once the execution spent `max_tokens` (§14.9)."""

    max_tokens: int
    on_exceed: PolicyAction  # DENY or REQUIRE_APPROVAL


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """What policy decided for a new step, and the limits the matched rule carries."""

    action: PolicyAction
    reason: str
    rule_id: str
    approval: ApprovalConfig | None = None
    rate_limit: RateLimit | None = None
    budget: Budget | None = None
    policy_hash: str | None = None
    """The hash of the bundle text that gave this verdict (§35.6), set by the caller that
    evaluated it with that text; None for a verdict no bundle gave."""


PERMISSIVE = PolicyResult(PolicyAction.ALLOW, "no policy bundle", "permissive")
LOCAL_STEP = PolicyResult(PolicyAction.ALLOW, "local step", "local")
DEFAULT_ALLOW = PolicyResult(PolicyAction.ALLOW, "default allow", "default")
DEFAULT_DENY = PolicyResult(PolicyAction.DENY, "no explicit allow rule matched", "default")


def bundle_error(reason: str) -> PolicyResult:
    """Fail closed: the agent's bundle could not be found or no longer compiles."""
    return PolicyResult(PolicyAction.DENY, reason, "bundle-error")


def target_matcher(pattern: str) -> GlobMatcher:
    """A target condition: the pattern equals the target or glob-matches it (§14.5)."""
    glob = compile_glob(pattern)
    return lambda target: target == pattern or glob(target)


@dataclass(frozen=True, slots=True)
class ArgumentPredicate:
    """Constraints on one top-level argument, checked against its rendered text.

    Empty constraints are absent. `regex` searches (unanchored) and is precompiled.
    """

    name: str
    equals: str = ""
    contains: str = ""
    one_of: frozenset[str] = frozenset()
    regex: Callable[[str], bool] | None = None

    def matches(self, value: str) -> bool:
        if self.equals and value != self.equals:
            return False
        if self.contains and self.contains not in value:
            return False
        if self.one_of and value not in self.one_of:
            return False
        return self.regex is None or self.regex(value)


@dataclass(frozen=True, slots=True)
class Rule:
    """A compiled rule. Every condition group must hold (AND); within a target group any
    pattern may match, and an agent group is a set the agent must belong to."""

    id: str
    result: PolicyResult
    step_kind: StepKind | None = None
    targets: tuple[tuple[GlobMatcher, ...], ...] = ()
    agent_ids: tuple[frozenset[str], ...] = ()
    arguments: tuple[ArgumentPredicate, ...] = ()

    def matches_call(self, agent_id: str, kind: StepKind, target: str) -> bool:
        if self.step_kind is not None and kind != self.step_kind:
            return False
        if any(agent_id not in ids for ids in self.agent_ids):
            return False
        return all(any(match(target) for match in group) for group in self.targets)

    def matches_arguments(self, arguments: _Arguments) -> bool:
        for predicate in self.arguments:
            value = arguments.rendered(predicate.name)
            if value is None or not predicate.matches(value):
                return False
        return True


class Bundle:
    """An agent's compiled rules, in evaluation order, and its default action."""

    __slots__ = ("_default", "_rules")

    def __init__(self, rules: Sequence[Rule], default_action: PolicyAction) -> None:
        self._rules = tuple(rules)
        self._default = DEFAULT_ALLOW if default_action is PolicyAction.ALLOW else DEFAULT_DENY

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def default_action(self) -> PolicyAction:
        return self._default.action

    def evaluate(
        self, agent_id: str, kind: StepKind, target: str, args_json: str | None
    ) -> PolicyResult:
        """The first matching rule's result; else `local` for local steps, else the default."""
        target = go_string(target)
        arguments: _Arguments | None = None
        for rule in self._rules:
            if not rule.matches_call(agent_id, kind, target):
                continue
            if rule.arguments:
                # Parsed at most once, and only when a candidate rule looks at arguments.
                if arguments is None:
                    arguments = _Arguments(args_json)
                if not rule.matches_arguments(arguments):
                    continue
            return rule.result
        return LOCAL_STEP if kind == StepKind.LOCAL else self._default


class _Arguments:
    """The step's args for one evaluation: decoded once, each value rendered once."""

    __slots__ = ("_object", "_rendered")

    def __init__(self, args_json: str | None) -> None:
        self._object = parse_arguments(args_json)
        self._rendered: dict[str, str] = {}

    def rendered(self, name: str) -> str | None:
        """The value's `%v` text, or None when the args are not an object or lack the key."""
        if self._object is None or name not in self._object:
            return None
        text = self._rendered.get(name)
        if text is None:
            text = self._rendered[name] = render_value(self._object[name])
        return text
