"""What an agent publishes about itself (docs/protocol.md §36): its description and the JSON
Schemas of its input and output, sent once per process with `PUT /v0/agents/{id}/metadata`.

The publication starts with the app's lifespan start-up or, failing that, with the first
webhook; `Agent.publish_metadata()` awaits it. Only a kernel that could not be reached is
asked again (on the next webhook): any answer, a refusal included, ends the attempts for the
life of the process. Imports only pydantic and the SDK's own modules; never the kernel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pydantic

from rebuno.sdk._kernel import KernelClient, encode_json
from rebuno.sdk.errors import NetworkError, RebunoError

logger = logging.getLogger("rebuno")

Schema = dict[str, Any] | type[pydantic.BaseModel]
"""A JSON Schema as a dict, or a pydantic model class whose schema is sent."""


def schema_of(schema: Schema | None) -> dict[str, Any] | None:
    """The JSON Schema `schema` stands for."""
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        return schema.model_json_schema()
    return schema


def checked_schema(schema: object, name: str) -> Schema | None:
    """`schema` when it is a dict, a pydantic model class or None; else a `TypeError`."""
    if schema is None or isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        return schema
    raise TypeError(f"{name} must be a dict or a pydantic model class, not {type(schema).__name__}")


class Publication:
    """The one publication of this process's metadata."""

    def __init__(
        self,
        kernel: KernelClient,
        description: str | None,
        output_schema: Schema | None,
        input_schema: Callable[[], dict[str, Any] | None],
    ) -> None:
        """`input_schema` is asked when the publication starts: the handler is bound late."""
        self.description = description
        self.output_schema = output_schema
        self._input_schema = input_schema
        self._kernel = kernel
        self.agent_id = kernel.agent_id
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        """Starts the publication unless it is running or has been answered; its task."""
        if self._task is None:
            self._task = asyncio.create_task(self._publish(), name="rebuno-publish-metadata")
        return self._task

    async def _publish(self) -> None:
        try:
            body = encode_json(
                {
                    "description": self.description,
                    "input_schema": self._input_schema(),
                    "output_schema": schema_of(self.output_schema),
                }
            )
        except (TypeError, pydantic.PydanticUserError) as exc:
            logger.warning("agent %s's metadata cannot be published: %s", self.agent_id, exc)
            return
        try:
            await self._kernel.publish_metadata(body)
        except NetworkError as exc:
            self._task = None  # the next webhook tries again
            logger.warning("could not publish agent metadata (%s); retrying on a webhook", exc)
        except RebunoError as exc:
            # Best effort: the agent serves either way, and the kernel only shows what it has.
            logger.warning("the kernel refused agent %s's metadata: %s", self.agent_id, exc)

    async def close(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
