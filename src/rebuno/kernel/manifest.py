"""The provisioning manifest (§18.4): agents to upsert at boot, read from a YAML file.

Environment variables are expanded on the raw text before YAML parsing; policy files are read
relative to the manifest and validated like `POST /v0/policies`. Every problem raises
`ValidationFailed` with a message naming the entry. Must not import `service`, `api` or a store.
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

from rebuno.kernel.domain.dispatch import lease_timeout_problem
from rebuno.kernel.domain.errors import KernelError, ValidationFailed
from rebuno.kernel.policy.loader import load_bundle

_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


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
        ValidationFailed: unreadable file, bad YAML, a bad entry, an unreadable policy file
            or an invalid bundle.
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
    entries = _agent_entries(document, path)
    return [_spec(index, entry, manifest.parent) for index, entry in enumerate(entries)]


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


def _parse_yaml(text: str, path: str) -> object:
    try:
        return YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
        raise ValidationFailed(f"manifest {path}: invalid YAML: {first_line}") from None


def _agent_entries(document: object, path: str) -> list[object]:
    if document is None:
        return []
    if not isinstance(document, dict):
        raise ValidationFailed(f"manifest {path}: expected a mapping with an `agents` list")
    agents = document.get("agents")
    if agents is None:
        return []
    if not isinstance(agents, list):
        raise ValidationFailed(f"manifest {path}: `agents` must be a list")
    return agents


def _spec(index: int, entry: object, base: Path) -> AgentSpec:
    where = f"agents[{index}]"
    if not isinstance(entry, dict):
        raise ValidationFailed(f"{where}: expected a mapping")
    agent_id = _text(entry, "id")
    if not agent_id:
        raise ValidationFailed(f"{where}: id is required")
    return AgentSpec(
        id=agent_id,
        webhook_url=_required(entry, "webhook_url", where),
        secret=_required(entry, "secret", where),
        lease_timeout_seconds=_lease_timeout(entry, where),
        policy_bundle=_policy(entry, where, base),
    )


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    # YAML reads `id: 42` as a number; the agent id is still the text the operator wrote.
    if isinstance(value, bool) or value is None:
        return ""
    return str(value) if isinstance(value, str | int | float) else ""


def _required(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = _text(entry, key)
    if not value:
        raise ValidationFailed(f"{where}: {key} is required")
    return value


def _lease_timeout(entry: Mapping[str, Any], where: str) -> float | None:
    value = entry.get("lease_timeout_seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"{where}: lease_timeout_seconds must be a positive number")
    if problem := lease_timeout_problem(float(value)):
        raise ValidationFailed(f"{where}: {problem}")
    return float(value)


def _policy(entry: Mapping[str, Any], where: str, base: Path) -> str | None:
    inline, policy_file = entry.get("policy"), entry.get("policy_file")
    if inline is not None and policy_file is not None:
        raise ValidationFailed(f"{where}: set either policy or policy_file, not both")
    bundle: str | None
    if policy_file is not None:
        bundle = _read_policy_file(policy_file, where, base)
    elif inline is None or isinstance(inline, str):
        bundle = inline
    else:
        raise ValidationFailed(f"{where}: policy must be a YAML text block (use `policy: |`)")
    if not bundle:
        return None
    _validate_bundle(bundle, where)
    return bundle


def _read_policy_file(value: object, where: str, base: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationFailed(f"{where}: policy_file must be a path")
    path = Path(value) if Path(value).is_absolute() else base / value
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationFailed(f"{where}: cannot read policy_file {path}: {_reason(exc)}") from None


def _validate_bundle(bundle: str, where: str) -> None:
    try:
        load_bundle(bundle)
    except KernelError as exc:
        raise ValidationFailed(f"{where}: invalid policy: {exc.message}") from None
    except ValueError as exc:
        raise ValidationFailed(f"{where}: invalid policy: {exc}") from None


def _reason(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
