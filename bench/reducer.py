"""`reducer`: provider status events applied per second by the real consumer path, against pgbench of the
transition transaction at the same client count (A-B-A), in-process and through Dramatiq on Redis.

Per repetition (BENCHMARKS.md, performance_anchors.md C.2):
  setup  a fresh database migrated with `aivedio_engine.db.migrate.upgrade`; per measured point a slice of
         tasks bulk-inserted with SQL in SUBMITTED, each with one ACKED attempt holding a provider job id; and
         the slice's stream of `provider.status.observed` envelopes (the payload `services.observations`
         stores): RUNNING then SUCCEEDED per task, plus 5 % re-deliveries of earlier events (same event id,
         i.e. what a relay republishing after a crash sends)
  per client count c (4, then 16), one chain:
         A   pgbench -n -M prepared -T D -c c -j 2 -f bench/sql/transition.sql   (own throwaway database)
         S1  in-process: c threads calling `reducer.reduce_event(engine, envelope, now)` on pre-built envelopes
         B   the same pgbench
         S2  Dramatiq: the messages enqueued on a RedisBroker (own key prefix) and a `dramatiq.Worker` with c
             threads running the `reduce_provider_status` actor from `declare_actors`, timed until every
             event's inbox row exists (a database condition with a deadline)
         C   the same pgbench
  ratio(in-process, c) = S1 ÷ mean(A, B); ratio(Dramatiq, c) = S2 ÷ mean(B, C); each pair is kept or
  discarded on its own two baselines.

events/s counts distinct events (a re-delivery costs time but is not counted) up to the commit of the last
distinct event. Once, in the last repetition: SQL round trips per event (libpq protocol trace, single thread)
and a py-spy profile of the in-process mode. A correctness gate runs over every repetition's database.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import common
from bench.common import BenchError, CpuSampler, Postgres, Repetition, fmt, fmt_spread, table

NAME = "reducer"
DESCRIPTION = ("provider.status.observed events applied/s (in-process and Dramatiq on Redis) ÷ pgbench "
               "transition.sql TPS at the same client count")
TARGET_RATIO, FLOOR_RATIO, STRETCH_RATIO = 0.50, 0.30, 1.0
MODES = ("inproc", "dramatiq")
MODE_LABEL = {"inproc": "in-process", "dramatiq": "Dramatiq/Redis"}
HEADLINE_PREFERENCE = ("dramatiq", "inproc")
PROVIDER, MODEL = "benchsim", "bench-v1"
#: a SUBMITTED task has been through CREATED..QUEUED (v3 after the API), DISPATCHING (v4) and SUBMITTED (v5)
TASK_VERSION = 5
RUNNING, SUCCEEDED = 0, 1
PHASE_NAME = {RUNNING: "RUNNING", SUCCEEDED: "SUCCEEDED"}
PROMPT = ("a red fox running through fresh snow at dusk, cinematic, 35mm film, shallow depth of field, "
          "golden hour light, slow tracking shot from the side")
PARAMS = f'{{"prompt": "{PROMPT}", "model": "{MODEL}", "duration_s": 5, "resolution": "1080p", "aspect_ratio": "16:9"}}'


# ------------------------------------------------------------------------------------------------ options
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(duration=10)
    p.add_argument("--clients", default="4,16", help="comma-separated concurrency levels (default 4,16)")
    p.add_argument("--modes", default="inproc,dramatiq", help="comma-separated: inproc, dramatiq (default both)")
    p.add_argument("--tasks", type=int, default=800,
                   help="tasks per measured point: 2 events each plus the duplicates (default 800)")
    p.add_argument("--warmup-tasks", type=int, default=40,
                   help="tasks run through each point's engine/actor before its clock starts (default 40)")
    p.add_argument("--dup-fraction", type=float, default=0.05,
                   help="re-deliveries of earlier events, as a fraction of the distinct events (default 0.05)")
    p.add_argument("--lag", type=int, default=1000,
                   help="minimum distance in the stream between a task's RUNNING and SUCCEEDED (default 1000)")
    p.add_argument("--seed", type=int, default=20261130, help="random seed of the event order")
    p.add_argument("--poll-interval", type=float, default=0.1,
                   help="seconds between the inbox-count checks that end a Dramatiq point (default 0.1)")
    p.add_argument("--point-timeout", type=int, default=240, help="deadline of one Dramatiq point, seconds")
    p.add_argument("--roundtrip-events", type=int, default=40,
                   help="events per kind in the SQL round-trip count (0 skips it)")
    p.add_argument("--no-actor-inproc", dest="actor_inproc", action="store_false",
                   help="skip the secondary point: the actor function called by plain threads (no Dramatiq)")
    p.add_argument("--profile", type=int, default=8, help="seconds of py-spy profile of the in-process mode (0 skips)")
    p.add_argument("--profile-threads", type=int, default=4, help="threads of the profiled in-process run")
    common.add_infra_args(p)


def _csv(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise BenchError(f"unknown value(s) {', '.join(bad)}; choose from {', '.join(allowed)}")
    if not items:
        raise BenchError("empty list")
    return items


# ------------------------------------------------------------------------------------------ the event stream
@dataclass(frozen=True)
class StreamItem:
    """One delivery: the RUNNING or SUCCEEDED event of task `task` (an index into the slice), or a re-delivery
    of that event (`dup`: same event id, so the inbox must drop it)."""

    task: int
    phase: int
    dup: bool = False


def build_stream(n_tasks: int, *, lag: int, dup_fraction: float, rng: random.Random) -> list[StreamItem]:
    """The delivery order of one slice.

    Tasks are visited in a random order; a task's SUCCEEDED comes at least `lag` deliveries after its RUNNING
    (RUNNING of task k+lag is interleaved with SUCCEEDED of task k), so with far fewer than `lag` events in
    flight the two events of a task never race and the stream stays one RUNNING + one SUCCEEDED per task in
    order, as a provider sends them. Then round(dup_fraction × distinct) earlier events are delivered a second
    time at a random later position, never after the last distinct event (so "every distinct event is in the
    inbox" is also the end of the stream, give or take the duplicates in flight)."""
    if n_tasks <= 0:
        return []
    order = list(range(n_tasks))
    rng.shuffle(order)
    lag = max(1, min(lag, n_tasks))
    seq = [StreamItem(order[k], RUNNING) for k in range(lag)]
    for k in range(lag, n_tasks):
        seq.append(StreamItem(order[k], RUNNING))
        seq.append(StreamItem(order[k - lag], SUCCEEDED))
    seq.extend(StreamItem(order[k], SUCCEEDED) for k in range(n_tasks - lag, n_tasks))
    n = len(seq)
    n_dup = min(max(0, round(dup_fraction * n)), n - 1)
    if n_dup == 0:
        return seq
    inserts: dict[int, list[StreamItem]] = defaultdict(list)  # q -> re-deliveries placed right before seq[q]
    for p in rng.sample(range(n - 1), n_dup):
        inserts[rng.randint(p + 1, n - 1)].append(StreamItem(seq[p].task, seq[p].phase, True))
    out: list[StreamItem] = []
    for q, item in enumerate(seq):
        out.extend(inserts.get(q, ()))
        out.append(item)
    return out


def stream_stats(items: Sequence[StreamItem]) -> dict[str, int]:
    """Deliveries, distinct events, duplicates, and the smallest RUNNING→SUCCEEDED distance of any task."""
    first: dict[tuple[int, int], int] = {}
    for pos, it in enumerate(items):
        if not it.dup:
            first[(it.task, it.phase)] = pos
    tasks = {t for t, _ in first}
    gaps = [first[(t, SUCCEEDED)] - first[(t, RUNNING)] for t in tasks if (t, RUNNING) in first
            and (t, SUCCEEDED) in first]
    return {"deliveries": len(items), "distinct": len(first), "duplicates": sum(it.dup for it in items),
            "tasks": len(tasks), "min_running_to_succeeded": min(gaps) if gaps else 0}


# ------------------------------------------------------------------------------------------ the workload
@dataclass
class Slice:
    """The tasks of one measured point and their events, in delivery order."""

    name: str
    task_ids: list[uuid.UUID]
    items: list[StreamItem]
    envelopes: list[Any]  # services.consume.Envelope, one per item (a re-delivery is the same object)
    stats: dict[str, int]

    @property
    def distinct(self) -> int:
        return self.stats["distinct"]

    def bodies(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.envelopes]


_TASK_SQL = """
INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status, version, progress,
    requested_model, selected_provider, current_attempt_no, priority, estimated_cost, reserved_amount, prompt,
    params, next_action_at, trace_id, created_at, updated_at)
SELECT t.id, %(tenant)s, %(name)s || '-' || t.n, sha256(convert_to(%(name)s || '-' || t.n, 'UTF8')), 'SUBMITTED',
       %(version)s, 0, %(model)s, %(provider)s, 1, 0, 10, 10, %(prompt)s, %(params)s::jsonb, %(poll_at)s,
       md5(t.id::text), %(now)s, %(now)s
  FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS t(id, n)
"""
_ATTEMPT_SQL = """
INSERT INTO task_attempts (id, task_id, attempt_no, provider, model, provider_request_key, provider_job_id,
    submit_state, request_fingerprint, submitted_at, next_poll_at, fencing_token, created_at, updated_at)
SELECT a.id, a.task_id, 1, %(provider)s, %(model)s, 'avd-' || replace(a.id::text, '-', ''), a.job_id, 'ACKED',
       sha256(convert_to(a.job_id, 'UTF8')), %(now)s, %(poll_at)s, a.fence, %(now)s, %(now)s
  FROM unnest(%(ids)s::uuid[], %(task_ids)s::uuid[], %(jobs)s::text[], %(fences)s::bigint[])
       AS a(id, task_id, job_id, fence)
"""


class Workload:
    """Seeds slices into one aivedio database (bulk SQL, not the API) and builds their envelopes."""

    def __init__(self, db_url: str, tenant_id: uuid.UUID, rng: random.Random, lag: int, dup_fraction: float) -> None:
        self.db_url, self.tenant_id, self.rng = db_url, tenant_id, rng
        self.lag, self.dup_fraction = lag, dup_fraction
        self.fence = 0
        self.tasks = 0
        self.slices: list[Slice] = []

    def seed(self, name: str, n_tasks: int, *, dup_fraction: float | None = None) -> Slice:
        import psycopg

        from aivedio_engine.clock import new_id

        now = datetime.now(UTC)
        task_ids = [new_id() for _ in range(n_tasks)]
        attempt_ids = [new_id() for _ in range(n_tasks)]
        jobs = [f"job-{t.hex}" for t in task_ids]
        fences = list(range(self.fence + 1, self.fence + n_tasks + 1))
        self.fence += n_tasks
        common_args = {"provider": PROVIDER, "model": MODEL, "now": now, "poll_at": now + timedelta(seconds=30)}
        with psycopg.connect(self.db_url, autocommit=True) as conn, conn.transaction():
            conn.execute(_TASK_SQL, {**common_args, "tenant": self.tenant_id, "name": name, "version": TASK_VERSION,
                                     "prompt": PROMPT, "params": PARAMS, "ids": task_ids})
            conn.execute(_ATTEMPT_SQL, {**common_args, "ids": attempt_ids, "task_ids": task_ids, "jobs": jobs,
                                        "fences": fences})
        self.tasks += n_tasks
        frac = self.dup_fraction if dup_fraction is None else dup_fraction
        items = build_stream(n_tasks, lag=self.lag, dup_fraction=frac, rng=self.rng)
        events = [(observation_envelope(t, j, RUNNING, now), observation_envelope(t, j, SUCCEEDED, now))
                  for t, j in zip(task_ids, jobs, strict=True)]
        envelopes = [events[it.task][it.phase] for it in items]
        sl = Slice(name, task_ids, items, envelopes, stream_stats(items))
        self.slices.append(sl)
        return sl

    @property
    def distinct_events(self) -> int:
        return sum(s.distinct for s in self.slices)


def observation_envelope(task_id: uuid.UUID, job_id: str, phase: int, base: datetime) -> Any:
    """The envelope the relay would publish for the outbox row `observations.record` writes for a signed
    callback with a webhook id: payload from `observations.to_payload`, aggregate = task, no tenant."""
    from aivedio_engine.clock import new_id
    from aivedio_engine.domain.events import EventType
    from aivedio_engine.domain.status import EventSource
    from aivedio_engine.providers.base import JobStatus, Observation, Output
    from aivedio_engine.services import observations
    from aivedio_engine.services.consume import Envelope

    webhook_id = f"evt-{new_id().hex}"
    if phase == RUNNING:
        obs = Observation(job_id=job_id, status=JobStatus.RUNNING, provider_updated_at=base + timedelta(seconds=5),
                          progress=10, event_id=webhook_id)
    else:
        outputs = (Output(url=f"https://cdn.example.com/out/{job_id}.mp4?X-Sig={webhook_id}",
                          expires_at=base + timedelta(hours=1), content_type="video/mp4", size_bytes=18_874_368),)
        obs = Observation(job_id=job_id, status=JobStatus.SUCCEEDED, provider_updated_at=base + timedelta(seconds=65),
                          progress=100, outputs=outputs, billed=True, event_id=webhook_id)
    payload = observations.to_payload(PROVIDER, obs, EventSource.CALLBACK, f"wh:{webhook_id}", new_id())
    return Envelope(event_id=new_id(), event_type=EventType.PROVIDER_STATUS_OBSERVED.value, schema_version=1,
                    aggregate_id=task_id, aggregate_version=0, tenant_id=None, trace_id=None, causation_id=None,
                    occurred_at=base, payload=payload)


def relay_message(envelope: Any) -> Any:
    """The Dramatiq message the outbox relay builds for this event (`worker.relay._message` on a row)."""
    from aivedio_engine.domain.events import ROUTES, EventType
    from aivedio_engine.worker.relay import _message

    row = types.SimpleNamespace(
        id=envelope.event_id, event_type=envelope.event_type, schema_version=envelope.schema_version,
        aggregate_id=envelope.aggregate_id, aggregate_version=envelope.aggregate_version,
        tenant_id=envelope.tenant_id, trace_id=envelope.trace_id, causation_id=envelope.causation_id,
        created_at=envelope.occurred_at, payload=envelope.payload,
        target=ROUTES[EventType(envelope.event_type)].actor)
    return _message(row)


# ------------------------------------------------------------------------------------------ settings / db
def reducer_settings(database_url: str, *, pool_size: int, worker_threads: int, redis_url: str, key_prefix: str,
                     data_dir: str) -> Any:
    """Distributed mode, as a deployment runs it: PostgreSQL, Redis broker and slots, default durability; the
    pool holds one connection per worker thread."""
    from aivedio_engine.config import load_settings

    overrides: dict[str, Any] = {
        "mode": "distributed", "data_dir": data_dir,
        "database": {"url": database_url, "pool_size": pool_size},
        "broker": {"kind": "redis", "url": redis_url, "worker_threads": worker_threads},
        "redis": {"url": redis_url, "key_prefix": key_prefix},
    }
    config = common.REPO / "aivedio.toml"
    return load_settings(config if config.is_file() else None, overrides)


def warm_pool(engine: Any, n: int) -> None:
    """Open `n` pooled connections at once, so no point pays for connecting."""
    conns = [engine.connect() for _ in range(n)]
    for c in conns:
        c.close()


def inbox_count(db_url: str) -> int:
    import psycopg

    from aivedio_engine.services.reducer import CONSUMER_GROUP

    with psycopg.connect(db_url, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM inbox_dedup WHERE consumer_group = %s",
                                (CONSUMER_GROUP,)).fetchone()[0])


