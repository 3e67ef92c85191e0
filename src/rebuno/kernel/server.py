"""The composition root: settings to store, services, webhook delivery, the API with the
console beside it, and background loops.

The only module that names a concrete store backend. `serve` runs one replica until SIGINT or
SIGTERM; `run` is its synchronous entry point on the fastest available event loop, and with
`workers` above 1 it forks that many replicas sharing one listening socket and supervises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.types import ASGIApp

from rebuno.kernel import background
from rebuno.kernel.api.app import create_app
from rebuno.kernel.background import DispatchLoop
from rebuno.kernel.config import (
    Settings,
    default_replica_id,
    split_listen_addr,
    webhook_targets,
)
from rebuno.kernel.console.routes import ConsoleRoutes
from rebuno.kernel.domain.errors import KernelError, ValidationFailed
from rebuno.kernel.http_protocol import http_protocol
from rebuno.kernel.manifest import load_manifest
from rebuno.kernel.metrics import HttpMetrics
from rebuno.kernel.service.context import Clock, utc_now
from rebuno.kernel.service.kernel import Kernel
from rebuno.kernel.store.base import Store
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.kernel.stream.postgres import PostgresBus
from rebuno.kernel.tracing import Tracing, install_log_correlation
from rebuno.kernel.webhooks.delivery import HttpDeliverer

log = logging.getLogger("rebuno.kernel")
GRACEFUL_SHUTDOWN_SECONDS = 10
CANCEL_ROUNDS = 5
CANCEL_GRACE_SECONDS = 1.0
GC_THRESHOLDS = (10_000, 20, 20)
"""The collector's generation thresholds while serving (CPython's defaults: 700, 10, 10)."""
_PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when its parent dies (Linux)."""


class ServerError(KernelError):
    """The server cannot start: a port in use, a bad address or database URL."""


def open_store(settings: Settings) -> Store:
    """`sqlite:///relative/path`, `sqlite:////absolute/path`, `sqlite:///:memory:`, or a
    `postgres://` / `postgresql://` URL."""
    url = settings.db_url
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from rebuno.kernel.store.sqlite import SqliteStore

        path = url.removeprefix("sqlite://").removeprefix("/")
        if not path:
            raise ValidationFailed(f"--db-url {url!r}: an sqlite URL needs a path")
        return SqliteStore(path)
    if scheme in ("postgres", "postgresql"):
        from rebuno.kernel.store.postgres import PostgresStore

        # §18.2: "auto" is enough connections for every delivery worker plus the API.
        auto_max = max(10, 2 * settings.dispatch_concurrency + 10)
        return PostgresStore(
            url, min_size=settings.db_min_conns, max_size=settings.db_max_conns or auto_max
        )
    raise ValidationFailed(
        f"--db-url: unsupported scheme {scheme!r} (use sqlite:///PATH or postgresql://…)"
    )


def open_bus(settings: Settings) -> MemoryBus | PostgresBus:
    """Replicas on one PostgreSQL share deltas through it (§16.3); SQLite is one process."""
    if urlsplit(settings.db_url).scheme in ("postgres", "postgresql"):
        return PostgresBus(settings.db_url)
    return MemoryBus()


def bind(listen_addr: str) -> socket.socket:
    """Binds the listening socket ourselves so a port in use is one clear error."""
    try:
        host, port = split_listen_addr(listen_addr)
    except ValueError as exc:
        raise ServerError(f"--listen-addr {listen_addr!r}: {exc}") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServerError(f"cannot listen on {listen_addr}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def public_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


async def provision(kernel: Kernel, manifest_path: str) -> None:
    """Upserts every agent of the manifest; its bundle replaces the stored one (§18.4)."""
    for spec in load_manifest(manifest_path):
        await kernel.register_agent(
            spec.id,
            spec.webhook_url,
            spec.secret,
            spec.lease_timeout_seconds,
            spec.policy_bundle,
            keep_bundle=False,
        )


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
    own_process: bool = False,
    store: Store | None = None,
    clock: Clock = utc_now,
) -> None:
    """Runs one replica until SIGINT/SIGTERM, or until `stop` is set (the REPL's `quit`, from
    another thread through `loop.call_soon_threadsafe(stop.set)`). Serves with HTTP metrics,
    log lines carrying the ids of their request or delivery, and tracing when
    `otel_endpoint` is set. `sock`: a listening socket bound already (a worker's).
    `own_process`: the process serves nothing else, so the collector is tuned for serving.
    `store` (not yet opened) replaces the one `settings.db_url` names and `clock` the system
    clock, for a harness that injects faults into either."""
    tracing = Tracing.from_settings(settings)
    install_log_correlation()
    sock = sock or bind(settings.listen_addr)
    store = store or open_store(settings)
    await store.open()
    deliverer = HttpDeliverer(settings.dispatch_timeout.total_seconds(), webhook_targets(settings))
    bus = open_bus(settings)
    try:
        kernel = Kernel(store, settings, bus=bus, clock=clock)
        dispatch_loop = DispatchLoop(kernel, tracing.deliverer(deliverer))
        kernel.wake = dispatch_loop.wake
        if settings.config_file:
            await provision(kernel, settings.config_file)
        app = HttpMetrics(tracing.asgi(application(kernel, settings)))
        server = uvicorn.Server(_uvicorn_config(app, settings))
        jobs = _background(kernel, dispatch_loop, bus)
        if stop is not None:
            jobs.append(("stop-watch", _exit_when(stop, server)))
        (on_ready or _announce)(public_url(sock))
        if own_process:
            _settle_heap()
        await _run_until_stopped(server, sock, jobs)
    finally:
        sock.close()
        if isinstance(bus, PostgresBus):
            await bus.close()
        await deliverer.close()
        await store.close()
        await asyncio.to_thread(tracing.shutdown)


