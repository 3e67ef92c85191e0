"""What one HTTP request costs the client: per-request latency (median, p90) and CPU time per
request of three ways to POST a small JSON body to a uvicorn server on loopback, one request at
a time on a kept-alive connection:

- (a) `httpx.AsyncClient` with its own transport (httpcore);
- (b) `httpx.AsyncClient` over `PoolTransport`, an httpx transport backed by the lean pool;
- (c) the lean pool (`rebuno._http.Pool`) called directly, as the SDK and the webhook delivery do.

The server runs in a process of its own (uvloop and httptools, as the kernel and an agent run
it), so the CPU time measured here is the client's alone. The clients take turns within each
round, so drift on a shared machine hits them alike; each is warmed up before it is measured.

`python -m bench.http_client [--requests N] [--rounds R] [--loops uvloop,asyncio]`

Imports httpx, uvicorn, uvloop, `rebuno._http` and the bench's own modules; never the kernel
or the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import uvloop

from bench.processes import Process
from bench.stats import median, percentile
from harness.ports import free_port
from rebuno._http import Pool, Timeout, TransportError

US = 1e6
WARM_UP = 200
BODY = b'{"i":0,"payload":"' + b"x" * 100 + b'"}'
ANSWER = b'{"ok":true,"i":0}'
_HEADERS = (("Content-Type", "application/json"),)
# Pool.request writes these two itself, from the origin and the body.
_OWN_HEADERS = frozenset((b"host", b"content-length"))
_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Post = Callable[[], Awaitable[int]]


class PoolTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends each request over a lean `Pool` (one origin).

    The request's body is read whole; the answer comes back whole, as the pool reads it.
    """

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw
            if name.lower() not in _OWN_HEADERS
        ]
        target = request.url.raw_path.decode("ascii")
        try:
            answer = await self._pool.request(request.method, target, headers, body)
        except Timeout as exc:
            raise httpx.ReadTimeout(str(exc), request=request) from exc
        except TransportError as exc:
            raise httpx.NetworkError(str(exc), request=request) from exc
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=httpx.ByteStream(answer.body),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


async def answer(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body and answers a small JSON object."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def serve(port: int) -> None:
    uvicorn.run(
        answer,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )


@dataclass
class Tally:
    """Every latency measured for one client on one loop, and its CPU per request by round."""

    latencies: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


async def _httpx(base: str, requests: int, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30.0, trust_env=False) as client:
        await _run(lambda: _status(client), requests, tally)


async def _httpx_over_pool(base: str, requests: int, tally: Tally) -> None:
    transport = PoolTransport(Pool(base, timeout=30.0))
    async with httpx.AsyncClient(
        base_url=base, timeout=30.0, trust_env=False, transport=transport
    ) as client:
        await _run(lambda: _status(client), requests, tally)


async def _pool(base: str, requests: int, tally: Tally) -> None:
    pool = Pool(base, timeout=30.0)
    try:

        async def post() -> int:
            return (await pool.request("POST", "/step", _HEADERS, BODY)).status

        await _run(post, requests, tally)
    finally:
        await pool.aclose()


async def _status(client: httpx.AsyncClient) -> int:
    response = await client.post("/step", content=BODY, headers=_HEADERS)
    return response.status_code


async def _run(post: Post, requests: int, tally: Tally) -> None:
    for _ in range(WARM_UP):
        await _check(post)
    latencies = [0.0] * requests
    clock = time.perf_counter
    cpu_started = time.process_time()
    for i in range(requests):
        started = clock()
        await _check(post)
        latencies[i] = clock() - started
    tally.cpu.append((time.process_time() - cpu_started) / requests)
    tally.latencies.extend(latencies)


async def _check(post: Post) -> None:
    status = await post()
    if status != 200:
        raise RuntimeError(f"the server answered {status}")


CLIENTS: dict[str, Callable[[str, int, Tally], Coroutine[Any, Any, None]]] = {
    "(a) httpx.AsyncClient": _httpx,
    "(b) httpx.AsyncClient over PoolTransport": _httpx_over_pool,
    "(c) Pool": _pool,
}


def measure(base: str, loops: list[str], requests: int, rounds: int) -> dict[str, Tally]:
    """Each client on each loop, `rounds` times in turn; keyed `loop/client`."""
    tallies = {f"{loop}/{name}": Tally() for loop in loops for name in CLIENTS}
    for _ in range(rounds):
        for loop in loops:
            for name, client in CLIENTS.items():
                with asyncio.Runner(loop_factory=_LOOPS[loop]) as runner:
                    runner.run(client(base, requests, tallies[f"{loop}/{name}"]))
    return tallies


def report(tallies: dict[str, Tally], loops: list[str], requests: int, rounds: int) -> str:
    lines = [
        f"{requests} sequential requests x {rounds} rounds per client and loop "
        f"(after {WARM_UP} unmeasured); CPU is the client process's, median of the rounds",
        "",
        "| loop | client | median µs | p90 µs | CPU µs/request | CPU vs (a) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for loop in loops:
        base_cpu = median(tallies[f"{loop}/{next(iter(CLIENTS))}"].cpu)
        for name in CLIENTS:
            tally = tallies[f"{loop}/{name}"]
            cpu = median(tally.cpu)
            lines.append(
                f"| {loop} | {name} | {median(tally.latencies) * US:.0f} "
                f"| {percentile(tally.latencies, 90) * US:.0f} | {cpu * US:.0f} "
                f"| {cpu / base_cpu:.2f} |"
            )
    lines.append("")
    for loop in loops:
        a, b, c = (tallies[f"{loop}/{name}"] for name in CLIENTS)
        times = [median(each.latencies) for each in (a, b, c)]
        cpus = [median(each.cpu) for each in (a, b, c)]
        lines.append(
            f"{loop}: (b) keeps {_kept(*times):.0%} of the latency and {_kept(*cpus):.0%} of "
            f"the CPU that (c) saves over (a), at {times[1] / times[2]:.1f}x the latency "
            f"and {cpus[1] / cpus[2]:.1f}x the CPU of (c)"
        )
    return "\n".join(lines)


def _kept(a: float, b: float, c: float) -> float:
    return (a - b) / (a - c)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_client", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000, help="measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loops", default="uvloop,asyncio", help="comma-separated")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    loops = [loop for loop in args.loops.split(",") if loop]
    unknown = sorted(set(loops) - set(_LOOPS))
    if unknown or args.requests < 1 or args.rounds < 1:
        parser.error(f"loops are {sorted(_LOOPS)}, requests and rounds at least 1")
    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        server = Process(
            [sys.executable, "-m", "bench.http_client", "--serve", str(port)],
            Path(scratch) / "server.log",
            {},
        )
        try:
            server.wait_for_port(port)
            tallies = measure(f"http://127.0.0.1:{port}", loops, args.requests, args.rounds)
        finally:
            server.stop()
    print(report(tallies, loops, args.requests, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
