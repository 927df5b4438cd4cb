"""The one module that imports httpx (so it can be swapped for httpx2 or another client in one place).

It answers the question paid calls hinge on: did the request possibly reach the server? `SentUnknown` means
the body may have left the process (read timeout, reset after write): the caller must treat the outcome as
ambiguous. `NotSent` means it certainly did not (DNS, connection refused, connect timeout, pool exhausted).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx


class TransportError(Exception):
    """Base for failures below HTTP."""


class NotSent(TransportError):
    """The request never reached the server: safe to retry."""


class SentUnknown(TransportError):
    """The request may have been received: the outcome is unknown."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        import json

        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    read: float = 30.0
    write: float = 30.0
    pool: float = 5.0


class HttpClient:
    """A small synchronous client: one connection pool, explicit timeouts, classified transport errors."""

    def __init__(self, base_url: str = "", timeouts: Timeouts | None = None, headers: Mapping[str, str] | None = None,
                 transport: Any = None) -> None:
        t = timeouts or Timeouts()
        self._client = httpx.Client(
            base_url=base_url,
            timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            headers=dict(headers or {}),
            follow_redirects=False,
            transport=transport,
        )

    def request(self, method: str, url: str, *, json: Any = None, content: bytes | Iterable[bytes] | None = None,
                headers: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None,
                timeout: float | None = None, data: Mapping[str, str] | None = None,
                files: Mapping[str, Any] | None = None) -> Response:
        """`content` may be an iterable of chunks (streamed); `data` + `files` make a multipart form."""
        try:
            r = self._client.request(method, url, json=json, content=content, data=data, files=files,
                                     headers=dict(headers or {}), params=params,
                                     timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol,
                httpx.LocalProtocolError) as exc:
            raise NotSent(_describe(exc)) from None
        except httpx.TransportError as exc:  # read/write timeouts, resets, remote protocol errors
            raise SentUnknown(_describe(exc)) from None
        return Response(r.status_code, dict(r.headers), r.content)

    @contextmanager
    def stream(self, method: str, url: str, *, headers: Mapping[str, str] | None = None) -> Iterator[Any]:
        try:
            with self._client.stream(method, url, headers=dict(headers or {})) as r:
                yield r
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise NotSent(_describe(exc)) from None
        except httpx.TransportError as exc:
            raise SentUnknown(_describe(exc)) from None

    def close(self) -> None:
        self._client.close()


def _describe(exc: Exception) -> str:
    # never the URL: signed query strings must not reach logs
    return type(exc).__name__
