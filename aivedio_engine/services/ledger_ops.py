"""Operator views and corrections of the credit ledger (`aivedio ledger...`).

- `balance` — the tenant's cached balance beside the ledger sum it must equal, and the credits held by open tasks.
- `entries` — ledger rows, newest first.
- `adjust` — one append-only ADJUSTMENT through `db.ledger.post`, keyed `adjustment:manual:{key}`: the same key
  again is a no-op reported as such (a different amount, tenant or task under a used key is refused: that is a
  second adjustment under a reused key, not a retry). The balance may not go negative (`tenants` has a CHECK
  for it); such an adjustment is refused, and the refusal is audited.
- `reconcile` — a provider invoice against our attempts (`services/invoice.py` defines the CSV and the
  classification). Applying books one ADJUSTMENT per duplicate or attributable orphan, for **0 credits**: the
  tenant is never charged for a job the platform or the vendor duplicated; the row is the ledger's record of
  the incident (linked to tenant, task and attempt, the vendor's amount and currency in `vendor_amount` /
  `vendor_currency`). A job a closed task paid for that the vendor billed for less (or credited) gets a REFUND
  of the difference in credits (`invoice_credits_per_unit` of the provider), and the task's cost drops by it.
  Business keys — derived from provider and job id — make re-applying the same invoice a no-op.

Every change carries an `Operation` and writes its audit row in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.db import ledger, ledger_queries
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.ledger_queries import Account, InvoicedAttempt
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import LedgerEntryType
from aivedio_engine.services import billing
from aivedio_engine.services.errors import Conflict, InsufficientCredits, InvalidInput, NotFound
from aivedio_engine.services.invoice import (
    ChargedJob,
    Finding,
    InvoiceLine,
    KnownAttempt,
    classify,
    refund_key,
    vendor_credits,
)
from aivedio_engine.services.operations import Operation, record

MANUAL_KEY_PREFIX = "adjustment:manual:"
MAX_KEY = 255 - len(MANUAL_KEY_PREFIX)
#: numeric(20,8)
_QUANTUM = Decimal("0.00000001")
_MAX_AMOUNT = Decimal("1e12")
#: an invoice is taken to cover its lines' billing times, give or take this (jobs are billed after they start)
PERIOD_SLACK = timedelta(days=1)


@dataclass(frozen=True)
class Balance:
    tenant_id: uuid.UUID
    tenant: str
    credit_balance: Decimal
    ledger_sum: Decimal
    #: credits held by reservations of tasks that are not closed yet
    reserved: Decimal
    entries: int
    by_type: dict[str, Decimal]

    @property
    def consistent(self) -> bool:
        return self.credit_balance == self.ledger_sum


@dataclass(frozen=True)
class AdjustResult:
    tenant_id: uuid.UUID
    tenant: str
    amount: Decimal
    business_key: str
    #: booked | duplicate | would_book
    outcome: str
    balance_before: Decimal
    balance_after: Decimal
    entry_id: uuid.UUID | None
    dry_run: bool


@dataclass
class ReconcileReport:
    lines: int
    considered: int
    providers: list[str]
    billed: dict[str, Decimal]
    period: tuple[datetime, datetime] | None
    findings: list[Finding]
    missing: list[dict[str, Any]]
    applied: bool = False
    dry_run: bool = False
    booked_entry_ids: list[str] = field(default_factory=list)

    def of(self, *kinds: str) -> list[Finding]:
        return [f for f in self.findings if f.kind in kinds]

    @property
    def not_bookable(self) -> list[Finding]:
        return [f for f in self.findings if f.business_key is None]


class LedgerOps:
    def __init__(self, engine: Engine, clock: Clock, invoice_rates: Mapping[str, Decimal] | None = None) -> None:
        self._engine = engine
        self._clock = clock
        #: provider → credits per unit of its invoice currency (absent: 1)
        self._rates = dict(invoice_rates or {})

    # --- reading -------------------------------------------------------------------------------------------

    def balance(self, tenant_ref: str) -> Balance:
        with self._engine.connect() as conn:
            tenant = _tenant(conn, tenant_ref)
            totals = ledger_queries.totals(conn, tenant.id)
        return Balance(
            tenant.id,
            tenant.name,
            tenant.credit_balance,
            sum(totals.by_type.values(), Decimal(0)),
            totals.reserved,
            totals.entries,
            totals.by_type,
        )

    def entries(
        self, tenant_ref: str | None = None, task_id: uuid.UUID | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Newest first."""
        if not 1 <= limit <= 10_000:
            raise InvalidInput("--limit must be within 1..10000", field="limit")
        with self._engine.connect() as conn:
            tenant_id, task_id = _entries_of(conn, tenant_ref, task_id)
            rows = ledger_queries.entries(conn, tenant_id=tenant_id, task_id=task_id, limit=limit)
        return [
            {
                "id": r.id,
                "created_at": r.created_at,
                "tenant_id": r.tenant_id,
                "task_id": r.task_id,
                "attempt_id": r.attempt_id,
                "entry_type": r.entry_type,
                "amount": r.amount,
                "unit": r.unit,
                "business_key": r.business_key,
                "reason": r.reason,
                "created_by": r.created_by,
                "vendor_amount": r.vendor_amount,
                "vendor_currency": r.vendor_currency,
            }
            for r in rows
        ]

    def count_entries(self, tenant_ref: str | None = None, task_id: uuid.UUID | None = None) -> int:
        """How many entries `entries` would return without its limit (a list cut by --limit says so)."""
        with self._engine.connect() as conn:
            tenant_id, task_id = _entries_of(conn, tenant_ref, task_id)
            return ledger_queries.count_entries(conn, tenant_id=tenant_id, task_id=task_id)

    # --- adjust --------------------------------------------------------------------------------------------

    def quote_adjust(
        self, tenant_ref: str, amount: Decimal, key: str, task_id: uuid.UUID | None = None
    ) -> AdjustResult:
        """What `adjust` would do, without writing anything (raises the same refusals)."""
        with self._engine.connect() as conn:
            return self._evaluate(conn, tenant_ref, amount, key, task_id, dry_run=True, lock=False)

    def adjust(
        self, tenant_ref: str, amount: Decimal, key: str, op: Operation, task_id: uuid.UUID | None = None
    ) -> AdjustResult:
        """Book one ADJUSTMENT (±amount credits) unless `key` is already booked."""
        reason = op.require_reason()
        now = self._clock.now()
        refusal: Exception | None = None
        with write_tx(self._engine) as conn:
            try:
                result = self._evaluate(conn, tenant_ref, amount, key, task_id, dry_run=op.dry_run, lock=True)
            except (InsufficientCredits, Conflict) as exc:
                # the refusal is part of the story: audit it (and commit that) before reporting it
                record(conn, op, affected_ids=[], outcome="refused", now=now)
                refusal = exc
            else:
                if result.outcome == "would_book" and not op.dry_run:
                    if not ledger.post(
                        conn,
                        tenant_id=result.tenant_id,
                        entry_type=LedgerEntryType.ADJUSTMENT,
                        amount=result.amount,
                        business_key=result.business_key,
                        now=now,
                        created_by=op.actor[:128],
                        task_id=task_id,
                        reason=reason,
                    ):
                        # booked by a concurrent adjustment of another tenant since _evaluate looked
                        raise Conflict(f"business key {key!r} was just used by another adjustment; retry to see it")
                    entry_id = ledger_queries.entry_id(conn, result.business_key)
                    result = replace(result, outcome="booked", entry_id=entry_id)
                affected = [result.entry_id] if result.entry_id and result.outcome == "booked" else []
                record(conn, op, affected_ids=affected, outcome="dry_run" if op.dry_run else result.outcome, now=now)
        if refusal is not None:
            raise refusal
        return result

    def _evaluate(
        self,
        conn: Connection,
        tenant_ref: str,
        amount: Decimal,
        key: str,
        task_id: uuid.UUID | None,
        *,
        dry_run: bool,
        lock: bool,
    ) -> AdjustResult:
        amount = _amount(amount)
        key = (key or "").strip()
        if not key or len(key) > MAX_KEY or not key.isprintable():
            raise InvalidInput(f"--business-key must be 1..{MAX_KEY} printable characters", field="business_key")
        stored_key = MANUAL_KEY_PREFIX + key
        tenant = _tenant(conn, tenant_ref, lock=lock)
        if task_id is not None:
            owner = ledger_queries.task_tenant(conn, task_id)
            if owner is None:
                raise NotFound(f"task {task_id} not found")
            if owner != tenant.id:
                raise InvalidInput(f"task {task_id} belongs to another tenant", field="task")
        balance = tenant.credit_balance
        existing = ledger_queries.entry(conn, stored_key)
        if existing is not None:
            if (existing.tenant_id, existing.amount, existing.task_id) != (tenant.id, amount, task_id):
                raise Conflict(
                    f"business key {key!r} was already used for a different adjustment "
                    f"({existing.amount} credits, tenant {existing.tenant_id}); choose a new key"
                )
            return AdjustResult(
                tenant.id, tenant.name, amount, stored_key, "duplicate", balance, balance, existing.id, dry_run
            )
        after = balance + amount
        if after < 0:
            raise InsufficientCredits(
                f"refused: tenant {tenant.name} has {balance} credits; an adjustment of "
                f"{amount} would leave {after} (the balance cannot go negative)"
            )
        return AdjustResult(tenant.id, tenant.name, amount, stored_key, "would_book", balance, after, None, dry_run)

    # --- reconcile -----------------------------------------------------------------------------------------

    def reconcile(
        self, lines: list[InvoiceLine], *, provider: str | None = None, op: Operation | None = None
    ) -> ReconcileReport:
        """Compare invoice lines with our attempts; with `op`, book the bookable findings (once)."""
        considered = [ln for ln in lines if provider is None or ln.provider == provider]
        providers = sorted({ln.provider for ln in considered})
        billed: dict[str, Decimal] = {}
        for ln in considered:
            billed[ln.currency or ""] = billed.get(ln.currency or "", Decimal(0)) + ln.amount
        period = (
            (
                min(ln.billed_at for ln in considered) - PERIOD_SLACK,
                max(ln.billed_at for ln in considered) + PERIOD_SLACK,
            )
            if considered
            else None
        )
        with self._engine.connect() as conn:
            by_job, by_key = _known_attempts(conn, considered)
            missing = _missing(conn, providers, period, {(ln.provider, ln.job_id) for ln in considered})
            paid = _charged_jobs(conn, by_job)
        findings = classify(considered, by_job, by_key) + vendor_credits(considered, paid, self._rates)
        findings.sort(key=lambda f: f.line.line_no)
        report = ReconcileReport(len(lines), len(considered), providers, billed, period, findings, missing)
        if op is not None:
            self._book(report, op)
        return report

    def _refund(self, conn: Connection, f: Finding, now: datetime, actor: str, reason: str) -> bool:
        assert f.attempt is not None and f.business_key is not None
        task = ledger_queries.task(conn, f.attempt.task_id)
        ln = f.line
        note = (
            f"invoice {ln.provider} job {ln.job_id}: billed {f.vendor_amount} {ln.currency or ''} (line "
            f"{ln.line_no}), below the charge: {f.credits} credits back. {reason}"
        )
        booked = billing.refund(
            conn,
            task,
            now,
            business_key=f.business_key,
            reason=note,
            created_by=actor,
            amount=f.credits,
            attempt_id=f.attempt.id,
            vendor_amount=f.vendor_amount,
            vendor_currency=(ln.currency or None) and ln.currency[:16],
        )
        return booked > 0

    def _book(self, report: ReconcileReport, op: Operation) -> None:
        reason = op.require_reason()
        now = self._clock.now()
        report.applied, report.dry_run = True, op.dry_run
        booked_keys: list[str] = []
        with write_tx(self._engine) as conn:
            for f in report.findings:
                if f.business_key is None or f.attempt is None:
                    f.booking = "not_bookable"
                    continue
                if ledger_queries.is_booked(conn, f.business_key):
                    f.booking = "already_booked"
                elif op.dry_run:
                    f.booking = "would_book"
                elif f.kind == "vendor_credit":
                    booked = self._refund(conn, f, now, op.actor[:128], reason)
                    f.booking = "booked" if booked else "already_booked"
                    if booked:
                        booked_keys.append(f.business_key)
                else:
                    ln = f.line
                    note = (
                        f"invoice {f.kind}: {ln.provider} job {ln.job_id} billed {ln.amount} {ln.currency or ''}"
                        f" at {ln.billed_at.isoformat()} (line {ln.line_no}); 0 credits, not charged to the "
                        f"tenant. {reason}"
                    )
                    booked = ledger.post(
                        conn,
                        tenant_id=f.attempt.tenant_id,
                        entry_type=LedgerEntryType.ADJUSTMENT,
                        amount=Decimal(0),
                        business_key=f.business_key,
                        now=now,
                        created_by=op.actor[:128],
                        task_id=f.attempt.task_id,
                        attempt_id=f.attempt.id,
                        reason=note,
                        vendor_amount=ln.amount,
                        vendor_currency=(ln.currency or None) and ln.currency[:16],
                    )
                    f.booking = "booked" if booked else "already_booked"
                    if booked:
                        booked_keys.append(f.business_key)
            if booked_keys:
                report.booked_entry_ids = [str(i) for i in ledger_queries.entry_ids(conn, booked_keys)]
            outcome = "dry_run" if op.dry_run else ("booked" if booked_keys else "nothing")
            if report.not_bookable and not op.dry_run:
                outcome = "partial"
            record(conn, op, affected_ids=report.booked_entry_ids, outcome=outcome, now=now)


