"""Metrics and alert rules of a running engine.

Real tasks against the sim provider (in-process Pump, FakeClock) for `/metrics` and the alert rules, on SQLite and
PostgreSQL. The logs of real processes are checked in test_log_redaction.py.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa
from dramatiq.brokers.stub import StubBroker
from prometheus_client.parser import text_string_to_metric_families

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.tables import alerts as alerts_table
from aivedio_engine.db.tables import dead_letters, generation_tasks, provider_events
from aivedio_engine.domain.status import AlertStatus
from aivedio_engine.observability.alert_rules import AlertEvaluator
from aivedio_engine.observability.logging import configure_logging
from aivedio_engine.observability.metrics import build_registry, render
from aivedio_engine.services.consume import Envelope
from aivedio_engine.worker.actors import declare_actors
from aivedio_engine.worker.broker import redis_namespace
from tests.support.app import make_context, running_api, tenant_with_key
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.rabbitmq import private_amqp_url
from tests.support.sim import running_sim, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
REDIS_URL = os.environ.get("AIVEDIO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "sqlite" else request.getfixturevalue("pg_url")


def scrape(base: str) -> tuple[Samples, dict[str, str]]:
    r = httpx.get(base + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    docs = {}
    for family in text_string_to_metric_families(text):
        docs[family.name] = family.documentation
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, docs


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def count(ctx: AppContext, status: str) -> int:
    with ctx.engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(generation_tasks).where(generation_tasks.c.status == status)
        ).scalar_one()


def test_metrics_follow_the_tasks(tmp_path: Path, db_url: str | None) -> None:
    with running_sim(seed=3, job_seconds=30, output_url_ttl_s=600) as sim:
        ctx = sim_context(tmp_path, sim, db_url, max_concurrency=2, metrics={"cache_s": 0})
        create_tasks(ctx, 5)  # 2 credits each (sim-v1, 720p, 2 s)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        ctx.dispatcher.run_once()
        drv.pump.run()
        ctx.clock.advance(120)  # type: ignore[attr-defined]
        sim.advance(120)
        with ctx.engine.begin() as conn:  # a message the worker gave up on, and an event for a job we never made
            now = ctx.clock.now()
            conn.execute(
                dead_letters.insert().values(
                    id=new_id(),
                    message_id="m-1",
                    actor="fetch_output",
                    queue="fetch",
                    message={},
                    first_seen_at=now,
                    last_seen_at=now,
                )
            )
            conn.execute(
                provider_events.insert().values(
                    id=new_id(),
                    provider="sim",
                    source="callback",
                    dedup_key="ghost",
                    orphan=True,
                    received_at=now,
                    expires_at=now,
                )
            )
        with running_api(ctx) as base:
            m, docs = scrape(base)
            assert value(m, "aivedio_queue_depth") == 3
            assert value(m, "aivedio_tasks", status="QUEUED", provider="sim") == 3
            assert 120 <= value(m, "aivedio_queue_age_p95_seconds") <= value(m, "aivedio_queue_oldest_age_seconds")
            assert value(m, "aivedio_provider_active_jobs", provider="sim") == 2
            assert value(m, "aivedio_provider_limit", provider="sim") == 2
            assert value(m, "aivedio_submit_unknown", provider="sim") == 0
            assert value(m, "aivedio_reserved_credits") == 10
            assert value(m, "aivedio_reserved_credit_age_seconds") >= 120
            assert value(m, "aivedio_submission_rate") == pytest.approx(5 / 300)
            assert value(m, "aivedio_state_events", outcome="applied") > 0
            assert value(m, "aivedio_state_transition_conflict_rate") == 0
            assert value(m, "aivedio_outbox_pending") == 0
            assert value(m, "aivedio_dead_letters") == 1
            assert value(m, "aivedio_orphan_provider_events", provider="sim") == 1
            assert value(m, "aivedio_metrics_db_up") == 1
            assert value(m, "aivedio_storage_free_bytes", path=str(tmp_path / "data")) > 0
            undocumented = [n for n, doc in docs.items() if n.startswith("aivedio_") and len(doc) < 10]
            assert not undocumented

            sim.advance(31)  # the two running jobs finish; the fetch requests are held back
            drv.run_until(lambda: count(ctx, "OUTPUT_FETCHING") >= 2)
            fetching = count(ctx, "OUTPUT_FETCHING")
            m, _ = scrape(base)
            assert value(m, "aivedio_output_fetch_backlog", provider="sim") == fetching
            # the sim's URLs live 600 s, under fetch.urgent_within_s (900 s): every waiting fetch is at risk
            assert value(m, "aivedio_output_url_expiry_risk", provider="sim") == fetching
            assert value(m, "aivedio_queue_depth") == count(ctx, "QUEUED")
        ctx.close()


def test_broker_queue_depth_is_read_from_redis(tmp_path: Path) -> None:
    prefix = f"obs-{uuid.uuid4().hex[:8]}:"
    ctx = make_context(tmp_path / "data", broker={"kind": "redis", "url": REDIS_URL}, redis={"key_prefix": prefix})
    ns = redis_namespace(ctx.settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.rpush(f"{ns}:fetch", "m1", "m2", "m3")  # where Dramatiq's Redis broker keeps waiting message ids
        client.rpush(f"{ns}:media.DQ", "m4")
        m, _ = parse(render(build_registry(ctx)).decode())
    finally:
        client.delete(f"{ns}:fetch", f"{ns}:media.DQ")
        client.close()
        ctx.close()
    assert value(m, "aivedio_mq_queue_depth", queue="fetch", kind="ready") == 3
    assert value(m, "aivedio_mq_queue_depth", queue="media", kind="delayed") == 1
    assert value(m, "aivedio_mq_queue_depth", queue="state", kind="ready") == 0


def test_actor_calls_are_counted_and_logged_with_their_task_ids(
    tmp_path: Path, restore_logging: None
) -> None:  # the imported fixture
    with running_sim() as sim:
        ctx = sim_context(tmp_path, sim, logging={"format": "json", "level": "DEBUG"})
        out = io.StringIO()
        configure_logging(ctx.settings, stream=out)
        actor = declare_actors(StubBroker(), ctx)["notify_status_changed"]
        task_id = new_id()
        envelope = Envelope(
            event_id=new_id(),
            event_type="task.status.changed",
            schema_version=1,
            aggregate_id=task_id,
            aggregate_version=2,
            tenant_id=None,
            trace_id="req-42",
            causation_id=None,
            occurred_at=ctx.clock.now(),
            payload={"task_id": str(task_id), "version": 2, "status": "QUEUED", "progress": 0},
        )
        with running_api(ctx) as base:
            before, _ = scrape(base)
            actor.fn(envelope.to_dict())
            after, _ = scrape(base)
        key = ("aivedio_actor_messages_total", frozenset({("actor", "notify_status_changed"), ("outcome", "ok")}))
        assert after[key] == before.get(key, 0) + 1
        lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
        (done,) = [line for line in lines if line["event"] == "actor finished"]
        assert done["task_id"] == str(task_id) and done["trace_id"] == "req-42" and done["outcome"] == "ok"
        ctx.close()


# --- alert rules ------------------------------------------------------------------------------------------


#: the threshold rules; the engine's own per-event alerts (e.g. media_failed per task) are not these tests' concern
THRESHOLD_RULES = [
    r.value
    for r in (
        Rule.FAILED_TASKS_HIGH,
        Rule.PROVIDER_CONSECUTIVE_FAILURES,
        Rule.QUEUE_BACKLOG,
        Rule.MEDIA_FAILURE_RATE,
        Rule.COST_ANOMALY,
        Rule.STORAGE_CAPACITY_LOW,
    )
]


def open_alerts(ctx: AppContext) -> dict[tuple[str, str], Any]:
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.select(alerts_table).where(
                alerts_table.c.status == AlertStatus.OPEN.value, alerts_table.c.rule.in_(THRESHOLD_RULES)
            )
        ).all()
    return {(r.rule, r.dedup_key): r for r in rows}


def evaluate_twice(ctx: AppContext) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], Any]]:
    """Evaluate through the sweeper, then again one interval later: the same alerts, seen again."""
    ctx.clock.advance(ctx.settings.alerts.interval_s)  # type: ignore[attr-defined]  # past earlier sweeps' turn
    assert ctx.sweeper.sweep().alerts > 0
    first = open_alerts(ctx)
    assert ctx.sweeper.sweep().alerts == 0  # within alerts.interval_s: not evaluated again
    ctx.clock.advance(ctx.settings.alerts.interval_s)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().alerts == len(first)
    second = open_alerts(ctx)
    assert second.keys() == first.keys()
    for key, row in second.items():
        assert row.id == first[key].id and row.last_seen_at > first[key].last_seen_at
    return first, second


QUIET = {
    "failed_tasks": 1000,
    "provider_consecutive_failures": 1000,
    "queue_depth": 1000,
    "queue_age_s": 86400,
    "media_min_samples": 1000,
    "cost_min_per_hour": "1000000",
    "min_free_bytes": 0,
    "min_free_ratio": 0,
}


def test_failures_raise_failed_tasks_and_provider_streak_once(tmp_path: Path, db_url: str | None) -> None:
    with running_sim(seed=5, faults="fail=1", job_seconds=3) as sim:
        ctx = sim_context(
            tmp_path, sim, db_url, alerts={**QUIET, "failed_tasks": 3, "provider_consecutive_failures": 3}
        )
        create_tasks(ctx, 3)
        drv = Driver(ctx, sim, Pump(ctx))
        drv.run_until(lambda: drv.all_in("FAILED_FINAL"))
        first, _ = evaluate_twice(ctx)
        assert set(first) == {("failed_tasks_high", "all"), ("provider_consecutive_failures", "sim")}
        assert first[("provider_consecutive_failures", "sim")].severity == "critical"
        assert "3 tasks failed" in first[("failed_tasks_high", "all")].message
        ctx.close()


def test_media_failure_rate(tmp_path: Path, db_url: str | None) -> None:
    with running_sim(seed=6, job_seconds=1) as sim:
        # every clip is over the media gate's pixel limit: the media step fails, the provider did its job
        ctx = sim_context(
            tmp_path,
            sim,
            db_url,
            media={"max_pixels": 1},
            alerts={**QUIET, "media_min_samples": 2, "media_failure_rate": 0.5},
        )
        create_tasks(ctx, 2)
        drv = Driver(ctx, sim, Pump(ctx))
        drv.run_until(lambda: drv.all_in("FAILED_FINAL"))
        first, _ = evaluate_twice(ctx)
        assert set(first) == {("media_failure_rate", "media")}
        assert "2 of 2 media steps failed" in first[("media_failure_rate", "media")].message
        ctx.close()


def test_queue_backlog_by_age_then_by_depth(tmp_path: Path, db_url: str | None) -> None:
    with running_sim() as sim:
        ctx = sim_context(tmp_path, sim, db_url, alerts={**QUIET, "queue_depth": 4, "queue_age_s": 600})
        create_tasks(ctx, 3)
        Pump(ctx).run()  # QUEUED; no dispatcher runs, so they stay
        assert ctx.sweeper.sweep().alerts == 0 and count(ctx, "QUEUED") == 3
        ctx.clock.advance(601)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().alerts == 1
        (alert,) = open_alerts(ctx).values()
        assert (alert.rule, alert.dedup_key) == ("queue_backlog", "queued")
        assert alert.message.startswith("3 tasks queued, the oldest for 10.0167 min")
        create_tasks(ctx, 1, prefix="u")  # over both thresholds now: still the one alert, seen again
        ctx.clock.advance(ctx.settings.alerts.interval_s)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().alerts == 1
        (again,) = open_alerts(ctx).values()
        assert again.id == alert.id and again.last_seen_at > alert.last_seen_at
        ctx.close()


def _spend(ctx: AppContext, tenant_id: Any, tasks: int, tag: str) -> None:
    for i in range(tasks):  # 2 credits each (sim-v1, 720p, 2 s), reserved at creation
        ctx.generations.create(tenant_id, f"{tag}{i}", {"prompt": f"shot {i}", "model": "sim-v1", "duration_s": 2})


def test_cost_over_budget_and_against_the_previous_day(tmp_path: Path, db_url: str | None) -> None:
    with running_sim() as sim:
        # nothing relays here, so the first task's outbox row stays due: shedding (its own test) is turned off
        ctx = sim_context(
            tmp_path,
            sim,
            db_url,
            alerts={**QUIET, "cost_budget_per_hour": "5", "cost_factor": 5, "cost_min_per_hour": "10"},
            limits={"shed_outbox_age_s": 0},
        )
        steady, burst = tenant_with_key(ctx, "steady", 1000).tenant_id, tenant_with_key(ctx, "burst", 1000).tenant_id
        _spend(ctx, steady, 1, "a")  # 2 credits, then a quiet day
        ctx.clock.advance(2 * 3600)  # type: ignore[attr-defined]
        _spend(ctx, burst, 3, "b")  # 6 credits in the hour: over the budget, no history
        _spend(ctx, steady, 6, "c")  # 12 credits in the hour: over the budget, and 144 × its mean of the day before
        first, _ = evaluate_twice(ctx)
        assert set(first) == {("cost_anomaly", f"tenant:{burst}"), ("cost_anomaly", f"tenant:{steady}")}
        assert (
            "6 credits committed in the last hour, over the budget of 5"
            in first[("cost_anomaly", f"tenant:{burst}")].message
        )

        # without a budget, only the deviation from the day before is an anomaly
        no_budget = ctx.settings.model_copy(
            update={"alerts": ctx.settings.alerts.model_copy(update={"cost_budget_per_hour": Decimal(0)})}
        )
        findings = AlertEvaluator(ctx.engine, ctx.clock, no_budget, lambda: ctx.liveness).evaluate_now()
        assert [(f.dedup_key, f.subject_id) for f in findings] == [(f"tenant:{steady}", str(steady))]
        assert "over 5 × its hourly mean of 0.08 the day before" in findings[0].message
        ctx.close()


def test_storage_capacity_low(tmp_path: Path) -> None:
    with running_sim() as sim:
        ctx = sim_context(tmp_path, sim, alerts={**QUIET, "min_free_bytes": 2**62})  # more than any disk has
        first, _ = evaluate_twice(ctx)
        assert set(first) == {("storage_capacity_low", str(tmp_path / "data"))}
        assert first[("storage_capacity_low", str(tmp_path / "data"))].severity == "critical"
        ctx.close()


@pytest.fixture
def amqp_url() -> Iterator[str]:
    yield from private_amqp_url("obs")


def test_broker_queue_depth_is_read_from_rabbitmq(tmp_path: Path, amqp_url: str) -> None:
    import pika

    ctx = make_context(tmp_path / "data", broker={"kind": "rabbitmq", "url": amqp_url})
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        for name, n in (("fetch", 3), ("media.DQ", 1)):  # where Dramatiq's RabbitMQ broker keeps messages
            channel.queue_declare(name, durable=True)
            for i in range(n):
                channel.basic_publish("", name, f"m{i}".encode())
        wait_until(lambda: channel.queue_declare("fetch", passive=True).method.message_count == 3, 10, "3 ready")
        m, _ = parse(render(build_registry(ctx)).decode())
    finally:
        connection.close()
        ctx.close()
    assert value(m, "aivedio_mq_queue_depth", queue="fetch", kind="ready") == 3
    assert value(m, "aivedio_mq_queue_depth", queue="media", kind="delayed") == 1
    assert value(m, "aivedio_mq_queue_depth", queue="state", kind="ready") == 0  # never declared: 0, not an error
