"""Binds an execution's input to the handler's signature, before the handler runs.

Three shapes: keyword fields (each parameter is an input field, validated by a pydantic model
built from the signature), a single pydantic-model parameter (the input is validated against
it), and raw passthrough (a single `dict`/`Any`/unannotated parameter receives the input as
is). Imports only pydantic and the SDK's errors; never the kernel.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from rebuno.sdk.errors import _InputInvalid

_RAW = (inspect.Parameter.empty, Any, dict, object)
_FIELD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True, slots=True)
class BoundCall:
    """The keyword arguments to call the handler with."""

    kwargs: dict[str, Any] = field(default_factory=dict)


class InputBinder:
    """Built once per handler; `bind(input)` raises `_InputInvalid` with a readable reason."""

    def __init__(self, handler: Callable[..., Any]) -> None:
        self._signature = inspect.signature(handler)
        self._hints = _type_hints(handler)
        params = [p for p in self._signature.parameters.values() if p.kind in _FIELD_KINDS]
        self._extra = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in self._signature.parameters.values()
        )
        self._whole = _whole_input(params, self._hints) if not self._extra else None
        name = getattr(handler, "__name__", "HandlerInput")
        self._fields = _fields_model(name, params, self._hints) if self._whole is None else None

    def json_schema(self) -> dict[str, Any] | None:
        """The JSON Schema of the input the handler takes (§36.1): its model's, or that of
        its keyword fields (titled with the handler's name); None for a handler that takes
        the raw input, or whose annotations have no JSON Schema."""
        model = self._fields
        if self._whole is not None:
            annotation = self._whole[1]
            model = annotation if _is_model(annotation) else None
        if model is None:
            return None
        try:
            return model.model_json_schema()
        except Exception:  # an arbitrary type pydantic validates but cannot describe
            return None

    def bind(self, value: Any) -> BoundCall:
        """The handler's arguments for the execution input `value`."""
        if self._whole is None:
            return BoundCall(kwargs=self._bind_fields(value))
        name, annotation = self._whole
        bound = _validate(annotation, value) if _is_model(annotation) else value
        return BoundCall(kwargs={name: bound})

    def _bind_fields(self, value: Any) -> dict[str, Any]:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise _InputInvalid(f"expected a JSON object as input, got {type(value).__name__}")
        known: dict[str, Any] = {}
        if self._fields is not None:
            model = _validate(self._fields, value)
            known = {name: getattr(model, name) for name in type(model).model_fields}
        extra = {k: v for k, v in value.items() if k not in known} if self._extra else {}
        return {**known, **extra}


def _whole_input(params: list[inspect.Parameter], hints: dict[str, Any]) -> tuple[str, Any] | None:
    """`(name, annotation)` when one parameter takes the whole input: a model, or raw."""
    if len(params) != 1:
        return None
    annotation = hints.get(params[0].name, params[0].annotation)
    return (params[0].name, annotation) if _is_model(annotation) or _is_raw(annotation) else None


def _type_hints(handler: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(handler)
    except Exception:
        return _hints_one_by_one(handler)


def _hints_one_by_one(handler: Callable[..., Any]) -> dict[str, Any]:
    """Resolve what can be resolved; a name that cannot (say, a class local to a function
    under `from __future__ import annotations`) binds as an untyped field."""
    namespace = getattr(handler, "__globals__", {})
    hints: dict[str, Any] = {}
    for name, annotation in getattr(handler, "__annotations__", {}).items():
        if not isinstance(annotation, str):
            hints[name] = annotation
            continue
        try:
            hints[name] = eval(annotation, namespace)  # the same lookup get_type_hints does
        except Exception:
            hints[name] = Any
    return hints


def _fields_model(
    name: str, params: list[inspect.Parameter], hints: dict[str, Any]
) -> type[pydantic.BaseModel]:
    definitions: dict[str, Any] = {}
    for param in params:
        annotation = hints.get(param.name, param.annotation)
        if annotation is inspect.Parameter.empty:
            annotation = Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        definitions[param.name] = (annotation, default)
    config = pydantic.ConfigDict(protected_namespaces=(), arbitrary_types_allowed=True)
    return pydantic.create_model(name, __config__=config, **definitions)


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel)


def _is_raw(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return annotation in _RAW or origin is dict


def _validate(model: type[pydantic.BaseModel], value: Any) -> pydantic.BaseModel:
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as exc:
        raise _InputInvalid(_describe(exc)) from None


def _describe(exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "input"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
