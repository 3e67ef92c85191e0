"""The provisioning manifest (§18.4): agents to upsert at boot, read from a YAML file.

Environment variables are expanded on the raw text before YAML parsing; policy files are read
relative to the manifest and validated like `POST /v0/policies`. Every problem raises
`ValidationFailed` with a message naming the file, the line and the key's path, e.g.
`manifest rebuno.yaml, line 4: agents[0].webhok_url: unknown key (did you mean webhook_url?)`:
an unknown key is refused rather than ignored, since a misspelt `policy` would otherwise boot
the agent without its bundle. Must not import `service`, `api` or a store.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import ScalarNode

from rebuno.kernel.domain.dispatch import lease_timeout_problem
from rebuno.kernel.domain.errors import ValidationFailed
from rebuno.kernel.policy.loader import (
    BundleInvalid,
    Location,
    closest_key,
    line_and_column,
    load_bundle,
    yaml_error_place,
    yaml_place,
)

_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_TOP_KEYS = ("agents",)
_AGENT_KEYS = ("id", "webhook_url", "secret", "lease_timeout_seconds", "policy", "policy_file")


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One manifest entry; it defines the agent completely (no bundle means none)."""

    id: str
    webhook_url: str
    secret: str
    lease_timeout_seconds: float | None
    policy_bundle: str | None


def load_manifest(path: str, env: Mapping[str, str] | None = None) -> list[AgentSpec]:
    """Read, expand and validate the manifest at `path` (`env` defaults to `os.environ`).

    Raises:
        ValidationFailed: unreadable file, bad YAML, an unknown key, a bad entry, an
            unreadable policy file or an invalid bundle.
    """
    manifest = Path(path)
    try:
        raw = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"cannot read manifest {path}: {_reason(exc)}") from None
    try:
        expanded = expand_env(raw, os.environ if env is None else env)
    except KeyError as exc:
        line = raw[: raw.find("$" + str(exc.args[0]))].count("\n") + 1
        raise ValidationFailed(
            f"manifest {path}, line {line}: environment variable {exc.args[0]} is not set "
            "(write $$ for a literal $)"
        ) from None
    document = _parse_yaml(expanded, path)
    try:
        entries = _agent_entries(document)
        return [_spec(index, entry, manifest.parent) for index, entry in enumerate(entries)]
    except _Refusal as refusal:
        raise ValidationFailed(_placed(refusal, path, expanded)) from None


