"""The credit ledger: append-only rows keyed by business key, and the tenant balance beside them.

Every entry moves the tenant's balance (db/balances.py: striped rows) in the same transaction, so the balance
equals the ledger sum by construction (the audit checks it). A reservation takes its credits with one conditional
UPDATE of one stripe (`... WHERE balance >= :amount`): check-then-insert without a lock overspends under
concurrency, and one balance row per tenant serialized all of a tenant's creations on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db import balances
from aivedio_engine.db.balances import InsufficientBalance as InsufficientBalance  # the callers' name for it
from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import credit_ledger, generation_tasks, task_attempts
from aivedio_engine.domain.status import TASK_TERMINAL, LedgerEntryType


def post(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    entry_type: LedgerEntryType,
    amount: Decimal,
    business_key: str,
    now: datetime,
    created_by: str,
    task_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
    reason: str | None = None,
    vendor_amount: Decimal | None = None,
    vendor_currency: str | None = None,
) -> bool:
    """Append one entry unless its business key is already booked. Returns False for a repeat (a no-op).
    `vendor_amount`/`vendor_currency`: the vendor's own figure behind the row (an invoice line), when there is one."""
    values = dict(
        id=new_id(),
        tenant_id=tenant_id,
        task_id=task_id,
        attempt_id=attempt_id,
        entry_type=entry_type.value,
        amount=amount,
        business_key=business_key,
        reason=reason,
        created_by=created_by,
        created_at=now,
        vendor_amount=vendor_amount,
        vendor_currency=vendor_currency,
    )
    insert = dialect_insert(conn)
    stmt = insert(credit_ledger).values(**values).on_conflict_do_nothing(index_elements=["business_key"])
    # RETURNING, not rowcount: SQLAlchemy 2.1 on psycopg reports -1 for an INSERT, so a repeat would look newly booked
    # and credit the balance a second time (tests/contract/test_repositories.py)
    if conn.execute(stmt.returning(credit_ledger.c.id)).first() is None:
        return False
    stripe = balances.stripe_of(task_id, business_key)
    if amount < 0:
        balances.debit(conn, tenant_id, -amount, stripe)  # InsufficientBalance: the caller rolls back
    elif entry_type is LedgerEntryType.ADJUSTMENT and amount > 0:
        balances.spread_credit(conn, tenant_id, amount)  # a grant or top-up funds every stripe
    elif amount > 0:
        balances.credit(conn, tenant_id, amount, stripe)  # a task's credits back to its own stripe
    return True


def reserve(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    amount: Decimal,
    now: datetime,
    created_by: str,
    whole_balance: bool = False,
) -> None:
    """RESERVE −amount if the balance covers it; raises InsufficientBalance otherwise (the caller rolls back).
    `whole_balance`: the task's stripe is known to be short, draw on all of them (balances.debit)."""
    values = dict(
        id=new_id(),
        tenant_id=tenant_id,
        task_id=task_id,
        entry_type=LedgerEntryType.RESERVE.value,
        amount=-amount,
        business_key=f"reserve:{task_id}",
        created_by=created_by,
        created_at=now,
    )
    conn.execute(credit_ledger.insert().values(**values))
    balances.debit(conn, tenant_id, amount, balances.stripe_of(task_id), whole=whole_balance)


def close_task_charge(conn: Connection, task_id: uuid.UUID, actual_cost: Decimal) -> None:
    """The task's reservation is closed: nothing reserved any more, `actual_cost` charged."""
    conn.execute(
        generation_tasks.update()
        .where(generation_tasks.c.id == task_id)
        .values(reserved_amount=0, actual_cost=actual_cost)
    )


def set_task_cost(conn: Connection, task_id: uuid.UUID, actual_cost: Decimal) -> None:
    """A closed task's charge after a later correction (a refund)."""
    conn.execute(generation_tasks.update().where(generation_tasks.c.id == task_id).values(actual_cost=actual_cost))


@dataclass(frozen=True, slots=True)
class ClosedCharge:
    """A closed task's charge, as an invoice correction needs it."""

    task_id: uuid.UUID
    #: the attempt whose job the tenant paid for (the task's latest)
    attempt_no: int
    #: what the task is charged now (net of refunds)
    actual_cost: Decimal


def closed_charges(conn: Connection, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, ClosedCharge]:
    """Terminal tasks among `task_ids` whose reservation is closed, with their charge and their latest attempt."""
    t, a = generation_tasks.c, task_attempts.c
    newest = sa.select(sa.func.max(a.attempt_no)).where(a.task_id == t.id).scalar_subquery()
    out: dict[uuid.UUID, ClosedCharge] = {}
    ids = sorted(task_ids)
    for start in range(0, len(ids), 500):
        for row in conn.execute(
            sa.select(t.id, t.actual_cost, newest.label("attempt_no")).where(
                t.id.in_(ids[start : start + 500]),
                t.status.in_([s.value for s in TASK_TERMINAL]),
                t.reserved_amount == 0,
            )
        ):
            out[row.id] = ClosedCharge(row.id, int(row.attempt_no or 0), Decimal(row.actual_cost or 0))
    return out


def booked_amounts(conn: Connection, business_keys: Collection[str]) -> dict[str, Decimal]:
    """The amount of each of these keys already booked."""
    keys = sorted(business_keys)
    out: dict[str, Decimal] = {}
    for start in range(0, len(keys), 500):
        for row in conn.execute(
            sa.select(credit_ledger.c.business_key, credit_ledger.c.amount).where(
                credit_ledger.c.business_key.in_(keys[start : start + 500])
            )
        ):
            out[row.business_key] = Decimal(row.amount)
    return out


def settled(conn: Connection, task_id: uuid.UUID) -> tuple[Decimal, Decimal] | None:
    """(reserved, charged) of a task closed by a SETTLE row: −RESERVE and RESERVE + SETTLE; None without one."""
    c = credit_ledger.c
    rows = {
        r.entry_type: Decimal(r.total)
        for r in conn.execute(
            sa.select(c.entry_type, sa.func.sum(c.amount).label("total"))
            .where(
                c.task_id == task_id,
                c.entry_type.in_([LedgerEntryType.RESERVE.value, LedgerEntryType.SETTLE.value]),
            )
            .group_by(c.entry_type)
        )
    }
    if LedgerEntryType.SETTLE.value not in rows:
        return None
    reserved = -rows.get(LedgerEntryType.RESERVE.value, Decimal(0))
    return reserved, reserved - rows[LedgerEntryType.SETTLE.value]
