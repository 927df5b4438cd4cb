"""Prometheus metrics: the capacity signals.

Two kinds:
- Process metrics (module-level prometheus-client objects in the default registry): what this process's actors
  did — calls by outcome, durations, calls in progress (hence media worker utilization). They describe the
  process that is scraped, so they are meaningful where the worker role runs (`serve --role all`).
- Database-derived gauges (`DbCollector`): the truth about queues, providers, the outbox, credits and alerts is
  in the database, shared by all processes, so it is read at scrape time (`db.snapshot.read_snapshot`: a handful of
  index-backed aggregates on one connection, with a short statement timeout). A failing read is reported as
  `aivedio_metrics_db_up 0`, never as a failed scrape.

polling_qps / polling_error_rate are the process counter `aivedio_provider_polls_total{provider,outcome}`
(`rate()` of it, and the `failed` share), counted where the polling runs.

orphan_object_count is `aivedio_orphan_objects` (with `aivedio_orphan_object_bytes`, `aivedio_storage_objects`,
`aivedio_storage_object_bytes`): objects in our store that no row references. Counting them takes a full bucket
listing, which no scrape may do, so they come from the newest completed row of `storage_scans`, written by the
sweeper every `sweeper.storage_scan_interval_s` (services/storage_scan.py); `aivedio_storage_scan_age_seconds`
says how old those figures are and keeps growing while scans fail. Before the first completed scan the five are
absent rather than 0 (like the broker gauges without a Redis broker): "never counted" is not "none".
(`aivedio_orphan_provider_events` is the other orphan: provider events for jobs we never recorded.)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from aivedio_engine.db import server
from aivedio_engine.db.handles import SQLAlchemyError
from aivedio_engine.db.snapshot import Snapshot, read_snapshot
from aivedio_engine.domain.events import Queue
from aivedio_engine.domain.status import AttemptStatus, StateEventOutcome, TaskStatus
from aivedio_engine.observability.snapshot import storage_usage

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Engine

log = logging.getLogger(__name__)
#: a standard-library logger, so a process that never configured logging stays quiet at DEBUG
_events = logging.getLogger("aivedio.actors")
#: outcomes that mean an observation lost a race with the task's state (duplicates are expected, not conflicts)
CONFLICT_OUTCOMES = frozenset(
    {StateEventOutcome.STALE.value, StateEventOutcome.ILLEGAL.value, StateEventOutcome.ANOMALY.value}
)

# --- process metrics ----------------------------------------------------------------------------------------

ACTOR_CALLS = Counter(
    "aivedio_actor_messages", "Broker messages handled by this process's actors.", ["actor", "outcome"]
)
ACTOR_SECONDS = Histogram(
    "aivedio_actor_duration_seconds",
    "Time one actor call took in this process.",
    ["actor"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
#: status queries of the polling loop: observed (a status came back), not_found (not visible yet), failed
PROVIDER_POLLS = Counter(
    "aivedio_provider_polls", "Provider status queries made by this process's polling loop.", ["provider", "outcome"]
)
CREATES_SHED = Counter(
    "aivedio_creates_shed",
    "New generations refused with 503 because the outbox backlog is older than limits.shed_outbox_age_s.",
)
REQUESTS_RATE_LIMITED = Counter(
    "aivedio_requests_rate_limited",
    "Requests refused with 429 by a tenant's token bucket (api.tenant_rate_limit_per_s / tenants update).",
    ["action"],
)
CREATE_BATCHES = Histogram(
    "aivedio_create_batch_size",
    "Creates sent together in one statement by this API process (db/creation_batch.py; a lone create counts 1).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
#: a batch that could not commit whole (a short stripe, a twin in flight, a deadlock): its creates ran one by one
CREATE_BATCH_FALLBACKS = Counter(
    "aivedio_create_batch_fallbacks",
    "Create batches rolled back and retried one create at a time, by the SQLSTATE that stopped them.",
    ["sqlstate"],
)
REDUCER_BATCHES = Histogram(
    "aivedio_reducer_batch_size",
    "Status observations reduced together in one transaction by this worker (services/reducer_batch.py).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
#: a batch that could not commit whole (a deadlock, an attempt conflict, one bad event): its events ran one by one
REDUCER_BATCH_FALLBACKS = Counter(
    "aivedio_reducer_batch_fallbacks",
    "Reducer batches rolled back and reduced one event at a time, by the error class that stopped them.",
    ["error"],
)
#: provider callbacks answered 401 by this API process (`callback_rejections` holds them across processes)
CALLBACK_VERIFY_FAILURES = Counter(
    "aivedio_callback_verify_failures",
    "Provider callbacks that failed verification in this process, by provider and reason "
    "(signature, timestamp, not_configured, malformed).",
    ["provider", "reason"],
)
#: SSE wake-ups this process could not hand to Redis (`notify.py`): dropped, the streams catch up on a heartbeat
SSE_SIGNALS_DROPPED = Counter(
    "aivedio_sse_signals_dropped",
    "Task and project status signals for SSE streams dropped by this process because Redis was unavailable.",
)
ACTOR_IN_PROGRESS = Gauge("aivedio_actor_in_progress", "Actor calls running now in this process.", ["actor"])
MEDIA_ACTORS = ("process_media",)


@contextmanager
def measure_actor(actor: str) -> Iterator[None]:
    """Count, time and log one actor call (inside the caller's log context, so the line carries its ids)."""
    started = time.perf_counter()
    outcome = "error"
    with ACTOR_IN_PROGRESS.labels(actor).track_inprogress():
        try:
            yield
            outcome = "ok"
        finally:
            elapsed = time.perf_counter() - started
            ACTOR_SECONDS.labels(actor).observe(elapsed)
            ACTOR_CALLS.labels(actor, outcome).inc()
            _events.debug(
                "actor finished", extra={"actor": actor, "outcome": outcome, "duration_ms": round(elapsed * 1000, 1)}
            )


# --- database-derived gauges ----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def _gauge(
    name: str,
    doc: str,
    value: float | None = None,
    labels: list[str] | None = None,
    samples: dict[tuple[str, ...], float] | None = None,
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, value=value if labels is None else None, labels=labels)
    for key, v in (samples or {}).items():
        family.add_metric(list(key), v)
    return family