class _TimedSampler:
    """CPU use of the groups over a point of unknown length: starts 1 s in, stops when told."""

    def __init__(self, groups: dict[str, Any]) -> None:
        self.sampler = CpuSampler(groups)
        self.started = threading.Event()
        self.timer = threading.Timer(1.0, self._start)

    def _start(self) -> None:
        self.sampler.start()
        self.started.set()

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> dict[str, float]:
        self.timer.cancel()
        self.timer.join()
        return self.sampler.stop() if self.started.is_set() else {}


def system_groups(db: str) -> dict[str, Any]:
    me = os.getpid()
    return {"bench": lambda pid, comm, cmd: pid == me,
            "redis": lambda pid, comm, cmd: comm == "redis-server",
            **common.postgres_groups([db])}


# ------------------------------------------------------------------------------------------ in-process mode
def run_inproc(engine: Any, envelopes: Sequence[Any], distinct: int, threads: int,
               sampler: _TimedSampler | None = None) -> dict[str, Any]:
    """`threads` threads take the next envelope and call `reducer.reduce_event` until the stream is empty."""
    from aivedio_engine.services import reducer

    n = len(envelopes)
    take = itertools.count()
    lock = threading.Lock()
    state: dict[str, Any] = {"processed": 0, "duplicate": 0, "t_distinct": None}
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        while True:
            i = next(take)
            if i >= n:
                return
            try:
                out = reducer.reduce_event(engine, envelopes[i], datetime.now(UTC))
            except Exception as exc:  # noqa: BLE001 - recorded, fails the gate
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            with lock:
                state[out] = state.get(out, 0) + 1
                if out == "processed" and state["processed"] == distinct:
                    state["t_distinct"] = time.monotonic()

    workers = [threading.Thread(target=work, name=f"bench-reducer-{k}", daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.monotonic()
    if sampler:
        sampler.start()
    for w in workers:
        w.join()
    t_end = time.monotonic()
    cpu = sampler.stop() if sampler else {}
    t_distinct = state["t_distinct"] or t_end
    elapsed = t_distinct - t0
    return {"threads": threads, "deliveries": n, "distinct": distinct, "processed": state["processed"],
            "duplicate": state["duplicate"], "errors": len(errors), "first_errors": errors[:3],
            "elapsed_s": round(elapsed, 3), "drain_s": round(t_end - t0, 3),
            "events_per_s": distinct / elapsed if elapsed > 0 and state["processed"] == distinct else math.nan,
            "deliveries_per_s": n / (t_end - t0) if t_end > t0 else math.nan, "cpu": cpu}


def inproc_point(settings: Any, sl: Slice, warm: Slice, threads: int, db: str) -> dict[str, Any]:
    from aivedio_engine.db.engine import make_engine

    engine = make_engine(settings)
    try:
        warm_pool(engine, threads)
        w = run_inproc(engine, warm.envelopes, warm.distinct, threads)
        res = run_inproc(engine, sl.envelopes, sl.distinct, threads, _TimedSampler(system_groups(db)))
        res["warmup"] = {k: w[k] for k in ("deliveries", "processed", "errors", "elapsed_s")}
        return res
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------------ Dramatiq mode
def _counting_middleware() -> Any:
    import dramatiq

    class Count(dramatiq.Middleware):
        """Messages the worker finished (acked), failed (will be retried or dead-lettered) or skipped."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.ok = self.failed = self.skipped = 0
            self.first_errors: list[str] = []

        def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                                  exception: BaseException | None = None) -> None:
            with self.lock:
                if exception is None:
                    self.ok += 1
                else:
                    self.failed += 1
                    if len(self.first_errors) < 3:
                        self.first_errors.append(f"{type(exception).__name__}: {exception}"[:300])

        def after_skip_message(self, broker: Any, message: Any) -> None:
            with self.lock:
                self.skipped += 1

    return Count()


def dramatiq_point(settings: Any, sl: Slice, warm: Slice, threads: int, db: str, db_url: str,
                   poll_interval: float, timeout_s: float) -> dict[str, Any]:
    """Enqueue the slice on a RedisBroker (as the relay would), then run a Dramatiq worker with `threads`
    threads until every distinct event's inbox row exists; then let it drain the re-deliveries and stop."""
    import dramatiq
    import psycopg

    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.domain.events import ROUTES, EventType
    from aivedio_engine.worker.actors import declare_actors
    from aivedio_engine.worker.broker import setup_broker

    queue = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].queue.value
    actor_name = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor
    ctx = build_context(settings)
    broker = setup_broker(settings, ctx)
    counter = _counting_middleware()
    broker.add_middleware(counter)
    actors = declare_actors(broker, ctx)
    worker = None
    out: dict[str, Any] = {"threads": threads, "deliveries": len(sl.envelopes), "distinct": sl.distinct}
    try:
        # warm the context (engine pool, statement caches, slot store) through the actor function itself
        warm_pool(ctx.engine, threads)
        fn = actors[actor_name].fn
        bodies = warm.bodies()
        take = itertools.count()

        def warm_work() -> None:
            while (i := next(take)) < len(bodies):
                fn(bodies[i])

        ws = [threading.Thread(target=warm_work, daemon=True) for _ in range(threads)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()

        t = time.monotonic()
        for env in sl.envelopes:
            broker.enqueue(relay_message(env))
        out["enqueue_s"] = round(time.monotonic() - t, 3)
        target = inbox_count(db_url) + sl.distinct
        broker.emit_after("process_boot")  # as the runtime does: TimeLimit starts its watchdog on it
        worker = dramatiq.Worker(broker, worker_threads=threads,
                                 worker_timeout=settings.broker.consumer_idle_timeout_ms)
        sampler = _TimedSampler(system_groups(db))
        with psycopg.connect(db_url, autocommit=True) as poll:
            count_sql = "SELECT count(*) FROM inbox_dedup WHERE consumer_group = 'reducer'"
            t0 = time.monotonic()
            worker.start()
            sampler.start()
            deadline = t0 + timeout_s
            seen = 0
            while True:
                seen = int(poll.execute(count_sql).fetchone()[0])
                if seen >= target or time.monotonic() > deadline:
                    break
                time.sleep(poll_interval)
            t_distinct = time.monotonic()
            cpu = sampler.stop()
        out["timed_out"] = seen < target
        if not out["timed_out"]:
            broker.join(queue, timeout=int(max(10.0, deadline - time.monotonic()) * 1000))
            worker.join()
        t_end = time.monotonic()
        elapsed = t_distinct - t0
        out.update({
            "elapsed_s": round(elapsed, 3), "drain_s": round(t_end - t0, 3), "inbox_rows_seen": seen,
            "inbox_rows_expected": target,
            "events_per_s": sl.distinct / elapsed if not out["timed_out"] and elapsed > 0 else math.nan,
            "deliveries_per_s": len(sl.envelopes) / (t_end - t0) if t_end > t0 else math.nan,
            "acked": counter.ok, "failed": counter.failed, "skipped": counter.skipped,
            "first_errors": counter.first_errors, "cpu": cpu,
            "worker_timeout_ms": settings.broker.consumer_idle_timeout_ms,
        })
        return out
    finally:
        if worker is not None:
            worker.stop(timeout=30_000)
        broker.close()
        ctx.close()


def actor_inproc_point(settings: Any, sl: Slice, warm: Slice, threads: int, db: str) -> dict[str, Any]:
    """The `reduce_provider_status` actor function (Envelope.parse + reduce_event + attempt_of +
    release_if_finished) called by `threads` plain threads on the message bodies: the actor's own cost without
    Dramatiq's transport, to split the Dramatiq figure. Timed to the end of the stream."""
    from dramatiq.brokers.stub import StubBroker

    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.domain.events import ROUTES, EventType
    from aivedio_engine.worker.actors import declare_actors

    ctx = build_context(settings)
    try:
        fn = declare_actors(StubBroker(), ctx)[ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor].fn
        warm_pool(ctx.engine, threads)

        def drive(bodies: list[dict[str, Any]], sampler: _TimedSampler | None) -> dict[str, Any]:
            take, errors = itertools.count(), []

            def work() -> None:
                while (i := next(take)) < len(bodies):
                    try:
                        fn(bodies[i])
                    except Exception as exc:  # noqa: BLE001 - recorded, fails the gate
                        errors.append(f"{type(exc).__name__}: {exc}"[:300])

            ws = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
            t0 = time.monotonic()
            for w in ws:
                w.start()
            if sampler:
                sampler.start()
            for w in ws:
                w.join()
            elapsed = time.monotonic() - t0
            return {"elapsed_s": round(elapsed, 3), "errors": len(errors), "first_errors": errors[:3],
                    "cpu": sampler.stop() if sampler else {}}

        drive(warm.bodies(), None)
        res = drive(sl.bodies(), _TimedSampler(system_groups(db)))
        res.update(threads=threads, deliveries=len(sl.envelopes), distinct=sl.distinct,
                   events_per_s=sl.distinct / res["elapsed_s"] if res["elapsed_s"] > 0 else math.nan)
        return res
    finally:
        ctx.close()


# ------------------------------------------------------------------------------------------ round trips
_RFQ = re.compile(r"^B\t\d+\tReadyForQuery\b")
_FRONT = re.compile(r"^F\t\d+\t(\w+)\t?(.*)$", re.S)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def parse_trace(lines: Sequence[str], prepared: dict[str, str]) -> list[str]:
    """libpq protocol trace → one label (the SQL, or BEGIN/COMMIT) per client round trip, i.e. per
    ReadyForQuery the backend sent. `prepared` maps statement names to their SQL across calls."""
    records: list[str] = []
    for line in lines:  # a query text with newlines continues on the next lines of the trace
        if line.startswith(("F\t", "B\t")) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    cycles: list[str] = []
    label: str | None = None
    for line in records:
        if _RFQ.match(line):
            cycles.append(label or "?")
            label = None
            continue
        m = _FRONT.match(line)
        if not m:
            continue
        kind, rest = m.groups()
        quoted = _QUOTED.findall(rest)
        if kind == "Query" and label is None:
            label = quoted[0] if quoted else rest
        elif kind == "Parse" and len(quoted) >= 2:
            if quoted[0]:
                prepared[quoted[0]] = quoted[1]
            if label is None:
                label = quoted[1]
        elif kind == "Bind" and len(quoted) >= 2 and label is None:
            label = prepared.get(quoted[1], f"prepared {quoted[1]}")
    return cycles


def sql_label(sql: str) -> str:
    """'INSERT INTO inbox_dedup (...) ...' → 'INSERT inbox_dedup'; keeps FOR UPDATE / ON CONFLICT visible."""
    s = " ".join(sql.split())
    if s in ("", ";"):
        return "pre-ping (empty query)"
    head = s.split(" ", 1)[0].upper()
    if head in ("BEGIN", "COMMIT", "ROLLBACK") or not s:
        return head or "?"
    if "pg_notify" in s:
        return "SELECT pg_notify"
    m = {"INSERT": re.search(r"INSERT INTO (\w+)", s, re.I), "UPDATE": re.search(r"UPDATE (\w+)", s, re.I),
         "DELETE": re.search(r"DELETE FROM (\w+)", s, re.I), "SELECT": re.search(r" FROM (\w+)", s, re.I)}.get(head)
    label = f"{head} {m.group(1)}" if m else s[:40]
    if head == "SELECT" and re.search(r"FOR UPDATE", s, re.I):
        label += " FOR UPDATE"
    if head == "INSERT" and re.search(r"ON CONFLICT", s, re.I):
        label += " ON CONFLICT"
    return label


def count_round_trips(settings: Any, work: Workload, per_kind: int, workdir: Path) -> dict[str, Any]:
    """SQL round trips per event on one connection, one thread: `reduce_event` alone, and the whole actor
    (`reduce_provider_status`: reduce_event + attempt_of + release_if_finished), for RUNNING, SUCCEEDED and a
    re-delivery; plus the Redis commands the actor sends. Counted from libpq's protocol trace."""
    import redis
    import sqlalchemy as sa
    from dramatiq.brokers.stub import StubBroker
    from psycopg import pq

    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.domain.events import ROUTES, EventType
    from aivedio_engine.services import reducer
    from aivedio_engine.worker.actors import declare_actors

    ctx = build_context(settings)
    pgconns: list[Any] = []
    sa.event.listen(ctx.engine, "connect", lambda dbapi_conn, rec: pgconns.append(dbapi_conn.pgconn))
    fn = declare_actors(StubBroker(), ctx)[ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor].fn
    # each path is warmed by itself: psycopg prepares a statement on its 6th execution and forgets them all on
    # every ROLLBACK, so what one path leaves prepared is not the other's steady state
    warm = work.seed("rt-warm", 16, dup_fraction=0.0)
    reduce_sl = work.seed("rt-reduce", per_kind, dup_fraction=0.0)
    actor_sl = work.seed("rt-actor", per_kind, dup_fraction=0.0)
    prepared: dict[str, str] = {}
    redis_calls = Counter()
    original = redis.Redis.execute_command

    def counting(self: Any, *args: Any, **kw: Any) -> Any:
        redis_calls[str(args[0]).upper() if args else "?"] += 1
        return original(self, *args, **kw)

    def by_phase(sl: Slice, phase: int) -> list[Any]:
        return [e for it, e in zip(sl.items, sl.envelopes, strict=True) if it.phase == phase and not it.dup]

    def traced(label: str, calls: list[Callable[[], Any]]) -> dict[str, Any]:
        files = []
        for k, pgc in enumerate(pgconns):
            f = (workdir / f"trace-{label}-{k}.txt").open("w")
            pgc.trace(f.fileno())
            pgc.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            files.append((pgc, f))
        redis_calls.clear()
        redis.Redis.execute_command = counting  # type: ignore[method-assign]
        try:
            for call in calls:
                call()
        finally:
            redis.Redis.execute_command = original  # type: ignore[method-assign]
            for pgc, f in files:
                pgc.untrace()
                f.close()
        cycles: list[str] = []
        parses = 0
        for _, f in files:
            lines = Path(f.name).read_text(errors="replace").splitlines()
            parses += sum(1 for ln in lines if re.match(r"^F\t\d+\tParse\b", ln))
            cycles += parse_trace(lines, prepared)
        n = len(calls)
        per_label = Counter(sql_label(c) for c in cycles)
        return {"events": n, "round_trips": len(cycles), "per_event": round(len(cycles) / n, 2),
                "parse_messages_per_event": round(parses / n, 2),
                "statements": {k: round(v / n, 2) for k, v in per_label.most_common()},
                "redis_commands_per_event": round(sum(redis_calls.values()) / n, 2),
                "redis_commands": {k: round(v / n, 2) for k, v in redis_calls.most_common()}}

    try:
        warm_pool(ctx.engine, 1)
        now = lambda: datetime.now(UTC)  # noqa: E731
        half = len(warm.task_ids) // 2
        warm_reduce = [e for it, e in zip(warm.items, warm.envelopes, strict=True) if it.task < half]
        warm_actor = [e for it, e in zip(warm.items, warm.envelopes, strict=True) if it.task >= half]
        if not pgconns:
            raise BenchError("round-trip count: no traced connection")
        # warm-ups are traced too, only so that statements prepared there get their SQL as a label
        traced("r-warm", [lambda e=e: reducer.reduce_event(ctx.engine, e, now()) for e in warm_reduce])
        out: dict[str, Any] = {"connections": len(pgconns)}
        runs = by_phase(reduce_sl, RUNNING)
        out["reduce_event RUNNING"] = traced("r-run", [lambda e=e: reducer.reduce_event(ctx.engine, e, now())
                                                        for e in runs])
        out["reduce_event SUCCEEDED"] = traced("r-succ", [lambda e=e: reducer.reduce_event(ctx.engine, e, now())
                                                          for e in by_phase(reduce_sl, SUCCEEDED)])
        out["reduce_event re-delivery"] = traced("r-dup", [lambda e=e: reducer.reduce_event(ctx.engine, e, now())
                                                           for e in runs])
        traced("a-warm", [lambda b=e.to_dict(): fn(b) for e in warm_actor])  # noqa: B008 - serialized before the traced call
        runs = by_phase(actor_sl, RUNNING)
        out["actor RUNNING"] = traced("a-run", [lambda b=e.to_dict(): fn(b) for e in runs])  # noqa: B008 - serialized before the traced call
        out["actor SUCCEEDED"] = traced("a-succ", [lambda b=e.to_dict(): fn(b) for e in by_phase(actor_sl, SUCCEEDED)])  # noqa: B008 - serialized before the traced call
        out["actor re-delivery"] = traced("a-dup", [lambda b=e.to_dict(): fn(b) for e in runs])  # noqa: B008 - serialized before the traced call
        out["connections"] = len(pgconns)
        return out
    finally:
        ctx.close()


# ------------------------------------------------------------------------------------------ profile
def profile_inproc(settings: Any, sl: Slice, threads: int, seconds: int, workdir: Path) -> dict[str, Any]:
    """py-spy record --gil (Python CPU only) of this process while `threads` threads reduce the slice."""
    from bench.api_create import summarize_profile

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return {"skipped": "py-spy not installed (.venv/bin/pip install py-spy)"}
    from aivedio_engine.db.engine import make_engine

    engine = make_engine(settings)
    raw = workdir / "pyspy-reducer.txt"
    result: dict[str, Any] = {}
    try:
        warm_pool(engine, threads)
        load = threading.Thread(target=lambda: result.setdefault(
            "load", run_inproc(engine, sl.envelopes, sl.distinct, threads)))
        load.start()
        time.sleep(1.0)
        spy = subprocess.run([pyspy, "record", "--gil", "-r", "200", "-d", str(seconds), "-f", "raw", "-o", str(raw),
                              "-p", str(os.getpid())], capture_output=True, text=True, timeout=seconds + 60)
        load.join()
    finally:
        engine.dispose()
    stacks: Counter[str] = Counter()
    if raw.exists():
        for line in raw.read_text(errors="replace").splitlines():
            stack, _, n = line.rpartition(" ")
            if stack and n.isdigit():
                stacks[stack] += int(n)
    if not stacks:
        return {"skipped": f"py-spy produced no samples: {spy.stderr.strip()[-300:]}", "load": result.get("load")}
    load_doc = result.get("load", {})
    return {**summarize_profile(stacks), "seconds": seconds, "threads": threads,
            "load": {k: load_doc.get(k) for k in ("deliveries", "processed", "errors", "elapsed_s", "events_per_s")}}


# ------------------------------------------------------------------------------------------ correctness
def correctness_gate(db_url: str, work: Workload, point_errors: list[str]) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("""
            WITH ev AS (SELECT task_id,
                               count(*) FILTER (WHERE outcome = 'applied' AND to_status = 'RUNNING') AS running,
                               count(*) FILTER (WHERE outcome = 'applied'
                                                  AND to_status = 'OUTPUT_FETCHING') AS fetching,
                               count(*) FILTER (WHERE outcome = 'applied') AS applied
                          FROM task_state_events GROUP BY task_id),
                 fo AS (SELECT aggregate_id, count(*) AS n FROM outbox_events
                         WHERE event_type = 'fetch.requested' GROUP BY aggregate_id)
            SELECT (SELECT count(*) FROM generation_tasks),
                   (SELECT count(*) FROM generation_tasks WHERE status <> 'OUTPUT_FETCHING'),
                   (SELECT count(*) FROM generation_tasks WHERE version <> %(v)s),
                   (SELECT count(*) FROM task_attempts WHERE submit_state <> 'SUCCEEDED'),
                   (SELECT count(*) FROM generation_tasks t LEFT JOIN ev ON ev.task_id = t.id
                     WHERE coalesce(ev.running, 0) <> 1 OR coalesce(ev.fetching, 0) <> 1
                        OR coalesce(ev.applied, 0) <> 2),
                   (SELECT count(*) FROM inbox_dedup WHERE consumer_group = 'reducer'),
                   (SELECT coalesce(sum(n), 0) FROM fo),
                   (SELECT count(*) FROM generation_tasks t LEFT JOIN fo ON fo.aggregate_id = t.id
                     WHERE coalesce(fo.n, 0) <> 1),
                   (SELECT count(*) FROM dead_letters),
                   (SELECT count(*) FROM task_state_events)
        """, {"v": TASK_VERSION + 2}).fetchone()
        (tasks, not_fetching, bad_version, attempts_not_done, bad_events, inbox, fetch_rows, bad_fetch, dead,
         events) = (int(x) for x in row)
        not_applied = dict(conn.execute(
            "SELECT outcome, count(*) FROM task_state_events WHERE outcome <> 'applied' GROUP BY outcome").fetchall())
        digests = dict(conn.execute(
            "SELECT coalesce(result_digest, '(none)'), count(*) FROM inbox_dedup WHERE consumer_group = 'reducer' "
            "GROUP BY 1").fetchall())
    expected_inbox = work.distinct_events
    checks = {
        "tasks == seeded": tasks == work.tasks,
        "every task OUTPUT_FETCHING at version +2": not_fetching == 0 and bad_version == 0,
        "every attempt SUCCEEDED": attempts_not_done == 0,
        "each task: exactly 1 applied RUNNING and 1 applied OUTPUT_FETCHING event": bad_events == 0,
        "re-deliveries applied nothing (any extra event row is not 'applied')": events - 2 * tasks == sum(
            not_applied.values()),
        "inbox rows == distinct events": inbox == expected_inbox,
        "fetch.requested outbox rows == tasks, one per task": fetch_rows == tasks and bad_fetch == 0,
        "no dead letter, no consumer error": dead == 0 and not point_errors,
    }
    return {"ok": all(checks.values()), "checks": checks, "tasks": tasks, "tasks_seeded": work.tasks,
            "tasks_not_output_fetching": not_fetching, "tasks_bad_version": bad_version,
            "attempts_not_succeeded": attempts_not_done, "tasks_bad_events": bad_events, "state_events": events,
            "state_events_not_applied": not_applied, "inbox_rows": inbox, "distinct_events": expected_inbox,
            "inbox_result_digests": digests, "fetch_requested_rows": fetch_rows, "tasks_bad_fetch": bad_fetch,
            "dead_letters": dead, "errors": point_errors[:5]}


# ------------------------------------------------------------------------------------------ orchestration
@dataclass
class Config:
    clients: list[int]
    modes: list[str]
    tasks: int
    warmup_tasks: int
    duration: int
    redis_url: str
    key_prefix: str
    poll_interval: float
    point_timeout: int
    workdir: Path
    lag: int
    dup_fraction: float
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)


def run_repetition(index: int, cfg: Config, pg: Postgres, pgb_db: str, sys_db: str, last: bool,
                   args: argparse.Namespace) -> tuple[dict[str, Any], dict[tuple[str, int], Repetition]]:
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db import migrate

    db_url = pg.url(sys_db, driver="postgresql")
    sa_url = pg.url(sys_db)
    rep_doc: dict[str, Any] = {"index": index, "database": sys_db, "chains": {}}
    reps: dict[tuple[str, int], Repetition] = {}
    point_errors: list[str] = []

    def settings_for(threads: int) -> Any:
        return reducer_settings(sa_url, pool_size=max(1, threads), worker_threads=max(1, threads),
                                redis_url=cfg.redis_url, key_prefix=cfg.key_prefix, data_dir=str(cfg.workdir / "data"))

    t = time.monotonic()
    pg.create_db(sys_db)
    ctx = build_context(settings_for(2))
    try:
        migrate.upgrade(ctx.engine)
        tenant = ctx.tenants.create(f"bench-reducer-{index}", Decimal(10) ** 9)
    finally:
        ctx.close()
    work = Workload(db_url, tenant.id, random.Random(cfg.seed + index), cfg.lag, cfg.dup_fraction)
    slices = {(m, c): (work.seed(f"{m}-c{c}", cfg.tasks), work.seed(f"{m}-c{c}-warm", cfg.warmup_tasks))
              for c in cfg.clients for m in cfg.modes}
    pg.psql(sys_db, "VACUUM ANALYZE")
    rep_doc["setup_s"] = round(time.monotonic() - t, 1)
    rep_doc["stream"] = next(iter(slices.values()))[0].stats
    _log(f"rep {index}: {sys_db} migrated, {work.tasks:,} tasks seeded, "
         f"{sum(s.stats['deliveries'] for s, _ in slices.values()):,} deliveries built ({rep_doc['setup_s']} s)")

    script = common.SQL_DIR / "transition.sql"
    for c in cfg.clients:
        chain: dict[str, Any] = {}
        _log(f"rep {index} c={c}: pgbench A")
        baselines = [common.run_pgbench(pg, pgb_db, script, c, cfg.duration, sample_cpu=True)]
        chain["A"] = baselines[0].as_dict()
        for k, mode in enumerate(cfg.modes):
            sl, warm = slices[(mode, c)]
            pg.checkpoint()
            _log(f"rep {index} c={c}: {MODE_LABEL[mode]} ({sl.stats['deliveries']:,} deliveries, "
                 f"{sl.distinct:,} distinct) after A/B {baselines[-1].tps:,.0f} TPS")
            try:
                if mode == "inproc":
                    res = inproc_point(settings_for(c), sl, warm, c, sys_db)
                    if res["errors"] or res["warmup"]["errors"]:
                        point_errors += res["first_errors"] or [f"{mode} c={c}: warm-up errors"]
                else:
                    res = dramatiq_point(settings_for(c), sl, warm, c, sys_db, db_url, cfg.poll_interval,
                                         cfg.point_timeout)
                    if res["failed"] or res["skipped"] or res["timed_out"]:
                        point_errors += res["first_errors"] or [f"{mode} c={c}: timed out or skipped messages"]
            except Exception as exc:  # noqa: BLE001 - the point is lost, the run goes on and the gate fails
                res = {"error": f"{type(exc).__name__}: {exc}", "events_per_s": math.nan}
                point_errors.append(f"{mode} c={c}: {res['error']}")
                _log(f"rep {index} c={c}: {mode} FAILED: {res['error']}")
            chain[mode] = res
            label = "BC"[k]
            _log(f"rep {index} c={c}: {res.get('events_per_s', math.nan):,.0f} events/s "
                 f"({res.get('elapsed_s', '?')} s); pgbench {label}")
            baselines.append(common.run_pgbench(pg, pgb_db, script, c, cfg.duration, sample_cpu=True))
            chain[label] = baselines[-1].as_dict()
            rep = Repetition(index, baselines[-2].tps, res.get("events_per_s", math.nan), baselines[-1].tps,
                             raw={"mode": mode, "clients": c})
            reps[(mode, c)] = rep
            _log(f"rep {index} c={c}: {mode} ratio {rep.ratio:.3f} (baselines {rep.a:,.0f} / {rep.b:,.0f}, "
                 f"differ {100 * rep.divergence:.1f} %{'' if rep.kept else ', DISCARDED'})")
        rep_doc["chains"][str(c)] = chain

    if last:
        if args.roundtrip_events:
            _log(f"rep {index}: SQL round trips per event ({args.roundtrip_events} events per kind, 1 thread)")
            try:
                cfg.extra["round_trips"] = count_round_trips(settings_for(1), work, args.roundtrip_events, cfg.workdir)
            except Exception as exc:  # noqa: BLE001
                cfg.extra["round_trips"] = {"skipped": f"{type(exc).__name__}: {exc}"}
                point_errors.append(f"round trips: {exc}")
        if args.actor_inproc:
            c = args.profile_threads
            sl, warm = work.seed("actor-inproc", cfg.tasks), work.seed("actor-inproc-warm", cfg.warmup_tasks)
            _log(f"rep {index}: actor function in-process, {c} threads, no Dramatiq ({sl.stats['deliveries']:,} "
                 f"deliveries)")
            try:
                res = actor_inproc_point(settings_for(c), sl, warm, c, sys_db)
                if res["errors"]:
                    point_errors += res["first_errors"]
            except Exception as exc:  # noqa: BLE001
                res = {"error": f"{type(exc).__name__}: {exc}"}
                point_errors.append(f"actor in-process: {res['error']}")
            cfg.extra["actor_inproc"] = res
            _log(f"rep {index}: actor function in-process {res.get('events_per_s', math.nan):,.0f} events/s")
        if args.profile:
            rate = next((r.system for (m, c), r in reps.items() if m == "inproc" and math.isfinite(r.system)), 300.0)
            n = max(200, int(rate * (args.profile + 4) / 2))
            sl = work.seed("profile", n)
            _log(f"rep {index}: py-spy {args.profile} s of the in-process mode, {args.profile_threads} threads "
                 f"({sl.stats['deliveries']:,} deliveries)")
            prof = profile_inproc(settings_for(args.profile_threads), sl, args.profile_threads, args.profile,
                                  cfg.workdir)
            cfg.extra["profile"] = prof
            if (prof.get("load") or {}).get("errors"):
                point_errors.append("profile run: consumer errors")

    rep_doc["gate"] = correctness_gate(db_url, work, point_errors)
    _log(f"rep {index}: correctness gate {'PASS' if rep_doc['gate']['ok'] else 'FAIL'}")
    return rep_doc, reps


def run(args: argparse.Namespace) -> int:
    import redis

    cfg_clients = [int(x) for x in _csv(args.clients)]
    modes = _csv(args.modes, MODES)
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("pgbench", "psql"):
        common.need_tool(tool)
    try:
        redis.Redis.from_url(args.redis_url).ping()
    except Exception as exc:  # noqa: BLE001
        if "dramatiq" in modes:
            raise BenchError(f"Redis at {args.redis_url} unreachable: {exc}") from None
    sync_commit = pg.setting("synchronous_commit")
    started = common.utc_now()
    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    pgb_db = f"bench_pgb_red_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-reducer-"))
    cfg = Config(clients=cfg_clients, modes=modes, tasks=args.tasks, warmup_tasks=args.warmup_tasks,
                 duration=args.duration, redis_url=args.redis_url, key_prefix=f"bench-reducer-{tag}:",
                 poll_interval=args.poll_interval, point_timeout=args.point_timeout, workdir=workdir,
                 lag=args.lag, dup_fraction=args.dup_fraction, seed=args.seed)
    doc: dict[str, Any] = {
        "benchmark": NAME, "date": started, "machine": common.machine_info(), "git": common.git_info(),
        "config": {"reps": args.reps, "duration_s": args.duration, "clients": cfg.clients, "modes": modes,
                   "tasks_per_point": args.tasks, "warmup_tasks_per_point": args.warmup_tasks,
                   "events_per_task": 2, "dup_fraction": args.dup_fraction, "lag": args.lag, "seed": args.seed,
                   "poll_interval_s": args.poll_interval, "synchronous_commit": sync_commit,
                   "redis_key_prefix": cfg.key_prefix, "wait_quiet_s": args.wait_quiet,
                   "baseline": "pgbench -n -M prepared -T D -c C -j 2 -f bench/sql/transition.sql "
                               "(schema + 100k tasks: bench/sql/create_task_schema.sql)",
                   "chain": "per C: A, in-process, B, Dramatiq, C; in-process ÷ mean(A, B), Dramatiq ÷ mean(B, C)",
                   "pool_size": "= worker threads", "discard_rule":
                       f"max(A,B)/min(A,B) - 1 > {common.MAX_BASELINE_DIVERGENCE}"},
        "targets": {"ratio": TARGET_RATIO, "floor": FLOOR_RATIO, "stretch_micro_batching": STRETCH_RATIO},
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
    all_reps: dict[tuple[str, int], list[Repetition]] = defaultdict(list)
    rep_docs: list[dict[str, Any]] = []
    created: list[str] = []
    code = 0
    _log(f"baseline database {pgb_db}; Redis prefix {cfg.key_prefix}; workdir {workdir}")
    try:
        pg.create_db(pgb_db)
        created.append(pgb_db)
        pg.psql(pgb_db, file=common.SQL_DIR / "create_task_schema.sql")
        for i in range(1, args.reps + 1):
            quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
            sys_db = f"bench_red_{tag}_r{i}"
            created.append(sys_db)
            rep_doc, reps = run_repetition(i, cfg, pg, pgb_db, sys_db, i == args.reps, args)
            rep_doc["quiet_before"] = quiet
            rep_docs.append(rep_doc)
            for key, r in reps.items():
                all_reps[key].append(r)
            if not args.keep_dbs:
                pg.drop_db(sys_db)
                created.remove(sys_db)
        doc.update(summary_doc(all_reps, cfg), repetitions=rep_docs, extra=cfg.extra)
        gate_ok = all(r["gate"]["ok"] for r in rep_docs)
        doc["gate"] = {"ok": gate_ok}
        headline = doc["summary"]["headline"]
        if not gate_ok:
            code = 1
        elif not any(common.kept(all_reps[(headline, c)]) for c in cfg.clients):
            code = 2
    except BaseException as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc.setdefault("repetitions", rep_docs)
        raise
    finally:
        if not args.keep_dbs:
            for db in created:
                try:
                    pg.drop_db(db)
                except BenchError as exc:
                    print(f"warning: could not drop {db}: {exc}", file=sys.stderr)
        try:
            doc["redis_keys_deleted"] = common.redis_cleanup(cfg.redis_url, cfg.key_prefix)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: Redis cleanup of {cfg.key_prefix}* failed: {exc}", file=sys.stderr)
        doc["finished"] = common.utc_now()
        path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path(NAME), doc)
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc))
    print(f"\nJSON: {path}")
    return code