def _charged_jobs(conn: Connection, by_job: dict[tuple[str, str], KnownAttempt]) -> dict[tuple[str, str], ChargedJob]:
    """The recorded jobs whose closed task paid for them (its latest attempt), with the charge before any invoice
    refund of that job, so a second look at the same invoice computes the same difference."""
    closed = ledger.closed_charges(conn, {a.task_id for a in by_job.values()})
    mine = {job: a for job, a in by_job.items() if a.task_id in closed and closed[a.task_id].attempt_no == a.attempt_no}
    refunded = ledger.booked_amounts(conn, {refund_key(*job) for job in mine})
    return {
        job: ChargedJob(a, closed[a.task_id].actual_cost + refunded.get(refund_key(*job), Decimal(0)))
        for job, a in mine.items()
    }


def _amount(value: Any) -> Decimal:
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        raise InvalidInput(f"--amount must be a number, got {value!r}", field="amount") from None
    if not amount.is_finite() or amount == 0 or abs(amount) >= _MAX_AMOUNT:
        raise InvalidInput("--amount must be a non-zero number below 1e12 in magnitude", field="amount")
    if amount != amount.quantize(_QUANTUM):
        raise InvalidInput("--amount has more than 8 decimal places", field="amount")
    return amount


def _tenant(conn: Connection, ref: str, lock: bool = False) -> Account:
    """A tenant by id or by name."""
    try:
        found = ledger_queries.account(conn, tenant_id=uuid.UUID(ref), lock=lock)
    except ValueError:
        found = ledger_queries.account(conn, name=ref, lock=lock)
    if found is None:
        raise NotFound(f"tenant {ref!r} not found")
    return found