def _age(now: datetime, then: datetime | None) -> float:
    return 0.0 if then is None else max(0.0, (now - then).total_seconds())


def snapshot_families(s: Snapshot, settings: Settings, now: datetime) -> list[GaugeMetricFamily]:
    providers = sorted(p for p, cfg in settings.providers.items() if cfg.enabled)

    def by_provider(counts: dict[str, int]) -> dict[tuple[str, ...], float]:
        # every configured provider gets a sample, so a dashboard shows a zero rather than a gap
        return {(p,): float(counts.get(p, 0)) for p in sorted({*providers, *counts})}

    def status(name: str) -> int:
        return sum(n for (st, _), n in s.tasks.items() if st == name)

    active: dict[str, int] = {}
    unknown: dict[str, int] = {}
    for (provider, state), n in s.attempts.items():
        active[provider] = active.get(provider, 0) + n
        if state == AttemptStatus.UNKNOWN.value:
            unknown[provider] = unknown.get(provider, 0) + n
    fetching = {p: n for (st, p), n in s.tasks.items() if st == TaskStatus.OUTPUT_FETCHING.value}
    window = settings.metrics.window_s
    total_events = sum(s.outcomes.values())
    conflicts = sum(n for outcome, n in s.outcomes.items() if outcome in CONFLICT_OUTCOMES)
    return [
        _gauge(
            "aivedio_tasks",
            "Unfinished tasks by status and selected provider.",
            labels=["status", "provider"],
            samples={k: float(v) for k, v in s.tasks.items()},
        ),
        _gauge(
            "aivedio_submission_rate", f"Tasks created per second over the last {window:g} s.", s.submissions / window
        ),
        _gauge("aivedio_queue_depth", "Tasks QUEUED, waiting for a provider slot.", status(TaskStatus.QUEUED.value)),
        _gauge(
            "aivedio_queue_age_p95_seconds",
            "95th percentile of how long QUEUED tasks have waited since they were created.",
            _age(now, s.queue_p95),
        ),
        _gauge("aivedio_queue_oldest_age_seconds", "Age of the oldest QUEUED task.", _age(now, s.queue_oldest)),
        _gauge(
            "aivedio_provider_active_jobs",
            "Attempts in flight (NEW, SENDING, ACKED, RUNNING, UNKNOWN) per provider.",
            labels=["provider"],
            samples=by_provider(active),
        ),
        _gauge(
            "aivedio_provider_limit",
            "Configured concurrency limit per provider (providers.*.max_concurrency).",
            labels=["provider"],
            samples={(p,): float(settings.providers[p].max_concurrency) for p in providers},
        ),
        _gauge(
            "aivedio_submit_unknown",
            "Attempts whose submit outcome is unknown (awaiting reconciliation).",
            labels=["provider"],
            samples=by_provider(unknown),
        ),
        _gauge(
            "aivedio_output_fetch_backlog",
            "Tasks in OUTPUT_FETCHING per provider.",
            labels=["provider"],
            samples=by_provider(fetching),
        ),
        _gauge(
            "aivedio_output_url_expiry_risk",
            "Tasks still fetching whose provider output URL expires within fetch.urgent_within_s (or already expired).",
            labels=["provider"],
            samples=by_provider(s.expiry_risk),
        ),
        _gauge(
            "aivedio_media_backlog",
            "Tasks in POST_PROCESSING (waiting for or in media processing).",
            status(TaskStatus.POST_PROCESSING.value),
        ),
        _gauge("aivedio_outbox_pending", "Outbox rows due for publishing and not yet published.", s.outbox_due),
        _gauge(
            "aivedio_outbox_oldest_age_seconds",
            "How long the oldest due outbox row has waited for the relay.",
            _age(now, s.outbox_oldest),
        ),
        _gauge("aivedio_reserved_credits", "Credits reserved by unfinished tasks.", s.reserved_credits),
        _gauge(
            "aivedio_reserved_credit_age_seconds",
            "Age of the oldest open credit reservation.",
            _age(now, s.reserved_oldest),
        ),
        _gauge(
            "aivedio_orphan_provider_events",
            "Provider events for jobs no attempt owns (possible orphan cost).",
            labels=["provider"],
            samples=by_provider(s.orphans),
        ),
        _gauge("aivedio_dead_letters", "Broker messages in the dead letters, not replayed.", s.dead_letters),
        _gauge(
            "aivedio_open_alerts",
            "Open alerts by rule and severity.",
            labels=["rule", "severity"],
            samples={k: float(v) for k, v in s.open_alerts.items()},
        ),
        _gauge(
            "aivedio_state_events",
            f"Task state events recorded in the last {window:g} s by outcome.",
            labels=["outcome"],
            samples={(k,): float(v) for k, v in s.outcomes.items()},
        ),
        _gauge(
            "aivedio_state_transition_conflict_rate",
            f"Share of the last {window:g} s of state events that "
            "lost a race (stale, illegal or anomalous observations).",
            conflicts / total_events if total_events else 0.0,
        ),
        _gauge(
            "aivedio_callback_lag_p95_seconds",
            f"95th percentile over the last {window:g} s of provider event time to our processing of the callback.",
            percentile(s.callback_lags, 0.95),
        ),
        *_storage_scan_families(s, now),
    ]


