"""Prometheus metrics of one replica: the collectors, the one-line hooks the services call,
the ASGI middleware that times HTTP requests, and the text `/metrics` serves.

A hook only bumps a number in nested dicts that the event loop's thread owns: no lock, no
label lookup, no object built once a label combination has been seen. prometheus_client is
used at scrape time only, to render the exposition format. Counts are per process and start
at zero; Prometheus' `rate()` and `increase()` handle the restarts. Events are counted when
their transaction writes them, so the rare transaction that fails at commit is still counted;
only the executions created and ended that the reference dashboard reads wait for the commit
(`counted_on_commit`).

Must not import the services, the API or a store: they import this module.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rebuno.protocol.enums import Decision
from rebuno.protocol.events import EventType

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from rebuno.kernel.domain.decision import StepDecision
    from rebuno.kernel.domain.dispatch import DeliveryOutcome
    from rebuno.kernel.domain.records import Event
    from rebuno.kernel.policy.engine import Bundle, PolicyResult
    from rebuno.protocol.enums import ApprovalStatus, StepKind

_Batch = TypeVar("_Batch", bound=Sized)
log = logging.getLogger("rebuno.kernel.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED_ROUTE = "unmatched"

# Seconds. Policy evaluation is a few string compares: microseconds, not milliseconds.
_POLICY_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
_HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# A person answers in minutes or hours; the default approval timeout is 15 minutes.
# The reference's layout for webhook attempts: an agent acknowledges in milliseconds.
_DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_APPROVAL_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 86400)

_STATUS_OF_EVENT: dict[str, str] = {
    EventType.EXECUTION_CREATED: "pending",
    EventType.EXECUTION_STARTED: "running",
    EventType.EXECUTION_RESUMED: "running",
    EventType.EXECUTION_BLOCKED: "blocked",
    EventType.EXECUTION_COMPLETED: "completed",
    EventType.EXECUTION_FAILED: "failed",
    EventType.EXECUTION_CANCELLED: "cancelled",
}


class _Cells:
    """Values under up to three label values, kept in nested dicts so that reaching a cell
    already seen allocates nothing (no key tuple)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        initial: Sequence[str] = (),
    ) -> None:
        """`initial`: the values of a family's one label whose series exist from the start."""
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self._root: dict[str, dict[str, dict[str, Any]]] = {}
        if not self.labels:
            # A series without labels exists from the start, so a scrape shows its zero.
            self._inner("", "")[""] = self._zero()
        for value in initial:
            self._inner(value, "")[""] = self._zero()

    def _zero(self) -> Any:
        return 0

    def _inner(self, first: str, second: str) -> dict[str, Any]:
        middle = self._root.get(first)
        if middle is None:
            middle = self._root[first] = {}
        inner = middle.get(second)
        if inner is None:
            inner = middle[second] = {}
        return inner

    def items(self) -> Iterator[tuple[list[str], Any]]:
        width = len(self.labels)
        for first, middle in self._root.items():
            for second, inner in middle.items():
                for third, value in inner.items():
                    yield [str(first), str(second), str(third)][:width], value


class Counter(_Cells):
    def inc(self, first: str = "", second: str = "", third: str = "", amount: int = 1) -> None:
        inner = self._inner(first, second)
        inner[third] = inner.get(third, 0) + amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in self.items():
            family.add_metric(labels, value)
        return family


