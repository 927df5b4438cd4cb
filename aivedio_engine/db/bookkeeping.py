"""Retention of the engine's own bookkeeping (issue 16 item 4): batched deletes by age of what no recovery path
needs any more. Each function deletes at most `batch` rows in the caller's (short) transaction and returns how many.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import (
    callback_rejections,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    provider_events,
    task_state_events,
    webhook_deliveries,
)
from aivedio_engine.domain.status import TASK_TERMINAL, OutboxStatus, StateEventOutcome, WebhookDeliveryState

_t = generation_tasks.c
_TERMINAL = sorted(s.value for s in TASK_TERMINAL)


def _delete_ids(conn: Connection, table: sa.Table, select_ids: sa.Select[Any]) -> int:
    ids = list(conn.execute(select_ids).scalars())
    if not ids:
        return 0
    return int(conn.execute(table.delete().where(table.c.id.in_(ids))).rowcount)


def delete_published_outbox(conn: Connection, before: datetime, batch: int) -> int:
    """PUBLISHED rows only: a PENDING row is work to do, a DEAD one work an operator may replay."""
    o = outbox_events.c
    stmt = sa.select(o.id).where(o.status == OutboxStatus.PUBLISHED.value, o.published_at < before).limit(batch)
    return _delete_ids(conn, outbox_events, stmt)


def delete_inbox(conn: Connection, before: datetime, batch: int) -> int:
    """Consumed-message ids processed before `before`. `aivedio replay dlq` refuses a letter whose message is
    older than the same cut-off, so a replay can never meet a message whose inbox row is gone."""
    i = inbox_dedup.c
    keys = sa.select(i.consumer_group, i.event_id).where(i.processed_at < before).order_by(i.processed_at).limit(batch)
    pairs = conn.execute(keys).all()
    deleted = 0
    for group, event_id in pairs:  # composite key: one short statement each, inside the caller's transaction
        deleted += int(
            conn.execute(inbox_dedup.delete().where(i.consumer_group == group, i.event_id == event_id)).rowcount
        )
    return deleted


def delete_state_events(conn: Connection, ended_before: datetime, batch: int) -> int:
    """History of tasks that ended before `ended_before`, except each task's last applied event (its final
    status and version, which the invariants and the timeline's header read). Unfinished tasks keep theirs."""
    e = task_state_events.c
    stmt = (
        sa.select(e.id)
        .join(generation_tasks, _t.id == e.task_id)
        .where(
            _t.status.in_(_TERMINAL),
            _t.finished_at < ended_before,
            sa.not_(sa.and_(e.outcome == StateEventOutcome.APPLIED.value, e.task_version == _t.version)),
        )
        .limit(batch)
    )
    return _delete_ids(conn, task_state_events, stmt)


def delete_provider_events(conn: Connection, received_before: datetime, now: datetime, batch: int) -> int:
    """Events received before the cut-off whose own expiry passed too (an unmatched one is kept until its alert
    was raised: the sweeper moves its expiry on when it does)."""
    pe = provider_events.c
    stmt = sa.select(pe.id).where(pe.received_at < received_before, pe.expires_at <= now).limit(batch)
    return _delete_ids(conn, provider_events, stmt)


def delete_webhook_deliveries(conn: Connection, before: datetime, batch: int) -> int:
    """Delivered and dead deliveries last changed before the cut-off; PENDING and FAILED ones are still due."""
    w = webhook_deliveries.c
    done = [WebhookDeliveryState.DELIVERED.value, WebhookDeliveryState.DEAD.value]
    stmt = sa.select(w.id).where(w.state.in_(done), w.updated_at < before).limit(batch)
    return _delete_ids(conn, webhook_deliveries, stmt)


def delete_callback_rejections(conn: Connection, before: datetime, batch: int) -> int:
    """Windows of failed callback verifications that began before the cut-off: their alert, if they earned one,
    was raised long ago."""
    r = callback_rejections.c
    return _delete_ids(conn, callback_rejections, sa.select(r.id).where(r.window_start < before).limit(batch))
