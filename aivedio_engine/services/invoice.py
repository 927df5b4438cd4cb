"""A provider invoice against what we recorded: parsing the CSV and classifying its lines (no I/O here).

Invoice CSV: a header row, then one row per charge. Column order is free and other columns are ignored (vendor
exports carry many); names are case-insensitive.

    provider     required  provider name as configured here (e.g. `sim`)
    job_id       required  the provider's job id
    amount       required  the amount billed, a decimal
    billed_at    required  ISO-8601 time of the charge (UTC when it has no offset)
    currency     optional  e.g. USD; reported, never converted
    request_key  optional  the Idempotency-Key we sent, when the vendor reports it: it attributes a job we never
                           recorded (an ambiguous submit whose job id we never learnt) to its attempt

Classification, per line:
- `duplicate_line` — the same (provider, job_id) billed again in this invoice (every repeat after the first);
- `duplicate_job` — a second paid job for one task: a job we never recorded, or one recorded by an attempt that
  never reached an outcome of its own, beside the job that produced the task's outcome (the recorded job of its
  highest attempt). Typical: an ambiguous submit resubmitted without lookup, both jobs billed. A billed job of an
  attempt that FAILED or was CANCELED before a retry is the vendor's ordinary rule, not a finding. A job the
  engine recorded itself as a duplicate (on an attempt closed as never created, `services/late_jobs.py`) is
  keyed by the platform-cost row it booked then, so applying finds it already booked;
- `orphan` — a job id we never recorded: attributed to a task when its request key is one of ours (the task then
  has no other paid job), otherwise nobody's — such a line cannot be booked to any tenant and needs a human.
- `vendor_credit` — the job a closed task was charged for, billed for less than we charged (a lower amount, or a
  credit note: a line with a negative amount) once the provider's `invoice_credits_per_unit` turns its currency
  into credits: a REFUND of the difference (Runway reports usage per account only, so its tasks are settled at
  the price list and corrected here). Negative lines are credits, never duplicates. A bill above the charge is
  not a finding: a tenant is never charged past what was settled.
"""

from __future__ import annotations

import csv
import hashlib
import io
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from aivedio_engine.domain.status import AttemptStatus
from aivedio_engine.services.billing import platform_cost_key
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.late_jobs import KIND as DUPLICATE_KIND

REQUIRED_COLUMNS = ("provider", "job_id", "amount", "billed_at")
OPTIONAL_COLUMNS = ("currency", "request_key")
MAX_LINES = 1_000_000
#: credit_ledger.business_key is varchar(255)
_KEY_MAX = 255
#: a billed job of an attempt in these states is explained by the provider's own outcome, not a duplicate
_OWN_OUTCOME = (AttemptStatus.FAILED.value, AttemptStatus.CANCELED.value)


@dataclass(frozen=True, slots=True)
class InvoiceLine:
    line_no: int
    provider: str
    job_id: str
    amount: Decimal
    currency: str | None
    billed_at: datetime
    request_key: str | None


@dataclass(frozen=True, slots=True)
class KnownAttempt:
    """An attempt of ours, as far as reconciliation needs it."""

    id: uuid.UUID
    task_id: uuid.UUID
    tenant_id: uuid.UUID
    attempt_no: int
    provider: str
    provider_job_id: str | None
    provider_request_key: str
    submit_state: str


@dataclass
class Finding:
    kind: str
    line: InvoiceLine
    attempt: KnownAttempt | None
    note: str
    #: None: nobody to book it to
    business_key: str | None
    #: after an apply: booked | already_booked | would_book | not_bookable
    booking: str | None = None
    #: credits a `vendor_credit` gives back (0 for the other kinds: their rows are 0-credit ADJUSTMENTs)
    credits: Decimal = Decimal(0)
    #: the vendor's own amount behind the finding (the job's net over the invoice for a `vendor_credit`)
    vendor_amount: Decimal | None = None

    def to_json(self) -> dict[str, Any]:
        a, ln = self.attempt, self.line
        return {
            "kind": self.kind,
            "line": ln.line_no,
            "provider": ln.provider,
            "job_id": ln.job_id,
            "amount": str(ln.amount),
            "currency": ln.currency,
            "billed_at": ln.billed_at.isoformat(),
            "request_key": ln.request_key,
            "tenant_id": str(a.tenant_id) if a else None,
            "task_id": str(a.task_id) if a else None,
            "attempt_id": str(a.id) if a else None,
            "note": self.note,
            "business_key": self.business_key,
            "booking": self.booking,
        }


@dataclass(frozen=True, slots=True)
class ChargedJob:
    """The job a closed task was charged for, and what it was charged before any invoice refund."""

    attempt: KnownAttempt
    charged: Decimal


def refund_key(provider: str, job_id: str) -> str:
    """`refund:invoice:{provider}:{job_id}`: one invoice correction per job, however often it is applied."""
    key = f"refund:invoice:{provider}:{job_id}"
    if len(key) <= _KEY_MAX:
        return key
    return "refund:invoice:sha256:" + hashlib.sha256(f"{provider}\n{job_id}".encode()).hexdigest()


def vendor_credits(
    lines: list[InvoiceLine], charged: dict[tuple[str, str], ChargedJob], rate: dict[str, Decimal]
) -> list[Finding]:
    """REFUND findings for jobs the vendor billed below what their closed task was charged. `charged` maps (provider,
    job id) to the charged job; `rate` the provider to credits per invoice unit (1 when absent)."""
    net: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    last: dict[tuple[str, str], InvoiceLine] = {}
    for line in lines:
        job = (line.provider, line.job_id)
        net[job] += line.amount
        last[job] = line
    findings: list[Finding] = []
    for job, total in net.items():
        paid = charged.get(job)
        if paid is None or paid.charged <= 0:
            continue
        vendor = (max(total, Decimal(0)) * rate.get(job[0], Decimal(1))).quantize(Decimal("0.00000001"))
        if vendor >= paid.charged:
            continue
        back = paid.charged - vendor
        ln = last[job]
        note = (
            f"the vendor billed {total} {ln.currency or ''} (= {vendor} credits) for a task charged {paid.charged}:"
            f" {back} credits back"
        ).replace("  ", " ")
        findings.append(
            Finding("vendor_credit", ln, paid.attempt, note, refund_key(*job), credits=back, vendor_amount=total)
        )
    return findings