class Histogram(_Cells):
    """Cumulative at scrape time; a cell is the per-bucket counts followed by the sum."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.bounds = tuple(buckets)
        self._size = len(self.bounds) + 2  # the +Inf bucket, then the sum
        super().__init__(name, documentation, labels)

    def _zero(self) -> list[float]:
        return [0.0] * self._size

    def observe(self, value: float, first: str = "", second: str = "", third: str = "") -> None:
        inner = self._inner(first, second)
        cell: list[float] | None = inner.get(third)
        if cell is None:
            cell = inner[third] = self._zero()
        cell[bisect_left(self.bounds, value)] += 1
        cell[-1] += value

    def family(self, name: str = "", documentation: str = "") -> Metric:
        """Rendered under `name` when given: one histogram may be exported under two."""
        family = HistogramMetricFamily(
            name or self.name, documentation or self.documentation, labels=self.labels
        )
        edges = [*(repr(float(bound)) for bound in self.bounds), "+Inf"]
        for labels, cell in self.items():
            cumulative, buckets = 0.0, []
            for edge, count in zip(edges, cell, strict=False):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric(labels, buckets, sum_value=cell[-1])
        return family


EVENTS = Counter("rebuno_events", "Events appended to the log, by type.", ["type"])
EXECUTIONS = Counter(
    "rebuno_execution_transitions",
    "Executions entering each status (created executions enter pending).",
    ["status"],
)
STEPS = Counter(
    "rebuno_step_decisions",
    "Step submissions answered, by kind and decision.",
    ["kind", "decision"],
)
REPLAYS = Counter(
    "rebuno_step_replays", "Submissions answered from a recorded step (replay hits).", ["kind"]
)
DISPATCH_CLAIMS = Counter("rebuno_dispatch_claims", "Dispatches claimed for delivery.", [])
DISPATCH_ATTEMPTS = Counter(
    "rebuno_dispatch_attempts",
    "Delivery attempts, by outcome: acked, failed, discarded (terminal run), exhausted.",
    ["outcome"],
)
LEASE_RECLAIMS = Counter(
    "rebuno_lease_reclaims", "Expired dispatch leases returned to the queue.", []
)
HTTP_REQUESTS = Counter(
    "rebuno_http_requests",
    "HTTP requests answered, by route template, method and status.",
    ["route", "method", "status"],
)
APPROVAL_WAIT = Histogram(
    "rebuno_approval_wait_seconds",
    "Time from an approval's request to its resolution, by resolution.",
    ["resolution"],
    _APPROVAL_BUCKETS,
)
POLICY_EVALUATION = Histogram(
    "rebuno_policy_evaluation_seconds",
    "Time to evaluate an agent's policy bundle for a new step.",
    [],
    _POLICY_BUCKETS,
)
HTTP_DURATION = Histogram(
    "rebuno_http_request_duration_seconds",
    "HTTP request latency up to the end of the response, by route template and method.",
    ["route", "method"],
    _HTTP_BUCKETS,
)

# -- the families the reference's dashboard reads (§37), beside ours -------------------------
# Same counts as some of ours, under the names and label values that dashboard queries, every
# value created at zero so that a fresh kernel already draws each bar.

EXECUTIONS_CREATED = Counter(
    "rebuno_executions_created", "Executions created (by a create, a fork or a sub-agent).", []
)
EXECUTIONS_COMPLETED = Counter(
    "rebuno_executions_completed",
    "Executions ended, by terminal status.",
    ["status"],
    ("completed", "failed", "cancelled"),
)
STEPS_SUBMITTED = Counter(
    "rebuno_steps_submitted",
    "Step submissions answered with a decision, by kind.",
    ["kind"],
    ("tool_call", "llm_call", "local"),
)
REPLAY = Counter(
    "rebuno_replay",
    "Step submissions, by whether they found a recorded step (hit) or were new.",
    ["hit"],
    ("true", "false"),
)
DISPATCH_OUTCOMES = Counter(
    "rebuno_dispatch_outcomes",
    "Webhook attempts: success (2xx), rejected (another status), exhausted (no answer).",
    ["outcome"],
    ("success", "rejected", "exhausted"),
)
DISPATCHES_RECLAIMED = Counter(
    "rebuno_dispatches_reclaimed", "Dispatches whose expired lease the reaper requeued.", []
)
POLICY_DECISIONS = Counter(
    "rebuno_policy_decisions",
    "New steps decided, by the decision recorded (a budget's denial counts as deny).",
    ["decision"],
    ("allow", "deny", "require_approval"),
)
APPROVAL_OUTCOMES = Counter(
    "rebuno_approval_outcomes",
    "Approvals resolved, by outcome.",
    ["outcome"],
    ("granted", "denied", "expired"),
)
RATE_LIMIT_DECISIONS = Counter(
    "rebuno_rate_limit_decisions",
    "Rate-limited calls (refused or parked), and limiter failures that allowed or denied.",
    ["outcome"],
    ("limited", "error_allowed", "error_denied"),
)
WORKER_ERRORS = Counter(
    "rebuno_worker_errors",
    "Failed background ticks: dispatch (claims, deliveries, the reaper), singletons (sweeps).",
    ["worker"],
    ("dispatch", "singletons"),
)
LLM_USAGE_MISSING = Counter(
    "rebuno_llm_usage_missing",
    "LLM call results recorded without token usage a budget could count.",
    [],
)
DISPATCH_LATENCY = Histogram(
    "rebuno_dispatch_latency_seconds",
    "Duration of each webhook attempt, to its answer or its failure.",
    [],
    _DISPATCH_BUCKETS,
)
_POLICY_LATENCY = "rebuno_policy_latency_seconds"
"""`POLICY_EVALUATION` again, under the name the reference's dashboard reads."""

