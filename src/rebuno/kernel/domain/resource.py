"""External resources and their checkpoints (docs/protocol.md §33): registration, the
generations steps advance, the count of settled steps, which captures are accepted, coverage,
and what a fork selects. Pure rules: no I/O, no clock.

Must not import anything outside `rebuno.protocol` and the domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from rebuno.kernel.domain.errors import Conflict, ValidationFailed
from rebuno.kernel.domain.event import Raw
from rebuno.kernel.domain.records import Checkpoint, Resource
from rebuno.protocol.enums import StepKind

KEY_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_RESOURCES = 64
MAX_ERROR_CHARS = 1024

UNKNOWN_RESOURCE = "unknown_resource"
MISSING_CHECKPOINT_REF = "missing_checkpoint_ref"
DUPLICATE_CAPTURE = "duplicate_capture"
STALE_GENERATION = "stale_generation"
WRITERS_ACTIVE = "writers_active"


@dataclass(frozen=True, slots=True)
class Registration:
    """A register request (§33.2), validated: `configuration` is canonical JSON text."""

    key: str
    driver_id: str
    configuration: str | None
    coverage_reuse: bool
    every_steps: int
    on_completion: bool | None

    @property
    def stored_on_completion(self) -> bool:
        return self.every_steps > 0 and self.on_completion is not False


@dataclass(frozen=True, slots=True)
class Capture:
    key: str
    generation: int
    checkpoint_ref: str


@dataclass(frozen=True, slots=True)
class CaptureFailure:
    key: str
    generation: int
    error: str


@dataclass(frozen=True, slots=True)
class Captures:
    """What a publish or a step outcome carries (§33.4, §33.6)."""

    captures: tuple[Capture, ...] = ()
    failures: tuple[CaptureFailure, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.captures or self.failures)


NO_CAPTURES = Captures()


@dataclass(frozen=True, slots=True)
class StepResource:
    """One entry of a `proceed` decision's `resources` (§33.5)."""

    key: str
    generation: int
    due: bool


@dataclass(frozen=True, slots=True)
class Touch:
    """What a live step does to the resources (§33.5): the keys it affects, the resources it
    touches as they are after it (generation + 1), and the decision's entries."""

    affected: tuple[str, ...] = ()
    touched: tuple[Resource, ...] = ()
    entries: tuple[StepResource, ...] = ()

    def generations(self) -> dict[str, int]:
        return {r.key: r.generation for r in self.touched}


NO_TOUCH = Touch()


def check_key(key: str) -> None:
    if KEY_PATTERN.fullmatch(key) is None:
        raise ValidationFailed("validation error: key must match ^[A-Za-z0-9_.-]{1,128}$")


def register(
    existing: Resource | None, request: Registration, execution_id: str, seq: int, total: int
) -> Resource | None:
    """The resource as registering leaves it, or None when nothing changes (§33.2). `seq`:
    the `resource.registered` event's, if one is written; `total`: resources already there."""
    if existing is None:
        if total >= MAX_RESOURCES:
            raise ValidationFailed(
                f"validation error: an execution has at most {MAX_RESOURCES} resources"
            )
        return Resource(
            execution_id=execution_id,
            key=request.key,
            driver_id=request.driver_id,
            configuration=request.configuration,
            coverage_reuse=request.coverage_reuse,
            every_steps=request.every_steps,
            on_completion=request.stored_on_completion,
            registered_seq=seq,
            generation=0,
            count=0,
        )
    if (
        existing.driver_id != request.driver_id
        or (existing.configuration or "null") != (request.configuration or "null")
        or existing.coverage_reuse != request.coverage_reuse
    ):
        raise Conflict(
            f"resource {request.key} is registered with another driver, configuration or"
            " coverage_reuse"
        )
    if existing.every_steps == 0 and request.every_steps > 0:
        # A policy, once enabled, is never changed by registering again (§33.9 item 5).
        return replace(
            existing,
            every_steps=request.every_steps,
            on_completion=request.stored_on_completion,
        )
    return None


def affected_keys(
    resources: Sequence[Resource], declared: Iterable[str], kind: StepKind
) -> tuple[str, ...]:
    """The keys a step affects, in registration order: none for an `llm_call`. Raises
    `ValidationFailed` naming a declared key that is not registered."""
    wanted = set(declared)
    if not wanted:
        return ()
    known = {r.key for r in resources}
    for key in sorted(wanted - known):
        raise ValidationFailed(f"validation error: resource {key} is not registered")
    if kind is StepKind.LLM_CALL:
        return ()
    return tuple(r.key for r in resources if r.key in wanted)


