"""The simulator's HTTP surface: the vendor API (`/v1/...`), its CDN (`/outputs/...`) and test control (`/_sim/...`).

Handlers are plain `def`s: FastAPI runs them in its thread pool, so injected latency and the wait for an
early callback block one worker thread, never the event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, RedirectResponse, Response

from aivedio_engine.providers.sim.faults import FaultSpecError, parse_faults
from aivedio_engine.providers.sim.server import SimClock, SimState

_DROP = "x-sim-drop-connection"
EARLY_CALLBACK_WAIT_S = 5.0


def create_app(state: SimState) -> Any:
    api = FastAPI(title="aivedio sim provider", docs_url=None, redoc_url=None, openapi_url=None)
    sample_mp4()  # render once up front, not inside the first output request

    def latency() -> None:
        lo, hi = state.faults.latency_s
        if hi > 0:
            time.sleep(state.dice.uniform("latency", lo, hi))

    @api.post("/v1/jobs")
    def submit(
        request_body: dict[str, Any] | None = None, idempotency_key: str | None = Header(None, alias="Idempotency-Key")
    ) -> Response:
        latency()
        outcome = state.submit(request_body or {}, idempotency_key or None)
        if outcome.early is not None:
            outcome.early.wait(EARLY_CALLBACK_WAIT_S)
        headers = dict(outcome.headers)
        if outcome.drop:
            headers[_DROP] = "1"
        return JSONResponse(outcome.body, status_code=outcome.status, headers=headers)

    @api.get("/v1/jobs/{job_id}")
    def query(job_id: str) -> Response:
        latency()
        job = state.get(job_id)
        return JSONResponse(job) if job else _not_found()

    @api.get("/v1/jobs")
    def find(
        request_key: str = "", created_after: str = "", created_before: str = "", limit: int = 100, cursor: str = ""
    ) -> Response:
        latency()
        if not request_key and (created_after or created_before or cursor):
            return _list(state, created_after, created_before, limit, cursor)
        if not state.config.lookup:
            return JSONResponse({"error": "unsupported"}, status_code=501)
        job = state.find(request_key) if request_key else None
        return JSONResponse(job) if job else _not_found()

    @api.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str) -> Response:
        latency()
        status, body = state.cancel(job_id)
        return JSONResponse(body, status_code=status)

    @api.get("/outputs/{name}")
    def output(name: str, expires: str = "", sig: str = "") -> Response:
        latency()
        job_id = _job_of(name)
        status = state.output_allowed(job_id, expires, sig)
        if status != 200:
            return JSONResponse({"error": "expired" if status == 403 else "not_found"}, status_code=status)
        if state.dice.roll("redirect", state.faults.p("redirect")):
            return RedirectResponse(f"/outputs/r/{name}?expires={expires}&sig={sig}", status_code=302)
        return Response(sample_mp4(), media_type="video/mp4")

    @api.get("/outputs/r/{name}")
    def redirected_output(name: str, expires: str = "", sig: str = "") -> Response:
        latency()
        status = state.output_allowed(_job_of(name), expires, sig)
        if status != 200:
            return JSONResponse({"error": "expired" if status == 403 else "not_found"}, status_code=status)
        return Response(sample_mp4(), media_type="video/mp4")

    @api.post("/_sim/jobs/{job_id}/void")
    def void(job_id: str) -> Response:
        status, body = state.void(job_id)
        return JSONResponse(body, status_code=status)

    @api.get("/_sim/truth")
    def truth() -> Response:
        return JSONResponse(state.truth())

    @api.post("/_sim/faults")
    def set_faults(body: dict[str, Any]) -> Response:
        try:
            faults = parse_faults(str(body.get("spec", "")))
        except FaultSpecError as exc:
            return JSONResponse({"error": "invalid_faults", "detail": str(exc)}, status_code=400)
        seed = body.get("seed")
        state.set_faults(faults, seed=int(seed) if seed is not None else None)
        return JSONResponse({"faults": faults.to_spec(), "seed": state.config.seed})

    @api.post("/_sim/config")
    def configure(body: dict[str, Any]) -> Response:
        allowed = {
            "lookup",
            "listing",
            "max_concurrency",
            "job_seconds",
            "webhook_url",
            "bill_factor",
            "cost_per_second",
            "billed_outputs",
        }
        unknown = set(body) - allowed
        if unknown:
            return JSONResponse({"error": "unknown_keys", "detail": sorted(unknown)}, status_code=400)
        state.configure(**body)
        return JSONResponse({k: getattr(state.config, k) for k in sorted(allowed)})

    @api.post("/_sim/advance")
    def advance(body: dict[str, Any]) -> Response:
        if not isinstance(state.clock, SimClock):
            return JSONResponse({"error": "real_clock"}, status_code=409)
        state.advance(float(body.get("seconds", 0)))
        return JSONResponse({"now": state.truth()["now"]})

    @api.post("/_sim/reset")
    def reset() -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    return _DropConnection(api)


def _not_found() -> Response:
    return JSONResponse({"error": "not_found"}, status_code=404)


def _list(state: SimState, created_after: str, created_before: str, limit: int, cursor: str) -> Response:
    if not state.config.listing:
        return JSONResponse({"error": "unsupported"}, status_code=501)
    try:
        after, before = _time_param(created_after), _time_param(created_before)
        page_after = int(cursor) if cursor else None
    except ValueError:
        return JSONResponse({"error": "invalid_filter"}, status_code=400)
    return JSONResponse(state.list_jobs(after, before, max(1, min(100, limit)), page_after))


def _time_param(value: str) -> datetime | None:
    """ISO 8601; a time without a zone is UTC. Raises ValueError."""
    if not value:
        return None
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


class _DropConnection:
    """ASGI wrapper: a response marked with the drop header goes out as headers only, then the connection dies.

    uvicorn closes the transport when an app returns without completing its response; the client then fails
    while reading the body (httpx RemoteProtocolError → `SentUnknown`), which is exactly "the request was
    received, the answer was lost". An exception instead would make uvicorn answer a clean 500.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dropping = False

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal dropping
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if any(k.lower() == _DROP.encode() for k, _ in headers):
                    dropping = True
                    await send(
                        {
                            "type": "http.response.start",
                            "status": message["status"],
                            "headers": [(b"content-type", b"application/json"), (b"content-length", b"512")],
                        }
                    )
                    return
            if dropping:
                return
            await send(message)

        await self.app(scope, receive, guarded_send)


