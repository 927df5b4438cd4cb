"""A tenant's credit balance: 64 striped rows that no foreign key references (migrations 0026, 0027).

The balance used to be a column of the tenant's row. Every creation updated it, so one tenant's creations queued
on that row lock until each commit had been flushed, and the KEY SHARE locks its children's foreign keys take on
the same row became MultiXacts: our own create transaction ran at 0.16 of the minimal one with 1 tenant (0.40
with 16). Now a debit takes its credits from one stripe, picked by the task id (`stripe_of`), with one conditional
UPDATE — concurrent creations of one tenant mostly touch different rows (16 stripes still left 16 concurrent
creations of one tenant meeting often enough to cost 14 % against 16 tenants; 64 took that away). When that
stripe cannot cover the debit, `debit` locks all of the tenant's stripes in stripe order, checks their sum, takes
the amount and spreads what is left evenly over them again, so the next debits find their stripes funded.

The guarantees are the column's: each stripe is non-negative (a CHECK, and every debit is conditional), so the
sum is; every change is made beside its ledger row in one transaction (db/ledger.py), so the sum is the ledger
sum, which the audit checks (db/invariants_ledger.py).

Lock order: a transaction moves at most one stripe on its own (credits stick to the stripe the transaction
touched first); only the spreading debit and `total(lock=True)` take several, always in stripe order. A
transaction that has moved one stripe and then needs the spreading debit can still deadlock with another
spreading debit (PostgreSQL aborts one); no path of the engine does that.
"""

from __future__ import annotations

import uuid
import zlib
from decimal import ROUND_DOWN, Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql

from aivedio_engine.db.session import dialect_insert, for_transaction
from aivedio_engine.db.tables import BALANCE_STRIPES, MONEY, tenant_balance_stripes

STRIPES = BALANCE_STRIPES
_s = tenant_balance_stripes.c
_CENT = Decimal("0.00000001")  # the ledger's precision: numeric(20,8)
_TXN_STRIPE = "aivedio.balance_stripe"

#: the stripe of a task, in SQL, for statements that take the task id as a parameter (db/creation.py); the same
#: number as `stripe_of(task_id)`
STRIPE_OF_TASK_SQL = f"mod(get_byte(uuid_send({{param}}::uuid), 15), {STRIPES})"


class InsufficientBalance(Exception):
    def __init__(self, balance: Decimal, needed: Decimal) -> None:
        super().__init__(f"balance {balance} is below the {needed} needed")
        self.balance = balance
        self.needed = needed


def stripe_of(task_id: uuid.UUID | None = None, key: str = "") -> int:
    """The task's stripe (its id's last byte), or, for an entry without a task, one picked by its business key."""
    if task_id is not None:
        return task_id.bytes[15] % STRIPES
    return zlib.crc32(key.encode()) % STRIPES


def total_of(tenant_id: Any) -> Any:
    """A scalar subquery: the balance of the tenant whose id is `tenant_id` (a column or a value)."""
    summed = sa.cast(sa.func.coalesce(sa.func.sum(_s.balance), 0), MONEY)
    return sa.select(summed).where(_s.tenant_id == tenant_id).scalar_subquery()


def total(conn: Connection, tenant_id: uuid.UUID, *, lock: bool = False) -> Decimal:
    """The tenant's balance. `lock` (PostgreSQL) holds all its stripes until the transaction ends: nothing else
    moves the balance meanwhile (an operator's adjustment checks and books under it)."""
    if not lock or conn.dialect.name != "postgresql":
        return Decimal(conn.execute(sa.select(total_of(tenant_id))).scalar_one())
    # Every stripe row must exist before they are locked: under READ COMMITTED a locking SELECT sees only the rows its
    # snapshot saw, so stripes a concurrent spread had just inserted would be missed, and writing the spread over
    # them would destroy their credits. The INSERT waits for such a spread to commit; the SELECT after it (a new
    # snapshot) then sees every stripe, and the rows are never deleted while the tenant lives.
    insert = postgresql.insert(tenant_balance_stripes).on_conflict_do_nothing(index_elements=[_s.tenant_id, _s.stripe])
    conn.execute(insert, [{"tenant_id": tenant_id, "stripe": i, "balance": 0} for i in range(STRIPES)])
    rows = conn.execute(
        sa.select(_s.balance).where(_s.tenant_id == tenant_id).order_by(_s.stripe).with_for_update()
    ).all()
    return sum((Decimal(r.balance) for r in rows), Decimal(0))


