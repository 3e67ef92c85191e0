"""Two `rebuno server` replicas on one PostgreSQL database: once a key's revocation or
rotation has been answered by one replica, the other refuses the old token on its very next
request, while a stream of requests races it (§34.7: no verification cache)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.polling import poll_until
from harness.processes import Server

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

TOKEN = "replica-token"


@pytest.fixture
def replicas(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    first = Server(postgres_url, TOKEN, tmp_path / "replica-1.log")
    try:
        second = Server(postgres_url, TOKEN, tmp_path / "replica-2.log")
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


class Hammer:
    """Reads `GET /v0/executions` on one replica with one token, as fast as it answers,
    keeping when each request started and what it got."""

    def __init__(self, url: str, token: str) -> None:
        self._url, self._token = url, token
        self.calls: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        with httpx.Client(base_url=self._url, headers=headers, timeout=5) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                self.calls.append((started, http.get("/v0/executions").status_code))

    def running(self) -> None:
        """Waits until a few requests are in, so the revocation races the ones that follow."""
        poll_until(lambda: len(self.calls) >= 5, 10, "the hammer to get going")

    def admitted_after(self, moment: float) -> list[int]:
        return [status for started, status in self.calls if started > moment and status != 401]


def _issue(server: Server) -> tuple[str, str]:
    issued = server.post("/v0/api-keys", {"name": "ci", "scopes": ["executions:read"]})
    return issued["id"], issued["token"]


def _status(server: Server, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{server.url}/v0/executions", headers=headers, timeout=5).status_code


def test_a_key_rotated_or_revoked_on_one_replica_is_refused_by_the_other_at_once(
    replicas: tuple[Server, Server],
) -> None:
    first, second = replicas
    key_id, old = _issue(first)
    assert _status(second, old) == 200

    with Hammer(second.url, old) as hammer:
        hammer.running()
        new = first.post(f"/v0/api-keys/{key_id}/rotate", None)["token"]
        rotated = time.monotonic()
        after_rotation = _status(second, old), _status(second, new)
    with Hammer(second.url, new) as racing:
        racing.running()
        revoked = httpx.delete(f"{first.url}/v0/api-keys/{key_id}", headers=first.headers)
        answered = time.monotonic()
        after_revocation = _status(second, new)

    assert after_rotation == (401, 200)
    assert hammer.admitted_after(rotated) == []
    assert revoked.status_code == 204
    assert after_revocation == 401
    assert racing.admitted_after(answered) == []
    assert any(status == 200 for _, status in racing.calls)  # it did race the revocation