_COUNTERS = (
    EVENTS,
    EXECUTIONS,
    STEPS,
    REPLAYS,
    DISPATCH_CLAIMS,
    DISPATCH_ATTEMPTS,
    LEASE_RECLAIMS,
    HTTP_REQUESTS,
    EXECUTIONS_CREATED,
    EXECUTIONS_COMPLETED,
    STEPS_SUBMITTED,
    REPLAY,
    DISPATCH_OUTCOMES,
    DISPATCHES_RECLAIMED,
    POLICY_DECISIONS,
    APPROVAL_OUTCOMES,
    RATE_LIMIT_DECISIONS,
    WORKER_ERRORS,
    LLM_USAGE_MISSING,
)
_HISTOGRAMS = (APPROVAL_WAIT, POLICY_EVALUATION, HTTP_DURATION, DISPATCH_LATENCY)
_ENDED = frozenset({"completed", "failed", "cancelled"})
_POLICY_DECISION_OF: dict[Decision, str] = {
    Decision.PROCEED: "allow",
    Decision.DENIED: "deny",
}


class _Gauges:
    deliveries_in_flight = 0
    queue_lag_seconds = 0.0
    queue_depth = 0


# -- hooks the services call, one line each ------------------------------------------------


def record_events(events: Iterable[Event]) -> None:
    for event in events:
        EVENTS.inc(event.type)
        status = _STATUS_OF_EVENT.get(event.type)
        if status is not None:
            EXECUTIONS.inc(status)
            # A fork's log gets its own `execution.created` and copies no execution event.
            if status == "pending":
                _on_commit(EXECUTIONS_CREATED, "")
            elif status in _ENDED:
                _on_commit(EXECUTIONS_COMPLETED, status)


_HELD: ContextVar[list[tuple[Counter, str]] | None] = ContextVar("rebuno_held", default=None)


@contextmanager
def counted_on_commit() -> Iterator[None]:
    """Around a transaction: the executions it creates and ends (§37) are counted once it
    committed, never when it failed. Under concurrent idempotent creates (§27.1), every
    loser's transaction writes its `execution.created` and then fails at commit; counted
    before, each would show as an execution that never existed."""
    held: list[tuple[Counter, str]] = []
    token = _HELD.set(held)
    try:
        yield
    finally:
        _HELD.reset(token)
    for counter, label in held:
        counter.inc(label)


def _on_commit(counter: Counter, label: str) -> None:
    held = _HELD.get()
    if held is None:
        counter.inc(label)
    else:
        held.append((counter, label))


def step_decided(kind: StepKind, decision: Decision, recorded: bool) -> None:
    """One answered submission. `recorded`: it found a step recorded under its id."""
    STEPS.inc(kind, decision)
    STEPS_SUBMITTED.inc(kind)
    REPLAY.inc("true" if recorded else "false")
    if decision is Decision.REPLAY:
        REPLAYS.inc(kind)


def new_step_decided(answer: StepDecision) -> None:
    """A new step decided by its verdict: the policy's decision, or the rate limit's."""
    if answer.decision is Decision.RATE_LIMITED or (
        answer.decision is Decision.BLOCKED and answer.approval_id is None
    ):
        RATE_LIMIT_DECISIONS.inc("limited")  # refused, or parked until a token is free
    elif answer.decision is Decision.BLOCKED:
        POLICY_DECISIONS.inc("require_approval")
    elif (decision := _POLICY_DECISION_OF.get(answer.decision)) is not None:
        POLICY_DECISIONS.inc(decision)


def llm_usage_missing() -> None:
    LLM_USAGE_MISSING.inc()


def worker_failed(worker: str) -> None:
    """A background tick failed: `dispatch` or `singletons`."""
    WORKER_ERRORS.inc(worker)


