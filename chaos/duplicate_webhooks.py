"""Each webhook delivered two or three times, some copies at once and some late: a proxy in front
of the agent forwards every POST the kernel makes (the kernel gets that answer) and sends copies
of it, byte for byte with the same headers, concurrently or after a delay of up to two seconds,
by when the execution may have moved on or ended.

Nothing crashes, so every op of every program must have run its body exactly once: a copy of a
delivery the agent is running or has run must start nothing.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from chaos.result import Result, Scale
from chaos.rig import TERMINAL, Bodies, LogFaults, Programs, Verdict, dev_kernel, log_faults
from harness.ports import free_port

NAME = "duplicate_webhooks"
SUMMARY = "each webhook delivered 2-3 times, concurrently and late"
SEED = 20260703
SIZES = {Scale.CI: 8, Scale.FULL: 150}
LATE = (0.05, 2.0)
"""The range a late copy is sent in, seconds after the original."""
_SKIPPED_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding"})


class Duplicator:
    """A loopback HTTP proxy to `upstream` that sends one to two extra copies of each POST."""

    def __init__(self, upstream: str, seed: int) -> None:
        self._upstream = upstream
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._copies: list[threading.Thread] = []
        self.counts: Counter[str] = Counter()
        # One client for every copy: a client per request costs the proxy more CPU than the
        # whole agent spends, and the delay it adds is not the fault under test.
        self._http = httpx.Client(timeout=10, limits=httpx.Limits(max_connections=64))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/webhook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _forward(self, body: bytes, headers: dict[str, str], kind: str) -> httpx.Response | None:
        try:
            response = self._http.post(self._upstream, content=body, headers=headers)
        except httpx.HTTPError:
            self._count(f"{kind}_unanswered")
            return None
        if kind != "original" and response.status_code == 200:
            self._count(f"{kind}_{'started' if response.json().get('accepted') else 'ignored'}")
        return response

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _copy(self, body: bytes, headers: dict[str, str], delay: float, kind: str) -> None:
        time.sleep(delay)
        self._forward(body, headers, kind)

    def _send_copies(self, body: bytes, headers: dict[str, str]) -> None:
        with self._lock:
            extra = self._rng.choice((1, 2))
            plans = [self._rng.random() < 0.5 for _ in range(extra)]
            delays = [0.0 if concurrent else self._rng.uniform(*LATE) for concurrent in plans]
        for delay in delays:
            kind = "concurrent" if delay == 0 else "late"
            self._count(kind)
            thread = threading.Thread(target=self._copy, args=(body, headers, delay, kind))
            thread.start()
            with self._lock:
                self._copies.append(thread)

    def drain(self) -> None:
        """Waits for every copy to be sent and answered."""
        with self._lock:
            copies = list(self._copies)
        for thread in copies:
            thread.join(15)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in _SKIPPED_HEADERS
                }
                proxy._count("webhooks")
                proxy._send_copies(body, headers)
                response = proxy._forward(body, headers, "original")
                with contextlib.suppress(OSError):  # the kernel may have given up on us
                    self.send_response(response.status_code if response is not None else 502)
                    content = response.content if response is not None else b""
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler


def program(rng: random.Random) -> dict[str, Any]:
    ops: list[dict[str, Any]] = []
    for _ in range(rng.randint(3, 6)):
        roll = rng.random()
        if roll < 0.8:
            once = roll < 0.4
            ops.append(
                {"t": "tool", "name": rng.choice("ab"), "once": once, "arg": rng.randint(0, 2)}
            )
        else:
            ops.append({"t": "local", "arg": rng.randint(0, 9)})
    return {"ops": ops}


def run(scale: Scale, workdir: Path) -> Result:
    rng = random.Random(SEED)
    port = free_port()
    proxy = Duplicator(f"http://127.0.0.1:{port}/webhook", SEED)
    # No crash here, so no lease needs to run out: a long one keeps a run slowed down by the
    # copies from being redelivered, which would be another fault than this one.
    kernel = dev_kernel(workdir, proxy.url, {"REBUNO_DISPATCH_LEASE_TIMEOUT": "30s"})
    rig = Programs(workdir, kernel.url, port, jitter_ms=30)
    try:
        rig.start_agent()
        programs = [program(rng) for _ in range(SIZES[scale])]
        ids = [rig.create(p) for p in programs]
        left = rig.wait_finished(ids, 120)
        proxy.drain()
        return judge(rig, proxy, ids, programs, left)
    finally:
        rig.close()
        kernel.stop()
        proxy.close()


def judge(
    rig: Programs,
    proxy: Duplicator,
    ids: list[str],
    programs: list[dict[str, Any]],
    left: list[str],
) -> Result:
    result = Result(NAME)
    bodies = Bodies.of(rig.ledger)
    verdict = Verdict()
    faults = LogFaults()
    statuses: Counter[str] = Counter()
    for execution_id in ids:
        execution = rig.execution(execution_id)
        statuses[execution["status"]] += 1
        faults += log_faults(rig.events(execution_id))
        if execution["status"] == "completed":
            verdict += bodies.judge_output(execution_id, execution["output"]["results"])
    steps = sum(len(p["ops"]) for p in programs)
    per_step = Counter(len(runs) for runs in bodies.runs.values())
    extra = bodies.total - steps
    counts = proxy.counts
    result.figures.update(
        executions=len(ids),
        logical_steps=steps,
        webhooks=counts["webhooks"],
        copies_concurrent=counts["concurrent"],
        copies_late=counts["late"],
        copies_started_a_run=counts["concurrent_started"] + counts["late_started"],
        copies_ignored=counts["concurrent_ignored"] + counts["late_ignored"],
        body_runs=bodies.total,
        effects_per_step_max=max(per_step, default=0),
        extra_effects=extra,
        duplicate_events=faults.duplicates,
        completed=statuses["completed"],
        unfinished=len(left),
    )
    result.expect(extra == 0 and set(per_step) <= {1}, f"{extra} extra effect(s): {dict(per_step)}")
    result.expect(verdict.misrouted == 0, f"{verdict.misrouted} result(s) not their call's")
    result.expect(faults.duplicates == 0, f"{faults.duplicates} duplicated event(s)")
    result.expect(faults.double_terminal == 0, f"{faults.double_terminal} step(s) ended twice")
    result.expect(not left, f"{len(left)} execution(s) never ended")
    result.expect(
        sum(statuses[s] for s in TERMINAL) == statuses["completed"],
        f"executions ended otherwise than completed: {dict(statuses)}",
    )
    return result
