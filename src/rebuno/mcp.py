"""Durable wrappers for Model Context Protocol tools.

`wrap_mcp_tool` turns one MCP tool descriptor (an object such as the `mcp` SDK's `Tool`, or a
plain dict) into a `wrap_tool` callable, so each call is recorded as a `tool_call` step.
Imports only the SDK's `wrap_tool`; never the kernel, and not the `mcp` package itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rebuno.sdk.tools import wrap_tool

__all__ = ["flatten_result", "wrap_mcp_tool", "wrap_mcp_tools"]

CallFn = Callable[[str, dict[str, Any]], Awaitable[Any] | Any]
ToResult = Callable[[Any], Any]


def wrap_mcp_tools(
    descriptors: Iterable[Any] | Any,
    *,
    call: CallFn,
    prefix: str = "",
    idempotency: str = "safe_to_retry",
    to_result: ToResult | None = None,
) -> list[Callable[..., Any]]:
    """Wrap every descriptor of a list (or of a `list_tools()` result with `.tools`).

    Example:
        tools = wrap_mcp_tools(await session.list_tools(), call=session.call_tool, prefix="docs")
    """
    listed = _field(descriptors, "tools")
    items = listed if listed is not None else descriptors
    return [
        wrap_mcp_tool(item, call=call, prefix=prefix, idempotency=idempotency, to_result=to_result)
        for item in items
    ]


def wrap_mcp_tool(
    descriptor: Any,
    *,
    call: CallFn,
    prefix: str = "",
    idempotency: str = "safe_to_retry",
    to_result: ToResult | None = None,
) -> Callable[..., Any]:
    """Wrap one MCP tool descriptor as a durable tool.

    Args:
        descriptor: An object or dict with `name`, `description` and `inputSchema`.
        call: `call(name, args)` runs the tool on the MCP server, with the bare name.
        prefix: Namespaces the tool id as `f"{prefix}_{name}"`; empty keeps the name as is.
        idempotency: `safe_to_retry` (default) or `at_most_once`.
        to_result: Maps the call's result to the recorded value; defaults to
            `flatten_result`.

    Null arguments are dropped before the call, since models fill optional fields with null
    and typed MCP parameters reject it.
    """
    name = str(_field(descriptor, "name") or "")
    if not name:
        raise ValueError("an MCP tool descriptor needs a name")
    schema = _field(descriptor, "inputSchema")
    if schema is None:
        schema = _field(descriptor, "input_schema")

    async def invoke(args: dict[str, Any]) -> Any:
        result = call(name, args)
        return await result if isinstance(result, Awaitable) else result

    return wrap_tool(
        f"{prefix}_{name}" if prefix else name,
        invoke,
        description=str(_field(descriptor, "description") or ""),
        args_schema=schema if isinstance(schema, dict) else None,
        idempotency=idempotency,
        to_result=to_result or flatten_result,
        transform_args=_without_nulls,
    )


def flatten_result(result: Any) -> Any:
    """A JSON value for an MCP `CallToolResult`: its structured content when present,
    otherwise its text blocks joined by newlines, otherwise the result itself as JSON."""
    structured = _field(result, "structuredContent")
    if structured is not None:
        return structured
    content = _field(result, "content")
    if isinstance(content, list):
        texts = [_field(block, "text") for block in content if _field(block, "type") == "text"]
        if texts:
            return "\n".join(str(text) for text in texts)
    dump = getattr(result, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else result


def _field(source: Any, name: str) -> Any:
    if isinstance(source, dict):
        return source.get(name)
    return getattr(source, name, None)


def _without_nulls(args: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in args.items() if value is not None}
