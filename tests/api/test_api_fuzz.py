"""A short, seeded fuzzing pass (`tests/api/fuzzing.py`) over every operation of the OpenAPI
document, against a real kernel on loopback, on each store: no answer is a server error, and
every answer has a status, content type, headers and body the document allows. `scripts/fuzz`
runs a longer pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.fuzzing import fuzz, running_kernel, webhooks
from tests.conftest import BACKENDS

EXAMPLES = 4
"""Per operation and generation mode (valid, invalid): about 250 requests, a few seconds."""


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kernel.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generated_requests_get_only_documented_answers(db_url: str) -> None:
    with webhooks() as hooks, running_kernel(db_url) as base_url:
        figures = fuzz(base_url, hooks, EXAMPLES, lambda label: True)

    assert [f"{check}: {details}" for check, details in figures.failures] == []
    assert figures.requests >= 200, figures.summary()
    # The requests got past parsing and authentication, and some were refused by both.
    assert {200, 204, 400, 401, 404, 409} <= set(figures.statuses), figures.summary()
