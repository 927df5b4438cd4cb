"""The rows of one task's story (services.task_timeline, `aivedio tasks show`): the task, its attempts, state
events, provider events, ledger rows, assets, review items, alerts and outbox rows. Rows go to the timeline's
formatting untouched; each read is one statement, in the caller's connection."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Row

from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.db.tables import (
    alerts,
    assets,
    credit_ledger,
    generation_tasks,
    outbox_events,
    provider_events,
    review_items,
    task_attempts,
    task_state_events,
)


def task(conn: Connection, task_id: uuid.UUID) -> Task | None:
    return Task.of(conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).first())


def attempts(conn: Connection, task_id: uuid.UUID) -> list[Attempt]:
    """The task's attempts, by attempt number."""
    stmt = sa.select(task_attempts).where(task_attempts.c.task_id == task_id).order_by(task_attempts.c.attempt_no)
    return [Attempt(*r) for r in conn.execute(stmt)]


def state_events(conn: Connection, task_id: uuid.UUID) -> list[Row[Any]]:
    return list(conn.execute(sa.select(task_state_events).where(task_state_events.c.task_id == task_id)))


def attempt_provider_events(conn: Connection, attempt_rows: Sequence[Any]) -> list[Row[Any]]:
    """Events matched to an attempt, and orphans carrying one of its job ids or request keys (a callback that
    beat the submit response, or one for a job we never bound)."""
    if not attempt_rows:
        return []
    pe = provider_events.c
    ids = [a.id for a in attempt_rows]
    conds: list[sa.ColumnElement[bool]] = [pe.matched_attempt_id.in_(ids)]
    for a in attempt_rows:
        keyed = [pe.provider_request_key == a.provider_request_key]
        if a.provider_job_id:
            keyed.append(pe.provider_job_id == a.provider_job_id)
        conds.append(sa.and_(pe.provider == a.provider, sa.or_(*keyed)))
    return list(conn.execute(sa.select(provider_events).where(sa.or_(*conds))))


def ledger_rows(conn: Connection, task_id: uuid.UUID) -> list[Row[Any]]:
    return list(conn.execute(sa.select(credit_ledger).where(credit_ledger.c.task_id == task_id)))


def task_assets(conn: Connection, task_id: uuid.UUID, inputs: Sequence[uuid.UUID]) -> list[Row[Any]]:
    """The task's outputs and derivatives, plus the input assets `inputs` (those its request named)."""
    cond = assets.c.task_id == task_id
    if inputs:
        cond = sa.or_(cond, assets.c.id.in_(inputs))
    return list(conn.execute(sa.select(assets).where(cond)))


def review_rows(conn: Connection, task_id: uuid.UUID) -> list[Row[Any]]:
    return list(conn.execute(sa.select(review_items).where(review_items.c.task_id == task_id)))


def subject_alerts(conn: Connection, task_id: uuid.UUID, attempt_ids: Sequence[uuid.UUID]) -> list[Row[Any]]:
    """Alerts about the task or one of its attempts."""
    subjects = [sa.and_(alerts.c.subject_type == "task", alerts.c.subject_id == str(task_id))]
    if attempt_ids:
        subjects.append(
            sa.and_(alerts.c.subject_type == "attempt", alerts.c.subject_id.in_([str(i) for i in attempt_ids]))
        )
    return list(conn.execute(sa.select(alerts).where(sa.or_(*subjects))))


def outbox_rows(conn: Connection, aggregate_ids: Sequence[uuid.UUID]) -> list[Row[Any]]:
    return list(conn.execute(sa.select(outbox_events).where(outbox_events.c.aggregate_id.in_(aggregate_ids))))
