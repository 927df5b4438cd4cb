"""The world a money sequence runs in: one engine (AppContext) on a database and data dir of its own, the sim
vendor in the same process on the same manual clock, callbacks held for the sequence to deliver, and a store that
can be broken and healed. The invariants live in tests/model/invariants.py, the rules in tests/model/money.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.config import ModelSettings
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.status import DerivativeProfile, OutboxStatus
from aivedio_engine.media import derive
from aivedio_engine.providers.sim.app import ThreadedSim
from aivedio_engine.providers.sim.server import SimClock, SimState
from aivedio_engine.providers.webhooks import sign_webhook
from aivedio_engine.services.consume import Envelope
from aivedio_engine.worker.actors import REGISTRY
from tests.support.app import make_context
from tests.support.sim import SECRET, sim_config

#: 1 credit per second at 720p, up to 4 variants: every estimate is a whole number of credits
SIM_V1 = ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": 1}, max_outputs=4)
#: a prompt containing this word is held for a human after its outputs are made (output moderation)
REVIEW_TERM = "inspect"
REVIEW_SLA_S = 600.0
#: the deadline every create asks for
DEADLINE_S = 300


class StoreDown(ConnectionError):
    """What the broken store raises on every call."""


@dataclass
class HeldCallback:
    job_id: str
    event_id: str
    body: bytes


class CallbackHold:
    """Stands in for the sim's callback dispatcher: the callbacks a job emits wait here until the sequence delivers,
    duplicates, reorders or drops them, signed on the engine's clock (the dispatcher signs on the wall clock, which
    a sequence that moves its clock by hours would make stale)."""

    def __init__(self) -> None:
        self.held: list[HeldCallback] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def forget_pending(self) -> None:
        with self._lock:
            self.held = []

    def stats(self) -> dict[str, int]:
        return {"pending": 0}

    def emit(self, job: Any, body: dict[str, Any], urgent: bool = False) -> None:
        job.events += 1
        event_id = f"evt_{job.id}_{job.events}"
        raw = json.dumps({**body, "event_id": event_id}, separators=(",", ":")).encode()
        with self._lock:
            self.held.append(HeldCallback(job.id, event_id, raw))

    def take(self) -> list[HeldCallback]:
        with self._lock:
            out, self.held = self.held, []
        return out


class _Shared:
    """One sim server per process (starting one costs ~0.4 s), re-initialised for each sequence."""

    server: ThreadedSim | None = None
    hold = CallbackHold()

    @classmethod
    def get(cls) -> ThreadedSim:
        if cls.server is None:
            state = SimState(sim_config(job_seconds=20), SimClock())
            state.dispatcher = cls.hold  # type: ignore[assignment]
            cls.server = ThreadedSim(state).start()
        return cls.server


@dataclass
class World:
    """One sequence's engine and vendor. `database_url` None: embedded SQLite in the data dir."""

    root: Path
    database_url: str | None
    clock: SimClock
    sim: SimState
    hold: CallbackHold
    ctx: AppContext = field(init=False)
    store_down: bool = False
    restarts: int = 0
    #: handler failures seen by the pump (a dead-lettered message), by event type
    dead_letters: list[str] = field(default_factory=list)
    #: vendor jobs whose refund the engine was told of by a delivered callback
    told_refunded: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ctx = self._context()

    def _context(self) -> AppContext:
        sim_url = _Shared.get().base_url
        provider = {
            "adapter": "sim",
            "base_url": sim_url,
            "allow_http_origin": True,
            "output_hosts": ["127.0.0.1"],
            "webhook_secrets": [SECRET],
            "models": {"sim-v1": SIM_V1},
        }
        ctx = make_context(
            self.root / "data",
            self.database_url,
            clock=self.clock,
            providers={"sim": provider},
            default_provider="sim",
            polling={"min_interval_s": 5, "max_interval_s": 10, "jitter": 0.0},
            limits={"platform_max_concurrency": 1000, "tenant_default_max_concurrency": 1000},
            media={"inline_after_fetch_max_bytes": 0, "review_prompt_terms": [REVIEW_TERM]},
            review={"sla_s": REVIEW_SLA_S},
            logging={"level": "ERROR"},
        )
        if self.store_down:
            _break(ctx)
        return ctx

    # --- the world's operations ---------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.sim.tick()

    def work(self) -> None:
        """What the roles do at this instant: dispatch, consume, sweep, consume."""
        self.ctx.dispatcher.run_once(max_picks=200)
        self.pump()
        self.ctx.sweeper.sweep()
        self.pump()

    def pump(self, max_events: int = 2000) -> None:
        """Hand every due outbox row to its consumer once, as the actors do. A consumer that raises has its message
        dead-lettered (the broker's retries are over in an instant on this clock): the sweeper re-drives it."""
        handlers = {spec.event_type.value: spec.handler for spec in REGISTRY.values()}
        delivered = 0
        while delivered < max_events:
            with self.ctx.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(outbox_events)
                    .where(
                        outbox_events.c.status == OutboxStatus.PENDING.value,
                        outbox_events.c.available_at <= self.clock.now(),
                    )
                    .order_by(outbox_events.c.id)
                    .limit(200)
                ).all()
            if not rows:
                return
            for row in rows:
                handler = handlers.get(row.event_type)
                if handler is not None:
                    env = Envelope(
                        event_id=row.id,
                        event_type=row.event_type,
                        schema_version=row.schema_version,
                        aggregate_id=row.aggregate_id,
                        aggregate_version=row.aggregate_version,
                        tenant_id=row.tenant_id,
                        trace_id=row.trace_id,
                        causation_id=row.causation_id,
                        occurred_at=row.created_at,
                        payload=row.payload,
                    )
                    try:
                        handler(self.ctx, env)
                    except StoreDown:
                        self.dead_letters.append(row.event_type)
                with self.ctx.engine.begin() as conn:
                    conn.execute(
                        outbox_events.update()
                        .where(outbox_events.c.id == row.id)
                        .values(status=OutboxStatus.PUBLISHED.value, published_at=self.clock.now())
                    )
                delivered += 1

    def deliver(self, callbacks: list[HeldCallback]) -> None:
        for cb in callbacks:
            if json.loads(cb.body).get("refunded"):
                self.told_refunded.add(cb.job_id)
            headers = sign_webhook([SECRET], cb.event_id, self.clock.now(), cb.body)
            headers["content-type"] = "application/json"
            self.ctx.callbacks.receive("sim", headers, cb.body)

    def break_store(self) -> None:
        self.store_down = True
        _break(self.ctx)

    def heal_store(self) -> None:
        self.store_down = False
        for name in _STORE_CALLS:
            self.ctx.storage.__dict__.pop(name, None)

    def restart(self) -> None:
        """Stop the engine between two steps and start it again on the same database and data dir."""
        self.ctx.close()
        self.restarts += 1
        self.ctx = self._context()

    def close(self) -> None:
        self.ctx.close()


