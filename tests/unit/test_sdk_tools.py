"""`@tool`, `wrap_tool`, `step()` and the MCP wrappers: what frameworks see, and what happens
before anything reaches the kernel."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from harness.asgi import asgi_lifespan
from rebuno import execution, step, tool, wrap_tool
from rebuno.mcp import flatten_result, wrap_mcp_tool, wrap_mcp_tools
from rebuno.sdk._context import ExecutionContext
from rebuno.sdk._kernel import KernelClient, Lease
from tests.sdk.loopback import serving


@tool
async def bare(query: str, limit: int = 10) -> list[str]:
    """Search for things."""
    return [query] * limit


@tool()
async def called(query: str) -> str:
    return query


@tool("web.search")
def with_id(query: str) -> str:
    return query


@tool("charge", idempotency="at_most_once")
async def with_idempotency(amount: int) -> int:
    return amount


@pytest.mark.parametrize("wrapped", [bare, called, with_id, with_idempotency])
def test_tool_wrapper_is_async_and_keeps_the_signature(wrapped: Any) -> None:
    assert inspect.iscoroutinefunction(wrapped)
    assert inspect.signature(wrapped) == inspect.signature(wrapped.__wrapped__)


def test_tool_keeps_name_and_docstring() -> None:
    assert bare.__name__ == "bare"
    assert bare.__doc__ == "Search for things."
    assert with_id.__name__ == "with_id"


def test_tool_records_its_idempotency() -> None:
    assert getattr(bare, "__idempotency__", None) == "safe_to_retry"
    assert getattr(with_idempotency, "__idempotency__", None) == "at_most_once"


def test_unknown_idempotency_is_rejected_at_decoration() -> None:
    with pytest.raises(ValueError, match="at_most_once"):
        tool(idempotency="sometimes")


async def test_tool_outside_an_execution_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="no active rebuno execution"):
        await bare("x")


async def test_step_outside_an_execution_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        await step("now", lambda: 1)


def test_wrap_tool_builds_a_keyword_only_signature_from_the_schema() -> None:
    schema = {
        "properties": {"limit": {"type": "integer"}, "query": {"type": "string"}},
        "required": ["query"],
    }

    search = wrap_tool("search", invoke=lambda args: args, description="Find", args_schema=schema)

    assert str(inspect.signature(search)) == "(*, query, limit=None)"
    assert (search.__name__, search.__doc__) == ("search", "Find")
    assert getattr(search, "__input_schema__", None) == schema
    assert inspect.iscoroutinefunction(search)


def test_wrap_tool_without_schema_takes_no_declared_arguments() -> None:
    ping = wrap_tool("ping", invoke=lambda args: "pong")

    assert str(inspect.signature(ping)) == "()"
    assert ping.__doc__ is None


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback HTTP server standing in for the kernel that only counts what reaches it."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        seen.append(f"{scope['method']} {scope['path']}")
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async with serving(app) as url:
        yield url, seen


@pytest.fixture
async def context(recorder: tuple[str, list[str]]) -> AsyncIterator[ExecutionContext]:
    kernel = KernelClient(agent_id="a", secret="s", base_url=recorder[0], timeout=5)
    context = ExecutionContext(
        kernel=kernel, execution_id="e", lease=Lease("d", 1, 120.0), agent_id="a"
    )
    with context.activate():
        yield context
    await kernel.aclose()


@pytest.mark.parametrize(
    "call",
    [
        lambda: bare(object()),
        lambda: step("pick", lambda seq: seq, args={"seq": {1, 2}}),
        lambda: wrap_tool("w", invoke=lambda args: args)(when=float("nan")),
    ],
    ids=["tool", "step", "wrap_tool"],
)
async def test_non_json_arguments_raise_type_error_before_anything_is_sent(
    context: ExecutionContext, recorder: tuple[str, list[str]], call: Any
) -> None:
    with pytest.raises(TypeError, match="not JSON-serializable"):
        await call()

    assert recorder[1] == []


async def test_execution_returns_the_active_context(context: ExecutionContext) -> None:
    assert execution() is context
    assert (execution().id, execution().dispatch_id, execution().dispatch_attempt) == ("e", "d", 1)


def test_execution_outside_a_handler_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        execution()


DESCRIPTOR = {
    "name": "search",
    "description": "Search the docs",
    "inputSchema": {
        "type": "object",
        "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["q"],
    },
}


def test_mcp_dict_descriptor_becomes_a_prefixed_tool() -> None:
    wrapped = wrap_mcp_tool(DESCRIPTOR, call=lambda name, args: None, prefix="docs")

    assert wrapped.__name__ == "docs_search"
    assert wrapped.__doc__ == "Search the docs"
    assert str(inspect.signature(wrapped)) == "(*, q, n=None)"


def test_mcp_object_descriptor_without_prefix_keeps_its_name() -> None:
    descriptor = SimpleNamespace(name="read", description=None, inputSchema=None)

    wrapped = wrap_mcp_tool(descriptor, call=lambda name, args: None)

    assert wrapped.__name__ == "read"
    assert str(inspect.signature(wrapped)) == "()"


def test_mcp_list_tools_result_is_unpacked() -> None:
    listed = SimpleNamespace(tools=[DESCRIPTOR, {**DESCRIPTOR, "name": "fetch"}])

    wrapped = wrap_mcp_tools(listed, call=lambda name, args: None, prefix="d")

    assert [t.__name__ for t in wrapped] == ["d_search", "d_fetch"]


def test_mcp_descriptor_without_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="name"):
        wrap_mcp_tool({"description": "nameless"}, call=lambda name, args: None)


@pytest.mark.parametrize(
    ("result", "flat"),
    [
        ({"structuredContent": {"a": 1}, "content": [{"type": "text", "text": "x"}]}, {"a": 1}),
        ({"content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}, "x\ny"),
        (
            SimpleNamespace(
                structuredContent=None,
                content=[SimpleNamespace(type="text", text="hi")],
            ),
            "hi",
        ),
        (
            {"content": [{"type": "image", "data": "AA=="}]},
            {"content": [{"type": "image", "data": "AA=="}]},
        ),
        ("plain", "plain"),
    ],
)
def test_mcp_results_are_flattened(result: Any, flat: Any) -> None:
    assert flatten_result(result) == flat