def evaluate_policy(
    bundle: Bundle, agent_id: str, kind: StepKind, target: str, args: str | None
) -> PolicyResult:
    """`bundle.evaluate(...)`, timed."""
    started = time.perf_counter()
    result = bundle.evaluate(agent_id, kind, target, args)
    POLICY_EVALUATION.observe(time.perf_counter() - started)
    return result


def claimed(batch: _Batch) -> _Batch:
    """Counts the dispatches a claim returned, and returns them."""
    if batch:
        DISPATCH_CLAIMS.inc(amount=len(batch))
    return batch


def delivery_started() -> None:
    _Gauges.deliveries_in_flight += 1


def delivery_finished() -> None:
    _Gauges.deliveries_in_flight -= 1


def delivery_attempted(outcome: DeliveryOutcome, seconds: float) -> None:
    DISPATCH_ATTEMPTS.inc("acked" if outcome.ok else "failed")
    if outcome.ok:
        DISPATCH_OUTCOMES.inc("success")
    else:
        DISPATCH_OUTCOMES.inc("rejected" if outcome.answered else "exhausted")
    DISPATCH_LATENCY.observe(seconds)


def dispatch_discarded() -> None:
    DISPATCH_ATTEMPTS.inc("discarded")


def dispatch_exhausted() -> None:
    DISPATCH_ATTEMPTS.inc("exhausted")


def leases_reclaimed(count: int) -> None:
    if count:
        LEASE_RECLAIMS.inc(amount=count)
        DISPATCHES_RECLAIMED.inc(amount=count)


def approval_resolved(status: ApprovalStatus, requested_at: datetime, now: datetime) -> None:
    APPROVAL_WAIT.observe((now - requested_at).total_seconds(), status)
    APPROVAL_OUTCOMES.inc(status)


# -- scrape time -----------------------------------------------------------------------------


async def refresh_queue(
    read_queue: Callable[[datetime], Awaitable[tuple[int, datetime | None]]], now: datetime
) -> None:
    """How many dispatches are due, and how late the most overdue one is (0 when nothing is
    due): a backlog the dispatch loops cannot keep up with shows as a growing depth and lag.
    A database that cannot answer leaves the last values, so the scrape itself succeeds."""
    try:
        depth, due_at = await read_queue(now)
    except Exception as exc:
        log.warning("metrics: cannot read the dispatch queue: %s", exc)
        return
    lag = (now - due_at).total_seconds() if due_at is not None else 0.0
    _Gauges.queue_lag_seconds = max(lag, 0.0)
    _Gauges.queue_depth = depth


class _Collector(Collector):
    def collect(self) -> Iterable[Metric]:
        for metric in (*_COUNTERS, *_HISTOGRAMS):
            yield metric.family()
        yield POLICY_EVALUATION.family(
            _POLICY_LATENCY, "Time to evaluate an agent's policy bundle for a new step."
        )
        yield GaugeMetricFamily(
            "rebuno_queue_depth",
            "Dispatches due for delivery and not yet claimed, read when scraped.",
            value=_Gauges.queue_depth,
        )
        yield GaugeMetricFamily(
            "rebuno_dispatch_deliveries_in_flight",
            "Webhook deliveries this replica is running now.",
            value=_Gauges.deliveries_in_flight,
        )
        yield GaugeMetricFamily(
            "rebuno_dispatch_queue_depth",
            "Dispatches due for delivery and not yet claimed.",
            value=_Gauges.queue_depth,
        )
        yield GaugeMetricFamily(
            "rebuno_dispatch_queue_lag_seconds",
            "Seconds the most overdue queued dispatch has been due (0 when none is).",
            value=_Gauges.queue_lag_seconds,
        )


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(_Collector())


def render() -> bytes:
    """The Prometheus text exposition of every metric."""
    return generate_latest(REGISTRY)


# -- HTTP ------------------------------------------------------------------------------------


class HttpMetrics:
    """ASGI middleware: counts and times each HTTP request by its route template.

    The template (`/v0/executions/{execution_id}`), not the path, keeps the label set small;
    a path no route matched is labelled `unmatched`. A streaming response is timed to its end.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = _route_template(scope)
            method = scope["method"]
            HTTP_REQUESTS.inc(route, method, str(status))
            HTTP_DURATION.observe(time.perf_counter() - started, route, method)


def _route_template(scope: Scope) -> str:
    # Starlette's router records the matched route in the scope it was given.
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE
