"""Operator views and corrections of the credit ledger (DESIGN §4, §11, §13 `aivedio ledger ...`).

- `balance` — the tenant's cached balance beside the ledger sum it must equal, and the credits held by open tasks.
- `entries` — ledger rows, newest first.
- `adjust` — one append-only ADJUSTMENT through `db.ledger.post`, keyed `adjustment:manual:{key}`: the same key
  again is a no-op reported as such (a different amount, tenant or task under a used key is refused: that is a
  second adjustment under a reused key, not a retry). The balance may not go negative (`tenants` has a CHECK
  for it); such an adjustment is refused, and the refusal is audited.
- `reconcile` — a provider invoice against our attempts (`services/invoice.py` defines the CSV and the
  classification). Applying books one ADJUSTMENT per duplicate or attributable orphan, for **0 credits**: the
  tenant is never charged for a job the platform or the vendor duplicated; the row is the ledger's record of
  the incident (linked to tenant, task and attempt, with the vendor's amount in its reason), and its business
  key — derived from provider and job id — makes re-applying the same invoice a no-op.

Every change carries an `Operation` and writes its audit row in the same transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import Clock
from aivedio_engine.db import ledger
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import credit_ledger, generation_tasks, task_attempts, tenants
from aivedio_engine.domain.status import AttemptStatus, LedgerEntryType
from aivedio_engine.services.errors import Conflict, InsufficientCredits, InvalidInput, NotFound
from aivedio_engine.services.invoice import Finding, InvoiceLine, KnownAttempt, classify
from aivedio_engine.services.operations import Operation, record

MANUAL_KEY_PREFIX = "adjustment:manual:"
MAX_KEY = 255 - len(MANUAL_KEY_PREFIX)
#: numeric(20,8)
_QUANTUM = Decimal("0.00000001")
_MAX_AMOUNT = Decimal("1e12")
#: an invoice is taken to cover its lines' billing times, give or take this (jobs are billed after they start)
PERIOD_SLACK = timedelta(days=1)
_cl = credit_ledger.c
_t = generation_tasks.c
_a = task_attempts.c


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
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    # --- reading -------------------------------------------------------------------------------------------

    def balance(self, tenant_ref: str) -> Balance:
        with self._engine.connect() as conn:
            tenant = _tenant(conn, tenant_ref)
            by_type = {
                r.entry_type: Decimal(r.total)
                for r in conn.execute(
                    sa.select(_cl.entry_type, sa.func.sum(_cl.amount).label("total"))
                    .where(_cl.tenant_id == tenant.id)
                    .group_by(_cl.entry_type)
                )
            }
            entries = conn.execute(sa.select(sa.func.count()).where(_cl.tenant_id == tenant.id)).scalar_one()
            reserved = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(_t.reserved_amount), 0)).where(_t.tenant_id == tenant.id)
            ).scalar_one()
        return Balance(
            tenant.id,
            tenant.name,
            Decimal(tenant.credit_balance),
            sum(by_type.values(), Decimal(0)),
            Decimal(reserved),
            int(entries),
            by_type,
        )

    def entries(
        self, tenant_ref: str | None = None, task_id: uuid.UUID | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Newest first."""
        if not 1 <= limit <= 10_000:
            raise InvalidInput("--limit must be within 1..10000", field="limit")
        stmt = sa.select(credit_ledger).order_by(_cl.created_at.desc(), _cl.id.desc()).limit(limit)
        with self._engine.connect() as conn:
            if tenant_ref is not None:
                stmt = stmt.where(_cl.tenant_id == _tenant(conn, tenant_ref).id)
            if task_id is not None:
                if conn.execute(sa.select(_t.id).where(_t.id == task_id)).first() is None:
                    raise NotFound(f"task {task_id} not found")
                stmt = stmt.where(_cl.task_id == task_id)
            rows = conn.execute(stmt).all()
        return [
            {
                "id": r.id,
                "created_at": r.created_at,
                "tenant_id": r.tenant_id,
                "task_id": r.task_id,
                "attempt_id": r.attempt_id,
                "entry_type": r.entry_type,
                "amount": Decimal(r.amount),
                "unit": r.unit,
                "business_key": r.business_key,
                "reason": r.reason,
                "created_by": r.created_by,
            }
            for r in rows
        ]

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
                    entry_id = conn.execute(
                        sa.select(_cl.id).where(_cl.business_key == result.business_key)
                    ).scalar_one()
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
            owner = conn.execute(sa.select(_t.tenant_id).where(_t.id == task_id)).scalar()
            if owner is None:
                raise NotFound(f"task {task_id} not found")
            if owner != tenant.id:
                raise InvalidInput(f"task {task_id} belongs to another tenant", field="task")
        balance = Decimal(tenant.credit_balance)
        existing = conn.execute(sa.select(credit_ledger).where(_cl.business_key == stored_key)).first()
        if existing is not None:
            if (existing.tenant_id, Decimal(existing.amount), existing.task_id) != (tenant.id, amount, task_id):
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
        report = ReconcileReport(
            len(lines), len(considered), providers, billed, period, classify(considered, by_job, by_key), missing
        )
        if op is not None:
            self._book(report, op)
        return report

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
                exists = conn.execute(sa.select(_cl.id).where(_cl.business_key == f.business_key)).first()
                if exists is not None:
                    f.booking = "already_booked"
                elif op.dry_run:
                    f.booking = "would_book"
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
                    )
                    f.booking = "booked" if booked else "already_booked"
                    if booked:
                        booked_keys.append(f.business_key)
            if booked_keys:
                report.booked_entry_ids = [
                    str(i) for i in conn.execute(sa.select(_cl.id).where(_cl.business_key.in_(booked_keys))).scalars()
                ]
            outcome = "dry_run" if op.dry_run else ("booked" if booked_keys else "nothing")
            if report.not_bookable and not op.dry_run:
                outcome = "partial"
            record(conn, op, affected_ids=report.booked_entry_ids, outcome=outcome, now=now)


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


