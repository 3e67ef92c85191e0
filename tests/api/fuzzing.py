"""Property-based fuzzing of the HTTP API against its own OpenAPI document.

A real kernel (`rebuno.kernel.server.serve`, uvicorn on loopback, server mode with a bearer
token) runs on a thread of its own; schemathesis generates requests for every operation of
`GET /v0/openapi.json`, valid ones and invalid ones, and checks each answer: never a 5xx, a
status the document lists, a content type and a body its schema allows.

The requests carry the credentials of their route: the bearer token, or a `v1=` signature
of the fuzzing agent over the request exactly as it goes out. About one in ten carries none,
and must then be the documented `401`. Half of them name, instead of the generated ids, a
live execution of that agent with its current lease, an executing step of it and a pending
approval, so that the routes reach their use cases and not only their parsing: those are
renewed whenever a request ended them.

`tests/api/test_api_fuzz.py` runs a short, seeded pass on each store; `scripts/fuzz` a longer
one (`python -m tests.api.fuzzing --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import hypothesis
import requests
import schemathesis
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from harness.polling import poll_until
from rebuno.kernel.config import Settings
from rebuno.kernel.server import serve
from rebuno.protocol.signing import (
    AGENT_ID_HEADER,
    DISPATCH_ATTEMPT_HEADER,
    DISPATCH_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign_request,
)

SEED = 20261201
AGENT = "fuzzer"
SECRET = "fuzz-secret"
TOKEN = "fuzz-token"
POLICY = """\
default_action: allow
rules:
  - id: ask
    when: {target: ask}
    then: {decision: require_approval, approval_config: {timeout: 1h}}
"""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
REQUEST_TIMEOUT_SECONDS = 20.0
SETUP_TIMEOUT_SECONDS = 20.0
CREDENTIAL_HEADERS = ("authorization", AGENT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER)
Operation = APIOperation[Any, Any, Any, Any]
SSE_OPERATION = "streamExecution"  # its answer never ends: only ever fuzzed with unknown ids
ACTIVITY_OPERATION = "watchActivity"  # nor does this one's: only ever fuzzed without credentials


@dataclass
class Figures:
    """What a run sent and found: each failure is the check that failed and the details."""

    requests: int = 0
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        found = Counter(check for check, _ in self.failures)
        failures = ", ".join(f"{check}: {n}" for check, n in sorted(found.items())) or "none"
        server_errors = sum(n for code, n in self.statuses.items() if code >= 500)
        return (
            f"{self.requests} requests in {self.seconds:.1f} s; {server_errors} server errors;"
            f" {len(self.failures)} failed checks ({failures}); statuses {statuses}"
        )


class _Webhooks(ThreadingHTTPServer):
    """The fuzzing agent's webhook: records each delivery's body and acknowledges it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _WebhookHandler)
        self.deliveries: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/webhook"

    def delivery_of(self, execution_id: str) -> dict[str, Any] | None:
        with self.lock:
            found = [d for d in self.deliveries if d.get("execution_id") == execution_id]
        return found[-1] if found else None


