"""Retention of the engine's own bookkeeping (issue 16 item 4) on both databases: outbox, inbox, state events, provider
events and webhook deliveries are deleted by age in batches, and nothing recovery still needs goes (a PENDING or
DEAD outbox row, a FAILED delivery, an unmatched provider event before its alert, the history of an unfinished
task, a task's last applied event). A dead letter older than the inbox retention is refused by `replay dlq`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db import webhooks as webhook_rows
from aivedio_engine.db.tables import (
    callback_rejections,
    dead_letters,
    inbox_dedup,
    outbox_events,
    provider_events,
    task_state_events,
    webhook_deliveries,
)
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.invariants import InvariantService
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.replay import ReplayService
from tests.support.app import FakeClock, make_context, tenant_with_key

DAY = timedelta(days=1)
runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    # batch 2: every kind needs more than one batch, so the batching is what is tested
    c = make_context(tmp_path / "data", url, clock=FakeClock(), retention={"batch": 2})
    yield c
    c.close()


def insert(ctx: AppContext, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    with ctx.engine.begin() as conn:
        conn.execute(table.insert(), rows)


def ids(ctx: AppContext, table: sa.Table, column: str = "id") -> set[Any]:
    with ctx.engine.connect() as conn:
        return set(conn.execute(sa.select(table.c[column])).scalars())


def outbox_row(now: datetime, status: str, age: timedelta) -> dict[str, Any]:
    route = ROUTES[EventType.GENERATION_QUEUED]
    return dict(
        id=new_id(),
        aggregate_type="generation_task",
        aggregate_id=new_id(),
        aggregate_version=1,
        event_type=EventType.GENERATION_QUEUED.value,
        payload={},
        status=status,
        target=route.actor,
        available_at=now - age,
        created_at=now - age,
        published_at=now - age if status == "PUBLISHED" else None,
    )


def test_bookkeeping_is_deleted_by_age_and_what_recovery_needs_stays(ctx: AppContext) -> None:
    # state events: a task that ended long ago keeps only its last applied event; an unfinished one keeps all
    r = ctx.settings.retention
    tenant = tenant_with_key(ctx, "acme").tenant_id
    params = {"prompt": "p", "model": "local-v1", "duration_s": 2}
    ended = ctx.generations.create(tenant, "ended", params).task.id
    waiting = ctx.generations.create(tenant, "waiting", params).task.id
    ctx.generations.cancel(tenant, ended)
    ctx.clock.advance(((r.state_events_days + 1) * DAY).total_seconds())  # type: ignore[attr-defined]
    with ctx.engine.connect() as conn:
        before = {
            t: conn.execute(sa.select(task_state_events.c.id).where(task_state_events.c.task_id == t)).all()
            for t in (ended, waiting)
        }
    assert len(before[ended]) == 5 and len(before[waiting]) == 4

    now = ctx.clock.now()
    old_out = [outbox_row(now, "PUBLISHED", (r.outbox_days + 1) * DAY) for _ in range(3)]
    kept_out = [
        outbox_row(now, "PUBLISHED", (r.outbox_days - 1) * DAY),
        outbox_row(now, "PENDING", 60 * DAY),
        outbox_row(now, "DEAD", 60 * DAY),
    ]
    insert(ctx, outbox_events, old_out + kept_out)
    inbox_days = ctx.settings.webhooks.dedup_retention_days
    inbox = [
        dict(consumer_group="g", event_id=new_id(), processed_at=now - (inbox_days + 1) * DAY) for _ in range(3)
    ] + [dict(consumer_group="g", event_id=new_id(), processed_at=now - (inbox_days - 1) * DAY)]
    insert(ctx, inbox_dedup, inbox)

    def provider_event(age: timedelta, expires_in: timedelta) -> dict[str, Any]:
        return dict(
            id=new_id(),
            provider="sim",
            source="callback",
            dedup_key=str(new_id()),
            received_at=now - age,
            expires_at=now + expires_in,
        )

    old_pe = [provider_event((r.provider_events_days + 1) * DAY, -DAY) for _ in range(3)]
    kept_pe = [
        provider_event((r.provider_events_days + 1) * DAY, DAY),  # unmatched, its alert not raised yet
        provider_event((r.provider_events_days - 1) * DAY, -DAY),
    ]
    insert(ctx, provider_events, old_pe + kept_pe)

    with ctx.engine.begin() as conn:
        endpoint = webhook_rows.add_endpoint(conn, tenant, "https://hooks.example/x", ["*"], "s", now)
    age = (r.webhook_deliveries_days + 1) * DAY

    def delivery(state: str, at: datetime) -> dict[str, Any]:
        return dict(
            id=new_id(),
            endpoint_id=endpoint.id,
            tenant_id=tenant,
            event_id=new_id(),
            event_type="task.succeeded",
            task_id=new_id(),
            payload={},
            state=state,
            created_at=at,
            updated_at=at,
        )

    old_wd = [delivery("DELIVERED", now - age), delivery("DEAD", now - age), delivery("DELIVERED", now - age)]
    kept_wd = [delivery("FAILED", now - age), delivery("PENDING", now - age), delivery("DELIVERED", now)]
    insert(ctx, webhook_deliveries, old_wd + kept_wd)

    def rejections(age: timedelta, reason: str) -> dict[str, Any]:
        at = now - age
        return dict(
            id=new_id(),
            provider="sim",
            reason=reason,
            window_start=at,
            failures=2,
            first_at=at,
            last_at=at,
            detail="no matching signature",
        )

    old_cr = [rejections((r.provider_events_days + 1) * DAY, why) for why in ("signature", "timestamp")]
    kept_cr = [rejections((r.provider_events_days - 1) * DAY, "signature")]
    insert(ctx, callback_rejections, old_cr + kept_cr)

    report = ctx.retention.enforce()
    assert report.rows == {
        "outbox_events": 3,
        "inbox_dedup": 3,
        "task_state_events": 4,
        "provider_events": 3,
        "webhook_deliveries": 3,
        "callback_rejections": 2,
    }
    mine = {row["id"] for row in old_out + kept_out}  # the tasks above wrote PENDING rows of their own
    assert ids(ctx, outbox_events) & mine == {row["id"] for row in kept_out}
    assert ids(ctx, inbox_dedup, "event_id") == {inbox[-1]["event_id"]}
    assert ids(ctx, provider_events) == {row["id"] for row in kept_pe}
    assert ids(ctx, webhook_deliveries) == {row["id"] for row in kept_wd}
    assert ids(ctx, callback_rejections) == {row["id"] for row in kept_cr}
    with ctx.engine.connect() as conn:
        left = conn.execute(
            sa.select(task_state_events.c.task_id, task_state_events.c.to_status, task_state_events.c.task_version)
        ).all()
    assert sorted((t, s) for t, s, _ in left if t == ended) == [(ended, "CANCELED")]
    assert sum(1 for t, _, _ in left if t == waiting) == 4
    assert ctx.retention.enforce().rows == dict.fromkeys(report.rows, 0)
    report = InvariantService(ctx.engine, ctx.clock).run(only=["I5.4"])  # each task matches its last event
    assert [(c.id, c.rows) for c in report.results if not c.ok] == []


def dead_letter(ctx: AppContext, occurred: datetime) -> uuid.UUID:
    route = ROUTES[EventType.GENERATION_QUEUED]
    envelope = Envelope(
        event_id=new_id(),
        event_type=EventType.GENERATION_QUEUED.value,
        schema_version=1,
        aggregate_id=new_id(),
        aggregate_version=1,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        occurred_at=occurred,
        payload={},
    )
    letter = new_id()
    insert(
        ctx,
        dead_letters,
        [
            dict(
                id=letter,
                message_id=str(envelope.event_id),
                actor=route.actor,
                queue=route.queue,
                message={"args": [envelope.to_dict()]},
                first_seen_at=occurred,
                last_seen_at=ctx.clock.now(),
            )
        ],
    )
    return letter


def test_a_dead_letter_older_than_the_inbox_retention_is_refused_never_replayed(
    ctx: AppContext, tmp_path: Path
) -> None:
    now, days = ctx.clock.now(), ctx.settings.webhooks.dedup_retention_days
    old = dead_letter(ctx, now - timedelta(days=days, minutes=1))
    young = dead_letter(ctx, now - timedelta(days=days) + timedelta(minutes=1))
    service = ReplayService(ctx.engine, ctx.clock, ctx.settings)
    result = service.replay("dlq", [str(old), str(young)], Operation("replay dlq", "retry", dry_run=False))
    assert [d["id"] for d in result.done] == [str(young)]
    assert [f["id"] for f in result.failed] == [str(old)]
    assert "older than the inbox retention (7 days" in result.failed[0]["reason"]
    assert "not replayed" in result.failed[0]["reason"]
    with ctx.engine.connect() as conn:
        replayed = dict(conn.execute(sa.select(dead_letters.c.id, dead_letters.c.replayed_at)).all())
        pending = conn.execute(sa.select(sa.func.count()).select_from(outbox_events)).scalar_one()
    assert replayed[old] is None and replayed[young] is not None and pending == 1

    if ctx.settings.is_postgres:
        return  # the CLI half needs the same database: the SQLite data dir is enough to show the message
    cli = runner.invoke(
        app,
        ["--set", f"data_dir={tmp_path / 'data'}", "replay", "dlq", "--reason", "again", "--yes", "--json"],
    )
    assert cli.exit_code != 0
    failed = json.loads(cli.stdout)["result"]["failed"]
    assert [f["id"] for f in failed] == [str(old)] and "inbox retention" in failed[0]["reason"]