def _tenant(conn: Connection, ref: str, lock: bool = False) -> Any:
    """A tenant by id or by name."""
    try:
        cond = tenants.c.id == uuid.UUID(ref)
    except ValueError:
        cond = tenants.c.name == ref
    stmt = sa.select(tenants).where(cond)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()  # serialises with reservations and other adjustments of this tenant
    row = conn.execute(stmt).first()
    if row is None:
        raise NotFound(f"tenant {ref!r} not found")
    return row


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


def _known(row: Any) -> KnownAttempt:
    return KnownAttempt(
        row.id,
        row.task_id,
        row.tenant_id,
        row.attempt_no,
        row.provider,
        row.provider_job_id,
        row.provider_request_key,
        row.submit_state,
    )


def _known_attempts(
    conn: Connection, lines: list[InvoiceLine]
) -> tuple[dict[tuple[str, str], KnownAttempt], dict[tuple[str, str], KnownAttempt]]:
    by_job: dict[tuple[str, str], KnownAttempt] = {}
    by_key: dict[tuple[str, str], KnownAttempt] = {}
    base = sa.select(*_ATTEMPT_COLUMNS).join(generation_tasks, _t.id == _a.task_id)
    for provider in sorted({ln.provider for ln in lines}):
        jobs = sorted({ln.job_id for ln in lines if ln.provider == provider})
        keys = sorted({ln.request_key for ln in lines if ln.provider == provider and ln.request_key})
        for start in range(0, len(jobs), 500):
            batch = jobs[start : start + 500]
            for row in conn.execute(base.where(_a.provider == provider, _a.provider_job_id.in_(batch))):
                by_job[(provider, row.provider_job_id)] = _known(row)
        for start in range(0, len(keys), 500):
            for row in conn.execute(
                base.where(_a.provider == provider, _a.provider_request_key.in_(keys[start : start + 500]))
            ):
                by_key[(provider, row.provider_request_key)] = _known(row)
    return by_job, by_key


def _missing(
    conn: Connection, providers: list[str], period: tuple[datetime, datetime] | None, invoiced: set[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Jobs we believe are billable — their attempt SUCCEEDED or we charged the task — that the invoice omits."""
    if not providers or period is None:
        return []
    sent = sa.func.coalesce(_a.submitted_at, _a.created_at)
    rows = conn.execute(
        sa.select(*_ATTEMPT_COLUMNS, _t.actual_cost, sent.label("sent_at"))
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
        {
            "provider": r.provider,
            "job_id": r.provider_job_id,
            "attempt_id": r.id,
            "task_id": r.task_id,
            "tenant_id": r.tenant_id,
            "submit_state": r.submit_state,
            "sent_at": r.sent_at,
            "charged": Decimal(r.actual_cost) if r.actual_cost is not None else None,
        }
        for r in rows
        if (r.provider, r.provider_job_id) not in invoiced
    ]
