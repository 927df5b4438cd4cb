"""The credit ledger as `aivedio ledger ...` reads it (services/ledger_ops.py): a tenant's account and totals, ledger
rows, and the attempts a provider invoice is compared with."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db import balances
from aivedio_engine.db.records import Task
from aivedio_engine.db.tables import credit_ledger, generation_tasks, task_attempts, tenants
from aivedio_engine.domain.status import AttemptStatus

_cl = credit_ledger.c
_t = generation_tasks.c
_a = task_attempts.c


@dataclass(frozen=True, slots=True)
class Account:
    """A tenant as the ledger's operator views need it."""

    id: uuid.UUID
    name: str
    credit_balance: Decimal


@dataclass(frozen=True, slots=True)
class Totals:
    """A tenant's ledger summed by entry type, its row count, and the credits its tasks hold reserved."""

    by_type: dict[str, Decimal]
    entries: int
    reserved: Decimal


@dataclass(frozen=True, slots=True)
class Entry:
    id: uuid.UUID
    created_at: datetime
    tenant_id: uuid.UUID
    task_id: uuid.UUID | None
    attempt_id: uuid.UUID | None
    entry_type: str
    amount: Decimal
    unit: str
    business_key: str
    reason: str | None
    created_by: str
    vendor_amount: Decimal | None
    vendor_currency: str | None


@dataclass(frozen=True, slots=True)
class InvoicedAttempt:
    """An attempt of ours, as comparing it with a provider invoice needs it."""

    id: uuid.UUID
    task_id: uuid.UUID
    tenant_id: uuid.UUID
    attempt_no: int
    provider: str
    provider_job_id: str | None
    provider_request_key: str
    submit_state: str


@dataclass(frozen=True, slots=True)
class BillableAttempt:
    """An attempt whose job we believe is billable, with its task's status and charge and when it was sent."""

    attempt: InvoicedAttempt
    task_status: str
    sent_at: datetime
    actual_cost: Decimal | None


def account(
    conn: Connection, *, tenant_id: uuid.UUID | None = None, name: str | None = None, lock: bool = False
) -> Account | None:
    """A tenant by id (or, without one, by name); None when there is none. `lock` (PostgreSQL) holds its row and its
    balance stripes until the caller's transaction ends: it serialises with reservations and other adjustments."""
    cond = tenants.c.id == tenant_id if tenant_id is not None else tenants.c.name == name
    stmt = sa.select(tenants.c.id, tenants.c.name).where(cond)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    row = conn.execute(stmt).first()
    if row is None:
        return None
    return Account(row.id, row.name, balances.total(conn, row.id, lock=lock))


def totals(conn: Connection, tenant_id: uuid.UUID) -> Totals:
    by_type = {
        r.entry_type: Decimal(r.total)
        for r in conn.execute(
            sa.select(_cl.entry_type, sa.func.sum(_cl.amount).label("total"))
            .where(_cl.tenant_id == tenant_id)
            .group_by(_cl.entry_type)
        )
    }
    entries = conn.execute(sa.select(sa.func.count()).where(_cl.tenant_id == tenant_id)).scalar_one()
    reserved = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(_t.reserved_amount), 0)).where(_t.tenant_id == tenant_id)
    ).scalar_one()
    return Totals(by_type, int(entries), Decimal(reserved))


def _entry(r: Any) -> Entry:
    return Entry(
        id=r.id,
        created_at=r.created_at,
        tenant_id=r.tenant_id,
        task_id=r.task_id,
        attempt_id=r.attempt_id,
        entry_type=r.entry_type,
        amount=Decimal(r.amount),
        unit=r.unit,
        business_key=r.business_key,
        reason=r.reason,
        created_by=r.created_by,
        vendor_amount=None if r.vendor_amount is None else Decimal(r.vendor_amount),
        vendor_currency=r.vendor_currency,
    )


def _of(tenant_id: uuid.UUID | None, task_id: uuid.UUID | None) -> list[Any]:
    where: list[Any] = []
    if tenant_id is not None:
        where.append(_cl.tenant_id == tenant_id)
    if task_id is not None:
        where.append(_cl.task_id == task_id)
    return where


def entries(conn: Connection, *, tenant_id: uuid.UUID | None, task_id: uuid.UUID | None, limit: int) -> list[Entry]:
    """Ledger rows of the tenant and/or the task (None: any), newest first."""
    stmt = sa.select(credit_ledger).order_by(_cl.created_at.desc(), _cl.id.desc()).limit(limit)
    return [_entry(r) for r in conn.execute(stmt.where(*_of(tenant_id, task_id))).all()]


