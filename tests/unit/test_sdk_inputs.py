"""Binding an execution's input to the handler's signature."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from rebuno.sdk._inputs import InputBinder
from rebuno.sdk.errors import _InputInvalid


class Question(BaseModel):
    prompt: str
    limit: int = 10


async def fields(prompt: str, limit: int = 10) -> None: ...


async def model(question: Question) -> None: ...


async def raw_dict(input: dict[str, Any]) -> None: ...


# Unannotated on purpose: a handler without annotations takes the input as it came.
async def raw_untyped(input) -> None: ...  # type: ignore[no-untyped-def]


async def nothing() -> None: ...


async def open_ended(prompt: str, **rest: Any) -> None: ...


def test_keyword_fields_are_bound_with_defaults() -> None:
    assert InputBinder(fields).bind({"prompt": "hi"}).kwargs == {"prompt": "hi", "limit": 10}


def test_keyword_fields_are_coerced_to_their_annotations() -> None:
    bound = InputBinder(fields).bind({"prompt": "hi", "limit": "3"})

    assert bound.kwargs == {"prompt": "hi", "limit": 3}


def test_unknown_fields_are_ignored_without_var_keyword() -> None:
    assert InputBinder(fields).bind({"prompt": "hi", "extra": 1}).kwargs["prompt"] == "hi"
    assert "extra" not in InputBinder(fields).bind({"prompt": "hi", "extra": 1}).kwargs


def test_var_keyword_handler_receives_unknown_fields() -> None:
    bound = InputBinder(open_ended).bind({"prompt": "p", "tone": "dry"})

    assert bound.kwargs == {"prompt": "p", "tone": "dry"}


def test_missing_required_field_is_invalid_input() -> None:
    with pytest.raises(_InputInvalid, match="prompt: Field required"):
        InputBinder(fields).bind({"limit": 1})


def test_wrong_field_type_is_invalid_input() -> None:
    with pytest.raises(_InputInvalid, match="limit"):
        InputBinder(fields).bind({"prompt": "p", "limit": "many"})


def test_non_object_input_is_invalid_for_fields() -> None:
    with pytest.raises(_InputInvalid, match="JSON object"):
        InputBinder(fields).bind(["prompt"])


def test_single_model_parameter_is_validated() -> None:
    bound = InputBinder(model).bind({"prompt": "why"})

    assert bound.kwargs == {"question": Question(prompt="why", limit=10)}


def test_single_model_parameter_rejects_bad_input() -> None:
    with pytest.raises(_InputInvalid, match="prompt"):
        InputBinder(model).bind({"limit": 2})


@pytest.mark.parametrize("handler", [raw_dict, raw_untyped])
@pytest.mark.parametrize("value", [{"anything": [1, 2]}, "text", None])
def test_raw_parameter_receives_input_unchanged(handler: Any, value: Any) -> None:
    assert InputBinder(handler).bind(value).kwargs == {"input": value}


def test_handler_without_parameters_ignores_input() -> None:
    assert InputBinder(nothing).bind({"ignored": True}).kwargs == {}


def test_absent_input_binds_defaults_only() -> None:
    async def optional(limit: int = 5) -> None: ...

    assert InputBinder(optional).bind(None).kwargs == {"limit": 5}


# -- the input schema an agent publishes (§36.1) ---------------------------------------------


def test_keyword_fields_publish_a_schema_titled_with_the_handler() -> None:
    assert InputBinder(fields).json_schema() == {
        "properties": {
            "prompt": {"title": "Prompt", "type": "string"},
            "limit": {"default": 10, "title": "Limit", "type": "integer"},
        },
        "required": ["prompt"],
        "title": "fields",
        "type": "object",
    }


def test_a_model_parameter_publishes_the_models_schema() -> None:
    assert InputBinder(model).json_schema() == Question.model_json_schema()


@pytest.mark.parametrize("handler", [raw_dict, raw_untyped])
def test_a_handler_taking_the_raw_input_publishes_no_schema(handler: Any) -> None:
    assert InputBinder(handler).json_schema() is None


def test_a_handler_without_parameters_publishes_an_empty_object() -> None:
    schema = InputBinder(nothing).json_schema()
    assert schema == {"properties": {}, "title": "nothing", "type": "object"}


def test_extra_keywords_are_left_out_of_the_schema() -> None:
    schema = InputBinder(open_ended).json_schema()
    assert schema is not None and list(schema["properties"]) == ["prompt"]
