"""Helpers shared by the relay, consumer and chaos tests: minimal rows, an effect counter, waiting with deadlines."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from aivedio_engine.clock import new_id
from aivedio_engine.db import outbox
from aivedio_engine.db.tables import generation_tasks, inbox_dedup, outbox_events, tenants
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.domain.status import OutboxStatus, TaskStatus

T0 = datetime(2026, 6, 23, 3, 0, tzinfo=UTC)


class MutableClock:
    """An injected clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def insert_tenant(conn: sa.Connection, now: datetime = T0) -> uuid.UUID:
    tid = new_id()
    conn.execute(tenants.insert().values(id=tid, name=f"t-{tid}", created_at=now, updated_at=now))
    return tid


def insert_tasks(
    conn: sa.Connection,
    tenant_id: uuid.UUID,
    n: int,
    *,
    version: int = 3,
    status: TaskStatus = TaskStatus.QUEUED,
    now: datetime = T0,
) -> list[uuid.UUID]:
    ids = [new_id() for _ in range(n)]
    conn.execute(
        generation_tasks.insert(),
        [
            dict(
                id=i,
                tenant_id=tenant_id,
                client_idempotency_key=str(i),
                request_hash=b"h",
                status=status.value,
                version=version,
                requested_model="local-v1",
                estimated_cost=Decimal("5"),
                prompt="a cat",
                params={"seconds": 5},
                created_at=now,
                updated_at=now,
            )
            for i in ids
        ],
    )
    return ids


def insert_queued_events(
    conn: sa.Connection, tenant_id: uuid.UUID, task_ids: list[uuid.UUID], *, version: int = 3, now: datetime = T0
) -> list[uuid.UUID]:
    """`generation.queued` rows in bulk (one statement), plus one NOTIFY on PostgreSQL like outbox.add does."""
    ids = [new_id() for _ in task_ids]
    conn.execute(
        outbox_events.insert(),
        [
            dict(
                id=eid,
                aggregate_type="generation_task",
                aggregate_id=tid,
                aggregate_version=version,
                event_type=EventType.GENERATION_QUEUED.value,
                payload={"task_id": str(tid), "priority": 0},
                status=OutboxStatus.PENDING.value,
                target=ROUTES[EventType.GENERATION_QUEUED].actor,
                available_at=now,
                tenant_id=tenant_id,
                trace_id=f"trace-{tid.hex[:8]}",
                created_at=now,
            )
            for eid, tid in zip(ids, task_ids, strict=True)
        ],
    )
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_notify(:ch, '')"), {"ch": outbox.NOTIFY_CHANNEL})
    return ids


def install_effect_counter(conn: sa.Connection) -> None:
    """Log every UPDATE of a task with a trigger, so "effect applied exactly once" is counted by the database."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("CREATE TABLE effect_log (task_id uuid NOT NULL, next_action_at timestamptz)")
        conn.exec_driver_sql(
            "CREATE FUNCTION log_task_effect() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO effect_log VALUES (NEW.id, NEW.next_action_at); RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER task_effect AFTER UPDATE ON generation_tasks "
            "FOR EACH ROW EXECUTE FUNCTION log_task_effect()"
        )
    else:
        conn.exec_driver_sql("CREATE TABLE effect_log (task_id CHAR(32) NOT NULL, next_action_at TEXT)")
        conn.exec_driver_sql(
            "CREATE TRIGGER task_effect AFTER UPDATE ON generation_tasks "
            "BEGIN INSERT INTO effect_log VALUES (NEW.id, NEW.next_action_at); END"
        )


def effects_per_task(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT task_id, count(*) FROM effect_log GROUP BY task_id").all()
    return {str(r[0]).replace("-", ""): r[1] for r in rows}


def count(engine: sa.Engine, table: sa.Table, *where: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


def inbox_count(engine: sa.Engine, group: str) -> int:
    return count(engine, inbox_dedup, inbox_dedup.c.consumer_group == group)


def outbox_statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(outbox_events.c.status, sa.func.count()).group_by(outbox_events.c.status)).all()
    return {r[0]: r[1] for r in rows}
