"""A loopback TCP proxy that can take a dependency away without touching the shared server behind it.

The degradation tests and `bench/run degrade` point the engine at one of these instead of PostgreSQL, Redis,
RabbitMQ, the object store or a provider. `cut()` closes every open connection and makes new ones fail
(connection refused: the port stays bound, so nothing else can take it), `restore()` lets them through again.
The upstream is `host:port` or a unix socket path.

    with TcpProxy(("127.0.0.1", 5432)) as proxy:     # proxy.port: point the engine at it
        proxy.cut(); ...; proxy.restore()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

Upstream = tuple[str, int] | str


class TcpProxy:
    def __init__(self, upstream: Upstream, host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self._listener = socket.create_server((host, 0))
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._up = True
        self._closed = False
        self.accepted = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._accept, name=f"tcpproxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def is_up(self) -> bool:
        return self._up

    def url(self, scheme: str, rest: str = "") -> str:
        return f"{scheme}://{self.host}:{self.port}{rest}"

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until `restore()`."""
        with self._lock:
            self._up = False
            doomed, self._open = self._open, set()
        for s in doomed:
            _close(s)

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.upstream)
            return s
        return socket.create_connection(self.upstream, timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            if not self._up:
                # a reset, as a stopped server's host would answer: the client fails at once, never hangs
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                _close(client)
                self.refused += 1
                continue
            try:
                server = self._connect_upstream()
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if not self._up:
                    _close(client)
                    _close(server)
                    continue
                self._open.update((client, server))
            self.accepted += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
