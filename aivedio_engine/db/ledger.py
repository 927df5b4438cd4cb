"""The credit ledger: append-only rows keyed by business key, and the tenant balance cache beside them.

Every entry updates `tenants.credit_balance` in the same transaction, so the cache equals the ledger sum by
construction (the audit checks it). A reservation locks the tenant row first: measured on this design,
check-then-insert without the lock overspends under concurrency.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import credit_ledger, tenants
from aivedio_engine.domain.status import LedgerEntryType


class InsufficientBalance(Exception):
    def __init__(self, balance: Decimal, needed: Decimal) -> None:
        super().__init__(f"balance {balance} is below the {needed} needed")
        self.balance = balance
        self.needed = needed


def lock_balance(conn: Connection, tenant_id: uuid.UUID) -> Decimal | None:
    """Lock the tenant row for the rest of the transaction; None if there is no such tenant."""
    stmt = sa.select(tenants.c.credit_balance).where(tenants.c.id == tenant_id)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).scalar_one_or_none()


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
) -> bool:
    """Append one entry unless its business key is already booked. Returns False for a repeat (a no-op)."""
    values = dict(
        id=new_id(), tenant_id=tenant_id, task_id=task_id, attempt_id=attempt_id, entry_type=entry_type.value,
        amount=amount, business_key=business_key, reason=reason, created_by=created_by, created_at=now,
    )
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(credit_ledger).values(**values).on_conflict_do_nothing(index_elements=["business_key"])
    if conn.execute(stmt).rowcount == 0:
        return False
    conn.execute(
        tenants.update()
        .where(tenants.c.id == tenant_id)
        .values(credit_balance=tenants.c.credit_balance + amount, updated_at=now)
    )
    return True


def require_balance(conn: Connection, tenant_id: uuid.UUID, amount: Decimal) -> None:
    """Lock the tenant row, then check it can pay `amount`. Call it FIRST in a reserving transaction: taking
    the row lock before any insert that references the tenant avoids the KEY SHARE → FOR UPDATE upgrade
    deadlock between two concurrent reservations."""
    balance = lock_balance(conn, tenant_id)
    if balance is None:
        raise LookupError(f"tenant {tenant_id} not found")
    if balance < amount:
        raise InsufficientBalance(balance, amount)
