"""A real webhook receiver on a loopback port that verifies every message with the `standardwebhooks` library, as
a client would. Its answers are scripted: a status per request (then the last one repeats), or hang."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    #: time.time() when the request arrived
    at: float
    #: which configured secrets verified it (empty: the signature is bad)
    verified_by: list[str]
    answered: int | None = None

    @property
    def message(self) -> Any:
        return json.loads(self.body)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self.message["data"])


@dataclass
class Receiver:
    url: str
    secrets: list[str] = field(default_factory=list)
    #: status answered to request n (the last one repeats); "hang" holds the request for `hang_s`
    script: list[int | str] = field(default_factory=lambda: [200])
    hang_s: float = 30.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hanging: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def verified(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.verified_by]

    def count(self) -> int:
        with self.lock:
            return len(self.received)


@contextmanager
def running_receiver(path: str = "/hook", **kwargs: Any) -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            rx = state["rx"]
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified = []
            for secret in list(rx.secrets):
                try:
                    Webhook(secret).verify(body, headers)
                    verified.append(secret)
                except WebhookVerificationError:
                    pass
            item = Received(headers, body, time.time(), verified)
            with rx.lock:
                n = len(rx.received)
                rx.received.append(item)
                action = rx.script[min(n, len(rx.script) - 1)]
            if action == "hang":
                with rx.lock:
                    rx.hanging += 1
                rx.release.wait(rx.hang_s)
                with rx.lock:
                    rx.hanging -= 1
                action = 200
            item.answered = int(action)
            try:
                self.send_response(int(action))
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:
                pass  # the sender gave up on us (its timeout)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rx = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}{path}", **kwargs)
    state["rx"] = rx
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rx
    finally:
        rx.release.set()
        server.shutdown()
        server.server_close()
