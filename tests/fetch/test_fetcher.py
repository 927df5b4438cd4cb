"""The SSRF-safe fetcher against real loopback HTTP servers (stdlib http.server in a thread), with an injected
resolver so public-looking names can point at 127.0.0.1 (S35–S50).

Where the rest of the corpus lives: S1–S34 as URL/address cases in tests/unit/test_fetch_policy.py; S40 (a CNAME
chain ending in an internal name) is S36 here, since the resolver returns the chain's final addresses and every
one is checked; S46 `test_more_than_three_redirects_is_blocked` (incl. the loop); S47 refresh; S48 the two
oversize tests; S49 gzip; S51 (an HLS playlist served as the output) is stored as bytes only and refused by the
media gate (tests/media/test_probe.py, tests/flow/test_media_pipeline.py); S52 in test_fetcher_tls.py."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aivedio_engine.clock import SystemClock
from aivedio_engine.config import FetchSettings
from aivedio_engine.fetch import CHUNK_SIZE, Fetcher, FetchError, FetchPolicy, StaticResolver
from aivedio_engine.storage.fs import FsStore

SIM = "sim.provider.example"
BODY = os.urandom(200_000)

Route = Callable[[BaseHTTPRequestHandler], None]


class Server:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                route = server.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _ok(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "video/mp4")
    h.send_header("Content-Length", str(len(BODY)))
    h.end_headers()
    h.wfile.write(BODY)


def _redirect(location: str) -> Route:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return route


def _huge_length(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "53687091200")
    h.end_headers()
    h.wfile.write(b"x" * 1000)


def _endless(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)  # HTTP/1.0, no Content-Length: body delimited by close
    h.end_headers()
    block = b"y" * 16384
    for _ in range(10_000):
        h.wfile.write(block)


def _slow(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.end_headers()
    for _ in range(200):
        h.wfile.write(b"z" * 50)
        h.wfile.flush()
        time.sleep(0.02)


def _stall(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "100")
    h.end_headers()
    h.wfile.write(b"a" * 10)
    h.wfile.flush()
    time.sleep(3)


def _gzip(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Encoding", "gzip")
    h.send_header("Content-Length", "4")
    h.end_headers()
    h.wfile.write(b"\x1f\x8b\x08\x00")


def _refresh(h: BaseHTTPRequestHandler) -> None:
    body = b'<meta http-equiv="refresh" content="0;url=https://169.254.169.254/">'
    h.send_response(200)
    h.send_header("Refresh", "0; url=https://169.254.169.254/")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.routes.update(
        {
            "/ok": _ok,
            "/huge": _huge_length,
            "/endless": _endless,
            "/slow": _slow,
            "/stall": _stall,
            "/gzip": _gzip,
            "/refresh": _refresh,
        }
    )
    for k in range(6):
        s.routes[f"/r/{k}"] = _redirect(f"/r/{k - 1}") if k else _ok
    s.routes["/loop"] = _redirect("/loop")
    yield s
    s.close()


def settings(**kw: float) -> FetchSettings:
    base = {"connect_timeout_s": 2, "idle_timeout_s": 2, "total_timeout_s": 20, "min_bytes_per_s": 0}
    base.update(kw)
    return FetchSettings(**base)


def policy(port: int, *, loopback: bool = True) -> FetchPolicy:
    return FetchPolicy(
        allowed_hosts=("cdn.provider.example",),
        origin_scheme="http",
        origin_host=SIM,
        origin_port=port,
        allow_http_origin=True,
        allow_loopback_origin=loopback,
    )


def resolver(**extra: object) -> StaticResolver:
    answers: dict[str, object] = {SIM: ["127.0.0.1"], "cdn.provider.example": ["10.0.0.5"]}
    answers.update({k.replace("_", "."): v for k, v in extra.items()})
    return StaticResolver(answers)  # type: ignore[arg-type]


def fetch_all(fetcher: Fetcher, url: str, pol: FetchPolicy) -> bytes:
    with fetcher.open(url, pol) as download:
        return b"".join(download.chunks())


def url(server: Server, path: str) -> str:
    return f"http://{SIM}:{server.port}{path}"


def test_200_streams_the_right_bytes_in_chunks(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with fetcher.open(url(server, "/ok?X-Amz-Signature=SECRET"), policy(server.port)) as download:
        assert download.status == 200 and download.content_type == "video/mp4"
        assert download.content_length == len(BODY)
        chunks = list(download.chunks())
    assert len(chunks) > 1 and all(len(c) <= CHUNK_SIZE for c in chunks)
    assert b"".join(chunks) == BODY
    assert download.bytes_read == len(BODY) and str(download.peer_ip) == "127.0.0.1"
    assert "SECRET" not in download.url
    path, headers = server.requests[-1]
    assert path == "/ok?X-Amz-Signature=SECRET"
    assert headers["host"] == f"{SIM}:{server.port}"  # connected to the pinned IP, Host kept
    assert headers["accept-encoding"] == "identity"


def test_public_name_resolving_to_loopback_is_blocked_without_loopback_origin(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/ok"), policy(server.port, loopback=False))
    assert info.value.reason == "blocked_address"
    assert server.requests == []  # no connection was made


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        (["10.0.0.5"], "blocked_address"),  # S36
        (["127.0.0.1", "10.0.0.5"], "blocked_address"),  # S38 mixed answers
        (["::ffff:169.254.169.254"], "blocked_address"),  # S39
        ([], "resolve_failed"),  # S41 SERVFAIL: fail closed
    ],
)
def test_bad_resolution_is_blocked(server: Server, answers: list[str], reason: str) -> None:
    fetcher = Fetcher(settings(), resolver(sim_provider_example=answers), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/ok"), policy(server.port))
    assert info.value.reason == reason
    assert server.requests == []


def test_dns_rebinding_uses_only_the_validated_answer(server: Server) -> None:
    """S37: one lookup per hop; the connection goes to the validated address, never re-resolved."""
    res = resolver(sim_provider_example=[["127.0.0.1"], ["10.0.0.5"]])
    fetcher = Fetcher(settings(), res, SystemClock())
    assert fetch_all(fetcher, url(server, "/ok"), policy(server.port)) == BODY
    assert res.calls == [SIM]


def test_redirect_hop_is_re_resolved_and_re_checked(server: Server) -> None:
    res = resolver(sim_provider_example=[["127.0.0.1"], ["10.0.0.5"]])
    server.routes["/to-self"] = _redirect("/ok")
    with pytest.raises(FetchError) as info:
        Fetcher(settings(), res, SystemClock()).open(url(server, "/to-self"), policy(server.port))
    assert info.value.reason == "blocked_address"
    assert res.calls == [SIM, SIM]
    assert [p for p, _ in server.requests] == ["/to-self"]


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("https://cdn.provider.example/o.mp4", "blocked_address"),  # allow-listed name → 10.0.0.5
        ("https://169.254.169.254/latest/meta-data/", "blocked_host"),  # S42
        ("http://video.cdn.provider.example/o.mp4", "blocked_scheme"),  # S43 downgrade
        ("file:///etc/passwd", "blocked_scheme"),  # S43
        ("gopher://127.0.0.1:6379/_FLUSHALL", "blocked_scheme"),  # S43
        ("//169.254.169.254/", "blocked_scheme"),  # S44 scheme-relative (inherits http)
        ("https://evil.example/", "blocked_host"),  # S45
        ("http://127.0.0.1:{port}/ok", "blocked_scheme"),  # loopback, but not the origin's host
        ("http://{sim}:8443/ok", "blocked_host"),  # S45 same host, other port
    ],
)
def test_redirect_to_forbidden_target_is_blocked(server: Server, location: str, reason: str) -> None:
    server.routes["/bad"] = _redirect(location.format(port=server.port, sim=SIM))
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/bad"), policy(server.port))
    assert info.value.reason == reason, str(info.value)
    assert [p for p, _ in server.requests] == ["/bad"]


def test_same_host_relative_redirects_up_to_three(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with fetcher.open(url(server, "/r/3"), policy(server.port)) as download:
        assert b"".join(download) == BODY
        assert download.redirects == 3


@pytest.mark.parametrize("path", ["/r/4", "/loop"])
def test_more_than_three_redirects_is_blocked(server: Server, path: str) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, path), policy(server.port))
    assert info.value.reason == "too_many_redirects"
    assert len(server.requests) == 4


def test_refresh_header_and_meta_refresh_are_not_followed(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    body = fetch_all(fetcher, url(server, "/refresh"), policy(server.port))
    assert b"refresh" in body and len(server.requests) == 1


def test_oversize_by_content_length_is_refused_before_reading(server: Server) -> None:
    fetcher = Fetcher(settings(max_bytes=1_000_000), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/huge"), policy(server.port))
    assert info.value.reason == "too_large"


def test_oversize_stream_without_content_length_stops_at_cap(server: Server) -> None:
    cap = 300_000
    fetcher = Fetcher(settings(max_bytes=cap), resolver(), SystemClock())
    download = fetcher.open(url(server, "/endless"), policy(server.port))
    assert download.content_length is None
    received = 0
    with pytest.raises(FetchError) as info:
        for chunk in download.chunks():
            received += len(chunk)
    assert info.value.reason == "too_large"
    assert received <= cap
    assert download.bytes_read <= cap + CHUNK_SIZE


def test_slow_body_below_minimum_throughput_is_too_slow(server: Server) -> None:
    fetcher = Fetcher(settings(min_bytes_per_s=100_000), resolver(), SystemClock(), throughput_window_s=0.3)
    started = time.monotonic()
    with pytest.raises(FetchError) as info:
        fetch_all(fetcher, url(server, "/slow"), policy(server.port))
    assert info.value.reason == "too_slow"
    assert time.monotonic() - started < 2


def test_stalled_body_hits_idle_timeout(server: Server) -> None:
    fetcher = Fetcher(settings(idle_timeout_s=0.3), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetch_all(fetcher, url(server, "/stall"), policy(server.port))
    assert info.value.reason == "timeout"


def test_gzip_is_not_requested_and_is_refused(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/gzip"), policy(server.port))
    assert info.value.reason == "bad_encoding"
    assert server.requests[-1][1]["accept-encoding"] == "identity"


def test_http_error_status_carries_status(server: Server) -> None:
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(url(server, "/missing?sig=SECRET"), policy(server.port))
    assert info.value.reason == "http_status" and info.value.status == 404


def test_error_messages_never_contain_the_query_string(server: Server) -> None:
    server.routes["/bad"] = _redirect("https://evil.example/o.mp4?token=SECRET2")
    cases = [
        (settings(), resolver(), "/missing?sig=SECRET"),
        (settings(), resolver(), "/bad?sig=SECRET"),
        (settings(), resolver(sim_provider_example=["10.0.0.5"]), "/ok?sig=SECRET"),
        (settings(max_bytes=10), resolver(), "/ok?sig=SECRET"),
        (settings(), resolver(), "/loop?sig=SECRET"),
    ]
    for fetch_settings, res, path in cases:
        with pytest.raises(FetchError) as info:
            fetcher = Fetcher(fetch_settings, res, SystemClock())
            fetch_all(fetcher, url(server, path), policy(server.port))
        text = f"{info.value} {info.value!r} {info.value.__cause__} {info.value.__context__}"
        assert "SECRET" not in text, text


def test_connection_refused_is_connect_failed() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetcher.open(f"http://{SIM}:{port}/ok?sig=SECRET", policy(port))
    assert info.value.reason == "connect_failed" and "SECRET" not in str(info.value)


def test_total_timeout_while_reading(server: Server) -> None:
    fetcher = Fetcher(settings(total_timeout_s=0.2), resolver(), SystemClock())
    with pytest.raises(FetchError) as info:
        fetch_all(fetcher, url(server, "/slow"), policy(server.port))
    assert info.value.reason == "timeout"


def test_download_streams_into_the_object_store(server: Server, tmp_path: Path) -> None:
    store = FsStore(tmp_path / "objects", b"k" * 32)
    fetcher = Fetcher(settings(), resolver(), SystemClock())
    with fetcher.open(url(server, "/ok"), policy(server.port)) as download:
        stored = store.put_stream("outputs/o.mp4", download.chunks(), download.content_type, 10_000_000)
    assert stored.size == len(BODY) and stored.sha256 == hashlib.sha256(BODY).hexdigest()