_STORE_CALLS = ("put_stream", "head", "open_read", "download_to", "delete")


def _break(ctx: AppContext) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreDown("store unreachable")

    for name in _STORE_CALLS:
        setattr(ctx.storage, name, down)


Backend = Callable[[], Iterator[str | None]]


@contextmanager
def world(database: Callable[[], Any]) -> Iterator[World]:
    """A fresh world: `database()` is a context manager yielding a database URL (None: SQLite)."""
    server = _Shared.get()
    clock = SimClock()
    server.state.reinit(sim_config(job_seconds=20), clock)
    Encoder.mode, Encoder.runs = "ok", 0
    # in memory where there is one: a sequence's SQLite commits are many, and their fsyncs are not what is tested
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="aivedio-model-", dir=shm if shm.is_dir() else None))
    Counts.sequences += 1
    if Counts.report_every and Counts.sequences % Counts.report_every == 0:
        print(f"... {Counts.sequences} sequences, {Counts.steps} steps", flush=True)
    try:
        with database() as url:
            if url is None:  # a copy of a migrated file: migrating each sequence's database would cost ~0.5 s
                (root / "data").mkdir()
                shutil.copyfile(_sqlite_template(), root / "data" / "aivedio.db")
            w = World(root, url, clock, server.state, _Shared.hold)
            try:
                yield w
            finally:
                w.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


_TEMPLATE: list[Path] = []


def _sqlite_template() -> Path:
    if not _TEMPLATE:
        from aivedio_engine.db import migrate

        where = Path(tempfile.mkdtemp(prefix="aivedio-model-template-"))
        engine = sa.create_engine(f"sqlite:///{where / 'aivedio.db'}")
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        _TEMPLATE.append(where / "aivedio.db")
    return _TEMPLATE[0]


@contextmanager
def sqlite_database() -> Iterator[None]:
    yield None


