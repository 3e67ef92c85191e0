"""`agent-instances` apart from any I/O: the `Rebuno-Agent-Instance` value both ways, and how
an `Agent` is named (its argument, `REBUNO_AGENT_INSTANCE`, or nothing until the port)."""

from __future__ import annotations

import pytest

from rebuno import Agent
from rebuno.protocol.extensions import (
    AgentInstance,
    format_instance,
    is_instance_name,
    parse_instance,
)

UUID = "0192f4c1-7a2b-7c3d-8e4f-a1b2c3d4e5f6"


def test_an_instance_survives_its_header_value() -> None:
    instance = AgentInstance("worker-3.example:5000", UUID)

    assert format_instance(instance) == f"worker-3.example:5000; incarnation={UUID}"
    assert parse_instance(format_instance(instance)) == instance


def test_spaces_around_the_separator_are_allowed() -> None:
    assert parse_instance(f"slot-a;incarnation={UUID}") == AgentInstance("slot-a", UUID)
    assert parse_instance(f" slot-a ;  incarnation={UUID} ") == AgentInstance("slot-a", UUID)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "slot-a",
        f"; incarnation={UUID}",
        f"slot a; incarnation={UUID}",
        f"slot,a; incarnation={UUID}",
        f'slot"a; incarnation={UUID}',
        f"slot\\a; incarnation={UUID}",
        f"slöt; incarnation={UUID}",
        f"{'a' * 201}; incarnation={UUID}",
        "slot-a; incarnation=",
        "slot-a; incarnation=not-a-uuid",
        f"slot-a; incarnation={UUID.upper()}",
        f"slot-a; incarnation={UUID}; extra=1",
        f"slot-a; generation={UUID}",
        f"slot-a; incarnation={UUID}{' ' * 300}",
    ],
)
def test_a_malformed_value_names_no_instance(value: str | None) -> None:
    assert parse_instance(value) is None


def test_a_name_is_at_most_200_visible_characters() -> None:
    assert is_instance_name("a" * 200)
    assert not is_instance_name("a" * 201)
    assert is_instance_name("pod/agent-7@zone[b]:8080~!#$%&'()*+<=>?^_`{|}")


def _agent(instance: str | None = None) -> Agent:
    return Agent("hello", secret="s", base_url="http://127.0.0.1:9", instance=instance)


def test_an_agent_is_named_by_its_argument_before_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REBUNO_AGENT_INSTANCE", "from-env")

    assert _agent(instance="slot-a").instance == "slot-a"
    assert _agent().instance == "from-env"


def test_without_a_name_an_agent_waits_for_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REBUNO_AGENT_INSTANCE", raising=False)

    assert _agent().instance is None


def test_a_name_no_header_can_carry_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="instance must be"):
        _agent(instance="slot a")
    monkeypatch.setenv("REBUNO_AGENT_INSTANCE", "slot;a")
    with pytest.raises(ValueError, match="REBUNO_AGENT_INSTANCE must be"):
        _agent()