def touch(resources: Sequence[Resource], affected: tuple[str, ...]) -> Touch:
    """A live step touches what it affects, and every resource without `coverage_reuse`."""
    if not resources:
        return NO_TOUCH
    touched: list[Resource] = []
    entries: list[StepResource] = []
    for r in resources:
        affects = r.key in affected
        if not (affects or not r.coverage_reuse):
            continue
        after = replace(r, generation=r.generation + 1)
        due = affects and r.every_steps > 0 and (r.count + 1) % r.every_steps == 0
        touched.append(after)
        entries.append(StepResource(r.key, after.generation, due))
    return Touch(affected, tuple(touched), tuple(entries))


def settle(resources: Sequence[Resource], affected: Iterable[str]) -> list[Resource]:
    """The resources a step that left `executing` counts toward, each one more."""
    keys = set(affected)
    return [replace(r, count=r.count + 1) for r in resources if r.key in keys]


def judge(
    resources: Mapping[str, Resource],
    writing: set[str],
    captures: Sequence[Capture],
) -> list[tuple[Capture, str | None]]:
    """Each capture with the reason it is refused (§33.4, first matching), or None when it
    is accepted. `writing`: the keys some `executing` step affects."""
    accepted: set[str] = set()
    judged: list[tuple[Capture, str | None]] = []
    for capture in captures:
        reason = _refusal(resources.get(capture.key), capture, accepted, writing)
        if reason is None:
            accepted.add(capture.key)
        judged.append((capture, reason))
    return judged


def _refusal(
    resource: Resource | None, capture: Capture, accepted: set[str], writing: set[str]
) -> str | None:
    if resource is None:
        return UNKNOWN_RESOURCE
    if not capture.checkpoint_ref:
        return MISSING_CHECKPOINT_REF
    if capture.key in accepted:
        return DUPLICATE_CAPTURE
    if capture.generation != resource.generation:
        return STALE_GENERATION
    if capture.key in writing:
        return WRITERS_ACTIVE
    return None


def is_covered(resource: Resource, checkpoints: Iterable[Checkpoint]) -> bool:
    """An open checkpoint of the resource's current generation (§33.1)."""
    return any(
        c.key == resource.key and c.invalidated_seq is None and c.generation == resource.generation
        for c in checkpoints
    )


def covers(checkpoint: Checkpoint, seq: int) -> bool:
    return checkpoint.covered_seq <= seq and (
        checkpoint.invalidated_seq is None or seq < checkpoint.invalidated_seq
    )


@dataclass(frozen=True, slots=True)
class Selection:
    """What a fork starts a resource from (§33.8.1): a checkpoint, or the initial
    environment (`checkpoint` None)."""

    checkpoint: Checkpoint | None
    covered: bool

    def render(self) -> dict[str, object]:
        if self.checkpoint is None:
            return {"covered": self.covered}
        return {
            "checkpoint_ref": self.checkpoint.checkpoint_ref,
            "checkpoint_seq": self.checkpoint.covered_seq,
            "covered": self.covered,
        }


def select(checkpoints: Sequence[Checkpoint], at_seq: int) -> Selection:
    """The newest checkpoint covering `at_seq`, else the newest of all, else none.
    `checkpoints`: the key's with `covered_seq <= at_seq`, in insertion order."""
    if not checkpoints:
        return Selection(None, False)
    newest_first = sorted(
        enumerate(checkpoints), key=lambda item: (item[1].covered_seq, item[0]), reverse=True
    )
    for _, checkpoint in newest_first:
        if covers(checkpoint, at_seq):
            return Selection(checkpoint, True)
    return Selection(newest_first[0][1], False)


def registered_payload(r: Resource) -> dict[str, object]:
    return {
        "key": r.key,
        "driver_id": r.driver_id,
        "configuration": Raw(r.configuration or "null"),
        "coverage_reuse": r.coverage_reuse,
        "every_steps": r.every_steps,
        "on_completion": r.on_completion,
    }


def checkpoint_payload(c: Checkpoint) -> dict[str, object]:
    return {
        "key": c.key,
        "generation": c.generation,
        "checkpoint_ref": c.checkpoint_ref,
        "covered_seq": c.covered_seq,
    }
