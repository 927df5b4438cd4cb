"""The SSRF corpus against the pure URL / address policy (S1–S41 offline)."""

from __future__ import annotations

import ipaddress

import pytest

from aivedio_engine.config import ProviderSettings
from aivedio_engine.fetch.policy import (
    FetchPolicy,
    PolicyError,
    address_block_reason,
    check_address,
    check_url,
    parse_url,
    redact,
)

POLICY = FetchPolicy(allowed_hosts=("cdn.provider.example",))
ALLOWED = "video.cdn.provider.example"

# (case id, url, expected reason) — every entry must be BLOCKED with that reason.
BLOCKED_URLS = [
    ("S1", f"http://{ALLOWED}/o.mp4", "blocked_scheme"),
    ("S2", "file:///etc/passwd", "blocked_scheme"),
    ("S3", "gopher://127.0.0.1:6379/_FLUSHALL", "blocked_scheme"),
    ("S4-dict", "dict://127.0.0.1:11211/", "blocked_scheme"),
    ("S4-ftp", f"ftp://{ALLOWED}/o.mp4", "blocked_scheme"),
    ("S4-data", "data:video/mp4;base64,AAAA", "blocked_scheme"),
    ("S4-jar", "jar:https://x.example/a.jar!/", "blocked_scheme"),
    ("S4-netdoc", "netdoc:///etc/passwd", "blocked_scheme"),
    ("S4-none", "//video.cdn.provider.example/o.mp4", "blocked_scheme"),
    ("S5", f"https://{ALLOWED}:22/", "blocked_host"),
    ("S5-8443", f"https://{ALLOWED}:8443/", "blocked_host"),
    ("S5-badport", f"https://{ALLOWED}:44x/", "blocked_host"),
    ("S6", f"https://user:pass@{ALLOWED}/", "blocked_host"),
    ("S7", f"https://{ALLOWED}@evil.example/", "blocked_host"),
    ("S8", f"https://evil.example\\@{ALLOWED}/", "blocked_host"),
    ("S9", f"https://{ALLOWED}\\.evil.example/", "blocked_host"),
    ("S10", f"https://{ALLOWED}%2eevil.example/", "blocked_host"),
    ("S11", f"https://{ALLOWED}\t.evil.example/", "blocked_host"),
    ("S11-nl", f"https://{ALLOWED}\n.evil.example/", "blocked_host"),
    ("S11-space", f"https://{ALLOWED} .evil.example/", "blocked_host"),
    ("S12", f"https://{ALLOWED}.evil.example/", "blocked_host"),
    ("S13-prefix", "https://evilcdn.provider.example/", "blocked_host"),
    ("S13-suffix", "https://cdn.provider.example.attacker.example/", "blocked_host"),
    ("S13-parent", "https://provider.example/", "blocked_host"),
    ("S14", "https://v\u0456deo.cdn.prov\u0456der.example/", "blocked_host"),
    ("S14-fullwidth", "https://video.cdn.provider\uff0eexample.evil/", "blocked_host"),
    ("S16", "https://127.0.0.1/", "blocked_host"),
    ("S17", "https://2130706433/", "blocked_host"),
    ("S18-hex", "https://0x7f000001/", "blocked_host"),
    ("S18-hexshort", "https://0x7f.1/", "blocked_host"),
    ("S19-oct", "https://017700000001/", "blocked_host"),
    ("S19-octshort", "https://0177.1/", "blocked_host"),
    ("S20-short", "https://127.1/", "blocked_host"),
    ("S20-zeros", "https://127.000.000.001/", "blocked_host"),
    ("S21-zero", "https://0/", "blocked_host"),
    ("S21-any", "https://0.0.0.0/", "blocked_host"),
    ("S22-v6lo", "https://[::1]/", "blocked_host"),
    ("S22-v6any", "https://[::]/", "blocked_host"),
    ("S23-mapped", "https://[::ffff:127.0.0.1]/", "blocked_host"),
    ("S23-mappedhex", "https://[::ffff:7f00:1]/", "blocked_host"),
    ("S24", "https://[::127.0.0.1]/", "blocked_host"),
    ("S25", "https://[64:ff9b::a9fe:a9fe]/", "blocked_host"),
    ("S26", "https://[2002:a9fe:a9fe::1]/", "blocked_host"),
    ("S27", "https://[fe80::1%25eth0]/", "blocked_host"),
    ("S28", "https://[fd00:ec2::254]/", "blocked_host"),
    ("S29", "https://169.254.169.254/latest/meta-data/iam/security-credentials/", "blocked_host"),
    ("S30", "https://169.254.170.2/v2/credentials", "blocked_host"),
    ("S31", "https://100.100.100.200/latest/meta-data/", "blocked_host"),
    ("S32", "https://168.63.129.16/", "blocked_host"),
    ("S33-10", "https://10.0.0.1/", "blocked_host"),
    ("S34-mcast", "https://224.0.0.1/", "blocked_host"),
    ("S35-localhost", "https://localhost/", "blocked_host"),
    ("S35-gce", "https://metadata.google.internal/computeMetadata/v1/", "blocked_host"),
    ("S35-k8s", "https://kubernetes.default.svc/", "blocked_host"),
    ("S35-nip", "https://127.0.0.1.nip.io/", "blocked_host"),
    ("num-5parts", "https://1.2.3.4.5/", "blocked_host"),
    ("num-badoct", "https://08.1/", "blocked_host"),
    ("num-overflow", "https://256.1.1.1/", "blocked_host"),
    ("empty-host", "https:///o.mp4", "blocked_host"),
    ("bad-v6", "https://[::1/", "blocked_host"),
]


