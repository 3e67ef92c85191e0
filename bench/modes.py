"""The agent modes A and B (and D, measured during B) run in: how the agent records its steps and
whether its registration carries a policy. The mode is chosen on the agent's side; the kernel
runs as it always does. Standard library only.

A figure of the headline mode keeps its plain key (`A.span_marginal_per_step`); the same figure
of another mode carries the mode after the letter (`A.governed.span_marginal_per_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOW_ALL_POLICY = """\
rules:
  - id: work
    when: {step_kind: local, target: work}
    then: {decision: allow}
default_action: allow
"""
"""The governed mode's bundle: it allows everything, but every new step is evaluated by it."""


@dataclass(frozen=True, slots=True)
class Mode:
    """`durability` is what the agent passes to `Agent` (`""`: nothing, the default);
    `policy` is the agent's bundle, if any; `judged` says whether the targets apply."""

    name: str
    durability: str
    policy: str | None
    judged: bool
    caption: str

    def key(self, letter: str) -> str:
        """The prefix of this mode's figures of scenario `letter` (`A`, `A.governed`)."""
        return letter if self is HEADLINE else f"{letter}.{self.name}"


HEADLINE = Mode("durable", "", None, True, "the default Agent, no policy: the headline, judged")
MODES = (
    HEADLINE,
    Mode("governed", "", ALLOW_ALL_POLICY, True, "the default Agent, an allow-all policy: judged"),
    Mode("batched", "batched", None, False, 'Agent(..., durability="batched"): not judged'),
)
BY_NAME = {mode.name: mode for mode in MODES}


def split(key: str) -> tuple[str, Mode]:
    """A figure's key without its mode, and the mode: `A.governed.x` is (`A.x`, governed)."""
    letter, _, rest = key.partition(".")
    name, dot, figure = rest.partition(".")
    if dot and name in BY_NAME:
        return f"{letter}.{figure}", BY_NAME[name]
    return key, HEADLINE