def count_entries(conn: Connection, *, tenant_id: uuid.UUID | None, task_id: uuid.UUID | None) -> int:
    stmt = sa.select(sa.func.count()).select_from(credit_ledger).where(*_of(tenant_id, task_id))
    return int(conn.execute(stmt).scalar_one())


def entry(conn: Connection, business_key: str) -> Entry | None:
    """The row booked under this key, if any."""
    row = conn.execute(sa.select(credit_ledger).where(_cl.business_key == business_key)).first()
    return None if row is None else _entry(row)


def entry_id(conn: Connection, business_key: str) -> uuid.UUID:
    """The id of the row booked under this key (there must be one)."""
    found: uuid.UUID = conn.execute(sa.select(_cl.id).where(_cl.business_key == business_key)).scalar_one()
    return found


def is_booked(conn: Connection, business_key: str) -> bool:
    return conn.execute(sa.select(_cl.id).where(_cl.business_key == business_key)).first() is not None


def entry_ids(conn: Connection, business_keys: Collection[str]) -> list[uuid.UUID]:
    return list(conn.execute(sa.select(_cl.id).where(_cl.business_key.in_(business_keys))).scalars())


def task_exists(conn: Connection, task_id: uuid.UUID) -> bool:
    return conn.execute(sa.select(_t.id).where(_t.id == task_id)).first() is not None


def task_tenant(conn: Connection, task_id: uuid.UUID) -> uuid.UUID | None:
    """The tenant owning the task; None when there is no such task."""
    owner: uuid.UUID | None = conn.execute(sa.select(_t.tenant_id).where(_t.id == task_id)).scalar()
    return owner


def task(conn: Connection, task_id: uuid.UUID) -> Task:
    """The task's row, for billing (there must be one)."""
    return Task(*conn.execute(sa.select(generation_tasks).where(_t.id == task_id)).one())


_ATTEMPT_COLUMNS = (
    _a.id,
    _a.task_id,
    _t.tenant_id,
    _a.attempt_no,
    _a.provider,
    _a.provider_job_id,
    _a.provider_request_key,
    _a.submit_state,
)
_ATTEMPTS = sa.select(*_ATTEMPT_COLUMNS).join(generation_tasks, _t.id == _a.task_id)


def _attempt(row: Any) -> InvoicedAttempt:
    return InvoicedAttempt(
        row.id,
        row.task_id,
        row.tenant_id,
        row.attempt_no,
        row.provider,
        row.provider_job_id,
        row.provider_request_key,
        row.submit_state,
    )


def attempts_by_job(conn: Connection, provider: str, job_ids: list[str]) -> dict[str, InvoicedAttempt]:
    """The provider's attempts bound to these job ids, by job id (500 per statement)."""
    out: dict[str, InvoicedAttempt] = {}
    for start in range(0, len(job_ids), 500):
        batch = job_ids[start : start + 500]
        for row in conn.execute(_ATTEMPTS.where(_a.provider == provider, _a.provider_job_id.in_(batch))):
            out[row.provider_job_id] = _attempt(row)
    return out


def attempts_by_request_key(conn: Connection, provider: str, keys: list[str]) -> dict[str, InvoicedAttempt]:
    """The provider's attempts sent with these request keys, by key (500 per statement)."""
    out: dict[str, InvoicedAttempt] = {}
    for start in range(0, len(keys), 500):
        for row in conn.execute(
            _ATTEMPTS.where(_a.provider == provider, _a.provider_request_key.in_(keys[start : start + 500]))
        ):
            out[row.provider_request_key] = _attempt(row)
    return out


def billable_attempts(
    conn: Connection, providers: list[str], period: tuple[datetime, datetime]
) -> list[BillableAttempt]:
    """Attempts of these providers sent within the period with a job, that SUCCEEDED or whose task was charged;
    by send time."""
    sent = sa.func.coalesce(_a.submitted_at, _a.created_at)
    rows = conn.execute(
        sa.select(*_ATTEMPT_COLUMNS, _t.actual_cost, _t.status.label("task_status"), sent.label("sent_at"))
        .join(generation_tasks, _t.id == _a.task_id)
        .where(
            _a.provider.in_(providers),
            _a.provider_job_id.is_not(None),
            sent.between(*period),
            sa.or_(_a.submit_state == AttemptStatus.SUCCEEDED.value, _t.actual_cost > 0),
        )
        .order_by(sent, _a.id)
    ).all()
    return [
        BillableAttempt(
            _attempt(r),
            r.task_status,
            r.sent_at,
            Decimal(r.actual_cost) if r.actual_cost is not None else None,
        )
        for r in rows
    ]
