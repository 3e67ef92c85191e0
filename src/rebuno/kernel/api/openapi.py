"""The OpenAPI 3.1 document of the HTTP API: `openapi.yaml` beside this module, served as JSON.

The YAML file is the one source; it is read and encoded once, on first use. Must not import
a store backend or `kernel.webhooks`.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import orjson
from ruamel.yaml import YAML

PATH = "/v0/openapi.json"
DOCUMENT = "openapi.yaml"


def document() -> dict[str, Any]:
    """The document as plain JSON values (a fresh copy each call)."""
    loaded: dict[str, Any] = orjson.loads(document_json())
    return loaded


@functools.cache
def document_json() -> bytes:
    """The document encoded as JSON, as `GET /v0/openapi.json` sends it."""
    text = resources.files(__package__).joinpath(DOCUMENT).read_text(encoding="utf-8")
    return orjson.dumps(YAML(typ="safe", pure=True).load(text))
