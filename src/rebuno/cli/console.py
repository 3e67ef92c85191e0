"""`rebuno dev` on a terminal: the kernel serves from a background thread with its own event
loop while the REPL holds the main thread, the only thread Ctrl-C and SIGTERM reach.

Signals are why the split goes this way round: uvicorn installs no handlers off the main
thread, so Ctrl-C belongs to the shell (it clears a line or interrupts a command) and only
`quit`, Ctrl-D or Ctrl-C on an empty line stop the kernel, gracefully, through its stop event.
Imports `rebuno.kernel.server` (the composition root) and the REPL; nothing else of the kernel.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from rebuno.cli import repl
from rebuno.kernel import server
from rebuno.kernel.config import Settings

# The server's own graceful shutdown is 10 s; beyond that the process exits regardless.
_JOIN_SECONDS = server.GRACEFUL_SHUTDOWN_SECONDS + 5


def interactive() -> bool:
    """stdin and stdout are terminals, and this process is in the foreground of its terminal:
    a kernel started in the background (`&`, a test harness) must not stop on SIGTTIN."""
    try:
        return (
            sys.stdin.isatty()
            and sys.stdout.isatty()
            and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
        )
    except (OSError, ValueError):
        return False


class KernelThread(threading.Thread):
    """Runs `server.run` and reports when it listens, or why it could not start."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="rebuno-kernel", daemon=True)
        self._settings = settings
        self._stop_event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.url = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            server.run(self._settings, stop=self._stop_event, on_ready=self._on_ready)
        except BaseException as exc:  # handed to the main thread, which reports it
            self.error = exc
        finally:
            self.ready.set()

    def _on_ready(self, url: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.url = url
        self.ready.set()

    def stop(self) -> None:
        """Asks the kernel to shut down gracefully and waits for it."""
        if self._loop is not None and self.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self.join(_JOIN_SECONDS)


def run(settings: Settings) -> None:
    """Serves with the REPL in the foreground; returns once both have stopped.

    Raises:
        KernelError, OSError: the kernel could not start (the same errors as `server.run`).
    """
    kernel = KernelThread(settings)
    kernel.start()
    try:
        kernel.ready.wait()
        if kernel.error is None:
            repl.start(kernel.url, kernel_alive=kernel.is_alive)
    finally:
        kernel.stop()
    if kernel.error is not None:
        raise kernel.error