def workflow_families(conn: Any, now: datetime) -> list[GaugeMetricFamily]:
    """System B: projects by status, open steps by queue and status, and each workflow queue's due
    depth and age (the backlog signals)."""
    from aivedio_engine.db import workflows as wf_repo

    backlog = wf_repo.backlog(conn, now)
    return [
        _gauge(
            "aivedio_projects",
            "System B projects by status.",
            labels=["status"],
            samples={(st,): float(n) for st, n in wf_repo.projects_by_status(conn).items()},
        ),
        _gauge(
            "aivedio_workflow_steps",
            "Workflow steps not yet finished for good (pending, running, retrying, failed, manual_required), "
            "by queue and status.",
            labels=["queue", "status"],
            samples={k: float(n) for k, n in wf_repo.open_steps_by_queue(conn).items()},
        ),
        _gauge(
            "aivedio_workflow_queue_due",
            "Workflow steps due now (pending, or retrying past their delay), by queue.",
            labels=["queue"],
            samples={(b.queue,): float(b.due) for b in backlog},
        ),
        _gauge(
            "aivedio_workflow_queue_age_seconds",
            "How long the longest-waiting due step of each workflow queue has been due.",
            labels=["queue"],
            samples={(b.queue,): _age(now, b.oldest_due_at) for b in backlog},
        ),
    ]


