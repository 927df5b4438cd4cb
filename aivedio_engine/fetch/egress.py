"""Outbound POSTs to URLs a client chose (client webhooks), under the fetcher's SSRF rules.

The URL is parsed strictly by `policy.parse_url` (no userinfo, numeric-host tricks checked by value), the name
is resolved once with the injected resolver, the host is refused if ANY answer is a blocked address, and the
request goes to the validated address itself (`httpclient.open_pinned`: no second lookup, no redirects, no
proxy). Unlike the output fetcher there is no host allow-list, since a client names its own receiver, and any
port is allowed; what protects us is the address check. Private networks are reachable only when the operator
says so (`client_webhooks.allow_private_networks`), and the cloud metadata ranges never are.

One attempt has one wall-clock budget, `timeout_s`: connect, send and the wait for the answer each get what is
left of it, and the answer's body is read only up to `max_response_bytes`.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass

from aivedio_engine import httpclient
from aivedio_engine.fetch.policy import (
    BLOCKED_ADDRESS,
    IPAddress,
    PolicyError,
    Target,
    address_block_reason,
    parse_url,
    private_network_block_reason,
)
from aivedio_engine.fetch.resolver import ResolveError, Resolver

USER_AGENT = "aivedio-webhooks/1"
_CHUNK = 16 * 1024


class EgressError(Exception):
    """reason: blocked_scheme, blocked_host, blocked_address, resolve_failed, timeout, connect_failed. The
    message never contains the query string."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason

    @property
    def permanent(self) -> bool:
        """A refused URL stays refused: retrying only burns the budget."""
        return self.reason.startswith("blocked_")


@dataclass(frozen=True, slots=True)
class EgressResponse:
    status: int
    #: at most `max_response_bytes` of the answer
    body: bytes
    peer_ip: IPAddress


def check_destination(url: str, *, allow_private: bool) -> Target:
    """Validate a URL a client wants messages sent to (at registration and before every attempt): scheme, syntax,
    and an IP literal's address. Names are checked when resolved. Raises PolicyError."""
    target = parse_url(url)
    if target.ip is not None:
        _check_ip(target.ip, target.host, allow_private)
    return target


def _check_ip(ip: IPAddress, host: str, allow_private: bool) -> None:
    reason = private_network_block_reason(ip) if allow_private else address_block_reason(ip)
    if reason is not None:
        hint = "" if allow_private else " (client_webhooks.allow_private_networks is off)"
        raise PolicyError(BLOCKED_ADDRESS, f"{host} is a blocked address: {reason}{hint}")


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    resolver: Resolver,
    allow_private: bool,
    connect_timeout_s: float,
    timeout_s: float,
    max_response_bytes: int,
    verify: bool | str = True,
) -> EgressResponse:
    """POST `body` to `url` once. Any HTTP answer is returned (the caller judges the status); everything else is
    an EgressError."""
    started = time.monotonic()
    try:
        target = check_destination(url, allow_private=allow_private)
        if target.ip is not None:
            ip: IPAddress = target.ip
        else:
            answers = resolver.resolve(target.host, target.port)
            for answer in answers:  # one bad answer refuses the host: the next lookup may return just that one
                _check_ip(answer, target.host, allow_private)
            ip = answers[0]
    except PolicyError as exc:
        raise EgressError(exc.reason, str(exc)) from None
    except ResolveError as exc:
        raise EgressError("resolve_failed", str(exc)) from None

    def left() -> float:
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            raise EgressError("timeout", f"no answer within {timeout_s:g}s from {target.redacted}")
        return remaining

    ip_host = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.ip is None else ip_host
    if target.port != default_port:
        host_header += f":{target.port}"
    try:
        response = httpclient.open_pinned(
            f"{target.scheme}://{ip_host}:{target.port}{target.path}",
            ip,
            headers={
                **headers,
                "Host": host_header,
                "User-Agent": USER_AGENT,
                "Content-Type": "application/json",
                "Accept-Encoding": "identity",
            },
            sni_hostname=target.host if target.scheme == "https" and target.ip is None else None,
            connect_timeout_s=min(connect_timeout_s, left()),
            idle_timeout_s=left(),
            verify=verify,
            method="POST",
            content=body,
        )
    except httpclient.PinnedTimeout:
        raise EgressError("timeout", f"no answer within {timeout_s:g}s from {target.redacted}") from None
    except httpclient.PinnedFailure as exc:
        raise EgressError("connect_failed", f"{target.redacted}: {exc}") from None
    try:
        kept = bytearray()
        if max_response_bytes > 0:
            for chunk in response.iter_raw(_CHUNK):
                kept += chunk[: max_response_bytes - len(kept)]
                if len(kept) >= max_response_bytes or time.monotonic() - started > timeout_s:
                    break  # the status is what counts; the rest of the answer is not worth waiting for
    except (httpclient.PinnedTimeout, httpclient.PinnedFailure):
        pass  # the status line arrived: the receiver's verdict stands even if its body does not
    finally:
        response.close()
    return EgressResponse(response.status, bytes(kept), ip)
