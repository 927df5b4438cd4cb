"""The one module that imports httpx (so it can be swapped for httpx2 or another client in one place).

`HttpClient` answers the question paid calls hinge on: did the request possibly reach the server?
`SentUnknown` means the body may have left the process (read timeout, reset after write): the caller must
treat the outcome as ambiguous. `NotSent` means it certainly did not (DNS, connection refused, connect
timeout, pool exhausted).

`open_pinned` serves the SSRF-safe output fetcher (`aivedio_engine.fetch`), which must connect to an address
it has already validated: the URL names that IP, while the `Host` header and the TLS SNI / certificate check
use the original host name (httpcore's `sni_hostname` request extension). No DNS lookup happens, so a
DNS-rebinding answer can never be used; no redirects are followed and no proxy or environment settings apply.
It lives here, not in the fetcher, so that httpx stays behind this one module.
"""

from __future__ import annotations

import ipaddress
import ssl
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

    @property
    def total(self) -> float:
        """A request's longest life: waiting for a pooled connection, connecting, writing, reading the answer."""
        return self.pool + self.connect + self.write + self.read


class HttpClient:
    """A small synchronous client: one connection pool, explicit timeouts, classified transport errors."""

    def __init__(
        self,
        base_url: str = "",
        timeouts: Timeouts | None = None,
        headers: Mapping[str, str] | None = None,
        transport: Any = None,
    ) -> None:
        t = timeouts or Timeouts()
        self._client = httpx.Client(
            base_url=base_url,
            timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
            headers=dict(headers or {}),
            follow_redirects=False,
            transport=transport,
        )

    def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        data: Mapping[str, str] | None = None,
        files: Mapping[str, Any] | None = None,
    ) -> Response:
        """`content` may be an iterable of chunks (streamed); `data` + `files` make a multipart form."""
        try:
            r = self._client.request(
                method,
                url,
                json=json,
                content=content,
                data=data,
                files=files,
                headers=dict(headers or {}),
                params=params,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except (
            httpx.ConnectError,
            httpx.ConnectTimeout,
            httpx.PoolTimeout,
            httpx.UnsupportedProtocol,
            httpx.LocalProtocolError,
        ) as exc:
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


# --- pinned single GETs (the output fetcher) ---------------------------------------------------------------


class PinnedTimeout(Exception):
    """Connect or idle-read timeout."""


class PinnedFailure(Exception):
    """Any other failure below HTTP (refused, reset, TLS). The message never contains the URL."""


class PinnedResponse:
    def __init__(
        self, client: httpx.Client, response: httpx.Response, peer_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> None:
        self._client = client
        self._response = response
        self.status = response.status_code
        self.peer_ip = peer_ip

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    def iter_raw(self, chunk_size: int) -> Iterator[bytes]:
        """Raw body bytes as they arrive from the socket (not batched up), each piece at most `chunk_size`."""
        try:
            for data in self._response.iter_raw():
                for start in range(0, len(data), chunk_size):
                    yield data[start : start + chunk_size]
        except httpx.TimeoutException:
            raise PinnedTimeout("idle read timeout") from None
        except httpx.HTTPError as exc:
            raise PinnedFailure(f"read failed: {type(exc).__name__}") from None

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            self._client.close()


def open_pinned(
    url: str,
    peer_ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
    *,
    headers: Mapping[str, str],
    sni_hostname: str | None,
    connect_timeout_s: float,
    idle_timeout_s: float,
    verify: bool | str = True,
    method: str = "GET",
    content: bytes | None = None,
) -> PinnedResponse:
    """Send `method url` (`GET` unless told; `content` is the body), whose host is the literal `peer_ip`, and
    return once the response headers are in (the body is not read yet). `sni_hostname` is the name TLS checks
    the certificate for; `verify` may be a CA bundle path.
    """
    timeout = httpx.Timeout(
        connect=connect_timeout_s, read=idle_timeout_s, write=idle_timeout_s, pool=connect_timeout_s
    )
    # a CA bundle path (tests, private CDNs) becomes a context: httpx deprecated verify=<path>
    tls: bool | ssl.SSLContext = ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    client = httpx.Client(
        transport=httpx.HTTPTransport(verify=tls, retries=0, trust_env=False),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
    )
    extensions = {"sni_hostname": sni_hostname} if sni_hostname is not None else {}
    try:
        request = client.build_request(method, url, headers=dict(headers), content=content, extensions=extensions)
        response = client.send(request, stream=True)
    except httpx.TimeoutException:
        client.close()
        raise PinnedTimeout("connect or response timeout") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        client.close()
        raise PinnedFailure(f"request failed: {type(exc).__name__}") from None
    return PinnedResponse(client, response, peer_ip)