def expand_env(text: str, env: Mapping[str, str]) -> str:
    """`$NAME` and `${NAME}` become the variable's value and `$$` a literal `$`. An unset
    variable raises `KeyError` with its name: a secret must never silently be the text
    `$NAME`."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        name = match.group(2) or match.group(3)
        if name not in env:
            raise KeyError(name)
        return env[name]

    return _VARIABLE.sub(substitute, text)


class _Refusal(Exception):
    """A problem with the key (or entry) at `location`, raised up to `load_manifest`, which
    names the file and the line. The message names `entry` (the entry, for a problem whose
    text names its key) or else `location`. `bundle` is the problem of the policy there,
    placed in its own text: in the policy file `file`, or in the manifest when inline."""

    def __init__(
        self,
        location: Location,
        problem: str,
        *,
        entry: Location | None = None,
        bundle: BundleInvalid | None = None,
        file: str = "",
    ) -> None:
        super().__init__(problem)
        self.location = location
        self.problem = problem
        self.shown = location if entry is None else entry
        self.bundle = bundle
        self.file = file


def _placed(refusal: _Refusal, path: str, text: str) -> str:
    where = _path_of(refusal.shown)
    bundle = refusal.bundle
    if refusal.file:
        place = line_and_column(bundle.line, bundle.column) if bundle is not None else ""
        return f"manifest {path}, {where} {refusal.file}{place}: {refusal.problem}"
    line, column, problem = _in_manifest(refusal, text)
    subject = f"{where}: " if where else ""
    return f"manifest {path}{line_and_column(line, column)}: {subject}{problem}"


def _in_manifest(refusal: _Refusal, text: str) -> tuple[int | None, int | None, str]:
    """The line of the key at fault, and the problem. A problem inside a `policy: |` block
    is placed where it is, since the block's lines are the bundle's lines."""
    found = yaml_place(text, refusal.location)
    if found is None:
        return None, None, refusal.problem
    bundle, block = refusal.bundle, found.value
    if bundle is None or bundle.line is None or not isinstance(block, ScalarNode):
        return found.line, None, refusal.problem
    if block.style != "|":
        return found.line, None, refusal.problem
    # The block's first line follows its `|` indicator; `start_mark.line` counts from 0.
    first = block.start_mark.line + 2
    if bundle.yaml_error is not None:
        indent = _indent(text, first, str(block.value))
        problem, line, column = yaml_error_place(bundle.yaml_error, first, indent)
        return line, column, f"invalid YAML: {problem}"
    return first + bundle.line - 1, None, refusal.problem


def _indent(text: str, first: int, bundle: str) -> int:
    """How far the block's lines are indented in the manifest, judged on its first line
    that is not blank."""
    lines = text.splitlines()[first - 1 :]
    for outer, inner in zip(lines, bundle.splitlines(), strict=False):
        if inner.strip():
            return len(outer) - len(inner) if outer.endswith(inner) else 0
    return 0


def _path_of(location: Location) -> str:
    """`("agents", 0, "secret")` as `agents[0].secret`."""
    text = ""
    for step in location:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _parse_yaml(text: str, path: str) -> object:
    try:
        return YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        problem, line, column = yaml_error_place(exc)
        place = line_and_column(line, column)
        raise ValidationFailed(f"manifest {path}{place}: invalid YAML: {problem}") from None


def _check_keys(mapping: Mapping[object, object], known: tuple[str, ...], at: Location) -> None:
    """Refuse the first key that is not `known`, naming the closest known one."""
    for key in mapping:
        if isinstance(key, str) and key in known:
            continue
        name = key if isinstance(key, str) else str(key)
        close = closest_key(name, known)
        hint = f"did you mean {close}?" if close else f"known keys: {', '.join(known)}"
        raise _Refusal((*at, name), f"unknown key ({hint})")


def _agent_entries(document: object) -> list[object]:
    """The entries, once no key anywhere is unknown: a typo is reported before whatever
    it leaves missing."""
    if document is None:
        return []
    if not isinstance(document, dict):
        raise _Refusal((), "expected a mapping with an `agents` list")
    _check_keys(document, _TOP_KEYS, ())
    agents = document.get("agents")
    if agents is None:
        return []
    if not isinstance(agents, list):
        raise _Refusal(("agents",), "`agents` must be a list")
    for index, entry in enumerate(agents):
        if isinstance(entry, dict):
            _check_keys(entry, _AGENT_KEYS, ("agents", index))
    return agents


def _spec(index: int, entry: object, base: Path) -> AgentSpec:
    at: Location = ("agents", index)
    if not isinstance(entry, dict):
        raise _Refusal(at, "expected a mapping")
    agent_id = _text(entry, "id")
    if not agent_id:
        raise _Refusal(at, "id is required")
    return AgentSpec(
        id=agent_id,
        webhook_url=_required(entry, "webhook_url", at),
        secret=_required(entry, "secret", at),
        lease_timeout_seconds=_lease_timeout(entry, at),
        policy_bundle=_policy(entry, at, base),
    )


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    # YAML reads `id: 42` as a number; the agent id is still the text the operator wrote.
    if isinstance(value, bool) or value is None:
        return ""
    return str(value) if isinstance(value, str | int | float) else ""


def _required(entry: Mapping[str, Any], key: str, at: Location) -> str:
    value = _text(entry, key)
    if not value:
        raise _Refusal((*at, key) if key in entry else at, f"{key} is required", entry=at)
    return value


def _lease_timeout(entry: Mapping[str, Any], at: Location) -> float | None:
    value = entry.get("lease_timeout_seconds")
    if value is None:
        return None
    key_at = (*at, "lease_timeout_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Refusal(key_at, "lease_timeout_seconds must be a positive number", entry=at)
    if problem := lease_timeout_problem(float(value)):
        raise _Refusal(key_at, problem, entry=at)
    return float(value)


def _policy(entry: Mapping[str, Any], at: Location, base: Path) -> str | None:
    inline, policy_file = entry.get("policy"), entry.get("policy_file")
    if inline is not None and policy_file is not None:
        raise _Refusal(at, "set either policy or policy_file, not both")
    if policy_file is not None:
        path = _policy_path(policy_file, at, base)
        bundle = _read_policy_file(path, at)
        if bundle:
            _validate_bundle(bundle, (*at, "policy_file"), file=str(path))
        return bundle or None
    if inline is not None and not isinstance(inline, str):
        problem = "policy must be a YAML text block (use `policy: |`)"
        raise _Refusal((*at, "policy"), problem, entry=at)
    if inline:
        _validate_bundle(inline, (*at, "policy"))
    return inline or None


def _policy_path(value: object, at: Location, base: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise _Refusal((*at, "policy_file"), "policy_file must be a path", entry=at)
    return Path(value) if Path(value).is_absolute() else base / value


def _read_policy_file(path: Path, at: Location) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot read policy_file {path}: {_reason(exc)}"
        raise _Refusal((*at, "policy_file"), problem, entry=at) from None


def _validate_bundle(bundle: str, at: Location, file: str = "") -> None:
    """Compile the bundle as the kernel will. Its problem is placed in the policy file, or
    in the manifest when the bundle is written inline (see `_Refusal`)."""
    try:
        load_bundle(bundle)
    except BundleInvalid as exc:
        raise _Refusal(at, exc.problem, bundle=exc, file=file) from None
    except ValidationFailed as exc:
        raise _Refusal(at, f"invalid policy: {exc.message}") from None
    except ValueError as exc:
        raise _Refusal(at, f"invalid policy: {exc}") from None


def _reason(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
