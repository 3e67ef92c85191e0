"""`@tool` and `wrap_tool`: route a function's calls through the kernel as `tool_call` steps.

The wrappers keep what frameworks introspect (name, docstring, signature) and hand each call to
the execution context, which submits it, replays it, or runs the body. Imports only the SDK's
own context and errors; never the kernel.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, overload

from rebuno.protocol.enums import Idempotency
from rebuno.sdk._context import execution
from rebuno.sdk.errors import PolicyError

ToolFunction = Callable[..., Any]


@overload
def tool(
    tool_id: ToolFunction, *, idempotency: str = ..., resources: list[str] | None = ...
) -> ToolFunction: ...
@overload
def tool(
    tool_id: str | None = None, *, idempotency: str = ..., resources: list[str] | None = ...
) -> Callable[[ToolFunction], ToolFunction]: ...
def tool(
    tool_id: str | ToolFunction | None = None,
    *,
    idempotency: str = "safe_to_retry",
    resources: list[str] | None = None,
) -> Any:
    """Make a function a durable tool: each call becomes a `tool_call` step.

    Usable bare (`@tool`), called (`@tool()`), with an id (`@tool("web.search")`) and with an
    idempotency (`@tool("charge", idempotency="at_most_once")`). The tool id defaults to the
    function's name. The wrapper is always async and keeps the function's name, docstring and
    signature. A call the policy denies returns the string
    `"<tool id> not allowed. reason: <reason>"` instead of raising, so an LLM can read it.

    Args:
        tool_id: The id the kernel and policy see, or the function when used bare.
        idempotency: `safe_to_retry` (default) or `at_most_once` for effects that must
            never run twice; an interrupted `at_most_once` call comes back as `ToolError`.
        resources: The keys of the registered resources (`rebuno.resource`) the tool
            changes; a call advances their generation and may capture them.

    Example:
        @tool("web.search")
        async def search(query: str, limit: int = 10) -> list[str]:
            return [f"result for {query}"]
    """
    mode = _idempotency(idempotency)
    keys = tuple(resources or ())
    if callable(tool_id):
        return _wrap_function(tool_id, tool_id.__name__, mode, keys)
    return lambda fn: _wrap_function(fn, tool_id or fn.__name__, mode, keys)


def wrap_tool(
    name: str,
    invoke: Callable[[dict[str, Any]], Any],
    *,
    description: str = "",
    args_schema: dict[str, Any] | None = None,
    idempotency: str = "safe_to_retry",
    to_result: Callable[[Any], Any] | None = None,
    transform_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    resources: list[str] | None = None,
) -> Callable[..., Any]:
    """Build a durable tool from a name and an `invoke(args)` callable.

    For tools that are not plain functions: framework tool objects, schema-only tools, MCP.
    The result is an async function of keyword arguments, named `name`, documented by
    `description`, with a keyword-only signature built from `args_schema` (its `properties`
    and `required`), which is also exposed as `__input_schema__`.

    Args:
        name: The tool id, seen by the LLM (`__name__`) and by the kernel.
        invoke: Called with the argument dict; may return a value or an awaitable.
        description: The tool's description (`__doc__`).
        args_schema: A JSON schema object describing the arguments.
        idempotency: `safe_to_retry` (default) or `at_most_once`.
        to_result: Maps invoke's return value to the JSON value that is recorded.
        transform_args: Maps the argument dict before it is recorded and passed to invoke.
        resources: The keys of the registered resources the tool changes.

    Example:
        search = wrap_tool(
            "search",
            invoke=lambda args: {"hits": [args["query"]]},
            description="Search the corpus",
            args_schema={"properties": {"query": {"type": "string"}}, "required": ["query"]},
        )
    """
    mode = _idempotency(idempotency)
    keys = tuple(resources or ())

    async def call_tool(**kwargs: Any) -> Any:
        args = transform_args(kwargs) if transform_args is not None else kwargs

        async def run() -> Any:
            raw = invoke(args)
            value = await raw if inspect.isawaitable(raw) else raw
            return to_result(value) if to_result is not None else value

        return await _invoke(name, args, mode, run, keys)

    call_tool.__name__ = call_tool.__qualname__ = name
    call_tool.__doc__ = description or None
    setattr(call_tool, "__signature__", _schema_signature(args_schema))  # noqa: B010
    setattr(call_tool, "__input_schema__", args_schema)  # noqa: B010
    setattr(call_tool, "__idempotency__", mode.value)  # noqa: B010
    return call_tool


def _wrap_function(
    fn: ToolFunction, tool_id: str, mode: Idempotency, keys: tuple[str, ...]
) -> ToolFunction:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    async def call_tool(*args: Any, **kwargs: Any) -> Any:
        recorded = _arguments(signature, args, kwargs)
        return await _invoke(tool_id, recorded, mode, lambda: fn(*args, **kwargs), keys)

    setattr(call_tool, "__idempotency__", mode.value)  # noqa: B010
    setattr(call_tool, "__tool_id__", tool_id)  # noqa: B010
    return call_tool


async def _invoke(
    tool_id: str,
    args: dict[str, Any],
    mode: Idempotency,
    run: Callable[[], Any],
    keys: tuple[str, ...] = (),
) -> Any:
    context = execution()
    try:
        return await context.invoke_tool(
            tool_id, args, idempotency=mode.value, run=run, resources=keys
        )
    except PolicyError as denial:
        # The denial becomes the tool's answer, so the model can choose another path.
        return f"{tool_id} not allowed. reason: {denial.reason}"


def _arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by name, defaults included, so equal calls record equal args."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    recorded: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            recorded.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            recorded[name] = list(value)
        else:
            recorded[name] = value
    return recorded


def _schema_signature(schema: dict[str, Any] | None) -> inspect.Signature:
    properties = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or [])
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if name in required else None,
        )
        for name in properties
        if name.isidentifier()
    ]
    # Required parameters first keeps the signature valid for any property order.
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    return inspect.Signature(params)


def _idempotency(value: str) -> Idempotency:
    try:
        return Idempotency(value)
    except ValueError:
        allowed = ", ".join(mode.value for mode in Idempotency)
        raise ValueError(f"idempotency must be one of {allowed}, not {value!r}") from None