def parse_invoice(text: str) -> list[InvoiceLine]:
    """Lines of an invoice CSV; InvalidInput names the first bad line and column."""
    rows = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header = next(rows, None)
    if not header:
        raise InvalidInput("invoice: empty file (expected a header row: provider,job_id,amount,currency,billed_at)")
    names = [h.strip().lower() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise InvalidInput(
            f"invoice: missing column(s) {', '.join(missing)} in the header "
            f"(expected {','.join(REQUIRED_COLUMNS)}[,{','.join(OPTIONAL_COLUMNS)}])"
        )
    at = {name: names.index(name) for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if name in names}
    lines: list[InvoiceLine] = []
    for line_no, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(lines) >= MAX_LINES:
            raise InvalidInput(f"invoice: more than {MAX_LINES} lines; split it")
        cell = {name: (row[i].strip() if i < len(row) else "") for name, i in at.items()}
        lines.append(_line(line_no, cell))
    return lines


def _line(line_no: int, cell: dict[str, str]) -> InvoiceLine:
    for name in ("provider", "job_id"):
        if not cell[name]:
            raise InvalidInput(f"invoice line {line_no}: {name} is empty")
    try:
        amount = Decimal(cell["amount"])
        if not amount.is_finite():
            raise InvalidOperation
    except InvalidOperation:
        raise InvalidInput(f"invoice line {line_no}: amount {cell['amount']!r} is not a number") from None
    try:
        billed_at = datetime.fromisoformat(cell["billed_at"].replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"invoice line {line_no}: billed_at {cell['billed_at']!r} is not an ISO-8601 time") from None
    return InvoiceLine(
        line_no,
        cell["provider"],
        cell["job_id"],
        amount,
        cell.get("currency") or None,
        billed_at if billed_at.tzinfo else billed_at.replace(tzinfo=UTC),
        cell.get("request_key") or None,
    )


def business_key(provider: str, job_id: str, repeat: int = 1) -> str:
    """`adjustment:invoice:{provider}:{job_id}` (`:repeat{n}` for the n-th billing of one job): booking the
    same finding again hits the ledger's unique key, so re-applying an invoice is a no-op."""
    key = f"adjustment:invoice:{provider}:{job_id}" + (f":repeat{repeat}" if repeat > 1 else "")
    if len(key) <= _KEY_MAX:
        return key
    digest = hashlib.sha256(f"{provider}\n{job_id}\n{repeat}".encode()).hexdigest()
    return f"adjustment:invoice:sha256:{digest}"


@dataclass
class _Billed:
    line: InvoiceLine
    attempt: KnownAttempt

    @property
    def recorded(self) -> bool:
        return self.attempt.provider_job_id == self.line.job_id


def classify(
    lines: list[InvoiceLine],
    by_job: dict[tuple[str, str], KnownAttempt],
    by_request_key: dict[tuple[str, str], KnownAttempt],
) -> list[Finding]:
    """Findings in invoice order. `by_job` maps (provider, job id) to the attempt that recorded it,
    `by_request_key` (provider, request key) to the attempt that sent it."""
    findings: list[Finding] = []
    times: Counter[tuple[str, str]] = Counter()
    per_task: dict[uuid.UUID, list[_Billed]] = defaultdict(list)
    for line in lines:
        if line.amount < 0:
            continue  # a credit note: `vendor_credits` reads it
        job = (line.provider, line.job_id)
        times[job] += 1
        attempt = by_job.get(job) or (
            by_request_key.get((line.provider, line.request_key)) if line.request_key else None
        )
        if times[job] > 1:
            findings.append(
                Finding(
                    "duplicate_line",
                    line,
                    attempt,
                    f"job billed {times[job]} times in this invoice",
                    business_key(line.provider, line.job_id, times[job]) if attempt else None,
                )
            )
        elif attempt is None:
            findings.append(
                Finding("orphan", line, None, "no attempt of ours recorded this job id or sent its request key", None)
            )
        else:
            per_task[attempt.task_id].append(_Billed(line, attempt))
    for billed in per_task.values():
        primary = max(billed, key=lambda b: (b.recorded, b.attempt.attempt_no, b.line.line_no))
        for b in billed:
            key = business_key(b.line.provider, b.line.job_id)
            if b is primary:
                if not b.recorded:
                    findings.append(
                        Finding(
                            "orphan",
                            b.line,
                            b.attempt,
                            f"job never recorded; its request key is attempt "
                            f"#{b.attempt.attempt_no}'s, and the task has no other paid job",
                            key,
                        )
                    )
            elif b.recorded and b.attempt.submit_state == AttemptStatus.FAILED_BEFORE_ACCEPT.value:
                # the engine recorded it when the late send's job turned up, with its platform-cost row
                findings.append(
                    Finding(
                        "duplicate_job",
                        b.line,
                        b.attempt,
                        f"second paid job for the task, recorded as a duplicate of attempt #{b.attempt.attempt_no} "
                        "(closed as never created) and booked as platform cost when it turned up",
                        platform_cost_key(b.attempt.task_id, b.attempt.id, DUPLICATE_KIND),
                    )
                )
            elif not (b.recorded and b.attempt.submit_state in _OWN_OUTCOME):
                how = "never recorded" if not b.recorded else f"recorded by a {b.attempt.submit_state} attempt"
                findings.append(
                    Finding(
                        "duplicate_job",
                        b.line,
                        b.attempt,
                        f"second paid job for the task ({how}); the task's outcome came from job "
                        f"{primary.line.job_id} of attempt #{primary.attempt.attempt_no}",
                        key,
                    )
                )
    findings.sort(key=lambda f: f.line.line_no)
    return findings