class _WebhookHandler(BaseHTTPRequestHandler):
    server: _Webhooks

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.deliveries.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a delivery is no news."""


@contextmanager
def webhooks() -> Iterator[_Webhooks]:
    server = _Webhooks()
    thread = threading.Thread(target=server.serve_forever, name="fuzz-webhooks", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def running_kernel(db_url: str) -> Iterator[str]:
    """A kernel in server mode on loopback, on its own thread and event loop; its base URL."""
    settings = Settings(
        dev=False,
        bearer_token=TOKEN,
        listen_addr="127.0.0.1:0",
        db_url=db_url,
        webhook_allow="127.0.0.0/8",
        accept_body_signatures=False,
        replica_id="fuzz",
        body_timeout=timedelta(seconds=5),
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    urls: list[str] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve(settings, stop=stop, on_ready=urls.append))
        except BaseException as exc:  # reported to the caller below
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="fuzz-kernel", daemon=True)
    thread.start()
    poll_until(lambda: bool(urls or failed), SETUP_TIMEOUT_SECONDS, "the kernel to listen")
    if failed:
        raise RuntimeError("the kernel did not start") from failed[0]
    try:
        yield urls[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)


@dataclass
class Live:
    """A running execution of the fuzzing agent, its lease, an executing step of it, and a
    pending approval (of another execution, which that approval blocks)."""

    execution_id: str
    dispatch_id: str
    attempt: int
    step_id: str
    approval_id: str


class Scene:
    """The kernel as the fuzzer finds it: a session, the fuzzing agent, and a `Live` set of
    ids it renews when a generated request has ended one of them."""

    def __init__(self, base_url: str, hooks: _Webhooks) -> None:
        self.base_url = base_url
        self.session = requests.Session()
        self._hooks = hooks
        self._live: Live | None = None
        self.changed = True

    def bearer(self, method: str, path: str, body: object = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return self.session.request(
            method,
            self.base_url + path,
            json=body,
            headers=headers,
            timeout=REQUEST_TIMEOUT_SECONDS,
        )

    def signed(
        self, method: str, path: str, body: object, lease: tuple[str, int] | None
    ) -> requests.Response:
        raw = json.dumps(body).encode()
        request = requests.Request(method, self.base_url + path, data=raw).prepare()
        sign(request, lease)
        return self.session.send(request, timeout=REQUEST_TIMEOUT_SECONDS)

    def register(self) -> None:
        registration = {
            "id": AGENT,
            "webhook_url": self._hooks.url,
            "secret": SECRET,
            "lease_timeout_seconds": 3600,
            "policy_bundle": POLICY,
        }
        _expect(self.bearer("POST", "/v0/agents", registration), 201)

    def live(self) -> Live:
        """The live ids, renewed first when any of them has ended (which only a change that
        succeeded can have done)."""
        if self._live is None or (self.changed and not self._still_live(self._live)):
            self._live = self._fresh()
        self.changed = False
        return self._live

    def _still_live(self, live: Live) -> bool:
        base = f"/v0/executions/{live.execution_id}"
        step = self.bearer("GET", f"{base}/steps/{live.step_id}")
        approval = self.bearer("GET", f"/v0/approvals/{live.approval_id}")
        execution = self.bearer("GET", base)
        return (
            step.status_code == 200
            and step.json()["status"] == "executing"
            and approval.status_code == 200
            and approval.json()["status"] == "pending"
            and execution.json().get("status") == "running"
            and self._lease_holds(live)
        )

    def _lease_holds(self, live: Live) -> bool:
        path = f"/v0/executions/{live.execution_id}/heartbeat"
        return self.signed("POST", path, {}, (live.dispatch_id, live.attempt)).status_code == 204

    def _fresh(self) -> Live:
        self.register()  # a generated request may have replaced the bundle or the webhook
        execution_id, lease = self._started()
        step = self._submit(execution_id, lease, "work")
        other, other_lease = self._started()
        approval = self._submit(other, other_lease, "ask")
        return Live(execution_id, *lease, step["step_id"], approval["approval_id"])

    def _started(self) -> tuple[str, tuple[str, int]]:
        created = _expect(self.bearer("POST", "/v0/executions", {"agent_id": AGENT}), 201)
        execution_id: str = created["id"]
        poll_until(
            lambda: self._hooks.delivery_of(execution_id) is not None,
            SETUP_TIMEOUT_SECONDS,
            f"the webhook of {execution_id}",
        )
        delivery = self._hooks.delivery_of(execution_id)
        assert delivery is not None
        return execution_id, (delivery["dispatch_id"], delivery["dispatch_attempt"])

    def _submit(self, execution_id: str, lease: tuple[str, int], target: str) -> dict[str, Any]:
        submission = {"kind": "tool_call", "target": target, "args": {"n": uuid.uuid4().hex}}
        path = f"/v0/executions/{execution_id}/steps"
        decision: dict[str, Any] = _expect(self.signed("POST", path, submission, lease), 200)
        return decision


def _expect(response: requests.Response, status: int) -> Any:
    if response.status_code != status:
        raise AssertionError(f"{response.request.method} {response.url}: {response.text}")
    return response.json()


def sign(request: requests.PreparedRequest, lease: tuple[str, int] | None) -> None:
    """Signs a prepared request as the fuzzing agent (§2.3), over its target and body as they
    go out; the lease headers are the request's own unless `lease` names one."""
    headers = request.headers
    for name in CREDENTIAL_HEADERS:
        headers.pop(name, None)
    if lease is not None:
        headers[DISPATCH_ID_HEADER], headers[DISPATCH_ATTEMPT_HEADER] = lease[0], str(lease[1])
    timestamp = str(int(time.time()))
    body = request.body or b""
    raw = body.encode() if isinstance(body, str) else body
    headers[AGENT_ID_HEADER] = AGENT
    headers[TIMESTAMP_HEADER] = timestamp
    headers[SIGNATURE_HEADER] = sign_request(
        SECRET,
        str(request.method),
        request.path_url,
        timestamp,
        headers.get(DISPATCH_ID_HEADER, ""),
        headers.get(DISPATCH_ATTEMPT_HEADER, ""),
        raw,
    )