def _storage_scan_families(s: Snapshot, now: datetime) -> list[GaugeMetricFamily]:
    scan = s.storage_scan
    if scan is None:
        return []
    return [
        _gauge(
            "aivedio_orphan_objects",
            "Objects in the object store that no database row references and that are "
            "older than the scan's grace (newest completed storage scan).",
            scan.orphans,
        ),
        _gauge("aivedio_orphan_object_bytes", "Bytes held by those orphan objects.", scan.orphan_bytes),
        _gauge(
            "aivedio_storage_objects", "Objects in the object store at the newest completed storage scan.", scan.objects
        ),
        _gauge(
            "aivedio_storage_object_bytes",
            "Bytes in the object store at the newest completed storage scan.",
            scan.bytes,
        ),
        _gauge(
            "aivedio_storage_scan_age_seconds",
            "Time since the newest completed storage scan finished (the age of the figures above).",
            _age(now, scan.finished_at),
        ),
    ]


class DbCollector(Collector):
    """Reads the database-derived gauges at scrape time; scrapes within `metrics.cache_s` share one read."""

    def __init__(self, engine: Engine, settings: Settings, clock: Clock) -> None:
        self._engine = engine
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()  # concurrent scrapes wait for one read instead of each running the queries
        self._cached: tuple[float, list[Any]] | None = None
        self._redis: Any = None

    def describe(self) -> list[Any]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Any]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > self._settings.metrics.cache_s:
                self._cached = (time.monotonic(), self._read())
            families = self._cached[1]
        return iter(families)

    def _read(self) -> list[Any]:
        started = time.perf_counter()
        now = self._clock.now()
        families: list[Any] = []
        up = 1.0
        try:
            with self._engine.connect() as conn, conn.begin():
                server.limit_statement_time(conn, self._settings.metrics.query_timeout_ms)
                snapshot = read_snapshot(
                    conn,
                    now,
                    window_s=self._settings.metrics.window_s,
                    urgent_within_s=self._settings.fetch.urgent_within_s,
                )
                workflow = workflow_families(conn, now)
            families += snapshot_families(snapshot, self._settings, now) + workflow
        except SQLAlchemyError as exc:
            up = 0.0
            log.warning("metrics: database read failed: %s", str(exc).splitlines()[0][:300])
        families += self._broker_families() + self._storage_families()
        workers = self._settings.broker.worker_threads
        in_progress = sum(
            REGISTRY.get_sample_value("aivedio_actor_in_progress", {"actor": a}) or 0.0 for a in MEDIA_ACTORS
        )
        families.append(
            _gauge(
                "aivedio_media_worker_utilization",
                "Media actor calls running in this process per worker thread (process-local).",
                in_progress / workers,
            )
        )
        families.append(_gauge("aivedio_metrics_db_up", "1 when this scrape's database queries succeeded.", up))
        families.append(
            _gauge(
                "aivedio_metrics_scrape_duration_seconds",
                "Time the database-derived gauges took.",
                time.perf_counter() - started,
            )
        )
        return families

    def _broker_families(self) -> list[Any]:
        """mq_consumer_lag: messages waiting in each RabbitMQ or Redis broker queue (and its delay queue). A stub
        broker lives in the worker's memory and cannot be read from here."""
        if self._settings.broker.kind == "rabbitmq":
            return self._queue_depth_families(self._rabbitmq_depths())
        if self._settings.broker.kind != "redis":
            return []
        import redis

        from aivedio_engine.worker.broker import redis_namespace

        timeout = self._settings.metrics.query_timeout_ms / 1000
        try:
            if self._redis is None:
                self._redis = redis.Redis.from_url(
                    self._settings.broker.url, socket_timeout=timeout, socket_connect_timeout=timeout
                )
            ns = redis_namespace(self._settings)
            pipe = self._redis.pipeline(transaction=False)
            for q in Queue:
                pipe.llen(f"{ns}:{q.value}")
                pipe.llen(f"{ns}:{q.value}.DQ")
            lengths = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics: broker queue read failed: %s", exc)
            return []
        return self._queue_depth_families(
            {
                (q.value, kind): float(lengths[2 * i + j])
                for i, q in enumerate(Queue)
                for j, kind in enumerate(("ready", "delayed"))
            }
        )

    def _rabbitmq_depths(self) -> dict[tuple[str, ...], float] | None:
        """Ready messages per queue by passive declares (a queue no one declared yet counts 0); the delay queue's
        messages are held by consumers until due, so RabbitMQ shows only those not yet taken."""
        import pika
        import pika.exceptions

        from aivedio_engine.worker.broker import rabbitmq_url

        params = pika.URLParameters(rabbitmq_url(self._settings))
        params.socket_timeout = params.blocked_connection_timeout = self._settings.metrics.query_timeout_ms / 1000
        samples: dict[tuple[str, ...], float] = {}
        try:
            connection = pika.BlockingConnection(params)
        except pika.exceptions.AMQPError as exc:
            log.warning("metrics: broker queue read failed: %s", exc)
            return None
        try:
            for q in Queue:
                for kind, name in (("ready", q.value), ("delayed", f"{q.value}.DQ")):
                    channel = connection.channel()
                    try:
                        depth = channel.queue_declare(name, passive=True).method.message_count
                        channel.close()
                    except pika.exceptions.ChannelClosedByBroker:  # 404: not declared yet
                        depth = 0
                    samples[(q.value, kind)] = float(depth)
        except pika.exceptions.AMQPError as exc:
            log.warning("metrics: broker queue read failed: %s", exc)
            return None
        finally:
            if connection.is_open:
                connection.close()
        return samples

    @staticmethod
    def _queue_depth_families(samples: dict[tuple[str, ...], float] | None) -> list[Any]:
        if samples is None:
            return []
        return [
            _gauge(
                "aivedio_mq_queue_depth",
                "Messages waiting in each broker queue (consumer lag).",
                labels=["queue", "kind"],
                samples=samples,
            )
        ]

    def _storage_families(self) -> list[Any]:
        usage = storage_usage(self._settings)
        return [
            _gauge(
                "aivedio_storage_free_bytes",
                "Free bytes on the file system of each local data path.",
                labels=["path"],
                samples={(p,): float(u.free) for p, u in usage.items()},
            ),
            _gauge(
                "aivedio_storage_total_bytes",
                "Size of the file system of each local data path.",
                labels=["path"],
                samples={(p,): float(u.total) for p, u in usage.items()},
            ),
        ]


def build_registry(ctx: AppContext) -> CollectorRegistry:
    """The registry of one app: its database collector (the process metrics stay in the default registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DbCollector(ctx.engine, ctx.settings, ctx.clock))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """Text exposition of the process metrics and the app's database-derived gauges."""
    return generate_latest(REGISTRY) + generate_latest(registry)
