"""Reading request bodies under the size cap, and reading fields out of a JSON body.

The cap (§3.3) is enforced from `Content-Length` before anything is read and again while a
chunked body streams in, before any signature is checked. Bodies are parsed with the
literal-preserving decoder, and JSON fields handed to the service are canonical text.
Must not import a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from starlette.requests import Request

from rebuno.kernel.domain.decision import Carried, StepOutcome, StepRecord, StepRequest
from rebuno.kernel.domain.errors import PayloadTooLarge, RequestTimeout, ValidationFailed
from rebuno.kernel.domain.records import RawJson
from rebuno.kernel.domain.resource import Capture, CaptureFailure, Captures
from rebuno.protocol.canonical import JsonNumber, args_hash, dumps, loads
from rebuno.protocol.enums import Idempotency, StepKind

JsonObject = dict[str, Any]
E = TypeVar("E", bound=StrEnum)
T = TypeVar("T")
NO_RESOURCES = "a step reported after it ran touches no resource"
# A step reported after it ran (`step-records`) never needed a decision: only these kinds and
# only a step that may run again can be reported that way.
_RECORDED_KINDS = frozenset({StepKind.TOOL_CALL, StepKind.LOCAL})


async def read_body(request: Request, limit: int, within: float | None = None) -> bytes:
    """The whole body, or `PayloadTooLarge` as soon as it is known to exceed `limit` bytes,
    or `RequestTimeout` when it has not all arrived `within` seconds (a client that
    trickles a body in would otherwise hold the request, and what it sent, for ever)."""
    declared = request.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(within):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {within:g} s") from None
    return b"".join(chunks)


OFF_LOOP_BYTES = 256 * 1024
"""A request body at least this large is parsed and canonicalised on a worker thread: for a
body of megabytes that is seconds of Python work, during which the event loop would answer
nothing else (health, heartbeats, deliveries)."""


async def off_loop(body: bytes, read: Callable[[bytes], T]) -> T:
    """`read(body)`, on a worker thread when the body is large (`OFF_LOOP_BYTES`)."""
    if len(body) < OFF_LOOP_BYTES:
        return read(body)
    return await asyncio.to_thread(read, body)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body is larger than {limit} bytes")


def parse_object(body: bytes) -> JsonObject:
    """The body as a JSON object; empty, malformed or non-object bodies are a 400."""
    if not body.strip():
        raise ValidationFailed("validation error: request body is required")
    try:
        value = loads(body)
    except ValueError as exc:
        raise ValidationFailed(f"validation error: invalid JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise ValidationFailed("validation error: request body must be a JSON object")
    # Nesting never exceeds the count of opening brackets, which C counts in no time; only a
    # body with more of them than the limit is walked.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and too_deep(value, MAX_DEPTH):
        raise ValidationFailed(f"validation error: JSON nested deeper than {MAX_DEPTH} levels")
    return value


MAX_DEPTH = 128
"""How deeply a request body's JSON may nest: canonical encoding, hashing and rendering all
walk it, and none of them should meet Python's recursion limit."""


def too_deep(value: object, limit: int) -> bool:
    """Whether `value` nests arrays and objects more than `limit` levels (iteratively)."""
    level: list[object] = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list) for item in level)


def is_text(value: object) -> bool:
    """A JSON string (number literals are `str` subclasses, and are not text)."""
    return isinstance(value, str) and not isinstance(value, JsonNumber)


def text_field(body: JsonObject, key: str, *, required: bool = False) -> str:
    """A string member; absent or null reads as `""`, any other type is a 400."""
    value = body.get(key)
    if value is None:
        value = ""
    if not is_text(value):
        raise ValidationFailed(f"validation error: {key} must be a string")
    if required and not value:
        raise ValidationFailed(f"validation error: {key} is required")
    if "\x00" in value:
        raise ValidationFailed(f"validation error: {key} must not contain a NUL character")
    return str(value)


MAX_LABEL_BYTES = 256


def label_field(body: JsonObject, key: str) -> str | None:
    """§23: a label is a string of at most 256 UTF-8 bytes, with no NUL and not only
    whitespace, kept exactly as sent; absent, null or `""` is none (None)."""
    value = text_field(body, key)
    if not value:
        return None
    if len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_BYTES:
        raise ValidationFailed(
            f"validation error: {key} is longer than {MAX_LABEL_BYTES} bytes of UTF-8"
        )
    if not value.strip():
        raise ValidationFailed(f"validation error: {key} must not be blank")
    return value


def required_raw(body: JsonObject, key: str) -> RawJson:
    """A member that must be present (of any JSON type, `null` included), as canonical text:
    an end or an outcome without its member is refused rather than read as `null`."""
    if key not in body:
        raise ValidationFailed(f"validation error: {key} is required")
    return dumps(body[key])


def raw_field(body: JsonObject, key: str) -> RawJson | None:
    """A member of any JSON type as canonical text; None when the member is absent."""
    if key not in body:
        return None
    return dumps(body[key])


def integer_field(body: JsonObject, key: str) -> int:
    value = body.get(key)
    if not isinstance(value, JsonNumber) or not _is_integer_literal(value):
        raise ValidationFailed(f"validation error: {key} must be an integer")
    if len(value.lstrip("+-")) > 19:  # past 64 bits; a longer literal is not even parsed
        raise ValidationFailed(f"validation error: {key} is out of range")
    return int(value)


MAX_OCCURRENCE = 2**31 - 1


