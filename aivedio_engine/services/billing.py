"""Closing a task's credit reservation, by the effect the state machine asked for and the vendor's bill (
; the rule table is `domain/settlement.py`).

Sign convention: RESERVE −estimate; SETTLE +(estimate − actual), the released difference; RELEASE +estimate;
REFUND +what the vendor gave back (never more than was charged). Business keys make every booking happen at
most once, however often a closing transition's consumer is redelivered.

The vendor's bill is read from the task's latest attempt, where the reducer recorded it from the job's
terminal observation (`task_attempts.vendor_billed`, `billed_seconds`, ...): callers pass nothing new.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from aivedio_engine.db import alerts, attempts, ledger
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Task
from aivedio_engine.domain.settlement import Bill, Quote, Rule, Settlement, refund_after_close, settle
from aivedio_engine.domain.status import AlertSeverity, LedgerEntryType
from aivedio_engine.domain.transitions import Decision, Effect


def refund_key(task_id: uuid.UUID, attempt_id: uuid.UUID | None) -> str:
    """One vendor refund per job: at closing or later (a void), whichever comes first books it."""
    return f"refund:{task_id}:vendor:{attempt_id}"


def quote_of(task: Task) -> Quote:
    """What the client was quoted, from the task row (the price per second is the estimate's, as reserved)."""
    params = task.params if isinstance(task.params, dict) else {}
    seconds = params.get("duration_s")
    outputs = params.get("n")
    return Quote(
        estimate=Decimal(task.estimated_cost),
        reserved=Decimal(task.reserved_amount or 0),
        requested_seconds=int(seconds) if isinstance(seconds, int) and seconds > 0 else 1,
        requested_outputs=int(outputs) if isinstance(outputs, int) and outputs > 0 else 1,
    )


def bill_from(recorded: attempts.VendorBill | None, verdict: bool | None = None) -> Bill:
    """The domain's view of a recorded bill; a caller's explicit verdict (e.g. "canceled before it ran: not
    billed") wins over the recorded one."""
    if recorded is None:
        return Bill(billed=verdict)
    return Bill(
        billed=verdict if verdict is not None else recorded.billed,
        seconds=recorded.seconds,
        outputs=recorded.outputs,
        refunded=bool(recorded.refunded),
    )


def close_reservation(
    conn: Connection,
    task: Task,
    decision: Decision,
    now: datetime,
    *,
    reason: str,
    billed: bool | None = None,
    created_by: str = "engine",
    delivered: int | None = None,
) -> Decimal | None:
    """Book the closing rows for a closing transition; returns the actual cost booked (None if nothing).
    `delivered`: the outputs a success delivered (its charge is capped at their quoted price)."""
    quote = quote_of(task)
    if quote.reserved <= 0:
        return None
    recorded = attempts.bill_of(conn, task.id)
    accepted = attempts.any_accepted(conn, task.id)
    result = settle(tuple(decision.effects), quote, bill_from(recorded, billed), accepted=accepted, delivered=delivered)
    if result.entry is None:
        return None
    attempt_id = recorded.attempt_id if recorded is not None else None
    book(conn, task, result, now, reason=reason, created_by=created_by, attempt_id=attempt_id)
    return result.actual


def book(
    conn: Connection,
    task: Task,
    result: Settlement,
    now: datetime,
    *,
    reason: str,
    created_by: str,
    attempt_id: uuid.UUID | None,
) -> None:
    """The rows of one settlement, the alert for a bill above the reservation, and the task's cost."""
    if result.entry is LedgerEntryType.RELEASE:
        key = f"release:{task.id}:{reason}"
    else:
        key = f"settle:{task.id}"
    note = reason if result.rule.value == reason else f"{reason} ({result.rule.value})"
    ledger.post(
        conn,
        tenant_id=task.tenant_id,
        task_id=task.id,
        attempt_id=attempt_id,
        entry_type=result.entry or LedgerEntryType.SETTLE,
        amount=result.amount,
        business_key=key,
        now=now,
        created_by=created_by,
        reason=note,
    )
    if result.refund > 0:
        ledger.post(
            conn,
            tenant_id=task.tenant_id,
            task_id=task.id,
            attempt_id=attempt_id,
            entry_type=LedgerEntryType.REFUND,
            amount=result.refund,
            business_key=refund_key(task.id, attempt_id),
            now=now,
            created_by=created_by,
            reason=f"{reason}: the vendor refunded its charge",
        )
    if result.over_reservation > 0:
        alerts.raise_alert(
            conn,
            alerts.Rule.VENDOR_BILL_OVER_RESERVATION,
            AlertSeverity.WARNING,
            dedup_key=str(task.id),
            now=now,
            subject_type="task",
            subject_id=str(task.id),
            message=(
                f"the vendor billed {result.vendor_charge} credits' worth for a reservation of {result.charged}; "
                f"{result.over_reservation} not charged to the tenant"
            ),
            details={
                "vendor_charge": str(result.vendor_charge),
                "charged": str(result.charged),
                "over_reservation": str(result.over_reservation),
            },
        )
    if result.platform_cost > 0:
        book_platform_cost(
            conn,
            task,
            result.platform_cost,
            now,
            kind=result.rule.value,
            why=_PLATFORM_COST_WHY.get(result.rule, result.rule.value) + f" ({reason})",
            attempt_id=attempt_id,
            created_by=created_by,
        )
    ledger.close_task_charge(conn, task.id, result.actual)


_PLATFORM_COST_WHY = {
    Rule.PLATFORM_COST: "the task ended without delivering, not by the tenant's doing; its reservation was released",
    Rule.UNDELIVERED_OUTPUTS: "outputs the vendor billed were not delivered; the tenant paid for the delivered ones",
}


def platform_cost_key(task_id: uuid.UUID, attempt_id: uuid.UUID | None, kind: str) -> str:
    return f"platform_cost:{task_id}:{attempt_id}:{kind}"


def book_platform_cost(
    conn: Connection,
    task: Task,
    amount: Decimal,
    now: datetime,
    *,
    kind: str,
    why: str,
    attempt_id: uuid.UUID | None,
    created_by: str = "engine",
) -> bool:
    """What the vendor billed that the tenant does not pay: one 0-credit ADJUSTMENT carrying the amount (credits'
    worth at the model's price list) so `ledger` and the invoice reconcile show it, and one `platform_cost` alert.
    Once per (task, attempt, kind), however often the caller is redelivered; False for a repeat."""
    booked = ledger.post(
        conn,
        tenant_id=task.tenant_id,
        task_id=task.id,
        attempt_id=attempt_id,
        entry_type=LedgerEntryType.ADJUSTMENT,
        amount=Decimal(0),
        business_key=platform_cost_key(task.id, attempt_id, kind),
        now=now,
        created_by=created_by,
        reason=f"platform cost: {why}; 0 credits charged to the tenant",
        vendor_amount=amount,
        vendor_currency=PLATFORM_COST_UNIT,
    )
    if booked:
        alerts.raise_alert(
            conn,
            alerts.Rule.PLATFORM_COST,
            AlertSeverity.WARNING,
            dedup_key=f"{task.id}:{kind}",
            now=now,
            subject_type="task",
            subject_id=str(task.id),
            message=f"{amount} credits' worth of vendor cost not charged to the tenant: {why}",
            details={"amount": str(amount), "kind": kind, "attempt_id": str(attempt_id) if attempt_id else None},
        )
    return booked


#: the unit of a platform-cost row's `vendor_amount`: the model's price list, as the tenant would have paid
PLATFORM_COST_UNIT = "credits"


def refund(
    conn: Connection,
    task: Task,
    now: datetime,
    *,
    business_key: str,
    reason: str,
    created_by: str = "engine",
    amount: Decimal | None = None,
    attempt_id: uuid.UUID | None = None,
    vendor_amount: Decimal | None = None,
    vendor_currency: str | None = None,
) -> Decimal:
    """A vendor refund after the task was closed (a voided job, an invoice credit): one REFUND row of at most what
    the task is still charged (`amount` None: all of it), and the task's cost lowered by it. Returns the amount
    booked (0: nothing to refund, not closed yet, or this key was booked before)."""
    if Decimal(task.reserved_amount or 0) > 0:
        return Decimal(0)  # still open: its closing reads the refund from the attempt instead
    charged = Decimal(task.actual_cost or 0)
    value = refund_after_close(charged, amount)
    if value <= 0:
        return Decimal(0)
    booked = ledger.post(
        conn,
        tenant_id=task.tenant_id,
        task_id=task.id,
        attempt_id=attempt_id,
        entry_type=LedgerEntryType.REFUND,
        amount=value,
        business_key=business_key,
        now=now,
        created_by=created_by,
        reason=reason,
        vendor_amount=vendor_amount,
        vendor_currency=vendor_currency,
    )
    if not booked:
        return Decimal(0)
    ledger.set_task_cost(conn, task.id, charged - value)
    return value


def settle_late_bill(conn: Connection, task: Task, now: datetime, *, attempt_id: uuid.UUID) -> Decimal:
    """A bill that arrives after the task was closed without it (a cancel confirmed by the cancel call, a deadline):
    when the table, given the bill now recorded on the attempt, charges less than was charged, the difference is
    REFUNDed once per attempt. A higher bill changes nothing: the charge never grows after the close."""
    if Decimal(task.reserved_amount or 0) > 0:
        return Decimal(0)
    closed = ledger.settled(conn, task.id)
    recorded = attempts.bill_of(conn, task.id)
    if closed is None or recorded is None or recorded.attempt_id != attempt_id:
        return Decimal(0)
    reserved, charged = closed
    quote = replace(quote_of(task), reserved=reserved)
    table = settle((Effect.SETTLE_CREDITS,), quote, bill_from(recorded), accepted=True)
    if table.charged >= charged:
        return Decimal(0)
    return refund(
        conn,
        task,
        now,
        business_key=f"refund:{task.id}:late_bill:{attempt_id}",
        reason=f"the vendor's bill, reported after the close, is {table.charged} ({table.rule.value})",
        amount=charged - table.charged,
        attempt_id=attempt_id,
    )
