"""Unauthenticated resource exhaustion: the kernel's RSS before and after each attack.

Run as `python -m bench.exhaustion` (about 40 s). It starts `rebuno server` on a scratch SQLite
file on a loopback port and, as nobody in particular, sends:
- 6,000 GETs naming a different 16 KB `Rebuno-Agent-Id` each, then 20,000 with short ones;
- 30 uploads that declare 9.9 MiB and never finish;
- 100 connections that never finish their request head (slowloris).

It prints the kernel's RSS after each, and how many slowloris connections are still open after
the head timeout. Everything stays on loopback and stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from harness.ports import free_port

UPLOAD_BYTES = int(9.9 * 1024 * 1024)
HEAD_TIMEOUT_SECONDS = 10


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def unsigned_gets(port: int, count: int, id_bytes: int) -> None:
    target = "/v0/executions/00000000-0000-0000-0000-000000000000"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        for index in range(count):
            agent = f"{index:07d}".ljust(id_bytes, "x")
            headers = {"Rebuno-Agent-Id": agent, "Rebuno-Signature": "v1=00"}
            await http.get(target, headers=headers)


def unfinished_uploads(port: int, count: int) -> list[socket.socket]:
    head = (
        "POST /v0/executions HTTP/1.1\r\nHost: kernel\r\nContent-Type: application/json\r\n"
        f"Content-Length: {UPLOAD_BYTES}\r\n\r\n"
    ).encode()
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.settimeout(5)
        # Refused before the whole body went out is what an attacker would see.
        with contextlib.suppress(OSError):
            sock.sendall(head + b"{" + b" " * (UPLOAD_BYTES - 100))
        opened.append(sock)
    return opened


def slowloris(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /v0/health HTTP/1.1\r\nHost: kernel\r\nX-Slow: ")
        opened.append(sock)
    return opened


def still_open(sockets: list[socket.socket]) -> int:
    """How many the kernel has not closed (reading nothing yet, or an answer)."""
    alive = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            alive += bool(sock.recv(1))
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def wait_healthy(port: int) -> None:
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v0/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("the kernel did not start")


def main() -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rebuno-exhaustion-") as scratch:
        env = {
            **os.environ,
            "REBUNO_BEARER_TOKEN": "exhaustion",
            "REBUNO_DB_URL": f"sqlite:///{scratch}/kernel.db",
        }
        args = [sys.executable, "-m", "rebuno.cli.main", "server"]
        args += ["--listen-addr", f"127.0.0.1:{port}", "--log-level", "error"]
        kernel = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(port)

            def report(what: str, extra: str = "") -> None:
                print(f"{what:<40} RSS {rss_mib(kernel.pid):7.1f} MiB {extra}")

            report("start")
            asyncio.run(unsigned_gets(port, 6000, 16 * 1024))
            report("6,000 GETs, 16 KB agent ids")
            asyncio.run(unsigned_gets(port, 20000, 12))
            report("20,000 GETs, distinct short agent ids")
            uploads = unfinished_uploads(port, 30)
            report("30 unfinished 9.9 MiB uploads")
            for sock in uploads:
                sock.close()
            held = slowloris(port, 100)
            time.sleep(1)
            report("100 slowloris connections, 1 s", f"({still_open(held)} open)")
            time.sleep(HEAD_TIMEOUT_SECONDS + 1)
            report(f"100 slowloris, {HEAD_TIMEOUT_SECONDS + 2} s", f"({still_open(held)} open)")
            for sock in held:
                sock.close()
        finally:
            kernel.kill()
            kernel.wait()


if __name__ == "__main__":
    main()
