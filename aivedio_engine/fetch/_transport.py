"""The output fetcher's pinned HTTP transport: the ONLY fetcher module that imports httpx.

(`aivedio_engine/httpclient.py` is the project's general HTTP module; this second one exists because the
fetcher needs a connection pinned to a pre-validated IP address, which the general client does not offer.)

The request goes to `scheme://<validated ip>:<port>/path` while the `Host` header and the TLS SNI / certificate
check use the original host name (httpcore's `sni_hostname` request extension). No DNS lookup happens here, so
a DNS-rebinding answer can never be used. No redirects are followed, no proxy or environment settings are used,
`Accept-Encoding: identity` is sent and the body is read raw (never decoded).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Iterator

import httpx

from aivedio_engine.fetch.policy import IPAddress, Target

USER_AGENT = "aivedio-fetcher/1"


class TransportTimeout(Exception):
    """Connect or idle-read timeout."""


class TransportFailure(Exception):
    """Any other failure below HTTP (refused, reset, TLS). The message never contains the URL."""


class PinnedResponse:
    def __init__(self, client: httpx.Client, response: httpx.Response, peer_ip: IPAddress) -> None:
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
            raise TransportTimeout("idle read timeout") from None
        except httpx.HTTPError as exc:
            raise TransportFailure(f"read failed: {type(exc).__name__}") from None

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            self._client.close()


def open_pinned(
    target: Target, ip: IPAddress, *, connect_timeout_s: float, idle_timeout_s: float, verify: bool | str = True
) -> PinnedResponse:
    """Send `GET target` to `ip` and return once the response headers are in (the body is not read yet)."""
    ip_host = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    url = f"{target.scheme}://{ip_host}:{target.port}{target.path}"
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.ip is None else ip_host
    if target.port != default_port:
        host_header += f":{target.port}"
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
    extensions = {"sni_hostname": target.host} if target.scheme == "https" and target.ip is None else {}
    try:
        request = client.build_request(
            "GET",
            url,
            headers={"Host": host_header, "Accept-Encoding": "identity", "User-Agent": USER_AGENT},
            extensions=extensions,
        )
        response = client.send(request, stream=True)
    except httpx.TimeoutException:
        client.close()
        raise TransportTimeout("connect or response timeout") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        client.close()
        raise TransportFailure(f"request failed: {type(exc).__name__}") from None
    return PinnedResponse(client, response, ip)