def credit(conn: Connection, tenant_id: uuid.UUID, amount: Decimal, stripe: int) -> None:
    """Add `amount` (≥ 0) to the balance: to the stripe this transaction already moved, else to `stripe`."""
    stripe = _sticky(conn, stripe)
    insert = dialect_insert(conn)
    stmt = insert(tenant_balance_stripes).values(tenant_id=tenant_id, stripe=stripe, balance=amount)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[_s.tenant_id, _s.stripe], set_={"balance": _s.balance + stmt.excluded.balance}
        )
    )


def debit(conn: Connection, tenant_id: uuid.UUID, amount: Decimal, stripe: int, *, whole: bool = False) -> None:
    """Take `amount` (> 0) from the balance, or raise InsufficientBalance (the caller rolls back). `whole`: go
    straight to `spread_debit` — for a caller that knows the stripe is short. Its UPDATE would be no help, and worse:
    an UPDATE that waited for a concurrent writer and then found the row no longer covers it keeps the row locked
    (PostgreSQL's re-check locks the newest version first), so the spread after it would hold one stripe out of
    order and could deadlock with another spread."""
    if whole:
        spread_debit(conn, tenant_id, amount)
        return
    stripe = _sticky(conn, stripe)
    taken = conn.execute(
        tenant_balance_stripes.update()
        .where(_s.tenant_id == tenant_id, _s.stripe == stripe, _s.balance >= amount)
        .values(balance=_s.balance - amount)
        .returning(_s.stripe)
    ).first()
    if taken is None:
        spread_debit(conn, tenant_id, amount)


def spread_debit(conn: Connection, tenant_id: uuid.UUID, amount: Decimal) -> None:
    """Take `amount` from the sum of all stripes and spread the rest evenly over them; InsufficientBalance when the
    sum is short. Locks every stripe of the tenant, in stripe order."""
    held = total(conn, tenant_id, lock=True)
    if held < amount:
        raise InsufficientBalance(held, amount)
    _spread(conn, tenant_id, held - amount)


def spread_credit(conn: Connection, tenant_id: uuid.UUID, amount: Decimal) -> None:
    """Add `amount` and spread the balance evenly over all stripes, so that the next reservations each find their
    own stripe funded (a grant or top-up: all of it on one stripe would send most of them down the slow path).
    Locks every stripe of the tenant, in stripe order."""
    _spread(conn, tenant_id, total(conn, tenant_id, lock=True) + amount)


def _spread(conn: Connection, tenant_id: uuid.UUID, balance: Decimal) -> None:
    share = (balance / STRIPES).quantize(_CENT, rounding=ROUND_DOWN)
    shares = [balance - share * (STRIPES - 1)] + [share] * (STRIPES - 1)
    # every stripe is held (PostgreSQL) or the writer is alone (SQLite): set, not add
    insert = dialect_insert(conn)
    stmt = insert(tenant_balance_stripes)
    conn.execute(
        stmt.on_conflict_do_update(index_elements=[_s.tenant_id, _s.stripe], set_={"balance": stmt.excluded.balance}),
        [{"tenant_id": tenant_id, "stripe": i, "balance": b} for i, b in enumerate(shares)],
    )


def _sticky(conn: Connection, stripe: int) -> int:
    """The stripe this transaction moved first, so that it holds one stripe lock at most (see the module doc)."""
    noted: list[int] | None = for_transaction(conn, _TXN_STRIPE, list)
    if noted is None:
        return stripe
    if not noted:
        noted.append(stripe)
    return int(noted[0])
