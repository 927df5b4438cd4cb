"""Pure URL and address policy of the SSRF-safe output fetcher.

No I/O here: parsing, host allow-list matching and the address check. The fetcher resolves names itself and
feeds every resolved address to `check_address`; IP literals are parsed here (decimal, octal, hex and short
forms like `127.1`, bracketed IPv6 with zone ids) so they are checked by value, never by string.

The URL is parsed once, here, and the fetcher sends exactly the URL rebuilt from the parsed parts
(`Target.url`), so no parser differential between the check and the request is possible.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from aivedio_engine.config import ProviderSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: reason codes carried by `FetchError.reason` (and `PolicyError.reason`).
BLOCKED_SCHEME = "blocked_scheme"
BLOCKED_HOST = "blocked_host"
BLOCKED_ADDRESS = "blocked_address"


class PolicyError(Exception):
    """A URL or an address is refused. The message never contains the query string."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def redact(url: str) -> str:
    """`url` without userinfo, query string and fragment: safe for logs and error messages."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "<unparseable url>"


_DEFAULT_PORTS = {"https": 443, "http": 80}
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NUMERIC_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_FORBIDDEN_HOST_CHARS = set("\\%@/?#[]<>^`{|}\"' ")

#: explicit denials on top of the range checks (cloud metadata / platform endpoints).
_DENY_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.169.254/32",  # AWS / GCP / Azure / DO metadata
        "169.254.170.2/32",  # ECS task credentials
        "100.100.100.200/32",  # Alibaba metadata
        "168.63.129.16/32",  # Azure wireserver (is_global is True)
        "fd00:ec2::254/128",  # AWS IMDS over IPv6
        "64:ff9b::/96",  # NAT64 well-known prefix
        "64:ff9b:1::/48",  # NAT64 local-use prefix
        "2002::/16",  # 6to4
        "2001::/32",  # Teredo
        "::/96",  # IPv4-compatible (deprecated); is_global is True for ::127.0.0.1
        "::ffff:0:0/96",  # IPv4-mapped
        "100.64.0.0/10",  # CGNAT (is_private misses it)
        "0.0.0.0/8",  # "this network": connect() to 0.0.0.0 reaches loopback listeners
        "192.0.0.0/24",  # IETF protocol assignments (192.0.0.192: Oracle Cloud metadata)
    )
)


@dataclass(frozen=True, slots=True)
class Target:
    """A validated URL: the parts the fetcher connects with."""

    scheme: str
    host: str  # normalized: lower case, no trailing dot, A-label; IPv6 without brackets or zone
    port: int
    path: str  # path + "?" + query, as sent in the request line (never logged: see `redacted`)
    ip: IPAddress | None  # set when the host is an IP literal

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.host
        default = _DEFAULT_PORTS[self.scheme] == self.port
        return f"{self.scheme}://{host}{'' if default else f':{self.port}'}{self.path}"

    @property
    def redacted(self) -> str:
        return redact(self.url)


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """Where one provider's outputs may be fetched from.

    `allowed_hosts` match on a label boundary: `cdn.vendor.com` allows `cdn.vendor.com` and `a.cdn.vendor.com`,
    never `evilcdn.vendor.com` nor `cdn.vendor.com.evil.org`. An `origin` (the provider's base URL) is allowed
    too; plain http and the origin's own port only for it, and only when `allow_http_origin`. Loopback
    addresses are allowed only when `allow_loopback_origin` and only for the origin's host (local and sim).
    """

    allowed_hosts: tuple[str, ...] = ()
    origin_scheme: str = ""
    origin_host: str = ""
    origin_port: int = 0
    allow_http_origin: bool = False
    allow_loopback_origin: bool = False
    _normalized: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts = tuple(h.lower().rstrip(".") for h in self.allowed_hosts if h.strip(". "))
        object.__setattr__(self, "_normalized", hosts)

    @classmethod
    def for_provider(cls, provider: ProviderSettings) -> FetchPolicy:
        scheme = host = ""
        port = 0
        if provider.base_url:
            origin = parse_url(provider.base_url, require_path=False)
            scheme, host, port = origin.scheme, origin.host, origin.port
        return cls(
            allowed_hosts=tuple(provider.output_hosts),
            origin_scheme=scheme,
            origin_host=host,
            origin_port=port,
            allow_http_origin=provider.allow_http_origin,
            allow_loopback_origin=provider.allow_http_origin and bool(host),
        )

    def is_origin(self, host: str) -> bool:
        return bool(self.origin_host) and host == self.origin_host

    def host_allowed(self, host: str) -> bool:
        if self.is_origin(host):
            return True
        return any(host == h or host.endswith("." + h) for h in self._normalized)


def _parse_ipv4_legacy(host: str) -> ipaddress.IPv4Address | None:
    """inet_aton-style forms: `2130706433`, `0x7f000001`, `0x7f.1`, `0177.1`, `127.1`, `127.000.000.001`.

    Returns None when `host` is not numeric-looking; raises PolicyError when it looks numeric but is invalid
    (an ambiguous host is refused rather than handed to a resolver that may read it differently).
    """
    parts = host.split(".")
    if not all(_NUMERIC_PART.match(p) for p in parts) or not 1 <= len(parts) <= 4:
        if parts and _NUMERIC_PART.match(parts[-1]):
            # a name whose last label is numeric is an IPv4 literal in WHATWG terms: refuse it
            raise PolicyError(BLOCKED_HOST, f"ambiguous numeric host {host!r}")
        return None
    values: list[int] = []
    for p in parts:
        try:
            if p.startswith("0x"):
                values.append(int(p[2:] or "0", 16))
            elif len(p) > 1 and p.startswith("0"):
                values.append(int(p, 8))
            else:
                values.append(int(p, 10))
        except ValueError:
            raise PolicyError(BLOCKED_HOST, f"invalid numeric host {host!r}") from None
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise PolicyError(BLOCKED_HOST, f"invalid numeric host {host!r}")
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _normalize_host(raw: str) -> tuple[str, IPAddress | None]:
    if not raw:
        raise PolicyError(BLOCKED_HOST, "empty host")
    if raw.startswith("["):
        if not raw.endswith("]"):
            raise PolicyError(BLOCKED_HOST, "malformed IPv6 literal")
        inner = raw[1:-1]
        inner = inner.split("%", 1)[0]  # zone id ("%25eth0"): dropped, the address itself is checked
        try:
            ip6 = ipaddress.IPv6Address(inner)
        except ValueError:
            raise PolicyError(BLOCKED_HOST, "malformed IPv6 literal") from None
        return str(ip6), ip6
    if any(c in _FORBIDDEN_HOST_CHARS or ord(c) < 0x21 or ord(c) == 0x7F for c in raw):
        raise PolicyError(BLOCKED_HOST, "forbidden character in host")
    host = raw.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise PolicyError(BLOCKED_HOST, "host is not a valid IDNA name") from None
    ip4 = _parse_ipv4_legacy(host)
    if ip4 is not None:
        return str(ip4), ip4
    labels = host.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise PolicyError(BLOCKED_HOST, "host is not a valid DNS name")
    return host, None


def parse_url(url: str, *, require_path: bool = True) -> Target:
    """Parse `url` strictly (no policy yet): scheme, host, port and path; refuses userinfo and odd syntax."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise PolicyError(BLOCKED_HOST, "control character or whitespace in URL")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise PolicyError(BLOCKED_HOST, "unparseable URL") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise PolicyError(BLOCKED_SCHEME, f"scheme {scheme or '(none)'!r} is not allowed")
    netloc = parts.netloc
    if not netloc:
        raise PolicyError(BLOCKED_HOST, "URL has no host")
    if "@" in netloc:
        raise PolicyError(BLOCKED_HOST, "userinfo in URL is not allowed")
    if "\\" in netloc:
        raise PolicyError(BLOCKED_HOST, "backslash in host")
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise PolicyError(BLOCKED_HOST, "malformed IPv6 literal")
        raw_host, rest = netloc[: end + 1], netloc[end + 1 :]
        if rest and not rest.startswith(":"):
            raise PolicyError(BLOCKED_HOST, "malformed authority")
        raw_port = rest[1:] if rest else None
    else:
        raw_host, sep, raw_port_s = netloc.partition(":")
        raw_port = raw_port_s if sep else None
    if raw_port is None or raw_port == "":
        port = _DEFAULT_PORTS[scheme]
    elif raw_port.isascii() and raw_port.isdigit() and 0 < int(raw_port) < 65536:
        port = int(raw_port)
    else:
        raise PolicyError(BLOCKED_HOST, "invalid port")
    host, ip = _normalize_host(raw_host)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme=scheme, host=host, port=port, path=path, ip=ip)