def application(kernel: Kernel, settings: Settings) -> ASGIApp:
    """The app a replica serves: the API, with the console's pages (§40) beside it on the
    API's authentication."""
    return create_app(kernel, settings, functools.partial(ConsoleRoutes, settings))


def _settle_heap() -> None:
    """Moves what start-up allocated (modules, the app, the pool) out of the collector's
    view, and lets the young generation grow before it is collected: a request allocates
    many short-lived objects, and a full collection would otherwise walk the whole heap."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _exit_when(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    server.should_exit = True


def _announce(url: str) -> None:
    print(f"rebuno kernel listening on {url}", file=sys.stderr, flush=True)
    print(f"rebuno console at {url}/ui", file=sys.stderr, flush=True)


def _uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        http=http_protocol(settings.header_timeout.total_seconds()),
        # uvicorn rewrites the client address and scheme from X-Forwarded-* on every request
        # from 127.0.0.1; the kernel reads neither (a signature covers the path alone).
        proxy_headers=False,
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # Connections and requests in progress together; past it uvicorn answers 503 at once.
        limit_concurrency=settings.max_connections,
        backlog=2048,
    )


def _background(
    kernel: Kernel, dispatch_loop: DispatchLoop, bus: MemoryBus | PostgresBus
) -> list[tuple[str, Coroutine[Any, Any, None]]]:
    jobs: list[tuple[str, Coroutine[Any, Any, None]]] = [
        ("dispatch-loop", dispatch_loop.run()),
        (
            "dispatch-watch",
            kernel.store.watch_dispatches(
                dispatch_loop.wake, kernel.ended, kernel.activity.touched
            ),
        ),
    ]
    if isinstance(bus, PostgresBus):
        jobs.append(("stream-bus", bus.run()))
    jobs.extend(background.jobs(kernel))
    return jobs


async def _run_until_stopped(
    server: uvicorn.Server,
    sock: socket.socket,
    jobs: list[tuple[str, Coroutine[Any, Any, None]]],
) -> None:
    """Serves HTTP while the background loops run; when serving stops they are cancelled."""
    tasks = [asyncio.create_task(job, name=name) for name, job in jobs]
    for task in tasks:
        task.add_done_callback(_report_stopped)
    try:
        await server.serve(sockets=[sock])
    finally:
        await _cancel_all(tasks)


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancels the background loops and waits for them. A driver may swallow a cancellation
    that lands inside one of its awaits, so a loop still running after a grace period is
    cancelled again rather than holding up shutdown."""
    pending = set(tasks)
    for _ in range(CANCEL_ROUNDS):
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_GRACE_SECONDS)
        if not pending:
            return
    log.warning("background loops still running at shutdown: %s", [t.get_name() for t in pending])


def _report_stopped(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background loop %s stopped", task.get_name(), exc_info=task.exception())


def run(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Synchronous entry point of `serve`: uvloop when installed, the default loop otherwise.
    With `settings.workers` above 1, forks the workers and supervises them instead."""
    if settings.workers > 1:
        _run_workers(settings)
        return
    _run_loop(serve(settings, stop=stop, on_ready=on_ready, own_process=True))


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is optional (not on every platform)
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def _run_workers(settings: Settings) -> None:
    """Forks `settings.workers` replicas on one listening socket (the operating system spreads
    the connections) and waits for them. SIGTERM or SIGINT stops them all gracefully; a worker
    that exits on its own stops the others, and the supervisor then fails with its status.
    Forked before any event loop or thread exists here, so each worker starts clean."""
    sock = bind(settings.listen_addr)
    workers: dict[int, int] = {}
    try:
        for index in range(settings.workers):
            pid = os.fork()
            if pid == 0:
                _worker(settings, sock, index)
            workers[pid] = index
    finally:
        sock.close()  # the workers hold their own copies
    failed = _supervise(workers)
    if failed:
        raise ServerError(f"worker {failed[0]} exited with status {failed[1]}")


def _worker(settings: Settings, sock: socket.socket, index: int) -> None:
    """A forked worker: one replica of its own (own replica id, pool, loops); never returns."""
    status = 0
    try:
        _stop_with_supervisor(os.getppid())
        own = dataclasses.replace(settings, workers=1, replica_id=default_replica_id())
        announce = _announce if index == 0 else _silent
        _run_loop(serve(own, on_ready=announce, sock=sock, own_process=True))
    except KernelError as exc:
        print(f"error: worker {index}: {exc.message}", file=sys.stderr, flush=True)
        status = 1
    except KeyboardInterrupt:
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)


def _silent(url: str) -> None:
    return None


def _stop_with_supervisor(supervisor: int) -> None:
    """Asks Linux to send SIGTERM to this worker when its supervisor dies (a SIGKILL leaves
    no one to forward signals). Elsewhere workers outlive a killed supervisor."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
        if libc is not None and hasattr(libc, "prctl"):
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != supervisor:  # it died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _supervise(workers: dict[int, int]) -> tuple[int, int] | None:
    """Waits for every worker; the first that exited on its own, with its status, if any."""
    stopping = False
    failed: tuple[int, int] | None = None

    def stop_all(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        _signal_all(workers, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while workers:
            pid, status = os.wait()
            index = workers.pop(pid, None)
            if index is None or stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            log.error("worker %d exited with status %d; stopping the others", index, code)
            failed, stopping = (index, code), True
            _signal_all(workers, signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return failed


def _signal_all(workers: dict[int, int], sig: int) -> None:
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