_MP4: bytes | None = None
_MP4_LOCK = threading.Lock()
#: an `ftyp` box only: enough for magic-number sniffing when ffmpeg is missing, not a playable video
_FALLBACK_MP4 = bytes.fromhex("00000018667479706d703432000000006d7034326973366d")


def sample_mp4() -> bytes:
    """A small real MP4 (1 s of ffmpeg `testsrc`, H.264, faststart), made once per process."""
    global _MP4
    with _MP4_LOCK:
        if _MP4 is None:
            _MP4 = _render_mp4() or _FALLBACK_MP4
        return _MP4


def _render_mp4() -> bytes | None:
    with tempfile.TemporaryDirectory(prefix="aivedio-sim-") as tmp:
        path = os.path.join(tmp, "out.mp4")
        argv = [
            "ffmpeg",
            "-nostdin",
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=160x90:rate=10:duration=1",
            "-pix_fmt",
            "yuv420p",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-movflags",
            "+faststart",
            "-y",
            path,
        ]
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
            with open(path, "rb") as fh:
                return fh.read()
        except (OSError, subprocess.SubprocessError):
            return None


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP, and
    # without it Nagle + delayed ACK add ~40 ms to every keep-alive request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _QuietDrops(logging.Filter):
    """Hide uvicorn's error line for the connections the sim drops on purpose (ambiguous accept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing response" not in record.getMessage()


def quiet_dropped_responses() -> None:
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrops) for f in log.filters):
        log.addFilter(_QuietDrops())


class ThreadedSim:
    """A sim server on a background thread (tests, benchmarks). `stop()` shuts it down and joins."""

    def __init__(self, state: SimState, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.state = state
        self._sock = bind_socket(host, port)
        bound_port = self._sock.getsockname()[1]
        self.base_url = f"http://{host if ':' not in host else f'[{host}]'}:{bound_port}"
        state.base_url = self.base_url
        # log_config=None: a test process keeps its own logging setup
        config = uvicorn.Config(
            create_app(state),
            log_config=None,
            log_level="warning",
            http="h11",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        quiet_dropped_responses()
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="sim-provider", daemon=True
        )

    def start(self, timeout_s: float = 10.0) -> ThreadedSim:
        self.state.start()
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("sim server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.state.stop()
        self._sock.close()


def serve(state: SimState, host: str, port: int) -> None:
    """Run in the foreground until SIGINT/SIGTERM (the CLI). uvicorn owns the signals here."""
    import uvicorn

    sock = bind_socket(host, port)
    state.base_url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    config = uvicorn.Config(
        create_app(state), log_level="warning", http="h11", lifespan="off", timeout_graceful_shutdown=2
    )
    quiet_dropped_responses()
    state.start()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        state.stop()
        sock.close()


def _job_of(name: str) -> str:
    """The job an output file name belongs to: `<job>.mp4`, or `<job>-<index>.mp4` for the others of n."""
    stem = name.removesuffix(".mp4")
    head, sep, index = stem.rpartition("-")
    return head if sep and index.isdigit() else stem