def check_url(url: str, policy: FetchPolicy) -> Target:
    """Parse and validate `url` against `policy` (scheme, userinfo, port, host allow-list, IP literal)."""
    target = parse_url(url)
    origin = policy.is_origin(target.host)
    if target.scheme == "http" and not (policy.allow_http_origin and origin):
        raise PolicyError(BLOCKED_SCHEME, f"plain http is not allowed for {target.redacted}")
    if not policy.host_allowed(target.host):
        raise PolicyError(BLOCKED_HOST, f"host not on the allow-list: {target.redacted}")
    if target.port != 443 and not (origin and target.port == policy.origin_port):
        raise PolicyError(BLOCKED_HOST, f"port {target.port} is not allowed: {target.redacted}")
    if origin and policy.allow_loopback_origin and target.port != policy.origin_port:
        # a loopback origin (local, sim) is one service on one port, not every service on the machine
        raise PolicyError(BLOCKED_HOST, f"port {target.port} is not the origin's port: {target.redacted}")
    if target.ip is not None:
        check_address(target.ip, policy, target.host)
    return target


def address_block_reason(ip: IPAddress) -> str | None:
    """Why `ip` may not be connected to, or None when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return "IPv4-mapped IPv6 address"
        if ip.sixtofour is not None:
            return "6to4 address"
        if ip.teredo is not None:
            return "Teredo address"
    for net in _DENY_NETWORKS:
        if ip.version == net.version and ip in net:
            return f"address in denied range {net}"
    if ip.is_unspecified:
        return "unspecified address"
    if ip.is_loopback:
        return "loopback address"
    if ip.is_multicast:
        return "multicast address"
    if ip.is_link_local:
        return "link-local address"
    if ip.is_private:
        return "private address"
    if ip.is_reserved:
        return "reserved address"
    if not ip.is_global:
        return "not a globally routable address"
    return None


def private_network_block_reason(ip: IPAddress) -> str | None:
    """Like `address_block_reason`, for senders that may reach private networks (client webhooks with
    `allow_private_networks`): loopback, private and link-local addresses pass; the denied ranges (cloud
    metadata and credentials endpoints, NAT64, 0.0.0.0/8 ...) and non-unicast addresses still do not."""
    reason = address_block_reason(ip)
    if reason is None or ip.is_loopback:  # ::1 sits inside the denied ::/96, but it is only loopback
        return None
    if any(ip.version == net.version and ip in net for net in _DENY_NETWORKS):
        return reason
    if ip.is_loopback or ip.is_private or ip.is_link_local:
        return None
    return reason


def check_address(ip: IPAddress, policy: FetchPolicy, host: str) -> None:
    """Refuse `ip` (a resolved address of `host`) unless it is public, or loopback for an allowed loopback origin."""
    reason = address_block_reason(ip)
    if reason is None:
        return
    if ip.is_loopback and policy.allow_loopback_origin and policy.is_origin(host):
        return
    raise PolicyError(BLOCKED_ADDRESS, f"{host} resolves to a blocked address ({reason})")
