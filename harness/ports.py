"""`free_port`: a loopback TCP port for a server about to start, chosen so that no outgoing
connection of this machine can take it between the pick and the server's bind.

Standard library only.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def _listening_ports() -> tuple[int, ...]:
    """The ports `free_port` picks from: every unprivileged one outside the range this machine
    takes the source ports of outgoing connections from (Linux's default, 32768-60999, when it
    does not say). A port from that range, once the probe has closed it, can become the source
    port of any outgoing connection (to PostgreSQL, say) before the server the test starts
    binds it, and the server then exits with "Address already in use"."""
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, _EPHEMERAL.read_text().split())
    return tuple(port for port in range(1024, 65536) if not low <= port <= high)


_PORTS = _listening_ports()


def free_port() -> int:
    """A loopback TCP port nothing listens on, outside the ephemeral range and not handed out
    before by this process, for a server a test is about to start."""
    while True:
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