def _security(operation: Operation) -> set[str]:
    """The credentials an operation takes: `bearer`, `agent`, both, or neither."""
    found: set[str] = set()
    for requirement in operation.definition.raw.get("security", [{"bearer": []}]):
        found.add("agent" if "agentSignature" in requirement else "bearer")
    return found


@dataclass(frozen=True, slots=True)
class Choice:
    """What the fuzzer does to a generated case besides its generated values. Drawn from a
    seeded `random.Random`, not by Hypothesis, which would favour the first (simplest) of
    each and so send most requests without credentials."""

    credentials: bool  # the operation's own credentials (else none at all)
    as_agent: bool  # on a route that takes either, sign as the agent
    known: bool  # name the live ids and the live lease

    @classmethod
    def draw(cls, rng: random.Random) -> Choice:
        return cls(rng.random() >= 0.1, rng.random() < 0.5, rng.random() < 0.5)


class Fuzzer:
    def __init__(self, scene: Scene, examples: int, figures: Figures) -> None:
        self._scene = scene
        self._examples = examples
        self._rng = random.Random(SEED)
        self.figures = figures

    def run(self, operation: Operation) -> None:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            self._run(operation, mode)

    def _run(self, operation: Operation, mode: GenerationMode) -> None:
        @hypothesis.seed(SEED)
        @hypothesis.settings(
            max_examples=self._examples,
            deadline=None,
            database=None,
            derandomize=False,
            phases=[hypothesis.Phase.generate],
            suppress_health_check=list(hypothesis.HealthCheck),
            verbosity=hypothesis.Verbosity.quiet,
        )
        @hypothesis.given(case=operation.as_strategy(mode))
        def check(case: Case[Operation]) -> None:
            self._send(operation, case, Choice.draw(self._rng))

        try:
            check()
        except hypothesis.errors.Unsatisfiable:
            # An operation without parameters or a body has no invalid request to generate.
            if mode is not GenerationMode.NEGATIVE:
                raise

    def _send(self, operation: Operation, case: Case[Operation], choice: Choice) -> None:
        if operation.definition.raw.get("operationId") == ACTIVITY_OPERATION:
            choice = Choice(False, choice.as_agent, choice.known)
        lease = None
        if choice.known and operation.definition.raw.get("operationId") != SSE_OPERATION:
            lease = self._name_live(operation, case)
        kwargs = case.as_transport_kwargs(base_url=self._scene.base_url)
        kwargs.pop("cookies", None)
        request = requests.Request(**kwargs).prepare()
        for name in CREDENTIAL_HEADERS:
            request.headers.pop(name, None)
        security = _security(operation)
        if choice.credentials and security:
            if "agent" in security and (choice.as_agent or "bearer" not in security):
                sign(request, lease)
            else:
                request.headers["Authorization"] = f"Bearer {TOKEN}"
        label = f"{operation.label} [{case.meta.generation.mode.value if case.meta else '?'}]"
        try:
            response = self._scene.session.send(request, timeout=REQUEST_TIMEOUT_SECONDS)
        except requests.RequestException as exc:
            self._fail("No answer", f"{label}: {exc!r}")
            return
        self.figures.requests += 1
        self.figures.statuses[response.status_code] += 1
        if request.method != "GET" and response.status_code < 300:
            self._scene.changed = True
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            for failure in group.exceptions:
                what = f"{label}: {response.status_code} to {request.method} {request.url}"
                self._fail(failure.title, f"{what}\n{failure.message}\n{response.text[:500]}")

    def _name_live(self, operation: Operation, case: Case[Operation]) -> tuple[str, int] | None:
        """Puts the live ids in the case's path and carried outcomes, drops its long poll;
        the lease to send."""
        live = self._scene.live()
        params = case.path_parameters if case.path_parameters is not None else {}
        for name, value in (
            ("execution_id", live.execution_id),
            ("step_id", live.step_id),
            ("approval_id", live.approval_id),
            ("agent_id", AGENT),
        ):
            if name in params:
                params[name] = value
        if case.query:
            case.query.pop("wait", None)
        carried = case.body.get("completions") if isinstance(case.body, dict) else None
        if isinstance(carried, list):
            for item in carried:
                if isinstance(item, dict) and "step_id" in item:
                    item["step_id"] = live.step_id
        takes_lease = any(p.name == DISPATCH_ID_HEADER for p in operation.headers)
        return (live.dispatch_id, live.attempt) if takes_lease else None

    def _fail(self, check: str, details: str) -> None:
        self.figures.failures.append((check, details))


