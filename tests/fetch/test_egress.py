"""The client-webhook egress (`fetch.egress.post`) against real loopback servers, with an injected resolver so
names can point anywhere: the address policy per answer, the pinned connection, the timeout and the body cap."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from aivedio_engine.fetch import StaticResolver
from aivedio_engine.fetch.egress import EgressError, post


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.mode = "ok"
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if outer.mode == "hang":
                    outer.release.wait(30)
                    return
                if outer.mode == "redirect":
                    self.send_response(302)
                    self.send_header("location", "http://169.254.169.254/")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                payload = b"x" * 1_000_000 if outer.mode == "big" else b"thanks"
                self.send_response(200)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except OSError:
                    pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    thread = threading.Thread(target=s.http.serve_forever, daemon=True)
    thread.start()
    yield s
    s.release.set()
    s.http.shutdown()
    s.http.server_close()


def send(url: str, resolver: StaticResolver | None = None, **kw: Any) -> Any:
    opts: dict[str, Any] = {"allow_private": True, "connect_timeout_s": 2, "timeout_s": 5, "max_response_bytes": 1024}
    opts.update(kw)
    return post(url, b'{"a":1}', {"webhook-id": "msg_1"}, resolver=resolver or StaticResolver({}), **opts)


def test_a_name_is_resolved_once_checked_and_connected_to_by_address(server: Server) -> None:
    resolver = StaticResolver({"hooks.client.example": ["127.0.0.1"]})
    url = f"http://hooks.client.example:{server.port}/in?t=1"
    with pytest.raises(EgressError, match="blocked_address") as refused:
        send(url, resolver, allow_private=False)
    assert refused.value.permanent and server.requests == []

    r = send(url, resolver)
    assert r.status == 200 and r.body == b"thanks" and str(r.peer_ip) == "127.0.0.1"
    (req,) = server.requests
    assert req["path"] == "/in?t=1" and req["body"] == b'{"a":1}'
    assert req["headers"]["Host"] == f"hooks.client.example:{server.port}"
    assert req["headers"]["webhook-id"] == "msg_1" and req["headers"]["Content-Type"] == "application/json"
    assert resolver.calls == ["hooks.client.example", "hooks.client.example"], "one lookup per attempt"


def test_one_blocked_answer_refuses_the_host(server: Server) -> None:
    resolver = StaticResolver({"mixed.example": ["127.0.0.1", "169.254.169.254"]})
    with pytest.raises(EgressError, match="blocked_address"):
        send(f"http://mixed.example:{server.port}/", resolver)
    assert server.requests == []


def test_a_hanging_receiver_costs_one_timeout(server: Server) -> None:
    server.mode = "hang"
    started = time.monotonic()
    with pytest.raises(EgressError, match="timeout") as timed_out:
        send(f"http://127.0.0.1:{server.port}/", timeout_s=0.5)
    took = time.monotonic() - started
    assert 0.4 < took < 1.5, took
    assert not timed_out.value.permanent


def test_the_answer_is_capped_and_redirects_are_not_followed(server: Server) -> None:
    server.mode = "big"
    r = send(f"http://127.0.0.1:{server.port}/", max_response_bytes=100)
    assert r.status == 200 and len(r.body) == 100
    server.mode = "redirect"
    r = send(f"http://127.0.0.1:{server.port}/")
    assert r.status == 302 and len(server.requests) == 2


def test_nothing_listening_is_a_retryable_failure() -> None:
    with pytest.raises(EgressError, match="connect_failed") as failed:
        send("http://127.0.0.1:9/")
    assert not failed.value.permanent