def summary_doc(all_reps: dict[tuple[str, int], list[Repetition]], cfg: Config) -> dict[str, Any]:
    points: dict[str, Any] = {}
    for (mode, c), reps in sorted(all_reps.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1])):
        def s(fn: Callable[[Repetition], float]) -> dict[str, Any] | None:
            x = common.summarize_kept(reps, fn)  # noqa: B023 - called within this iteration
            return x.as_dict() if x else None

        points[f"{mode}_c{c}"] = {
            "mode": mode, "clients": c, "kept": len(common.kept(reps)), "total": len(reps),
            "ratio": s(lambda r: r.ratio), "events_per_s": s(lambda r: r.system),
            "pgbench_tps_mean": s(lambda r: (r.a + r.b) / 2),
            "per_rep": [r.as_dict() for r in reps],
        }

    def works(mode: str) -> bool:
        return mode in cfg.modes and all(math.isfinite(r.system) for c in cfg.clients for r in all_reps[(mode, c)])

    headline = next((m for m in HEADLINE_PREFERENCE if works(m)), cfg.modes[0])
    return {"summary": {"headline": headline, "points": points}}


# ------------------------------------------------------------------------------------------------ output
def render(doc: dict[str, Any]) -> str:
    m, g, cfg = doc["machine"], doc["git"], doc["config"]
    head = (f"reducer — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
            f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
            f"synchronous_commit={cfg['synchronous_commit']}, {cfg['reps']} reps, pgbench {cfg['duration_s']} s per "
            f"baseline, {cfg['tasks_per_point']:,} tasks per point (2 events each + {100 * cfg['dup_fraction']:.0f} % "
            f"re-deliveries)")
    out = [head]
    sm = doc.get("summary")
    if not sm:
        return "\n".join(out + ["", f"no result: {doc.get('error', '?')}"])
    headline = sm["headline"]
    out += ["", f"Headline mode: {MODE_LABEL[headline]}."]

    def sp(d: dict[str, Any] | None) -> common.Spread | None:
        return common.Spread(d["median"], d["min"], d["max"], d["n"]) if d else None

    rows = []
    for p in sm["points"].values():
        mark = " ★" if p["mode"] == headline else ""
        r_med, r_spread = fmt_spread(sp(p["ratio"]), 3)
        e_med, e_spread = fmt_spread(sp(p["events_per_s"]))
        b_med, _ = fmt_spread(sp(p["pgbench_tps_mean"]))
        rows.append([f"{MODE_LABEL[p['mode']]}{mark}", p["clients"], r_med, r_spread, e_med, e_spread, b_med,
                     f"≥ {TARGET_RATIO} (floor {FLOOR_RATIO})", f"{p['kept']}/{p['total']}"])
    out += ["", table(["mode", "c", "ratio median", "ratio spread", "events/s median", "events/s spread",
                       "pgbench TPS mean(A,B) median", "target", "kept reps"], rows)]

    modes_run = [m_ for m_ in MODES if m_ in cfg["modes"]]
    hdr, per = ["rep", "c", "pgbench A"], []
    for k, mode in enumerate(modes_run):
        hdr += [f"{MODE_LABEL[mode]} events/s", f"pgbench {'BC'[k]}"]
    for rep in doc.get("repetitions", []):
        for c, chain in rep["chains"].items():
            row = [rep["index"], c, fmt((chain.get("A") or {}).get("tps"))]
            for k, mode in enumerate(modes_run):
                row += [fmt((chain.get(mode) or {}).get("events_per_s")), fmt((chain.get("BC"[k]) or {}).get("tps"))]
            per.append(row)
    if per:
        out += ["", "Per repetition, in run order (chain A → " + " → ".join(
            f"{MODE_LABEL[m_]} → {'BC'[k]}" for k, m_ in enumerate(modes_run)) + "):", table(hdr, per)]
    ratio_rows = []
    for p in sm["points"].values():
        for r in p["per_rep"]:
            ratio_rows.append([r["index"], MODE_LABEL[p["mode"]], p["clients"], fmt(r["baseline_a"]), fmt(r["system"]),
                               fmt(r["baseline_b"]), f"{100 * (r['baseline_divergence'] or math.inf):.1f} %",
                               fmt(r["ratio"], 3), "yes" if r["kept"] else "DISCARDED"])
    ratio_rows.sort(key=lambda x: (x[0], x[2], x[1]))
    out += ["", "Ratios per repetition (each against the two pgbench runs around it):",
            table(["rep", "mode", "c", "baseline before", "events/s", "baseline after", "A/B differ", "ratio", "kept"],
                  ratio_rows)]

    cpu_rows = []
    for rep in doc.get("repetitions", []):
        for c, chain in rep["chains"].items():
            for name, point in chain.items():
                cpu = point.get("cpu") if isinstance(point, dict) else None
                if not cpu:
                    continue
                rate = point.get("tps") or point.get("events_per_s") or 0
                label = MODE_LABEL.get(name, f"pgbench {name}")

                def cell(*groups: str) -> str:
                    vals = [cpu[f"{g_}_cores"] for g_ in groups if f"{g_}_cores" in cpu]  # noqa: B023 - called within this iteration
                    if not vals:
                        return "—"
                    cores = sum(vals)
                    return f"{cores:.2f} ({cores * 1e6 / rate:.0f})" if rate and math.isfinite(rate) else f"{cores:.2f}"  # noqa: B023 - called within this iteration

                cpu_rows.append([f"rep {rep['index']} c={c} {label}", fmt(rate),
                                 f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %", f"{cpu['other_cores']:.2f}",
                                 cell("pgbench", "bench"), cell("postgres"), cell("pg_shared"), cell("redis")])
    if cpu_rows:
        out += ["", "Where the CPU goes (cores, sampled from 1 s into each point to its end; CPU µs per event or "
                    "transaction in brackets; 'client' = pgbench or this Python process; 'other' = everything else "
                    "on the shared box):",
                table(["point", "rate/s", "box busy", "other", "client", "PG backends", "PG shared", "redis"],
                      cpu_rows)]

    extra = doc.get("extra", {})
    ai = extra.get("actor_inproc")
    reps_doc = doc.get("repetitions", [])
    if ai and "events_per_s" in ai and reps_doc:
        c = str(ai["threads"])
        chain = reps_doc[-1]["chains"].get(c, {})
        rows = []
        for label, point in ((f"reduce_event, {c} threads (in-process point)", chain.get("inproc")),
                             (f"actor function, {c} plain threads (no broker)", ai),
                             (f"Dramatiq worker, {c} threads (Dramatiq point)", chain.get("dramatiq"))):
            if not point or "events_per_s" not in point:
                continue
            cpu, rate = point.get("cpu") or {}, point["events_per_s"]

            def us(g_: str, cpu: dict[str, float] = cpu, rate: float = rate) -> str:
                cores = cpu.get(g_ + "_cores")
                return f"{cores * 1e6 / rate:,.0f}" if cores is not None and rate and math.isfinite(rate) else "—"

            rows.append([label, fmt(rate), us("bench"), us("postgres"), us("redis")])
        out += ["", f"Where the Dramatiq figure goes (last repetition, c={c}; CPU µs per event):",
                table(["path", "events/s", "Python process", "PG backends", "redis"], rows)]
    rt = extra.get("round_trips")
    if rt and "skipped" not in rt:
        rows = [[k, v["per_event"], v["parse_messages_per_event"],
                 ", ".join(f"{s} ×{n:g}" for s, n in v["statements"].items()), v["redis_commands_per_event"]]
                for k, v in rt.items() if isinstance(v, dict)]
        out += ["", "Round trips per event (1 thread, 1 connection, libpq protocol trace, after a warm-up on the same "
                    "path; pgbench's transition.sql is 7 round trips, all prepared):",
                table(["path", "PG round trips", "Parse msgs", "what they are (per event)", "Redis commands"], rows)]
    elif rt:
        out += ["", f"round trips: {rt['skipped']}"]
    prof = extra.get("profile")
    if prof and "top_self" in prof:
        load = prof.get("load") or {}
        out += ["", f"py-spy --gil (Python CPU only), in-process mode, {prof['threads']} threads, {prof['seconds']} s: "
                    f"{prof['samples']} samples ({prof['samples'] - prof['cpu_samples']} blocking leaves dropped); "
                    f"the profiled run did {fmt(load.get('events_per_s'))} events/s. Top 10 by own time:",
                table(["#", "frame", "% of CPU samples"], [[i + 1, f["frame"], f["pct"]]
                                                          for i, f in enumerate(prof["top_self"])]),
                "", "Top 10 by inclusive CPU time (thread wrappers left out):",
                table(["#", "frame", "% of CPU samples"], [[i + 1, f["frame"], f["pct"]]
                                                          for i, f in enumerate(prof["top_inclusive"])]),
                "", "Own CPU time by package: " + ", ".join(f"{p['package']} {p['pct']} %"
                                                            for p in prof["self_by_package"])]
    elif prof:
        out += ["", f"profile: {prof.get('skipped')}"]

    for rep in doc.get("repetitions", []):
        gt = rep.get("gate")
        if not gt:
            continue
        out += ["", f"Correctness gate, rep {rep['index']}: {'PASS' if gt['ok'] else 'FAIL'} — tasks {gt['tasks']:,}, "
                    f"inbox rows {gt['inbox_rows']:,} (distinct events {gt['distinct_events']:,}), state events "
                    f"{gt['state_events']:,} (not applied: {gt['state_events_not_applied'] or 0}), fetch.requested "
                    f"rows {gt['fetch_requested_rows']:,}, dead letters {gt['dead_letters']}"]
        out += [f"  [{'x' if ok else ' '}] {name}" for name, ok in gt["checks"].items()]
        if gt["errors"]:
            out += [f"  first error: {gt['errors'][0]}"]
    return "\n".join(out)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
