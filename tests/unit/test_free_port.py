"""`harness.ports.free_port`: the ports test servers listen on never come from the range the
operating system picks the source ports of outgoing connections from, so no connection can
take one between the pick and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from harness.ports import free_port


def _ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_ports_are_outside_the_ephemeral_range_and_never_handed_out_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not set(ports) & set(_ephemeral_range())


def test_a_handed_out_port_can_be_listened_on() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))
        server.listen()
