"""A loopback TCP listener (the `listener` fixture) and how many connections reached it: the proof that a hostile
input made nothing call out."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, int]]:
    """A loopback TCP listener that records whether anything connected to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock, sock.getsockname()[1]
    finally:
        sock.close()


def connections(sock: socket.socket) -> int:
    hits = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return hits
        conn.close()
        hits += 1
