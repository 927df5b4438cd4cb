"""Name resolution for the output fetcher, injectable so tests can simulate DNS answers (incl. rebinding).

The fetcher resolves each hop exactly once, validates every answer and connects to a validated address:
a second lookup by the HTTP client (the DNS-rebinding window) never happens.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol

from aivedio_engine.fetch.policy import IPAddress


class ResolveError(Exception):
    """The name did not resolve (NXDOMAIN, SERVFAIL, timeout): the fetch fails closed."""


class Resolver(Protocol):
    def resolve(self, host: str, port: int) -> list[IPAddress]:
        """All addresses of `host` (never empty; raises ResolveError instead)."""
        ...


class SystemResolver:
    """`socket.getaddrinfo` with a timeout (getaddrinfo itself has none, so it runs in a helper thread)."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self._timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch-dns")

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        future = self._pool.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = future.result(timeout=self._timeout_s)
        except FutureTimeout:
            raise ResolveError(f"resolving {host} timed out") from None
        except (OSError, UnicodeError) as exc:
            raise ResolveError(f"resolving {host} failed: {type(exc).__name__}") from None
        out: list[IPAddress] = []
        for info in infos:
            addr = str(info[4][0]).split("%", 1)[0]
            ip = ipaddress.ip_address(addr)
            if ip not in out:
                out.append(ip)
        if not out:
            raise ResolveError(f"{host} has no address")
        return out


class StaticResolver:
    """A fake resolver: `{name: [addr, ...]}`, or `{name: [[first answer], [second answer], ...]}` to play
    successive answers (DNS rebinding); the last answer repeats. Unknown names raise ResolveError.
    `calls` records every lookup."""

    def __init__(self, answers: Mapping[str, Sequence[str] | Sequence[Sequence[str]]]) -> None:
        self._answers: dict[str, list[list[str]]] = {}
        for name, value in answers.items():
            seq = list(value)
            if seq and not isinstance(seq[0], str):
                self._answers[name.lower()] = [list(v) for v in seq]
            else:
                self._answers[name.lower()] = [[str(v) for v in seq]]
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        with self._lock:
            self.calls.append(host)
            answers = self._answers.get(host.lower())
            if not answers:
                raise ResolveError(f"{host}: NXDOMAIN")
            current = answers.pop(0) if len(answers) > 1 else answers[0]
        if not current:
            raise ResolveError(f"{host}: SERVFAIL")
        return [ipaddress.ip_address(a) for a in current]
