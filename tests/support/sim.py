"""The `sim` provider for tests: a real HTTP server on a free loopback port, plus a callback sink.

    from tests.support.sim import running_sim, sim, sim_factory, callback_sink   # fixtures and helpers

    with running_sim(seed=7, faults="ambiguous=1", job_seconds=0.5) as s:
        provider = s.provider()                  # a SimProvider pointed at it
        ...
        s.advance(1.0)                           # manual clock: jobs move only when told
        assert s.truth()["duplicate_paid_jobs"] == 0

The clock is a `SimClock` unless `real_clock=True`; callbacks go out from the server's delivery thread either way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.config import ModelSettings, ProviderSettings
from aivedio_engine.db.tables import task_attempts
from aivedio_engine.httpclient import HttpClient
from aivedio_engine.providers.sim.adapter import SimProvider
from aivedio_engine.providers.sim.app import ThreadedSim
from aivedio_engine.providers.sim.faults import parse_faults
from aivedio_engine.providers.sim.server import RealClock, SimClock, SimConfig, SimState
from aivedio_engine.providers.webhooks import new_secret

SECRET = new_secret(b"sim-test-secret-0123456789abcdef")
OLD_SECRET = new_secret(b"sim-test-old-secret-0123456789ab")


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` until truthy; fail the test at the deadline instead of hanging or guessing a sleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


@dataclass
class SimHandle:
    base_url: str
    state: SimState
    http: HttpClient

    @property
    def clock(self) -> SimClock | RealClock:
        return self.state.clock

    def advance(self, seconds: float) -> None:
        self.state.advance(seconds)

    def truth(self) -> dict[str, Any]:
        """Ground truth as an HTTP client sees it (the same endpoint a chaos checker uses)."""
        r = self.http.request("GET", "/_sim/truth")
        assert r.status == 200, r.status
        return r.json()  # type: ignore[no-any-return]

    def jobs_per_task(self, engine: Any) -> Counter[Any]:
        """The vendor's jobs per task of ours: each job's request key → the attempt that sent it → its task (None:
        a job no request of ours made). The sim's `duplicate_paid_jobs` counts per request key, so it cannot see
        a task's second job made by another attempt's request."""
        jobs = self.truth()["jobs"]
        keys = {j["request_key"] for j in jobs if j["request_key"]}
        with engine.connect() as conn:
            q = sa.select(task_attempts.c.provider_request_key, task_attempts.c.task_id)
            owner = dict(conn.execute(q.where(task_attempts.c.provider_request_key.in_(keys))).all())
        return Counter(owner.get(j["request_key"]) for j in jobs)

    def set_faults(self, spec: str, seed: int | None = None) -> None:
        body: dict[str, Any] = {"spec": spec}
        if seed is not None:
            body["seed"] = seed
        r = self.http.request("POST", "/_sim/faults", json=body)
        assert r.status == 200, r.body

    def configure(self, **changes: Any) -> None:
        self.state.configure(**changes)

    def reset(self) -> None:
        assert self.http.request("POST", "/_sim/reset").status == 200

    def provider_settings(self, **overrides: Any) -> ProviderSettings:
        values: dict[str, Any] = {
            "adapter": "sim",
            "base_url": self.base_url,
            "allow_http_origin": True,
            "output_hosts": ["127.0.0.1"],
            "webhook_secrets": [SECRET],
            "models": {
                "sim-v1": ModelSettings(
                    max_duration_s=10, resolutions=["720p", "1080p"], price_per_second={"720p": 1, "1080p": 2}
                )
            },
        }
        values.update(overrides)
        return ProviderSettings(**values)

    def provider(self, **overrides: Any) -> SimProvider:
        return SimProvider("sim", self.provider_settings(**overrides))


def sim_config(
    seed: int = 0,
    faults: str = "",
    *,
    job_seconds: float = 0.5,
    lookup: bool = True,
    max_concurrency: int | None = None,
    webhook_url: str | None = None,
    webhook_secrets: tuple[str, ...] = (SECRET,),
    output_url_ttl_s: float = 3600.0,
) -> SimConfig:
    return SimConfig(
        seed=seed,
        faults=parse_faults(faults),
        job_seconds=job_seconds,
        lookup=lookup,
        max_concurrency=max_concurrency,
        webhook_url=webhook_url,
        webhook_secrets=webhook_secrets,
        output_url_ttl_s=output_url_ttl_s,
    )


@contextmanager
def running_sim(*, real_clock: bool = False, **config: Any) -> Iterator[SimHandle]:
    """A sim server of its own (keyword arguments: those of `sim_config`), stopped on exit."""
    state = SimState(sim_config(**config), RealClock() if real_clock else SimClock())
    server = ThreadedSim(state).start()
    http = HttpClient(server.base_url)
    try:
        yield SimHandle(server.base_url, state, http)
    finally:
        http.close()
        server.stop()


_shared: dict[str, SimHandle] = {}


def _shared_sim(request: pytest.FixtureRequest, **config: Any) -> SimHandle:
    """One manual-clock server per session, re-initialised for each test: uvicorn start + stop cost ~0.4 s."""
    if "sim" not in _shared:
        cm = running_sim()
        _shared["sim"] = cm.__enter__()

        def _stop() -> None:
            _shared.pop("sim", None)
            cm.__exit__(None, None, None)

        request.session.config.add_cleanup(_stop)
    handle = _shared["sim"]
    handle.state.reinit(sim_config(**config), SimClock())
    return handle


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> SimHandle:
    """A fresh-state sim with the defaults of `sim_config` (the server itself is shared by the session)."""
    return _shared_sim(request)


@pytest.fixture
def sim_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., SimHandle]]:
    """`sim_factory(seed=..., faults=...)` → a started sim. The first call in a test re-initialises the shared
    server; further calls (two sims at once) and `real_clock=True` start servers of their own."""
    used = False
    with ExitStack() as stack:

        def make(real_clock: bool = False, **config: Any) -> SimHandle:
            nonlocal used
            if used or real_clock:
                return stack.enter_context(running_sim(real_clock=real_clock, **config))
            used = True
            return _shared_sim(request, **config)

        yield make


# callbacks ---------------------------------------------------------------------------------------------------
@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    path: str


@dataclass
class CallbackSink:
    """A loopback HTTP endpoint that records every POST (raw body, headers) and answers `status`."""

    url: str = ""
    status: int = 204
    received: list[Received] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def record(self, item: Received) -> None:
        with self._cond:
            self.received.append(item)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.received) >= count, timeout=timeout_s):
                raise AssertionError(f"got {len(self.received)} callbacks, wanted {count} within {timeout_s}s")
            return list(self.received)


@contextmanager
def running_sink(status: int = 204) -> Iterator[CallbackSink]:
    sink = CallbackSink(status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            sink.record(Received({k.lower(): v for k, v in self.headers.items()}, body, self.path))
            self.send_response(sink.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sink.url = f"http://127.0.0.1:{server.server_address[1]}/callbacks/sim"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def callback_sink() -> Iterator[CallbackSink]:
    with running_sink() as sink:
        yield sink
