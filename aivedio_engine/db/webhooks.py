"""Client webhook endpoints and their delivery log (migration 0013). Every function runs on the caller's
connection, inside the caller's transaction; none makes a network call."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import webhook_deliveries, webhook_endpoints
from aivedio_engine.domain.status import WebhookDeliveryState

_w = webhook_endpoints.c
_d = webhook_deliveries.c
#: states an attempt may start from
RETRYABLE = (WebhookDeliveryState.PENDING.value, WebhookDeliveryState.FAILED.value)
#: states `replay webhooks` puts back in line
REPLAYABLE = (WebhookDeliveryState.DEAD.value, WebhookDeliveryState.FAILED.value)


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    event_filter: tuple[str, ...]
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    created_at: datetime
    updated_at: datetime
    removed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Delivery:
    id: uuid.UUID
    endpoint_id: uuid.UUID
    tenant_id: uuid.UUID
    event_id: uuid.UUID
    event_type: str
    task_id: uuid.UUID
    payload: dict[str, Any]
    state: str
    attempts: int
    next_attempt_at: datetime | None
    first_attempt_at: datetime | None
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime
    updated_at: datetime


def _endpoint(row: Any) -> Endpoint:
    return Endpoint(
        id=row.id,
        tenant_id=row.tenant_id,
        url=row.url,
        event_filter=tuple(row.event_filter or ()),
        secret=row.secret,
        previous_secret=row.previous_secret,
        previous_secret_until=row.previous_secret_until,
        created_at=row.created_at,
        updated_at=row.updated_at,
        removed_at=row.removed_at,
    )


def _delivery(row: Any) -> Delivery:
    return Delivery(**{c.name: getattr(row, c.name) for c in webhook_deliveries.columns})


# --- endpoints ------------------------------------------------------------------------------------------------


def add_endpoint(
    conn: Connection, tenant_id: uuid.UUID, url: str, event_filter: Sequence[str], secret: str, now: datetime
) -> Endpoint:
    values = dict(
        id=new_id(),
        tenant_id=tenant_id,
        url=url,
        event_filter=list(event_filter),
        secret=secret,
        previous_secret=None,
        previous_secret_until=None,
        created_at=now,
        updated_at=now,
        removed_at=None,
    )
    conn.execute(webhook_endpoints.insert().values(**values))
    return Endpoint(**{**values, "event_filter": tuple(event_filter)})  # type: ignore[arg-type]


def get_endpoint(
    conn: Connection, endpoint_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Endpoint | None:
    """A live endpoint (of `tenant_id` when given), or None."""
    stmt = sa.select(webhook_endpoints).where(_w.id == endpoint_id, _w.removed_at.is_(None))
    if tenant_id is not None:
        stmt = stmt.where(_w.tenant_id == tenant_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = conn.execute(stmt).first()
    return None if row is None else _endpoint(row)


def read_endpoint(conn: Connection, endpoint_id: uuid.UUID) -> Endpoint | None:
    """Any endpoint, removed ones too (a delivery must learn that its endpoint is gone)."""
    row = conn.execute(sa.select(webhook_endpoints).where(_w.id == endpoint_id)).first()
    return None if row is None else _endpoint(row)


def list_endpoints(conn: Connection, tenant_id: uuid.UUID | None = None) -> list[Endpoint]:
    """Live endpoints, oldest first; every tenant's when `tenant_id` is None (operators)."""
    stmt = sa.select(webhook_endpoints).where(_w.removed_at.is_(None)).order_by(_w.created_at, _w.id)
    if tenant_id is not None:
        stmt = stmt.where(_w.tenant_id == tenant_id)
    return [_endpoint(r) for r in conn.execute(stmt)]


def remove_endpoint(conn: Connection, endpoint_id: uuid.UUID, now: datetime) -> None:
    conn.execute(webhook_endpoints.update().where(_w.id == endpoint_id).values(removed_at=now, updated_at=now))


def rotate_secret(
    conn: Connection, endpoint: Endpoint, new_secret: str, previous_until: datetime, now: datetime
) -> Endpoint:
    """The new secret signs from now on; the current one keeps signing until `previous_until`."""
    conn.execute(
        webhook_endpoints.update()
        .where(_w.id == endpoint.id)
        .values(
            secret=new_secret,
            previous_secret=endpoint.secret,
            previous_secret_until=previous_until,
            updated_at=now,
        )
    )
    return Endpoint(
        id=endpoint.id,
        tenant_id=endpoint.tenant_id,
        url=endpoint.url,
        event_filter=endpoint.event_filter,
        secret=new_secret,
        previous_secret=endpoint.secret,
        previous_secret_until=previous_until,
        created_at=endpoint.created_at,
        updated_at=now,
        removed_at=None,
    )


# --- deliveries -----------------------------------------------------------------------------------------------


def add_delivery(
    conn: Connection,
    endpoint: Endpoint,
    *,
    event_id: uuid.UUID,
    event_type: str,
    task_id: uuid.UUID,
    payload: dict[str, Any],
    now: datetime,
) -> uuid.UUID | None:
    """One PENDING delivery of `event_id` to `endpoint`, due now; None when it already exists (a redelivered
    fan-out)."""
    exists = conn.execute(sa.select(_d.id).where(_d.endpoint_id == endpoint.id, _d.event_id == event_id)).first()
    if exists is not None:
        return None
    delivery_id = new_id()
    conn.execute(
        webhook_deliveries.insert().values(
            id=delivery_id,
            endpoint_id=endpoint.id,
            tenant_id=endpoint.tenant_id,
            event_id=event_id,
            event_type=event_type,
            task_id=task_id,
            payload=payload,
            state=WebhookDeliveryState.PENDING.value,
            attempts=0,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
        )
    )
    return delivery_id