def postgres_database(template: str) -> Callable[[], Any]:
    """A context manager factory: a throwaway copy of the migrated template for each sequence."""
    from tests.conftest import _throwaway_database

    @contextmanager
    def make() -> Iterator[str]:
        gen = iter(_throwaway_database(template))
        dsn = next(gen)
        try:
            yield dsn.replace("postgresql://", "postgresql+psycopg://", 1)
        finally:
            next(gen, None)  # the generator's cleanup: drop the database

    return make


def new_key() -> str:
    return uuid.uuid4().hex


class Encoder:
    """How the stubbed encode behaves: "ok", "fails" (every profile FAILED, not retryable: a QC finding on the
    output), "every_other" (every second run fails so), "flaky" (every second run fails retryably) or "down"
    (every run fails retryably: our encoder is down, the media step's budget runs, then a person holds it)."""

    mode = "ok"
    runs = 0


# --- the media step's derive, stubbed behind its interface ----------------------------------------------------
def stub_build_derivatives(
    src: Path, probe: Any, workdir: Path, profiles: Any, limits: Any
) -> dict[DerivativeProfile, derive.DerivativeResult]:
    """`derive.build_derivatives` without ffmpeg: each profile's files as the real run names them (the proxy a
    copy of the source, a one-segment HLS, a thumbnail's bytes), collected by the real `_collect`. The money does
    not depend on the encode; the probe before it and every store and database step after it stay real."""
    out: dict[DerivativeProfile, derive.DerivativeResult] = {}
    Encoder.runs += 1
    refuse = Encoder.mode == "fails" or (Encoder.mode == "every_other" and Encoder.runs % 2 == 0)
    if refuse or Encoder.mode == "down" or (Encoder.mode == "flaky" and Encoder.runs % 2 == 0):
        error = "the encoder refused it" if refuse else "the encoder is unavailable"
        return {
            DerivativeProfile(p): derive.DerivativeResult(
                DerivativeProfile(p), "FAILED", error=error, retryable=not refuse
            )
            for p in profiles
        }
    for profile in dict.fromkeys(DerivativeProfile(p) for p in profiles):
        if profile is DerivativeProfile.WAVEFORM:
            out[profile] = derive.DerivativeResult(profile, "SKIPPED", error="no audio stream")
            continue
        d = derive.output_dir(Path(workdir), profile)
        d.mkdir(parents=True, exist_ok=True)
        if profile is DerivativeProfile.HLS:
            (d / "init.mp4").write_bytes(b"\x00\x00\x00\x08ftyp")
            (d / "seg0.m4s").write_bytes(b"\x00\x00\x00\x08moof")
            (d / derive.HLS_PLAYLIST).write_text(
                '#EXTM3U\n#EXT-X-MAP:URI="init.mp4"\n#EXTINF:1.0,\nseg0.m4s\n#EXT-X-ENDLIST\n', "utf-8"
            )
        elif profile is DerivativeProfile.PROXY_MP4:
            shutil.copyfile(src, d / derive._FILE_NAMES[profile])
        else:
            (d / derive._FILE_NAMES[profile]).write_bytes(b"\xff\xd8\xff\xe0stub-thumbnail\xff\xd9")
        out[profile] = derive._collect(profile, d)
    return out


@contextmanager
def cheap_media() -> Iterator[None]:
    """The stubbed encode, and ffprobe run once per distinct file (the sim serves one clip): the gate itself still
    judges every probe."""
    from aivedio_engine.media import probe as probe_module
    from aivedio_engine.services import media as media_module

    real_build, real_run = derive.build_derivatives, probe_module.run_ffprobe
    seen: dict[tuple[str, str], Any] = {}

    def run_ffprobe(path: Path, family: str, limits: Any, ffprobe: str = "ffprobe") -> Any:
        key = (hashlib.sha256(Path(path).read_bytes()).hexdigest(), family)
        if key not in seen:
            seen[key] = real_run(path, family, limits, ffprobe)
        return seen[key]

    derive.build_derivatives = stub_build_derivatives
    probe_module.run_ffprobe = run_ffprobe
    assert media_module.derive is derive
    try:
        yield
    finally:
        derive.build_derivatives = real_build
        probe_module.run_ffprobe = real_run


class Counts:
    """Sequences and steps run in this process, and the states their tasks ended in (the checker prints them)."""

    sequences = 0
    steps = 0
    #: print the counts every this many sequences (0: never)
    report_every = 0
    endings: Counter[str] = Counter()