@pytest.mark.parametrize(("case", "url", "reason"), BLOCKED_URLS, ids=[c[0] for c in BLOCKED_URLS])
def test_corpus_url_is_blocked(case: str, url: str, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        check_url(url, POLICY)
    assert info.value.reason == reason, (case, str(info.value))


ALLOWED_URLS = [
    ("S15", "https://VIDEO.CDN.PROVIDER.EXAMPLE./o.mp4", "video.cdn.provider.example"),
    ("exact", "https://cdn.provider.example/o.mp4?X-Amz-Signature=abc", "cdn.provider.example"),
    ("deep", "https://a.b.cdn.provider.example/o.mp4", "a.b.cdn.provider.example"),
    ("port443", "https://video.cdn.provider.example:443/o.mp4", "video.cdn.provider.example"),
]


@pytest.mark.parametrize(("case", "url", "host"), ALLOWED_URLS, ids=[c[0] for c in ALLOWED_URLS])
def test_corpus_url_is_allowed(case: str, url: str, host: str) -> None:
    target = check_url(url, POLICY)
    assert target.host == host and target.port == 443 and target.scheme == "https"


# IP literals: decoded by value, then the address check (also what a resolver answer goes through).
BLOCKED_LITERALS = [
    ("S16", "https://127.0.0.1/", "127.0.0.1"),
    ("S17", "https://2130706433/", "127.0.0.1"),
    ("S18", "https://0x7f000001/", "127.0.0.1"),
    ("S18b", "https://0x7f.1/", "127.0.0.1"),
    ("S19", "https://017700000001/", "127.0.0.1"),
    ("S19b", "https://0177.1/", "127.0.0.1"),
    ("S20", "https://127.1/", "127.0.0.1"),
    ("S20b", "https://127.000.000.001/", "127.0.0.1"),
    ("S21", "https://0/", "0.0.0.0"),
    ("S23", "https://[::ffff:7f00:1]/", "::ffff:7f00:1"),
    ("S27", "https://[fe80::1%25eth0]/", "fe80::1"),
]


@pytest.mark.parametrize(("case", "url", "ip"), BLOCKED_LITERALS, ids=[c[0] for c in BLOCKED_LITERALS])
def test_ip_literal_encodings_normalize(case: str, url: str, ip: str) -> None:
    target = parse_url(url)
    assert target.ip == ipaddress.ip_address(ip)
    assert address_block_reason(target.ip) is not None


BLOCKED_ADDRESSES = [
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",
    "0.1.2.3",
    "::1",
    "::",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::1",
    "2002:a9fe:a9fe::1",
    "2002:5db8:d822::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "fe80::1",
    "fd00:ec2::254",
    "fc00::1",
    "169.254.169.254",
    "169.254.170.2",
    "169.254.0.1",
    "100.100.100.200",
    "100.64.0.1",
    "100.127.255.254",
    "168.63.129.16",
    "10.0.0.1",
    "10.0.0.5",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "198.18.0.1",
    "192.0.0.192",
    "192.0.2.1",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "ff02::1",
]


@pytest.mark.parametrize("addr", BLOCKED_ADDRESSES)
def test_address_blocked(addr: str) -> None:
    ip = ipaddress.ip_address(addr)
    assert address_block_reason(ip) is not None
    with pytest.raises(PolicyError) as info:
        check_address(ip, POLICY, ALLOWED)
    assert info.value.reason == "blocked_address"


@pytest.mark.parametrize("addr", ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "100.128.0.1"])
def test_public_address_allowed(addr: str) -> None:
    check_address(ipaddress.ip_address(addr), POLICY, ALLOWED)


