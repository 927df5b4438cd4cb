"""`reducer`: provider status events applied per second by the real consumer path, against two pgbench
baselines at the same client count (A-B-A), in-process and through Dramatiq on Redis, with the tasks of each
point over 1 and over 16 tenants.

Baselines ("Two baselines"):
  minimal bench/sql/transition.sql (B.3) on the B.2 schema; rate = TPS (one transition each)
  own      the actor's own transactions, captured at run time (bench.own_sql): `reduce_provider_status` called
           on fresh tasks of a scratch aivedio database with a RUNNING callback, the SUCCEEDED one and the
           RUNNING re-delivered, every statement and parameter recorded, the committed transactions rendered as
           one prepared pgbench script (the re-delivery with probability 2 × dup-fraction); each execution takes
           a fresh seeded task; rate = 2 events per execution

Per repetition (C.2):
  setup  a fresh database migrated with `aivedio_engine.db.migrate.upgrade`; per measured point a slice of
         tasks bulk-inserted with SQL in SUBMITTED, each with one ACKED attempt holding a provider job id, over
         the point's tenants; and the slice's stream of `provider.status.observed` envelopes (the payload
         `services.observations` stores): RUNNING then SUCCEEDED per task, plus 5 % re-deliveries of earlier
         events (same event id, i.e. what a relay republishing after a crash sends). A second fresh database for
         the own baseline, where the capture runs.
  per client count c and tenant spread t, one chain:
         A   pgbench minimal, then pgbench own, -c c -j 2
         S1  in-process: c threads calling `reducer.reduce_event(engine, envelope, now)` on pre-built envelopes
         B   the same two pgbench runs
         S2  Dramatiq: the messages the relay sends (`worker.relay.messages`: up to `broker.reducer_batch`
             events per `reduce_provider_statuses` message) enqueued on a RedisBroker (own key prefix) and a
             `dramatiq.Worker` with c threads running the actors from `declare_actors`, timed until every
             event's inbox row exists (a database condition with a deadline)
         C   the same two pgbench runs
  ratio(S, minimal) = S ÷ mean(minimal around S); client-path cost = S ÷ mean(own around S); schema cost =
  own ÷ minimal; each baseline pair is kept or discarded on its own two runs.

events/s counts distinct events (a re-delivery costs time but is not counted) up to the commit of the last
distinct event. Once, in the last repetition: SQL round trips per event (libpq protocol trace, single thread,
with pool checkouts) for reduce_event and the actor, RUNNING, SUCCEEDED and re-delivery, and a py-spy profile
of the in-process mode. A correctness gate runs over every repetition's database, and checks that each own
script writes per execution the rows the actor wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
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
from bench.own_sql import parse_trace, sql_label  # shared with api_create; the tests import them from here

NAME = "reducer"
DESCRIPTION = (
    "provider.status.observed events applied/s (in-process and Dramatiq on Redis) ÷ pgbench at the "
    "same client count of the minimal transition.sql and of the actor's own transactions (captured at "
    "run time), 1 and 16 tenants; round trips per event"
)
TARGET_RATIO, FLOOR_RATIO, STRETCH_RATIO = 0.50, 0.30, 1.0
MODES = ("inproc", "dramatiq")
MODE_LABEL = {"inproc": "in-process", "dramatiq": "Dramatiq/Redis"}
HEADLINE_PREFERENCE = ("dramatiq", "inproc")
PROVIDER, MODEL = "benchsim", "bench-v1"
#: a SUBMITTED task has been through CREATED..QUEUED (v3 after the API), DISPATCHING (v4) and SUBMITTED (v5)
TASK_VERSION = 5
RUNNING, SUCCEEDED = 0, 1
PHASE_NAME = {RUNNING: "RUNNING", SUCCEEDED: "SUCCEEDED"}
PROMPT = (
    "a red fox running through fresh snow at dusk, cinematic, 35mm film, shallow depth of field, "
    "golden hour light, slow tracking shot from the side"
)
PARAMS = f'{{"prompt": "{PROMPT}", "model": "{MODEL}", "duration_s": 5, "resolution": "1080p", "aspect_ratio": "16:9"}}'


# ------------------------------------------------------------------------------------------------ options
#: what --quick changes (options given on the command line win): one repetition at c=16, short points, no secondaries
QUICK = {
    "reps": 1,
    "duration": 4,
    "clients": "16",
    "tasks": 2000,
    "roundtrip_events": 6,
    "actor_inproc": False,
    "profile": 0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(duration=10)
    p.add_argument("--clients", default="4,16", help="comma-separated concurrency levels (default 4,16)")
    p.add_argument("--modes", default="inproc,dramatiq", help="comma-separated: inproc, dramatiq (default both)")
    p.add_argument(
        "--tenants",
        default="1,16",
        help="comma-separated tenant spreads: each point's tasks (system and own baseline) belong to that "
        "many tenants, round robin (default 1,16; at most 16)",
    )
    p.add_argument(
        "--tasks",
        type=int,
        default=3000,
        help="tasks per measured point: 2 events each plus the duplicates (default 3000: the batched reducer takes "
        "32 events a message, so a point needs many messages per worker thread to measure more than its start)",
    )
    p.add_argument(
        "--warmup-tasks",
        type=int,
        default=40,
        help="tasks run through each point's engine/actor before its clock starts (default 40)",
    )
    p.add_argument(
        "--dup-fraction",
        type=float,
        default=0.05,
        help="re-deliveries of earlier events, as a fraction of the distinct events (default 0.05)",
    )
    p.add_argument(
        "--lag",
        type=int,
        default=3000,
        help="minimum distance in the stream between a task's RUNNING and SUCCEEDED (default 3000: more than the "
        "events a worker holds at once — threads × prefetched messages × events per message — so no SUCCEEDED "
        "overtakes its RUNNING, as none does at a real provider)",
    )
    p.add_argument("--seed", type=int, default=20261130, help="random seed of the event order")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.1,
        help="seconds between the inbox-count checks that end a Dramatiq point (default 0.1)",
    )
    p.add_argument("--point-timeout", type=int, default=240, help="deadline of one Dramatiq point, seconds")
    p.add_argument(
        "--worker-queues",
        choices=("all", "own"),
        default="all",
        help="queues the Dramatiq point's worker consumes: every declared queue (a worker serving all of them, "
        "the default) or only the reducer's (`aivedio serve --role worker --queues <its queue>`)",
    )
    p.add_argument(
        "--reducer-batch",
        type=int,
        default=None,
        help="observations per Dramatiq message, as the relay groups them (`broker.reducer_batch`; default: "
        "aivedio.toml's); 1 sends each alone",
    )
    p.add_argument(
        "--worker-processes",
        type=int,
        default=0,
        help="run the Dramatiq point's worker as `aivedio serve --role worker --queues <the reducer's> --processes "
        "N` (the point's threads shared out over N processes) instead of in the benchmark's process (default 0: "
        "in it, with all of them)",
    )
    p.add_argument(
        "--roundtrip-events", type=int, default=40, help="events per kind in the SQL round-trip count (0 skips it)"
    )
    p.add_argument(
        "--no-actor-inproc",
        dest="actor_inproc",
        action="store_false",
        help="skip the secondary point: the actor function called by plain threads (no Dramatiq)",
    )
    p.add_argument("--profile", type=int, default=8, help="seconds of py-spy profile of the in-process mode (0 skips)")
    p.add_argument("--profile-threads", type=int, default=4, help="threads of the profiled in-process run")
    common.add_output_args(
        p,
        "one repetition at c=16 (both modes, both tenant spreads), 4 s baselines, 200 tasks "
        "per point, no actor-only point or profile: ~2-3 min",
    )
    common.add_infra_args(p)
    p.set_defaults(_defaults={k: p.get_default(k) for k in QUICK})


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
    gaps = [
        first[(t, SUCCEEDED)] - first[(t, RUNNING)] for t in tasks if (t, RUNNING) in first and (t, SUCCEEDED) in first
    ]
    return {
        "deliveries": len(items),
        "distinct": len(first),
        "duplicates": sum(it.dup for it in items),
        "tasks": len(tasks),
        "min_running_to_succeeded": min(gaps) if gaps else 0,
    }


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
SELECT t.id, (%(tenants)s::uuid[])[1 + (t.n - 1) %% %(n_tenants)s], %(name)s || '-' || t.n,
       sha256(convert_to(%(name)s || '-' || t.n, 'UTF8')), 'SUBMITTED',
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
    """Seeds slices into one aivedio database (bulk SQL, not the API) and builds their envelopes. A slice's
    tasks belong to the first `tenants` of `tenant_ids`, round robin."""

    def __init__(
        self, db_url: str, tenant_ids: Sequence[uuid.UUID], rng: random.Random, lag: int, dup_fraction: float
    ) -> None:
        self.db_url, self.tenant_ids, self.rng = db_url, list(tenant_ids), rng
        self.lag, self.dup_fraction = lag, dup_fraction
        self.fence = 0
        self.tasks = 0
        self.slices: list[Slice] = []

    def seed(self, name: str, n_tasks: int, *, dup_fraction: float | None = None, tenants: int = 1) -> Slice:
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
            conn.execute(
                _TASK_SQL,
                {
                    **common_args,
                    "tenants": self.tenant_ids[:tenants],
                    "n_tenants": tenants,
                    "name": name,
                    "version": TASK_VERSION,
                    "prompt": PROMPT,
                    "params": PARAMS,
                    "ids": task_ids,
                },
            )
            conn.execute(
                _ATTEMPT_SQL, {**common_args, "ids": attempt_ids, "task_ids": task_ids, "jobs": jobs, "fences": fences}
            )
        self.tasks += n_tasks
        frac = self.dup_fraction if dup_fraction is None else dup_fraction
        items = build_stream(n_tasks, lag=self.lag, dup_fraction=frac, rng=self.rng)
        events = [
            (observation_envelope(t, j, RUNNING, now), observation_envelope(t, j, SUCCEEDED, now))
            for t, j in zip(task_ids, jobs, strict=True)
        ]
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
        obs = Observation(
            job_id=job_id,
            status=JobStatus.RUNNING,
            provider_updated_at=base + timedelta(seconds=5),
            progress=10,
            event_id=webhook_id,
        )
    else:
        outputs = (
            Output(
                url=f"https://cdn.example.com/out/{job_id}.mp4?X-Sig={webhook_id}",
                expires_at=base + timedelta(hours=1),
                content_type="video/mp4",
                size_bytes=18_874_368,
            ),
        )
        obs = Observation(
            job_id=job_id,
            status=JobStatus.SUCCEEDED,
            provider_updated_at=base + timedelta(seconds=65),
            progress=100,
            outputs=outputs,
            billed=True,
            event_id=webhook_id,
        )
    payload = observations.to_payload(PROVIDER, obs, EventSource.CALLBACK, f"wh:{webhook_id}", new_id())
    return Envelope(
        event_id=new_id(),
        event_type=EventType.PROVIDER_STATUS_OBSERVED.value,
        schema_version=1,
        aggregate_id=task_id,
        aggregate_version=0,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        occurred_at=base,
        payload=payload,
    )


def relay_messages(envelopes: Sequence[Any], reducer_batch: int, claim: int = 200) -> list[Any]:
    """The Dramatiq messages the outbox relay builds for these events, claimed `claim` rows at a time (its default
    batch) with `reducer_batch` observations per message (`worker.relay.messages`)."""
    from aivedio_engine.worker.relay import messages

    rows = [_row(env) for env in envelopes]
    out = []
    for lo in range(0, len(rows), claim):
        for _, message in messages(rows[lo : lo + claim], reducer_batch):
            if isinstance(message, Exception):
                raise message
            out.append(message)
    return out


def collapse(sequence: list[str]) -> list[str]:
    """A batch's round trips with its per-event writes written once: first, (unit) ×k, last."""
    middle = sequence[1:-1]
    for p in range(1, len(middle) // 2 + 1):
        k, rest = divmod(len(middle), p)
        if not rest and middle == middle[:p] * k:
            return [sequence[0], f"({', '.join(middle[:p])}) ×{k}", sequence[-1]]
    return sequence


def phases(sl: Slice) -> list[tuple[list[Any], int]]:
    """The slice's RUNNING deliveries, then the others, each with its distinct events. A warm-up slice is short,
    so its SUCCEEDED would follow its RUNNING by fewer events than a worker holds at once (several batches of
    them): sent in one go, some SUCCEEDED would overtake their RUNNING, which then arrives stale."""
    parts: list[tuple[list[Any], int]] = []
    for running in (True, False):
        picked = [(it, e) for it, e in zip(sl.items, sl.envelopes, strict=True) if (it.phase == RUNNING) is running]
        parts.append(([e for _, e in picked], sum(not it.dup for it, _ in picked)))
    return parts


def _row(envelope: Any) -> Any:
    from aivedio_engine.domain.events import ROUTES, EventType

    return types.SimpleNamespace(
        id=envelope.event_id,
        event_type=envelope.event_type,
        schema_version=envelope.schema_version,
        aggregate_id=envelope.aggregate_id,
        aggregate_version=envelope.aggregate_version,
        tenant_id=envelope.tenant_id,
        trace_id=envelope.trace_id,
        causation_id=envelope.causation_id,
        created_at=envelope.occurred_at,
        payload=envelope.payload,
        target=ROUTES[EventType(envelope.event_type)].actor,
    )


# ------------------------------------------------------------------------------------------ settings / db
def reducer_settings(
    database_url: str,
    *,
    pool_size: int,
    worker_threads: int,
    redis_url: str,
    key_prefix: str,
    data_dir: str,
    reducer_batch: int | None = None,
) -> Any:
    """Distributed mode, as a deployment runs it: PostgreSQL, Redis broker and slots, default durability; the
    pool holds one connection per worker thread."""
    from aivedio_engine.config import load_settings

    overrides: dict[str, Any] = {
        "mode": "distributed",
        "data_dir": data_dir,
        "database": {"url": database_url, "pool_size": pool_size},
        "broker": {"kind": "redis", "url": redis_url, "worker_threads": worker_threads},
        "redis": {"url": redis_url, "key_prefix": key_prefix},
    }
    if reducer_batch is not None:
        overrides["broker"]["reducer_batch"] = reducer_batch
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
        return int(
            conn.execute("SELECT count(*) FROM inbox_dedup WHERE consumer_group = %s", (CONSUMER_GROUP,)).fetchone()[0]
        )


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
    return {
        "bench": lambda pid, comm, cmd: pid == me,
        "redis": lambda pid, comm, cmd: comm == "redis-server",
        **common.postgres_groups([db]),
    }


# ------------------------------------------------------------------------------------------ in-process mode
def run_inproc(
    engine: Any, envelopes: Sequence[Any], distinct: int, threads: int, sampler: _TimedSampler | None = None
) -> dict[str, Any]:
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
    return {
        "threads": threads,
        "deliveries": n,
        "distinct": distinct,
        "processed": state["processed"],
        "duplicate": state["duplicate"],
        "errors": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": round(elapsed, 3),
        "drain_s": round(t_end - t0, 3),
        "events_per_s": distinct / elapsed if elapsed > 0 and state["processed"] == distinct else math.nan,
        "deliveries_per_s": n / (t_end - t0) if t_end > t0 else math.nan,
        "cpu": cpu,
    }


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

        def after_process_message(
            self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
        ) -> None:
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


def dramatiq_point(
    settings: Any,
    sl: Slice,
    warm: Slice,
    threads: int,
    db: str,
    db_url: str,
    poll_interval: float,
    timeout_s: float,
    own_queue_only: bool = False,
    worker_processes: int = 0,
) -> dict[str, Any]:
    """Enqueue the slice on a RedisBroker (as the relay would), then run a Dramatiq worker with `threads`
    threads until every distinct event's inbox row exists; then let it drain the re-deliveries and stop.
    `own_queue_only`: the worker consumes the reducer's queue (and its delay queue) only, not every declared one.
    `worker_processes` > 0: the worker is `aivedio serve --role worker --queues <the reducer's> --processes N`
    instead (`serve_point`)."""
    if worker_processes:
        return serve_point(settings, sl, warm, threads, db, db_url, poll_interval, timeout_s, worker_processes)
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
    out: dict[str, Any] = {
        "threads": threads,
        "deliveries": len(sl.envelopes),
        "distinct": sl.distinct,
        "worker_queues": "own" if own_queue_only else "all",
    }
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
        for message in relay_messages(sl.envelopes, settings.broker.reducer_batch):
            broker.enqueue(message)
        out["enqueue_s"] = round(time.monotonic() - t, 3)
        target = inbox_count(db_url) + sl.distinct
        broker.emit_after("process_boot")  # as the runtime does: TimeLimit starts its watchdog on it
        worker = dramatiq.Worker(
            broker,
            queues={queue} if own_queue_only else None,
            worker_threads=threads,
            worker_timeout=settings.broker.consumer_idle_timeout_ms,
        )
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
        out.update(
            {
                "elapsed_s": round(elapsed, 3),
                "drain_s": round(t_end - t0, 3),
                "inbox_rows_seen": seen,
                "inbox_rows_expected": target,
                "events_per_s": sl.distinct / elapsed if not out["timed_out"] and elapsed > 0 else math.nan,
                "deliveries_per_s": len(sl.envelopes) / (t_end - t0) if t_end > t0 else math.nan,
                "acked": counter.ok,
                "failed": counter.failed,
                "skipped": counter.skipped,
                "first_errors": counter.first_errors,
                "cpu": cpu,
                "worker_timeout_ms": settings.broker.consumer_idle_timeout_ms,
            }
        )
        return out
    finally:
        if worker is not None:
            worker.stop(timeout=30_000)
        broker.close()
        ctx.close()


def serve_point(
    settings: Any,
    sl: Slice,
    warm: Slice,
    threads: int,
    db: str,
    db_url: str,
    poll_interval: float,
    timeout_s: float,
    processes: int,
) -> dict[str, Any]:
    """The Dramatiq point as a deployment runs it: `aivedio serve --role worker --queues <the reducer's queue>
    --processes N`: the point's `threads` shared out over N processes (one process's threads share a GIL; measured
    here, one process ran 16 threads at 2.5 ms of CPU per event, 4 or 8 at 1.7 ms). The workers are
    started and warmed through the broker with the warm slice first; the clock runs from the first enqueue of the
    measured slice (the relay's enqueues and the workers' consumption overlap, as they do in production) until
    every distinct event's inbox row exists. Acks are not counted (the workers are other processes); the inbox
    rows are the measure."""
    import psycopg

    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.domain.events import ROUTES, EventType
    from aivedio_engine.worker.broker import setup_broker

    queue = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].queue.value
    per_process = -(-threads // processes)  # the point's concurrency, shared out over the processes
    items = {
        "mode": settings.mode,
        "data_dir": str(settings.data_dir),
        "database.url": settings.database.url,
        "database.pool_size": str(per_process),
        "broker.kind": "redis",
        "broker.url": settings.broker.url,
        "broker.worker_threads": str(per_process),
        "redis.url": settings.redis.url,
        "redis.key_prefix": settings.redis.key_prefix,
        "broker.reducer_batch": str(settings.broker.reducer_batch),
    }
    argv = [sys.executable, "-m", "aivedio_cli", "--config", str(common.REPO / "aivedio.toml")]
    for k, v in items.items():
        argv += ["--set", f"{k}={v}"]
    argv += ["serve", "--role", "worker", "--queues", queue, "--processes", str(processes)]
    ctx = build_context(settings)
    broker = setup_broker(settings, ctx)
    out: dict[str, Any] = {
        "threads": threads,
        "processes": processes,
        "threads_per_process": per_process,
        "deliveries": len(sl.envelopes),
        "distinct": sl.distinct,
        "worker_queues": "own",
        "acked": None,
        "failed": 0,
        "skipped": 0,
        "first_errors": [],
    }
    # a file, not a pipe: nobody reads the workers' log while they run, and a full pipe would block them
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, cwd=common.REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        with psycopg.connect(db_url, autocommit=True) as poll:
            count_sql = "SELECT count(*) FROM inbox_dedup WHERE consumer_group = 'reducer'"

            def wait_for(target: int, deadline: float) -> int:
                while True:
                    seen = int(poll.execute(count_sql).fetchone()[0])
                    if seen >= target or time.monotonic() > deadline or proc.poll() is not None:
                        return seen
                    time.sleep(poll_interval)

            t = time.monotonic()
            for part, distinct in phases(warm):
                target = inbox_count(db_url) + distinct
                for message in relay_messages(part, settings.broker.reducer_batch):
                    broker.enqueue(message)
                if wait_for(target, t + timeout_s) < target:
                    raise BenchError(f"the serve workers did not take the warm-up: {_log_tail(log)}")
            out["warm_s"] = round(time.monotonic() - t, 3)
            target = inbox_count(db_url) + sl.distinct
            sampler = _TimedSampler(
                {**system_groups(db), "workers": lambda pid, comm, cmd: "aivedio_cli" in cmd and "serve" in cmd}
            )
            t0 = time.monotonic()
            sampler.start()
            for message in relay_messages(sl.envelopes, settings.broker.reducer_batch):
                broker.enqueue(message)
            out["enqueue_s"] = round(time.monotonic() - t0, 3)
            seen = wait_for(target, t0 + timeout_s)
            t_distinct = time.monotonic()
            cpu = sampler.stop()
        out["timed_out"] = seen < target
        if proc.poll() is not None:
            raise BenchError(f"aivedio serve exited ({proc.returncode}): {_log_tail(log)}")
        elapsed = t_distinct - t0
        out.update(
            {
                "elapsed_s": round(elapsed, 3),
                "inbox_rows_seen": seen,
                "inbox_rows_expected": target,
                "events_per_s": sl.distinct / elapsed if not out["timed_out"] and elapsed > 0 else math.nan,
                "cpu": cpu,
            }
        )
        return out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        broker.close()
        ctx.close()


def _log_tail(log: Any, n: int = 2000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-n:]


def actor_inproc_point(settings: Any, sl: Slice, warm: Slice, threads: int, db: str) -> dict[str, Any]:
    """The `reduce_provider_status` actor function (Envelope.parse + reduce_observation, which frees an ended
    attempt's slot after its commit) called by `threads` plain threads on the message bodies: the actor's own
    cost without Dramatiq's transport, to split the Dramatiq figure. Timed to the end of the stream."""
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
            return {
                "elapsed_s": round(elapsed, 3),
                "errors": len(errors),
                "first_errors": errors[:3],
                "cpu": sampler.stop() if sampler else {},
            }

        drive(warm.bodies(), None)
        res = drive(sl.bodies(), _TimedSampler(system_groups(db)))
        res.update(
            threads=threads,
            deliveries=len(sl.envelopes),
            distinct=sl.distinct,
            events_per_s=sl.distinct / res["elapsed_s"] if res["elapsed_s"] > 0 else math.nan,
        )
        return res
    finally:
        ctx.close()


# ------------------------------------------------------------------------------------------ round trips
def count_round_trips(settings: Any, work: Workload, per_kind: int, workdir: Path) -> dict[str, Any]:
    """SQL round trips per event on one connection, one thread: `reduce_event` alone, and the whole actor
    (`reduce_provider_status`: reduce_observation with its after-commit slot release), for RUNNING, SUCCEEDED and a
    re-delivery; plus the Redis commands the actor sends. Counted from libpq's protocol trace."""
    import redis
    import sqlalchemy as sa
    from dramatiq.brokers.stub import StubBroker
    from psycopg import pq

    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.domain.events import REDUCE_BATCH, ROUTES, EventType
    from aivedio_engine.services import reducer
    from aivedio_engine.worker.actors import declare_actors

    ctx = build_context(settings)
    pgconns: list[Any] = []
    sa.event.listen(ctx.engine, "connect", lambda dbapi_conn, rec: pgconns.append(dbapi_conn.pgconn))
    declared = declare_actors(StubBroker(), ctx)
    fn = declared[ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor].fn
    batch_fn = declared[REDUCE_BATCH.actor].fn
    # each path is warmed by itself: psycopg prepares a statement on its 6th execution and forgets them all on
    # every ROLLBACK, so what one path leaves prepared is not the other's steady state
    warm = work.seed("rt-warm", 16, dup_fraction=0.0)
    reduce_sl = work.seed("rt-reduce", per_kind, dup_fraction=0.0)
    actor_sl = work.seed("rt-actor", per_kind, dup_fraction=0.0)
    prepared: dict[str, str] = {}
    redis_calls = Counter()
    original = redis.Redis.execute_command
    checkouts = [0]
    sa.event.listen(ctx.engine, "checkout", lambda *_: checkouts.__setitem__(0, checkouts[0] + 1))

    def counting(self: Any, *args: Any, **kw: Any) -> Any:
        redis_calls[str(args[0]).upper() if args else "?"] += 1
        return original(self, *args, **kw)

    def by_phase(sl: Slice, phase: int) -> list[Any]:
        return [e for it, e in zip(sl.items, sl.envelopes, strict=True) if it.phase == phase and not it.dup]

    def trace_once(label: str, calls: list[Callable[[], Any]]) -> list[list[str]]:
        """Run the calls with every connection traced; the trace lines of each connection."""
        files = []
        for k, pgc in enumerate(pgconns):
            f = (workdir / f"trace-{label}-{k}.txt").open("w")
            pgc.trace(f.fileno())
            pgc.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            files.append((pgc, f))
        redis.Redis.execute_command = counting  # type: ignore[method-assign]
        try:
            for call in calls:
                call()
        finally:
            redis.Redis.execute_command = original  # type: ignore[method-assign]
            for pgc, f in files:
                pgc.untrace()
                f.close()
        return [Path(f.name).read_text(errors="replace").splitlines() for _, f in files]

    def traced(label: str, calls: list[Callable[[], Any]], events: int | None = None) -> dict[str, Any]:
        """`events`: how many events the calls carry together (default one each)."""
        redis_calls.clear()
        checkouts[0] = 0
        first = trace_once(f"{label}-first", calls[:1])  # the first call alone: its round trips in order
        rest = trace_once(label, calls[1:])
        cycles: list[str] = []
        sequence: list[str] = []
        parses = 0
        for k, traces in enumerate((first, rest)):
            for lines in traces:
                parses += sum(1 for ln in lines if re.match(r"^F\t\d+\tParse\b", ln))
                got = parse_trace(lines, prepared)
                cycles += got
                if k == 0:
                    sequence += [sql_label(c) for c in got]
        n = events or len(calls)
        per_label = Counter(sql_label(c) for c in cycles)
        if events:
            sequence = collapse(sequence)
        return {
            "events": n,
            "calls": len(calls),
            "round_trips": len(cycles),
            "per_event": round(len(cycles) / n, 2),
            "checkouts_per_event": round(checkouts[0] / n, 2),
            "sequence": sequence,
            "parse_messages_per_event": round(parses / n, 2),
            "statements": {k: round(v / n, 2) for k, v in per_label.most_common()},
            "redis_commands_per_event": round(sum(redis_calls.values()) / n, 2),
            "redis_commands": {k: round(v / n, 2) for k, v in redis_calls.most_common()},
        }

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
        out["reduce_event RUNNING"] = traced(
            "r-run", [lambda e=e: reducer.reduce_event(ctx.engine, e, now()) for e in runs]
        )
        out["reduce_event SUCCEEDED"] = traced(
            "r-succ", [lambda e=e: reducer.reduce_event(ctx.engine, e, now()) for e in by_phase(reduce_sl, SUCCEEDED)]
        )
        out["reduce_event re-delivery"] = traced(
            "r-dup", [lambda e=e: reducer.reduce_event(ctx.engine, e, now()) for e in runs]
        )
        traced("a-warm", [lambda b=e.to_dict(): fn(b) for e in warm_actor])  # noqa: B008 - serialized before the traced call
        runs = by_phase(actor_sl, RUNNING)
        out["actor RUNNING"] = traced("a-run", [lambda b=e.to_dict(): fn(b) for e in runs])  # noqa: B008 - serialized before the traced call
        out["actor SUCCEEDED"] = traced("a-succ", [lambda b=e.to_dict(): fn(b) for e in by_phase(actor_sl, SUCCEEDED)])  # noqa: B008 - serialized before the traced call
        out["actor re-delivery"] = traced("a-dup", [lambda b=e.to_dict(): fn(b) for e in runs])  # noqa: B008 - serialized before the traced call
        # the batched actor, as the relay feeds it: `reducer_batch` events per message
        size = max(2, settings.broker.reducer_batch)
        warm_batch = work.seed("rt-bwarm", 2 * size, dup_fraction=0.0)
        batch_sl = work.seed("rt-batch", size, dup_fraction=0.0)

        def batches(sl: Slice, phase: int, k: int = size) -> list[Callable[[], Any]]:
            events = [e.to_dict() for e in by_phase(sl, phase)]
            return [lambda b=events[i : i + k]: batch_fn(b) for i in range(0, len(events), k)]

        traced("b-warm", batches(warm_batch, RUNNING, size // 2) + batches(warm_batch, SUCCEEDED, size // 2))
        for kind, label, phase in (("RUNNING", "b-run", RUNNING), ("SUCCEEDED", "b-succ", SUCCEEDED)):
            out[f"batch actor {kind} (×{size})"] = traced(label, batches(batch_sl, phase), events=size)
        out[f"batch actor re-delivery (×{size})"] = traced("b-dup", batches(batch_sl, RUNNING), events=size)
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
        load = threading.Thread(
            target=lambda: result.setdefault("load", run_inproc(engine, sl.envelopes, sl.distinct, threads))
        )
        load.start()
        time.sleep(1.0)
        spy = subprocess.run(
            [
                pyspy,
                "record",
                "--gil",
                "-r",
                "200",
                "-d",
                str(seconds),
                "-f",
                "raw",
                "-o",
                str(raw),
                "-p",
                str(os.getpid()),
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
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
    return {
        **summarize_profile(stacks),
        "seconds": seconds,
        "threads": threads,
        "load": {k: load_doc.get(k) for k in ("deliveries", "processed", "errors", "elapsed_s", "events_per_s")},
    }


# ------------------------------------------------------------------------------------------ own transaction
#: distinct events per execution of the own script: the RUNNING and the SUCCEEDED of one fresh task
EVENTS_PER_SCRIPT = 2
#: tenants of the own database; a script spreads its tasks over the first T of them
OWN_TENANTS = 16

# The own database's tasks are functions of an index g, so that the captured parameters can be turned back into
# the same functions of pgbench's :idx (bench.own_sql.Entity). One SUBMITTED v5 task with one ACKED attempt per g.
_OWN_TASK_SQL = """
INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status, version, progress,
    requested_model, selected_provider, current_attempt_no, priority, estimated_cost, reserved_amount, prompt,
    params, next_action_at, trace_id, created_at, updated_at)
SELECT md5('rt:' || g::text)::uuid, (%(tenants)s::uuid[])[1 + g %% %(n_tenants)s], 'rk-' || g::text || '-x',
       sha256(convert_to('rk-' || g::text || '-x', 'UTF8')), 'SUBMITTED', %(version)s, 0, %(model)s, %(provider)s,
       1, 0, 10, 10, %(prompt)s, %(params)s::jsonb, %(poll_at)s, md5('rtr:' || g::text), %(now)s, %(now)s
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""
_OWN_ATTEMPT_SQL = """
INSERT INTO task_attempts (id, task_id, attempt_no, provider, model, provider_request_key, provider_job_id,
    submit_state, request_fingerprint, submitted_at, next_poll_at, fencing_token, created_at, updated_at)
SELECT md5('ra:' || g::text)::uuid, md5('rt:' || g::text)::uuid, 1, %(provider)s, %(model)s,
       'avd-' || md5('rq:' || g::text), 'job-' || md5('rj:' || g::text), 'ACKED',
       sha256(convert_to('job-' || md5('rj:' || g::text), 'UTF8')), %(now)s, %(poll_at)s, 1000000 + g, %(now)s, %(now)s
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""


def own_entities(tenant_ids: Sequence[uuid.UUID], script_tenants: int) -> list[Any]:
    from bench import own_sql

    return [
        own_sql.choice_entity("tenant", tenant_ids, OWN_TENANTS, script_tenants),
        own_sql.md5_uuid_entity("task id", "rt:"),
        own_sql.md5_uuid_entity("attempt id", "ra:"),
        own_sql.text_entity("provider job id", "job-", "rj:", md5=True),
        own_sql.text_entity("provider request key", "avd-", "rq:", md5=True),
        own_sql.text_entity("idempotency key", "rk-", "-x"),
        own_sql.text_entity("trace id", "", "rtr:", md5=True),
        own_sql.int_entity("fencing token", 1_000_000),
    ]


def own_job_id(i: int) -> str:
    import hashlib

    return "job-" + hashlib.md5(f"rj:{i}".encode()).hexdigest()


class OwnReducer:
    """The own-transaction baseline of one repetition: a scratch aivedio database (migrated, 16 tenants), the
    pgbench scripts rendered from what the real actor sent to it, and fresh tasks seeded for every run."""

    def __init__(self, pg: Postgres, db: str) -> None:
        self.pg, self.db = pg, db
        self.url = pg.url(db, driver="postgresql")
        self.tenant_ids: list[uuid.UUID] = []
        self.scripts: dict[int, Path] = {}
        self.info: dict[str, Any] = {"database": db}
        self.next = 1000
        self.last_tps: dict[int, float] = {}

    def seed(self, lo: int, hi: int, tenants: int) -> None:
        """Tasks lo..hi (inclusive), SUBMITTED v5 with an ACKED attempt, over the first `tenants` tenants."""
        import psycopg

        now = datetime.now(UTC)
        args = {
            "tenants": self.tenant_ids[:tenants],
            "n_tenants": tenants,
            "lo": lo,
            "hi": hi,
            "version": TASK_VERSION,
            "model": MODEL,
            "provider": PROVIDER,
            "prompt": PROMPT,
            "params": PARAMS,
            "now": now,
            "poll_at": now + timedelta(seconds=30),
        }
        with psycopg.connect(self.url, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(_OWN_TASK_SQL, args)
                conn.execute(_OWN_ATTEMPT_SQL, args)
            conn.execute("ANALYZE generation_tasks, task_attempts")

    def consumed(self) -> int:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return int(conn.execute("SELECT count(*) FROM generation_tasks WHERE status <> 'SUBMITTED'").fetchone()[0])

    def prepare(self, settings: Any, dup_probability: float, workdir: Path, tenant_sets: Sequence[int]) -> None:
        """Capture: the `reduce_provider_status` actor function (as Dramatiq calls it) on fresh tasks — a RUNNING
        callback, the SUCCEEDED one, then the RUNNING re-delivered — with every statement recorded; render the
        committed transactions as one script per tenant spread (the re-delivery runs with `dup_probability`);
        check with pgbench -t that each script writes the rows the actor wrote."""
        from dramatiq.brokers.stub import StubBroker

        from aivedio_engine.bootstrap import build_context
        from aivedio_engine.db import migrate
        from aivedio_engine.domain.events import ROUTES, EventType
        from aivedio_engine.worker.actors import declare_actors
        from bench import own_sql

        ctx = build_context(settings)
        try:
            migrate.upgrade(ctx.engine)
            for k in range(OWN_TENANTS):
                self.tenant_ids.append(ctx.tenants.create(f"own-reducer-{k}", Decimal(10) ** 9).id)
            self.seed(0, 5, OWN_TENANTS)
            rec = own_sql.Recorder(ctx.engine)
            fn = declare_actors(StubBroker(), ctx)[ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor].fn
            base = datetime.now(UTC)
            md5 = own_entities(self.tenant_ids, 1)[1]

            def events(i: int) -> list[dict[str, Any]]:
                task, job = md5.value(i), own_job_id(i)
                running = observation_envelope(task, job, RUNNING, base)
                return [
                    running.to_dict(),
                    observation_envelope(task, job, SUCCEEDED, base).to_dict(),
                    running.to_dict(),
                ]

            for body in events(0):  # warm-up
                fn(body)
            ctx.engine.dispose()
            before = own_sql.settled_writes(self.pg, self.db)
            n_cap = 4
            for i in range(1, 1 + n_cap):
                with rec.operation(i, "event"):
                    for body in events(i):
                        fn(body)
            ctx.engine.dispose()
            product = own_sql.writes_per_op(before, own_sql.settled_writes(self.pg, self.db, before), n_cap)
        finally:
            ctx.close()
        ops = own_sql.choose_structure(rec.ops, "event")
        self.info["capture"] = {
            "operations": len(rec.ops),
            "same_shape": len(ops),
            "shapes_seen": len({o.signature() for o in rec.ops}),
            "path": "reduce_provider_status actor function (declare_actors) ← RUNNING, SUCCEEDED, RUNNING re-delivered",
            "product_writes_per_op (ins, upd, del)": product,
        }
        literal = own_sql.Literals(self.url)
        git = common.git_info()
        self.info["scripts"] = {}
        try:
            for t in sorted(set(tenant_sets)):
                ents = own_entities(self.tenant_ids, t)
                title = (
                    f"aivedio reducer: our own transactions, captured {common.utc_now()} at commit "
                    f"{(git.get('commit') or '?')[:10]}{' (dirty tree)' if git.get('dirty') else ''}\n"
                    f"from the reduce_provider_status actor: a fresh task's RUNNING, its SUCCEEDED, and with "
                    f"probability {dup_probability:g} the RUNNING re-delivered; tasks over {t} tenant(s)"
                )
                script = own_sql.render_script(
                    ops[0], ops[1], literal, ents, title=title, optional={2: dup_probability}
                )
                check = own_sql.render_script(
                    ops[0], ops[1], literal, ents, title=title + " (check)", optional={2: 1.0}
                )
                path, check_path = workdir / f"own-reducer-t{t}.sql", workdir / f"own-reducer-t{t}-check.sql"
                path.write_text(script.text)
                check_path.write_text(check.text)
                clients, per_client = 2, 4
                lo = self.next
                self.next += clients * per_client
                self.seed(lo, self.next - 1, t)
                before = own_sql.settled_writes(self.pg, self.db)
                own_sql.run_script_n(
                    self.pg,
                    self.db,
                    check_path,
                    per_client,
                    clients,
                    {"base": lo, "stride": per_client, "n": 0, "ts": int(time.time() * 1000)},
                )
                replay = own_sql.writes_per_op(
                    before, own_sql.settled_writes(self.pg, self.db, before), clients * per_client
                )
                self.scripts[t] = path
                self.info["scripts"][str(t)] = {**script.as_dict(), "verify": own_sql.compare_writes(product, replay)}
        finally:
            literal.close()

    def run(self, tenants: int, clients: int, duration: int, fallback_tps: float) -> dict[str, Any]:
        """pgbench of the own script on fresh tasks: each client walks its own range of :idx, seeded beforehand
        with room for 1.6 × the expected executions (the last own rate, else half the minimal TPS just
        measured). A run that needed more tasks than it had is flagged (`overrun`) and its rate is not used."""
        expected = self.last_tps.get(tenants) or max(50.0, fallback_tps / EVENTS_PER_SCRIPT)
        stride = math.ceil(expected * duration * 1.6 / clients) + 50
        lo = self.next
        self.next += clients * stride
        t0 = time.monotonic()
        self.seed(lo, self.next - 1, tenants)
        seed_s = time.monotonic() - t0
        used0 = self.consumed()
        res = common.run_pgbench(
            self.pg,
            self.db,
            self.scripts[tenants],
            clients,
            duration,
            sample_cpu=True,
            defines={"base": lo, "stride": stride, "n": 0, "ts": int(time.time() * 1000)},
        )
        used = self.consumed() - used0
        overrun = used < res.transactions
        self.last_tps[tenants] = res.tps * (2.0 if overrun else 1.0)
        return {
            **res.as_dict(),
            "tenants": tenants,
            "events_per_script": EVENTS_PER_SCRIPT,
            "events_per_s": math.nan if overrun else res.tps * EVENTS_PER_SCRIPT,
            "tasks_seeded": clients * stride,
            "tasks_used": used,
            "overrun": overrun,
            "seed_s": round(seed_s, 2),
        }


# ------------------------------------------------------------------------------------------ correctness
def correctness_gate(db_url: str, work: Workload, point_errors: list[str]) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            """
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
        """,
            {"v": TASK_VERSION + 2},
        ).fetchone()
        (
            tasks,
            not_fetching,
            bad_version,
            attempts_not_done,
            bad_events,
            inbox,
            fetch_rows,
            bad_fetch,
            dead,
            events,
        ) = (int(x) for x in row)
        not_applied = dict(
            conn.execute(
                "SELECT outcome, count(*) FROM task_state_events WHERE outcome <> 'applied' GROUP BY outcome"
            ).fetchall()
        )
        digests = dict(
            conn.execute(
                "SELECT coalesce(result_digest, '(none)'), count(*) FROM inbox_dedup WHERE consumer_group = 'reducer' "
                "GROUP BY 1"
            ).fetchall()
        )
    expected_inbox = work.distinct_events
    checks = {
        "tasks == seeded": tasks == work.tasks,
        "every task OUTPUT_FETCHING at version +2": not_fetching == 0 and bad_version == 0,
        "every attempt SUCCEEDED": attempts_not_done == 0,
        "each task: exactly 1 applied RUNNING and 1 applied OUTPUT_FETCHING event": bad_events == 0,
        "re-deliveries applied nothing (any extra event row is not 'applied')": events - 2 * tasks
        == sum(not_applied.values()),
        "inbox rows == distinct events": inbox == expected_inbox,
        "fetch.requested outbox rows == tasks, one per task": fetch_rows == tasks and bad_fetch == 0,
        "no dead letter, no consumer error": dead == 0 and not point_errors,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "tasks": tasks,
        "tasks_seeded": work.tasks,
        "tasks_not_output_fetching": not_fetching,
        "tasks_bad_version": bad_version,
        "attempts_not_succeeded": attempts_not_done,
        "tasks_bad_events": bad_events,
        "state_events": events,
        "state_events_not_applied": not_applied,
        "inbox_rows": inbox,
        "distinct_events": expected_inbox,
        "inbox_result_digests": digests,
        "fetch_requested_rows": fetch_rows,
        "tasks_bad_fetch": bad_fetch,
        "dead_letters": dead,
        "errors": point_errors[:5],
    }


# ------------------------------------------------------------------------------------------ orchestration
@dataclass
class Config:
    clients: list[int]
    modes: list[str]
    tenants: list[int]
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


def run_repetition(
    index: int, cfg: Config, pg: Postgres, pgb_db: str, sys_db: str, own_db: str, last: bool, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[tuple[str, int, int, str], Repetition]]:
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db import migrate

    db_url = pg.url(sys_db, driver="postgresql")
    sa_url = pg.url(sys_db)
    rep_doc: dict[str, Any] = {"index": index, "database": sys_db, "own_database": own_db, "chains": {}}
    reps: dict[tuple[str, int, int, str], Repetition] = {}
    point_errors: list[str] = []

    def settings_for(threads: int, url: str = sa_url) -> Any:
        return reducer_settings(
            url,
            pool_size=max(1, threads),
            worker_threads=max(1, threads),
            redis_url=cfg.redis_url,
            key_prefix=cfg.key_prefix,
            data_dir=str(cfg.workdir / "data"),
            reducer_batch=args.reducer_batch,
        )

    t = time.monotonic()
    pg.create_db(sys_db)
    ctx = build_context(settings_for(2))
    try:
        migrate.upgrade(ctx.engine)
        tenant_ids = [
            ctx.tenants.create(f"bench-reducer-{index}-{k}", Decimal(10) ** 9).id for k in range(max(cfg.tenants))
        ]
    finally:
        ctx.close()
    work = Workload(db_url, tenant_ids, random.Random(cfg.seed + index), cfg.lag, cfg.dup_fraction)
    slices = {
        (m, c, tn): (
            work.seed(f"{m}-c{c}-t{tn}", cfg.tasks, tenants=tn),
            work.seed(f"{m}-c{c}-t{tn}-warm", cfg.warmup_tasks, tenants=tn),
        )
        for c in cfg.clients
        for tn in cfg.tenants
        for m in cfg.modes
    }
    pg.psql(sys_db, "VACUUM ANALYZE")
    rep_doc["setup_s"] = round(time.monotonic() - t, 1)
    rep_doc["stream"] = next(iter(slices.values()))[0].stats
    _log(
        f"rep {index}: {sys_db} migrated, {work.tasks:,} tasks seeded over {max(cfg.tenants)} tenant(s), "
        f"{sum(s.stats['deliveries'] for s, _ in slices.values()):,} deliveries built ({rep_doc['setup_s']} s)"
    )

    t = time.monotonic()
    pg.create_db(own_db)
    own = OwnReducer(pg, own_db)
    own.prepare(settings_for(2, pg.url(own_db)), cfg.dup_fraction * EVENTS_PER_SCRIPT, cfg.workdir, cfg.tenants)
    rep_doc["own_transaction"] = own.info
    rep_doc["own_setup_s"] = round(time.monotonic() - t, 1)
    for tn, sc in own.info["scripts"].items():
        _log(
            f"rep {index}: own script, {tn} tenant(s): {sc['statements']} statements, {sc['round_trips']} round "
            f"trips per execution; replays the actor's writes: {'yes' if sc['verify']['ok'] else 'NO'}"
            + (f"; {len(sc['warnings'])} warning(s)" if sc["warnings"] else "")
        )
        if not sc["verify"]["ok"]:
            point_errors.append(f"own script ({tn} tenants) does not write what the actor writes")

    minimal = common.SQL_DIR / "transition.sql"
    for c in cfg.clients:
        for tn in cfg.tenants:
            chain: dict[str, Any] = {}
            label = f"rep {index} c={c} t={tn}"

            def block(name: str, label: str = label, c: int = c, tn: int = tn) -> dict[str, Any]:
                _log(f"{label}: baselines {name} (minimal, own)")
                m = common.run_pgbench(pg, pgb_db, minimal, c, cfg.duration, sample_cpu=True).as_dict()
                o = own.run(tn, c, cfg.duration, m["tps"])
                if o["overrun"]:
                    _log(
                        f"{label}: own baseline {name} ran out of fresh tasks ({o['tasks_used']:,} used for "
                        f"{o['transactions']:,} scripts); its rate is not used"
                    )
                return {"minimal": m, "own": o}

            blocks = [block("A")]
            chain["A"] = blocks[0]
            for k, mode in enumerate(cfg.modes):
                sl, warm = slices[(mode, c, tn)]
                pg.checkpoint()
                _log(
                    f"{label}: {MODE_LABEL[mode]} ({sl.stats['deliveries']:,} deliveries, {sl.distinct:,} distinct)"
                    f" after minimal {blocks[-1]['minimal']['tps']:,.0f} TPS, own "
                    f"{blocks[-1]['own']['events_per_s']:,.0f} events/s"
                )
                try:
                    if mode == "inproc":
                        res = inproc_point(settings_for(c), sl, warm, c, sys_db)
                        if res["errors"] or res["warmup"]["errors"]:
                            point_errors += res["first_errors"] or [f"{mode} c={c}: warm-up errors"]
                    else:
                        res = dramatiq_point(
                            settings_for(c),
                            sl,
                            warm,
                            c,
                            sys_db,
                            db_url,
                            cfg.poll_interval,
                            cfg.point_timeout,
                            own_queue_only=args.worker_queues == "own",
                            worker_processes=args.worker_processes,
                        )
                        if res["failed"] or res["skipped"] or res["timed_out"]:
                            point_errors += res["first_errors"] or [f"{mode} c={c}: timed out or skipped messages"]
                except Exception as exc:  # noqa: BLE001 - the point is lost, the run goes on and the gate fails
                    res = {"error": f"{type(exc).__name__}: {exc}", "events_per_s": math.nan}
                    point_errors.append(f"{mode} c={c} t={tn}: {res['error']}")
                    _log(f"{label}: {mode} FAILED: {res['error']}")
                res["tenants"] = tn
                chain[mode] = res
                name = "BC"[k]
                _log(f"{label}: {res.get('events_per_s', math.nan):,.0f} events/s ({res.get('elapsed_s', '?')} s)")
                blocks.append(block(name))
                chain[name] = blocks[-1]
                rate = res.get("events_per_s", math.nan)
                a, b = blocks[-2], blocks[-1]
                raw = {"mode": mode, "clients": c, "tenants": tn}
                rm = Repetition(index, a["minimal"]["tps"], rate, b["minimal"]["tps"], raw=raw)
                ro = Repetition(index, a["own"]["events_per_s"], rate, b["own"]["events_per_s"], raw=raw)
                reps[(mode, c, tn, "minimal")], reps[(mode, c, tn, "own")] = rm, ro
                _log(
                    f"{label}: {mode}: ÷ minimal {rm.ratio:.3f} (differ {100 * rm.divergence:.1f} %"
                    f"{'' if rm.kept else ', DISCARDED'}), ÷ own {ro.ratio:.3f} (differ {100 * ro.divergence:.1f} %"
                    f"{'' if ro.kept else ', DISCARDED'}), own ÷ minimal {schema_cost(rm, ro):.3f}"
                )
            rep_doc["chains"][f"c{c}_t{tn}"] = chain
    if not args.keep_dbs:
        pg.drop_db(own_db)

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
            _log(
                f"rep {index}: actor function in-process, {c} threads, no Dramatiq ({sl.stats['deliveries']:,} "
                f"deliveries)"
            )
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
            rate = next(
                (r.system for (m, c, tn, b), r in reps.items() if m == "inproc" and math.isfinite(r.system)), 300.0
            )
            n = max(200, int(rate * (args.profile + 4) / 2))
            sl = work.seed("profile", n)
            _log(
                f"rep {index}: py-spy {args.profile} s of the in-process mode, {args.profile_threads} threads "
                f"({sl.stats['deliveries']:,} deliveries)"
            )
            prof = profile_inproc(
                settings_for(args.profile_threads), sl, args.profile_threads, args.profile, cfg.workdir
            )
            cfg.extra["profile"] = prof
            if (prof.get("load") or {}).get("errors"):
                point_errors.append("profile run: consumer errors")

    rep_doc["gate"] = correctness_gate(db_url, work, point_errors)
    for tn, sc in own.info["scripts"].items():
        rep_doc["gate"]["checks"][f"own script ({tn} tenant(s)) writes the rows the actor writes, per table"] = sc[
            "verify"
        ]["ok"]
    rep_doc["gate"]["ok"] = all(rep_doc["gate"]["checks"].values())
    _log(f"rep {index}: correctness gate {'PASS' if rep_doc['gate']['ok'] else 'FAIL'}")
    return rep_doc, reps


def schema_cost(minimal: Repetition, own: Repetition) -> float:
    """own events/s ÷ minimal TPS: mean of the own baselines over the mean of the minimal ones around a point."""
    return common.ratio((own.a + own.b) / 2, minimal.a, minimal.b)


def run(args: argparse.Namespace) -> int:
    import redis

    quick = common.apply_quick(args, QUICK, args._defaults)
    cfg_clients = [int(x) for x in _csv(args.clients)]
    cfg_tenants = [int(x) for x in _csv(args.tenants)]
    if any(t < 1 or t > OWN_TENANTS for t in cfg_tenants):
        raise BenchError(f"--tenants: each value must be 1..{OWN_TENANTS}")
    modes = _csv(args.modes, MODES)
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("pgbench", "psql"):
        common.need_tool(tool)
    try:
        redis.Redis.from_url(args.redis_url).ping()
    except Exception as exc:  # noqa: BLE001
        raise BenchError(f"Redis at {args.redis_url} unreachable: {exc}") from None
    sync_commit = pg.setting("synchronous_commit")
    started = common.utc_now()
    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    pgb_db = f"bench_pgb_red_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-reducer-"))
    cfg = Config(
        clients=cfg_clients,
        modes=modes,
        tenants=cfg_tenants,
        tasks=args.tasks,
        warmup_tasks=args.warmup_tasks,
        duration=args.duration,
        redis_url=args.redis_url,
        key_prefix=f"bench-reducer-{tag}:",
        poll_interval=args.poll_interval,
        point_timeout=args.point_timeout,
        workdir=workdir,
        lag=args.lag,
        dup_fraction=args.dup_fraction,
        seed=args.seed,
    )
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "date": started,
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {
            "reps": args.reps,
            "duration_s": args.duration,
            "clients": cfg.clients,
            "modes": modes,
            "tenants": cfg.tenants,
            "quick": args.quick,
            "quick_changed": quick,
            "tasks_per_point": args.tasks,
            "warmup_tasks_per_point": args.warmup_tasks,
            "events_per_task": 2,
            "dup_fraction": args.dup_fraction,
            "lag": args.lag,
            "seed": args.seed,
            "poll_interval_s": args.poll_interval,
            "worker_queues": args.worker_queues,
            "worker_processes": args.worker_processes,
            "reducer_batch": args.reducer_batch,
            "synchronous_commit": sync_commit,
            "redis_key_prefix": cfg.key_prefix,
            "wait_quiet_s": args.wait_quiet,
            "baseline_minimal": "pgbench -n -M prepared -T D -c C -j 2 -f bench/sql/transition.sql "
            "(schema + 100k tasks: bench/sql/create_task_schema.sql); rate = TPS",
            "baseline_own": "pgbench -n -M prepared -T D -c C -j 2 -D base=.. -D stride=.. -D n=0 -D ts=.. "
            "-f <own script captured at run time> on fresh tasks of a scratch aivedio database; "
            f"rate = {EVENTS_PER_SCRIPT} events per script execution",
            "chain": "per C and tenant spread T: [minimal, own] A, in-process, [..] B, Dramatiq, [..] C; "
            "in-process ÷ mean(A, B), Dramatiq ÷ mean(B, C), for each baseline on its own",
            "pool_size": "= worker threads",
            "discard_rule": f"max(A,B)/min(A,B) - 1 > {common.MAX_BASELINE_DIVERGENCE}",
        },
        "targets": {"ratio": TARGET_RATIO, "floor": FLOOR_RATIO, "stretch_micro_batching": STRETCH_RATIO},
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
    all_reps: dict[tuple[str, int, int, str], list[Repetition]] = defaultdict(list)
    rep_docs: list[dict[str, Any]] = []
    created: list[str] = []
    code = 0
    real_stdout = sys.stdout
    _log(f"baseline database {pgb_db}; Redis prefix {cfg.key_prefix}; workdir {workdir}")
    try:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            pg.create_db(pgb_db)
            created.append(pgb_db)
            pg.psql(pgb_db, file=common.SQL_DIR / "create_task_schema.sql")
            for i in range(1, args.reps + 1):
                quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
                sys_db, own_db = f"bench_red_{tag}_r{i}", f"bench_own_red_{tag}_r{i}"
                created += [sys_db, own_db]
                rep_doc, reps = run_repetition(i, cfg, pg, pgb_db, sys_db, own_db, i == args.reps, args)
                rep_doc["quiet_before"] = quiet
                rep_docs.append(rep_doc)
                for key, r in reps.items():
                    all_reps[key].append(r)
                if not args.keep_dbs:
                    for db in (sys_db, own_db):
                        pg.drop_db(db)
                        created.remove(db)
            doc.update(summary_doc(all_reps, cfg), repetitions=rep_docs, extra=cfg.extra)
            doc["own_transaction"] = rep_docs[-1].get("own_transaction") if rep_docs else None
            doc["round_trips"] = round_trip_summary(doc)
            gate_ok = all(r["gate"]["ok"] for r in rep_docs)
            doc["gate"] = {"ok": gate_ok}
            headline = doc["summary"]["headline"]
            if not gate_ok:
                code = 1
            elif not any(common.kept(all_reps[(headline, c, cfg.tenants[0], "minimal")]) for c in cfg.clients):
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
        path = Path(args.json_out) if args.json_out else common.default_json_path(NAME)
        for t, sc in ((doc.get("own_transaction") or {}).get("scripts") or {}).items():
            sql_path = path.with_name(f"{path.stem}-own-t{t}.sql")
            sql_path.parent.mkdir(parents=True, exist_ok=True)
            sql_path.write_text(sc["script"])
            sc["file"] = str(sql_path)
        path = common.write_json(path, doc)
        shutil.rmtree(workdir, ignore_errors=True)
        if args.json and "error" in doc:  # still one JSON object on stdout, saying what went wrong
            real_stdout.write(json.dumps(common.json_clean(doc), default=str) + "\n")
    common.emit(args, doc, render(doc), path, real_stdout)
    return code


def summary_doc(all_reps: dict[tuple[str, int, int, str], list[Repetition]], cfg: Config) -> dict[str, Any]:
    def sp(values: list[float]) -> dict[str, Any] | None:
        x = common.summarize(values)
        return x.as_dict() if x else None

    points: dict[str, Any] = {}
    keys = sorted({k[:3] for k in all_reps}, key=lambda k: (MODES.index(k[0]), k[1], k[2]))
    for mode, c, tn in keys:
        mins, owns = all_reps[(mode, c, tn, "minimal")], all_reps[(mode, c, tn, "own")]
        pairs = list(zip(mins, owns, strict=False))
        points[f"{mode}_c{c}_t{tn}"] = {
            "mode": mode,
            "clients": c,
            "tenants": tn,
            "total": len(mins),
            "kept_minimal": len(common.kept(mins)),
            "kept_own": len(common.kept(owns)),
            "kept_both": sum(1 for m, o in pairs if m.kept and o.kept),
            "ratio_vs_minimal": sp([m.ratio for m in mins if m.kept]),
            "client_path_cost": sp([o.ratio for o in owns if o.kept]),
            "schema_cost": sp([schema_cost(m, o) for m, o in pairs if m.kept and o.kept]),
            "events_per_s": sp([m.system for m, o in pairs if m.kept or o.kept]),
            "minimal_tps_mean": sp([(m.a + m.b) / 2 for m in mins if m.kept]),
            "own_events_per_s_mean": sp([(o.a + o.b) / 2 for o in owns if o.kept]),
            "per_rep": [
                {"minimal": m.as_dict(), "own": o.as_dict(), "schema_cost": schema_cost(m, o)} for m, o in pairs
            ],
        }

    def works(mode: str) -> bool:
        return mode in cfg.modes and all(
            math.isfinite(r.system) for (m, *_), rs in all_reps.items() if m == mode for r in rs
        )

    headline = next((m for m in HEADLINE_PREFERENCE if works(m)), cfg.modes[0])
    return {"summary": {"headline": headline, "points": points}}


def round_trip_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Round trips per event: counted on the wire (libpq trace) for reduce_event and the actor, and per pgbench
    execution for each transaction of the own script and for transition.sql."""
    out: dict[str, Any] = {}
    rt = (doc.get("extra") or {}).get("round_trips") or {}
    for k, v in rt.items():
        if isinstance(v, dict):
            out[k] = {
                "round_trips": v["per_event"],
                "checkouts": v.get("checkouts_per_event"),
                "parse_messages": v["parse_messages_per_event"],
                "redis_commands": v["redis_commands_per_event"],
                "sequence": v.get("sequence"),
            }
    own = doc.get("own_transaction") or {}
    for _t, sc in (own.get("scripts") or {}).items():
        for name, n, shape in zip(
            ("RUNNING", "SUCCEEDED", "re-delivery"), sc.get("tx_round_trips", []), sc.get("shape", []), strict=False
        ):
            out[f"own script {name} (pgbench)"] = {"round_trips": n, "sequence": ["BEGIN", *shape, "COMMIT"]}
        break
    out["minimal transition.sql (pgbench)"] = {
        "round_trips": common.script_round_trips((common.SQL_DIR / "transition.sql").read_text())
    }
    return out


# ------------------------------------------------------------------------------------------------ output
def render(doc: dict[str, Any]) -> str:
    m, g, cfg = doc["machine"], doc["git"], doc["config"]
    head = (
        f"reducer — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
        f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
        f"synchronous_commit={cfg['synchronous_commit']}, {cfg['reps']} reps, pgbench {cfg['duration_s']} s per "
        f"baseline, {cfg['tasks_per_point']:,} tasks per point (2 events each + {100 * cfg['dup_fraction']:.0f} % "
        f"re-deliveries){' — QUICK' if cfg.get('quick') else ''}"
    )
    out = [head]
    sm = doc.get("summary")
    if not sm:
        return "\n".join(out + ["", f"no result: {doc.get('error', '?')}"])
    headline = sm["headline"]
    out += [
        "",
        f"Headline mode: {MODE_LABEL[headline]}. Minimal = transition.sql (TPS = transitions/s); own = the "
        f"actor's own transactions replayed by pgbench ({EVENTS_PER_SCRIPT} events per execution).",
    ]

    def sp(d: dict[str, Any] | None) -> common.Spread | None:
        return common.Spread(d["median"], d["min"], d["max"], d["n"]) if d else None

    rows = []
    for p in sm["points"].values():
        mark = " ★" if p["mode"] == headline else ""
        cells = []
        for metric, digits in (
            ("ratio_vs_minimal", 3),
            ("schema_cost", 3),
            ("client_path_cost", 3),
            ("events_per_s", 2),
            ("minimal_tps_mean", 2),
            ("own_events_per_s_mean", 2),
        ):
            med, spread = fmt_spread(sp(p[metric]), digits)
            cells.append(med if spread in ("—", f"{med} – {med}") else f"{med} ({spread})")
        rows.append(
            [
                f"{MODE_LABEL[p['mode']]}{mark}",
                p["clients"],
                p["tenants"],
                *cells,
                f"{p['kept_minimal']}/{p['kept_own']}/{p['kept_both']} of {p['total']}",
            ]
        )
    out += [
        "",
        table(
            [
                "mode",
                "c",
                "tenants",
                "÷ minimal (target ≥ 0.5)",
                "schema cost own ÷ minimal",
                "client-path cost ÷ own",
                "events/s",
                "minimal TPS",
                "own events/s",
                "kept min/own/both",
            ],
            rows,
        ),
        "(median, and the spread in brackets when there are several kept repetitions)",
    ]

    modes_run = [m_ for m_ in MODES if m_ in cfg["modes"]]
    hdr, per = ["rep", "c", "tenants", "A minimal / own"], []
    for k, mode in enumerate(modes_run):
        hdr += [f"{MODE_LABEL[mode]} events/s", f"{'BC'[k]} minimal / own"]
    for rep in doc.get("repetitions", []):
        for key, chain in rep["chains"].items():
            c, tn = key.removeprefix("c").split("_t")

            def both(b: dict[str, Any] | None) -> str:
                b = b or {}
                return f"{fmt((b.get('minimal') or {}).get('tps'))} / {fmt((b.get('own') or {}).get('events_per_s'))}"

            row = [rep["index"], c, tn, both(chain.get("A"))]
            for k, mode in enumerate(modes_run):
                row += [fmt((chain.get(mode) or {}).get("events_per_s")), both(chain.get("BC"[k]))]
            per.append(row)
    if per:
        out += [
            "",
            "Per repetition, in run order (chain A → "
            + " → ".join(f"{MODE_LABEL[m_]} → {'BC'[k]}" for k, m_ in enumerate(modes_run))
            + "):",
            table(hdr, per),
        ]
    ratio_rows = []
    for p in sm["points"].values():
        for r in p["per_rep"]:
            for base in ("minimal", "own"):
                x = r[base]
                div = x["baseline_divergence"]
                ratio_rows.append(
                    [
                        x["index"],
                        MODE_LABEL[p["mode"]],
                        p["clients"],
                        p["tenants"],
                        base,
                        fmt(x["baseline_a"]),
                        fmt(x["system"]),
                        fmt(x["baseline_b"]),
                        f"{100 * div:.1f} %" if div is not None else "—",
                        fmt(x["ratio"], 3),
                        "yes" if x["kept"] else "DISCARDED",
                    ]
                )
    ratio_rows.sort(key=lambda x: (x[0], x[2], x[3], x[1], x[4]))
    out += [
        "",
        "Ratios per repetition (each against the two baselines of its kind around it):",
        table(
            ["rep", "mode", "c", "tenants", "baseline", "before", "events/s", "after", "A/B differ", "ratio", "kept"],
            ratio_rows,
        ),
    ]

    cpu_rows = []
    for rep in doc.get("repetitions", []):
        for key, chain in rep["chains"].items():
            for name, point in chain.items():
                subs = (
                    [(f"{name} minimal", point.get("minimal")), (f"{name} own", point.get("own"))]
                    if name in ("A", "B", "C")
                    else [(MODE_LABEL.get(name, name), point)]
                )
                for label, pt in subs:
                    cpu = (pt or {}).get("cpu")
                    if not cpu:
                        continue
                    rate = pt.get("events_per_s") if "events_per_s" in pt else pt.get("tps")
                    if label.endswith("own"):
                        rate = pt.get("tps")

                    def cell(*groups: str, cpu: dict[str, float] = cpu, rate: Any = rate) -> str:
                        vals = [cpu[f"{g_}_cores"] for g_ in groups if f"{g_}_cores" in cpu]
                        if not vals:
                            return "—"
                        cores = sum(vals)
                        ok = rate and isinstance(rate, (int, float)) and math.isfinite(rate)
                        return f"{cores:.2f} ({cores * 1e6 / rate:.0f})" if ok else f"{cores:.2f}"

                    cpu_rows.append(
                        [
                            f"rep {rep['index']} {key} {label}",
                            fmt(rate),
                            f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %",
                            f"{cpu['other_cores']:.2f}",
                            cell("pgbench", "bench"),
                            cell("postgres"),
                            cell("pg_shared"),
                            cell("redis"),
                        ]
                    )
    if cpu_rows:
        out += [
            "",
            "Where the CPU goes (cores, sampled over each point; CPU µs per event, per transaction (minimal) "
            "or per script execution (own) in brackets; 'client' = pgbench or this Python process; 'other' "
            "= everything else on the shared box):",
            table(["point", "rate/s", "box busy", "other", "client", "PG backends", "PG shared", "redis"], cpu_rows),
        ]

    extra = doc.get("extra", {})
    ai = extra.get("actor_inproc")
    reps_doc = doc.get("repetitions", [])
    if ai and "events_per_s" in ai and reps_doc:
        c = str(ai["threads"])
        chain = reps_doc[-1]["chains"].get(f"c{c}_t1", {})
        rows = []
        for label, point in (
            (f"reduce_event, {c} threads (in-process point)", chain.get("inproc")),
            (f"actor function, {c} plain threads (no broker)", ai),
            (f"Dramatiq worker, {c} threads (Dramatiq point)", chain.get("dramatiq")),
        ):
            if not point or "events_per_s" not in point:
                continue
            cpu, rate = point.get("cpu") or {}, point["events_per_s"]

            def us(g_: str, cpu: dict[str, float] = cpu, rate: float = rate) -> str:
                cores = cpu.get(g_ + "_cores")
                return f"{cores * 1e6 / rate:,.0f}" if cores is not None and rate and math.isfinite(rate) else "—"

            rows.append([label, fmt(rate), us("bench"), us("postgres"), us("redis")])
        if rows:
            out += [
                "",
                f"Where the Dramatiq figure goes (last repetition, c={c}, 1 tenant; CPU µs per event):",
                table(["path", "events/s", "Python process", "PG backends", "redis"], rows),
            ]
    rt = doc.get("round_trips")
    if rt:
        out += [
            "",
            "Round trips per event (counted: libpq protocol trace, one per wait for the server — a Sync, a "
            "Flush or a simple query answered —, 1 thread, after a warm-up on the same path; pgbench: one per "
            "command of the script, a pipeline once):",
            table(
                ["path", "PG round trips", "checkouts", "Parse msgs", "Redis cmds", "what they are"],
                [
                    [
                        k,
                        fmt(v.get("round_trips")),
                        fmt(v.get("checkouts")),
                        fmt(v.get("parse_messages")),
                        fmt(v.get("redis_commands")),
                        ", ".join(v.get("sequence") or []),
                    ]
                    for k, v in rt.items()
                ],
            ),
        ]
    elif (extra.get("round_trips") or {}).get("skipped"):
        out += ["", f"round trips: {extra['round_trips']['skipped']}"]

    own = doc.get("own_transaction") or {}
    for t, sc in (own.get("scripts") or {}).items():
        v = sc["verify"]
        out += [
            "",
            f"Own transactions replayed by pgbench, {t} tenant(s) ({sc['statements']} statements, "
            f"{sc['round_trips']} round trips per execution with the re-delivery; "
            f"{sc.get('file', 'script in the JSON')}): writes the rows the actor writes: "
            f"{'yes' if v['ok'] else 'NO'} — per table (ins, upd, del) per RUNNING+SUCCEEDED+re-delivery, "
            f"actor / replay: "
            + "; ".join(f"{tb} {x['product']} / {x['replay']}" for tb, x in v["per_table_ins_upd_del_per_op"].items()),
            "  values: " + ", ".join(f"{k} ×{n}" for k, n in sc["how_values_vary"].items()),
        ]
        out += [f"  warning: {w}" for w in sc["warnings"]]
    overruns = [
        f"rep {r['index']} {key} {name}"
        for r in reps_doc
        for key, ch in r["chains"].items()
        for name, b in ch.items()
        if name in ("A", "B", "C") and (b.get("own") or {}).get("overrun")
    ]
    if overruns:
        out += ["", "Own baselines that ran out of fresh tasks (rate not used): " + ", ".join(overruns)]

    prof = extra.get("profile")
    if prof and "top_self" in prof:
        load = prof.get("load") or {}
        out += [
            "",
            f"py-spy --gil (Python CPU only), in-process mode, {prof['threads']} threads, {prof['seconds']} s: "
            f"{prof['samples']} samples ({prof['samples'] - prof['cpu_samples']} blocking leaves dropped); "
            f"the profiled run did {fmt(load.get('events_per_s'))} events/s. Top 10 by own time:",
            table(
                ["#", "frame", "% of CPU samples"],
                [[i + 1, f["frame"], f["pct"]] for i, f in enumerate(prof["top_self"])],
            ),
            "",
            "Top 10 by inclusive CPU time (thread wrappers left out):",
            table(
                ["#", "frame", "% of CPU samples"],
                [[i + 1, f["frame"], f["pct"]] for i, f in enumerate(prof["top_inclusive"])],
            ),
            "",
            "Own CPU time by package: " + ", ".join(f"{p['package']} {p['pct']} %" for p in prof["self_by_package"]),
        ]
    elif prof:
        out += ["", f"profile: {prof.get('skipped')}"]

    for rep in doc.get("repetitions", []):
        gt = rep.get("gate")
        if not gt:
            continue
        out += [
            "",
            f"Correctness gate, rep {rep['index']}: {'PASS' if gt['ok'] else 'FAIL'} — tasks {gt['tasks']:,}, "
            f"inbox rows {gt['inbox_rows']:,} (distinct events {gt['distinct_events']:,}), state events "
            f"{gt['state_events']:,} (not applied: {gt['state_events_not_applied'] or 0}), fetch.requested "
            f"rows {gt['fetch_requested_rows']:,}, dead letters {gt['dead_letters']}",
        ]
        out += [f"  [{'x' if ok else ' '}] {name}" for name, ok in gt["checks"].items()]
        if gt["errors"]:
            out += [f"  first error: {gt['errors'][0]}"]
    return "\n".join(out)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