def occurrence_field(body: JsonObject) -> int | None:
    """`step-occurrences`: the agent's own number for this submission, 0 or more; None when
    absent or null."""
    if body.get("occurrence") is None:
        return None
    occurrence = integer_field(body, "occurrence")
    if not 0 <= occurrence <= MAX_OCCURRENCE:
        raise ValidationFailed(f"validation error: occurrence must be from 0 to {MAX_OCCURRENCE}")
    return occurrence


def number_field(body: JsonObject, key: str) -> float | None:
    """A number member; None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, JsonNumber):
        raise ValidationFailed(f"validation error: {key} must be a number")
    try:
        return float(value)
    except OverflowError:  # an integer literal too large for a float
        raise ValidationFailed(f"validation error: {key} is out of range") from None


def _is_integer_literal(literal: str) -> bool:
    return not any(mark in literal for mark in ".eE")


def is_empty(value: object) -> bool:
    """Whether an extension field carries nothing (absent, null, "", [] or {})."""
    return value is None or value in ("", [], {})


def reject_present(body: JsonObject, keys: tuple[str, ...], why: str) -> None:
    for key in keys:
        if not is_empty(body.get(key)):
            raise ValidationFailed(f"validation error: {key} is not supported: {why}")


def step_request(body: JsonObject) -> StepRequest:
    """§5.2: `kind` required and known, `idempotency` known or empty, `args` missing ≡ null."""
    kind = _member(StepKind, text_field(body, "kind", required=True), "kind")
    idempotency = _member(
        Idempotency, text_field(body, "idempotency") or Idempotency.SAFE_TO_RETRY, "idempotency"
    )
    args = raw_field(body, "args")
    args = None if args == "null" else args
    return StepRequest(
        kind=kind,
        target=text_field(body, "target"),
        args=args,
        args_hash=args_hash(args or "null"),
        idempotency=idempotency,
        resources=_declared(body.get("resources")),
    )


def _declared(value: object) -> tuple[str, ...]:
    """§33.5: the resources a step declares, an array of strings; duplicates are ignored."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_text(key) for key in value):
        raise ValidationFailed("validation error: resources must be an array of strings")
    return tuple(dict.fromkeys(str(key) for key in value))


MAX_CAPTURES = 1000


def captures_field(body: JsonObject) -> Captures:
    """§33.4: `captures` and `capture_failures`, each absent or an array of entries with a
    string `key`, an integer `generation` and a string `checkpoint_ref` or `error`."""
    captures = tuple(
        Capture(key, generation, text)
        for key, generation, text in _entries(body, "captures", "checkpoint_ref")
    )
    failures = tuple(
        CaptureFailure(key, generation, text)
        for key, generation, text in _entries(body, "capture_failures", "error")
    )
    return Captures(captures, failures)


MAX_CHECKPOINT_REF_BYTES = 4096


def _entries(body: JsonObject, field: str, text_key: str) -> list[tuple[str, int, str]]:
    items = body.get(field)
    if items is None:
        return []
    if not isinstance(items, list) or len(items) > MAX_CAPTURES:
        raise ValidationFailed(
            f"validation error: {field} must be an array of at most {MAX_CAPTURES} objects"
        )
    entries = []
    for item in items:
        if not isinstance(item, dict):
            raise ValidationFailed(f"validation error: each of {field} must be an object")
        key = text_field(item, "key", required=True)
        text = text_field(item, text_key)
        if text_key == "checkpoint_ref" and len(text.encode()) > MAX_CHECKPOINT_REF_BYTES:
            raise ValidationFailed(
                f"validation error: checkpoint_ref is longer than {MAX_CHECKPOINT_REF_BYTES} bytes"
            )
        entries.append((key, integer_field(item, "generation"), text))
    return entries


def _member(enum: type[E], text: str, field: str) -> E:
    try:
        return enum(text)
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise ValidationFailed(f"validation error: {field} must be one of {allowed}") from None


MAX_OUTCOMES = 1000


def step_outcomes(body: JsonObject) -> tuple[Carried, ...]:
    """The `completions` member of our extensions, in the order the steps finished: each item
    is `{"step_id", "result" | "error"}` (`step-completions`: a submitted step's outcome) or
    `{"kind", "target", "args", "result" | "error"}` (`step-records`: a step that ran before it
    was submitted). Absent means none."""
    items = body.get("completions")
    if items is None:
        return ()
    if not isinstance(items, list) or len(items) > MAX_OUTCOMES:
        raise ValidationFailed(
            f"validation error: completions must be a list of at most {MAX_OUTCOMES} objects"
        )
    return tuple(_outcome(item) for item in items)


def _outcome(item: object) -> Carried:
    if not isinstance(item, dict) or ("result" in item) == ("error" in item):
        raise ValidationFailed(
            "validation error: each completion needs a step_id or a kind, and exactly one of"
            " result, error"
        )
    result, error = raw_field(item, "result"), raw_field(item, "error")
    if "step_id" in item or "kind" not in item:
        step_id = text_field(item, "step_id", required=True)
        return StepOutcome(step_id, result, error)
    request = step_request(item)
    if request.resources:
        raise ValidationFailed(f"validation error: resources is not supported: {NO_RESOURCES}")
    if request.kind not in _RECORDED_KINDS or request.idempotency is not Idempotency.SAFE_TO_RETRY:
        raise ValidationFailed(
            "validation error: a completion with a kind records a safe_to_retry tool_call or"
            " local step"
        )
    return StepRecord(request, result, error)