def test_public_ip_literal_needs_allow_list() -> None:
    with pytest.raises(PolicyError) as info:
        check_url("https://93.184.216.34/o.mp4", POLICY)
    assert info.value.reason == "blocked_host"
    target = check_url("https://93.184.216.34/o.mp4", FetchPolicy(allowed_hosts=("93.184.216.34",)))
    assert str(target.ip) == "93.184.216.34"


def test_ip_literal_on_allow_list_still_address_checked() -> None:
    with pytest.raises(PolicyError) as info:
        check_url("https://0x7f.1/", FetchPolicy(allowed_hosts=("127.0.0.1",)))
    assert info.value.reason == "blocked_address"


# Local / sim provider: http and loopback only for its own origin.
SIM = ProviderSettings(
    adapter="sim", base_url="http://127.0.0.1:8765", allow_http_origin=True, output_hosts=["cdn.provider.example"]
)


def test_sim_origin_allows_http_and_loopback() -> None:
    policy = FetchPolicy.for_provider(SIM)
    target = check_url("http://127.0.0.1:8765/outputs/o.mp4?sig=1", policy)
    assert target.port == 8765 and str(target.ip) == "127.0.0.1"
    check_address(ipaddress.ip_address("127.0.0.1"), policy, "127.0.0.1")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8766/o.mp4", "blocked_host"),  # other port on the origin
        ("http://127.0.0.2:8765/o.mp4", "blocked_scheme"),  # other loopback host
        ("http://cdn.provider.example/o.mp4", "blocked_scheme"),  # http for a non-origin host
        ("http://localhost:8765/o.mp4", "blocked_scheme"),  # another name for the origin is not the origin
        ("https://127.0.0.1/o.mp4", "blocked_host"),  # https on the loopback origin's host, but not its port
        ("https://127.0.0.1:443/o.mp4", "blocked_host"),
    ],
)
def test_sim_origin_is_narrow(url: str, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        check_url(url, FetchPolicy.for_provider(SIM))
    assert info.value.reason == reason, str(info.value)


def test_origin_match_is_by_normalized_address() -> None:
    target = check_url("http://127.1:8765/o.mp4", FetchPolicy.for_provider(SIM))
    assert target.host == "127.0.0.1"


def test_loopback_not_allowed_for_non_origin_host_even_with_sim_policy() -> None:
    policy = FetchPolicy.for_provider(SIM)
    with pytest.raises(PolicyError) as info:
        check_address(ipaddress.ip_address("127.0.0.1"), policy, "video.cdn.provider.example")
    assert info.value.reason == "blocked_address"
    with pytest.raises(PolicyError):  # private addresses are never allowed, not even for the origin
        check_address(ipaddress.ip_address("10.0.0.1"), policy, "127.0.0.1")


def test_production_provider_policy_has_no_loopback_allowance() -> None:
    policy = FetchPolicy.for_provider(
        ProviderSettings(adapter="runway", base_url="https://api.runway.example", output_hosts=["cdn.runway.example"])
    )
    assert not policy.allow_http_origin and not policy.allow_loopback_origin
    with pytest.raises(PolicyError):
        check_url("http://api.runway.example/o.mp4", policy)


def test_redact_drops_query_fragment_and_userinfo() -> None:
    assert redact("https://u:p@cdn.example/o.mp4?X-Amz-Signature=SECRET#f") == "https://cdn.example/o.mp4"
    assert "SECRET" not in redact("https://cdn.example/?sig=SECRET")


def test_error_messages_never_contain_query() -> None:
    for url in ("https://evil.example/o.mp4?sig=SECRET", "http://cdn.provider.example/o.mp4?sig=SECRET"):
        with pytest.raises(PolicyError) as info:
            check_url(url, POLICY)
        assert "SECRET" not in str(info.value)