def get_delivery(conn: Connection, delivery_id: uuid.UUID) -> Delivery | None:
    row = conn.execute(sa.select(webhook_deliveries).where(_d.id == delivery_id)).first()
    return None if row is None else _delivery(row)


def claim(conn: Connection, delivery_id: uuid.UUID, now: datetime, hold_until: datetime) -> Delivery | None:
    """Take the delivery for one attempt: only when it is PENDING/FAILED and due (a crashed attempt's claim has
    lapsed). `next_attempt_at` becomes `hold_until`, so a duplicate message finds nothing due meanwhile.
    Returns the delivery as claimed (attempts not yet counted), or None."""
    due = sa.and_(
        _d.id == delivery_id, _d.state.in_(RETRYABLE), sa.or_(_d.next_attempt_at.is_(None), _d.next_attempt_at <= now)
    )
    moved = conn.execute(webhook_deliveries.update().where(due).values(next_attempt_at=hold_until, updated_at=now))
    if moved.rowcount != 1:
        return None
    return get_delivery(conn, delivery_id)


def release(conn: Connection, delivery_id: uuid.UUID, due_at: datetime, now: datetime) -> None:
    """Hand a claimed delivery back without counting an attempt (its endpoint was busy in this process)."""
    conn.execute(
        webhook_deliveries.update()
        .where(_d.id == delivery_id, _d.state.in_(RETRYABLE))
        .values(next_attempt_at=due_at, updated_at=now)
    )


def record_attempt(
    conn: Connection,
    delivery: Delivery,
    *,
    state: WebhookDeliveryState,
    attempted_at: datetime,
    status_code: int | None,
    error: str | None,
    next_attempt_at: datetime | None,
    now: datetime,
) -> None:
    """The outcome of one attempt (counted), guarded so that a concurrent replay or removal is not overwritten
    by a stale worker: only a delivery still in a retryable state moves."""
    conn.execute(
        webhook_deliveries.update()
        .where(_d.id == delivery.id, _d.state.in_(RETRYABLE), _d.attempts == delivery.attempts)
        .values(
            state=state.value,
            attempts=delivery.attempts + 1,
            next_attempt_at=next_attempt_at,
            first_attempt_at=delivery.first_attempt_at or attempted_at,
            last_attempt_at=attempted_at,
            last_status_code=status_code,
            last_error=error,
            delivered_at=now if state is WebhookDeliveryState.DELIVERED else None,
            updated_at=now,
        )
    )


def kill(conn: Connection, delivery_id: uuid.UUID, error: str, now: datetime) -> None:
    """DEAD without an attempt (its endpoint was removed)."""
    conn.execute(
        webhook_deliveries.update()
        .where(_d.id == delivery_id, _d.state.in_(RETRYABLE))
        .values(state=WebhookDeliveryState.DEAD.value, next_attempt_at=None, last_error=error, updated_at=now)
    )


def list_deliveries(
    conn: Connection,
    *,
    tenant_id: uuid.UUID | None = None,
    endpoint_id: uuid.UUID | None = None,
    states: Sequence[str] = (),
    task_id: uuid.UUID | None = None,
    limit: int = 100,
    oldest_first: bool = False,
) -> list[Delivery]:
    stmt = sa.select(webhook_deliveries)
    if tenant_id is not None:
        stmt = stmt.where(_d.tenant_id == tenant_id)
    if endpoint_id is not None:
        stmt = stmt.where(_d.endpoint_id == endpoint_id)
    if states:
        stmt = stmt.where(_d.state.in_(list(states)))
    if task_id is not None:
        stmt = stmt.where(_d.task_id == task_id)
    order = (_d.created_at, _d.id) if oldest_first else (_d.created_at.desc(), _d.id.desc())
    return [_delivery(r) for r in conn.execute(stmt.order_by(*order).limit(limit))]


def count_deliveries(conn: Connection, *, endpoint_id: uuid.UUID | None = None, states: Sequence[str] = ()) -> int:
    stmt = sa.select(sa.func.count()).select_from(webhook_deliveries)
    if endpoint_id is not None:
        stmt = stmt.where(_d.endpoint_id == endpoint_id)
    if states:
        stmt = stmt.where(_d.state.in_(list(states)))
    return int(conn.execute(stmt).scalar_one())


def requeue(conn: Connection, delivery_id: uuid.UUID, now: datetime) -> bool:
    """DEAD/FAILED → PENDING, due now, with a fresh budget (attempts and first attempt reset); the log keeps
    the last status and error until the next attempt. False when the delivery no longer qualifies."""
    moved = conn.execute(
        webhook_deliveries.update()
        .where(_d.id == delivery_id, _d.state.in_(REPLAYABLE))
        .values(
            state=WebhookDeliveryState.PENDING.value,
            attempts=0,
            first_attempt_at=None,
            next_attempt_at=now,
            updated_at=now,
        )
    )
    return moved.rowcount == 1


def tenant_id_by_ref(conn: Connection, ref: str) -> uuid.UUID | None:
    """A tenant's id from its id or its name (the CLI's `--tenant`)."""
    from aivedio_engine.db.tables import tenants

    try:
        cond = tenants.c.id == uuid.UUID(ref)
    except ValueError:
        cond = tenants.c.name == ref
    found = conn.execute(sa.select(tenants.c.id).where(cond)).scalar()
    return None if found is None else uuid.UUID(str(found))


def task_tenant(conn: Connection, task_id: uuid.UUID) -> uuid.UUID | None:
    from aivedio_engine.db.tables import generation_tasks

    found = conn.execute(sa.select(generation_tasks.c.tenant_id).where(generation_tasks.c.id == task_id)).scalar()
    return None if found is None else uuid.UUID(str(found))
