"""The scenarios `make chaos` runs, in order: module names under `chaos`."""

from __future__ import annotations

import importlib

from chaos.result import Scenario

MODULES: tuple[str, ...] = (
    "agent_kill",
    "false_commit",
    "duplicate_webhooks",
    "clock_skew",
    "property_replay",
    "replica_kill",
    "postgres_restart",
    "partition",
)


def scenarios(names: list[str] | None = None) -> list[Scenario]:
    """The registered scenarios, or those named (by `NAME`), in registry order."""
    loaded: list[Scenario] = [importlib.import_module(f"chaos.{module}") for module in MODULES]
    if names is None:
        return loaded
    unknown = set(names) - {scenario.NAME for scenario in loaded}
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return [scenario for scenario in loaded if scenario.NAME in names]
