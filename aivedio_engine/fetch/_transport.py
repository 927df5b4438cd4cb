"""Why the fetcher's requests are pinned: a host name is resolved and validated once, and the connection must go
to that very address, or a DNS-rebinding answer could slip in between the check and the connect.

This module maps a validated `Target` and its address onto `httpclient.open_pinned` (httpx stays behind that one
module): the URL names the IP, while the `Host` header, and for https to a named host the TLS SNI / certificate
check, keep the original name. `Accept-Encoding: identity` because the fetcher caps and stores the raw body,
never a decoded one.
"""

from __future__ import annotations

import ipaddress

from aivedio_engine import httpclient
from aivedio_engine.fetch.policy import IPAddress, Target

USER_AGENT = "aivedio-fetcher/1"


def open_pinned(
    target: Target, ip: IPAddress, *, connect_timeout_s: float, idle_timeout_s: float, verify: bool | str = True
) -> httpclient.PinnedResponse:
    """Send `GET target` to `ip` and return once the response headers are in (the body is not read yet).

    Raises `httpclient.PinnedTimeout` or `httpclient.PinnedFailure`."""
    ip_host = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    url = f"{target.scheme}://{ip_host}:{target.port}{target.path}"
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.ip is None else ip_host
    if target.port != default_port:
        host_header += f":{target.port}"
    return httpclient.open_pinned(
        url,
        ip,
        headers={"Host": host_header, "Accept-Encoding": "identity", "User-Agent": USER_AGENT},
        sni_hostname=target.host if target.scheme == "https" and target.ip is None else None,
        connect_timeout_s=connect_timeout_s,
        idle_timeout_s=idle_timeout_s,
        verify=verify,
    )