def _known(row: InvoicedAttempt) -> KnownAttempt:
    return KnownAttempt(**asdict(row))  # the same fields: the persistence layer's record, the invoice's type


def _known_attempts(
    conn: Connection, lines: list[InvoiceLine]
) -> tuple[dict[tuple[str, str], KnownAttempt], dict[tuple[str, str], KnownAttempt]]:
    by_job: dict[tuple[str, str], KnownAttempt] = {}
    by_key: dict[tuple[str, str], KnownAttempt] = {}
    for provider in sorted({ln.provider for ln in lines}):
        jobs = sorted({ln.job_id for ln in lines if ln.provider == provider})
        keys = sorted({ln.request_key for ln in lines if ln.provider == provider and ln.request_key})
        for job_id, row in ledger_queries.attempts_by_job(conn, provider, jobs).items():
            by_job[(provider, job_id)] = _known(row)
        for key, row in ledger_queries.attempts_by_request_key(conn, provider, keys).items():
            by_key[(provider, key)] = _known(row)
    return by_job, by_key


def _entries_of(
    conn: Connection, tenant_ref: str | None, task_id: uuid.UUID | None
) -> tuple[uuid.UUID | None, uuid.UUID | None]:
    """The tenant's id (None: any) and the task (None: any) whose entries are asked for; NotFound for either."""
    tenant_id = _tenant(conn, tenant_ref).id if tenant_ref is not None else None
    if task_id is not None and not ledger_queries.task_exists(conn, task_id):
        raise NotFound(f"task {task_id} not found")
    return tenant_id, task_id


def _missing(
    conn: Connection, providers: list[str], period: tuple[datetime, datetime] | None, invoiced: set[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Jobs we believe are billable — their attempt SUCCEEDED or we charged the task — that the invoice omits."""
    if not providers or period is None:
        return []
    return [
        {
            "provider": r.attempt.provider,
            "job_id": r.attempt.provider_job_id,
            "attempt_id": r.attempt.id,
            "task_id": r.attempt.task_id,
            "tenant_id": r.attempt.tenant_id,
            "task_status": r.task_status,
            "submit_state": r.attempt.submit_state,
            "sent_at": r.sent_at,
            "charged": r.actual_cost,
        }
        for r in ledger_queries.billable_attempts(conn, providers, period)
        if (r.attempt.provider, r.attempt.provider_job_id) not in invoiced
    ]