def fuzz(base_url: str, hooks: _Webhooks, examples: int, only: Callable[[str], bool]) -> Figures:
    """Fuzzes every operation of the kernel's document `examples` times in each mode."""
    scene = Scene(base_url, hooks)
    scene.register()
    schema = schemathesis.openapi.from_url(base_url + "/v0/openapi.json")
    schema.config.base_url = base_url
    figures = Figures()
    fuzzer = Fuzzer(scene, examples, figures)
    started = time.monotonic()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operation = result.ok()
        if only(operation.label):
            fuzzer.run(operation)
    figures.seconds = time.monotonic() - started
    return figures


@contextmanager
def postgres_database(server_url: str) -> Iterator[str]:
    """A new empty database on `server_url` (the kernel migrates it), dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"rebuno_fuzz_{uuid.uuid4().hex}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield server_url.rsplit("/", 1)[0] + "/" + name
        finally:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def database(store: str, workdir: str, postgres_url: str) -> Iterator[str]:
    if store == "sqlite":
        yield f"sqlite:///{workdir}/fuzz.db"
        return
    with postgres_database(postgres_url) as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(
        prog="scripts/fuzz", description="Fuzz the kernel's HTTP API against its document."
    )
    parser.add_argument("--examples", type=int, default=200, help="per operation and mode")
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--only", default="", help="only operations whose label contains this")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    checks = ", ".join(check.__name__ for check in CHECKS)
    print(
        f"{args.examples} examples per operation and mode, seed {SEED}; checks: {checks}",
        flush=True,
    )
    failed = 0
    for store in stores:
        with (
            tempfile.TemporaryDirectory() as workdir,
            database(store, workdir, args.postgres_url) as db_url,
            webhooks() as hooks,
            running_kernel(db_url) as base_url,
        ):
            figures = fuzz(base_url, hooks, args.examples, lambda label: args.only in label)
        for check, details in figures.failures:
            print(f"{store}: {check}: {details}\n", file=sys.stderr)
        print(f"{store}: {figures.summary()}", flush=True)
        failed += len(figures.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
