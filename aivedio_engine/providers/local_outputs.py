"""Serving the `local` provider's finished outputs over loopback HTTP, like a vendor's CDN (providers/local.py).

Output URLs carry an expiry and an HMAC over (output name, expiry) keyed per instance: an expired or edited URL
gets 403, like a vendor CDN, which lets the engine's refresh-on-403 path run for real. Only finished outputs
(renamed into the served directory once complete) are ever served; nothing is listed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from aivedio_engine.clock import Clock
from aivedio_engine.testing.failpoints import failpoint

_OUTPUT_PATH = re.compile(r"/outputs/(loc_[0-9a-f]{32}(?:-[1-9])?)\.mp4")


class OutputServer:
    """The files `<root>/<name>.mp4`, served at `base_url` under signed URLs until `close()`."""

    def __init__(self, root: Path, clock: Clock, thread_name: str) -> None:
        self._root = root
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._server = _OutputServer(self)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=thread_name, daemon=True
        )
        self._thread.start()

    def url(self, name: str, expires: int) -> str:
        return f"{self.base_url}/outputs/{name}.mp4?expires={expires}&sig={self._sign(name, expires)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def join(self) -> None:
        self._thread.join(timeout=5)

    def _sign(self, name: str, expires: int) -> str:
        return hmac.new(self._key, f"{name}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def authorize(self, raw_path: str) -> tuple[int, Path | None]:
        """(HTTP status, file): 404 for anything but an output path, 403 for a bad or expired signature."""
        parts = urlsplit(raw_path)
        match = _OUTPUT_PATH.fullmatch(parts.path)
        if match is None:
            return 404, None
        query = parse_qs(parts.query, keep_blank_values=True)
        expires, sig = query.get("expires", []), query.get("sig", [])
        if len(expires) != 1 or len(sig) != 1 or not expires[0].isdigit() or len(expires[0]) > 12:
            return 403, None
        if not hmac.compare_digest(sig[0], self._sign(match.group(1), int(expires[0]))):
            return 403, None
        if int(expires[0]) < self._clock.now().timestamp():
            return 403, None
        path = self._root / f"{match.group(1)}.mp4"
        return (200, path) if path.is_file() else (404, None)


class _OutputServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, outputs: OutputServer) -> None:
        self.outputs = outputs
        super().__init__(("127.0.0.1", 0), _OutputHandler)


class _OutputHandler(BaseHTTPRequestHandler):
    """GET of one finished output; no listing, no other files. Other methods get the stdlib's 501."""

    server: _OutputServer
    server_version = "aivedio-local"
    sys_version = ""

    def do_GET(self) -> None:  # stdlib naming
        failpoint("local.serve_output")  # tests hold a download here (a slow CDN) to stop the engine mid-fetch
        status, path = self.server.outputs.authorize(self.path)
        try:
            handle = open(path, "rb") if path is not None else None  # noqa: SIM115 (closed below)
        except OSError:  # swept between the check and the open
            handle, status = None, 404
        if handle is None:
            self.send_error(status)
            return
        with handle:
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(os.fstat(handle.fileno()).st_size))
            self.send_header("Cache-Control", "private, no-store")
            self.end_headers()
            try:
                shutil.copyfileobj(handle, self.wfile, 256 * 1024)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; nothing to clean up

    def log_message(self, format: str, *args: object) -> None:
        pass  # request lines carry signed query strings, which must never reach logs
