"""`wrap_tool` and the MCP wrappers against a real kernel: what is recorded, what is called."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rebuno import wrap_tool
from rebuno.mcp import wrap_mcp_tools
from tests.sdk.conftest import Harness

SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": ["integer", "null"]}},
    "required": ["query"],
}


async def test_wrap_tool_records_transformed_args_and_mapped_result(harness: Harness) -> None:
    invoked: list[dict[str, Any]] = []

    async def invoke(args: dict[str, Any]) -> SimpleNamespace:
        invoked.append(args)
        return SimpleNamespace(hits=[args["query"].upper()])

    search = wrap_tool(
        "corpus.search",
        invoke,
        args_schema=SCHEMA,
        transform_args=lambda args: {**args, "query": args["query"].strip()},
        to_result=lambda value: {"hits": value.hits},
    )

    async def process() -> Any:
        return await search(query="  tea ")

    async with harness.serve("searcher", process):
        done = await harness.run("searcher")

    [recorded] = await harness.client.list_steps(done.id)
    assert invoked == [{"query": "tea"}]
    assert (recorded.target, recorded.args, recorded.result) == (
        "corpus.search",
        {"query": "tea"},
        {"hits": ["TEA"]},
    )
    assert done.output == {"hits": ["TEA"]}


async def test_mcp_tool_calls_bare_name_without_nulls_and_records_flattened_text(
    harness: Harness,
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(name: str, args: dict[str, Any]) -> SimpleNamespace:
        calls.append((name, args))
        text = SimpleNamespace(type="text", text=f"found {args['query']}")
        return SimpleNamespace(structuredContent=None, content=[text], isError=False)

    listed = SimpleNamespace(tools=[{"name": "search", "description": "", "inputSchema": SCHEMA}])
    [search] = wrap_mcp_tools(listed, call=call_tool, prefix="docs")

    async def process() -> Any:
        return await search(query="leases", limit=None)

    async with harness.serve("mcp-user", process):
        done = await harness.run("mcp-user")

    [recorded] = await harness.client.list_steps(done.id)
    assert calls == [("search", {"query": "leases"})]
    assert (recorded.target, recorded.args, recorded.result) == (
        "docs_search",
        {"query": "leases"},
        "found leases",
    )
    assert done.output == "found leases"
