"""`aivedio ledger balance|entries|adjust|reconcile`: read the credit ledger, correct it, check an invoice."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._params import complete_provider, complete_tenant
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id, print_count
from aivedio_cli._services import service_context
from aivedio_engine.services.errors import Conflict, InsufficientCredits

if TYPE_CHECKING:
    from aivedio_engine.services.ledger_ops import AdjustResult, ReconcileReport

app = typer.Typer(
    help="The credit ledger: balances, entries, adjustments, invoice reconciliation.", no_args_is_help=True
)

TENANT = typer.Option(..., "--tenant", autocompletion=complete_tenant, help="Tenant id or name.")
JSON = typer.Option(False, "--json", help="JSON on stdout.")


def _uuid(value: str | None, what: str) -> uuid.UUID | None:
    return None if value is None else parse_id(value, what)


def _plain(value: Any) -> Any:
    """Rows → JSON values: ISO times, exact decimals, ids as strings."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")  # "0.00000000", never "0E-8"
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _money(value: Decimal) -> str:
    """numeric(20,8) without its trailing zeros: 997.00000000 → 997.00, 0.12500000 → 0.125."""
    cents = value.quantize(Decimal("0.01"))
    return f"{cents:.2f}" if cents == value else format(value.normalize(), "f")


def _time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")  # UTC, to the second: the table must fit a terminal


#: missing charges listed by the human report (--json carries them all)
MISSING_SHOWN = 20
#: short words that must stay whole; every other column may fold (an id cut short by "…" is useless to copy)
_WHOLE = {"line", "kind", "type", "amount", "booking", "by"}


def _table(*columns: str) -> Table:
    table = Table()
    for column in columns:
        table.add_column(column, no_wrap=column in _WHOLE, overflow="fold")
    return table


def _service(app_ctx: Any) -> Any:
    return app_ctx.ledger_ops


@app.command("balance")
def balance(ctx: typer.Context, tenant: str = TENANT, as_json: bool = JSON) -> None:
    """The tenant's balance, the ledger sum it must equal, and the credits held by open tasks."""
    with service_context(ctx) as app_ctx:
        b = _service(app_ctx).balance(tenant)
    data = {
        "tenant_id": str(b.tenant_id),
        "tenant": b.tenant,
        "credit_balance": b.credit_balance,
        "ledger_sum": b.ledger_sum,
        "consistent": b.consistent,
        "reserved": str(b.reserved),
        "entries": b.entries,
        "by_type": {k: str(v) for k, v in sorted(b.by_type.items())},
    }
    if as_json:
        emit_json(data)
    else:
        console = out()
        console.print(
            f"[bold]{b.tenant}[/] {b.tenant_id}: {_money(b.credit_balance)} credits "
            f"({_money(b.reserved)} held by open tasks, {b.entries} ledger entries)",
            highlight=False,
        )
        for entry_type, total in sorted(b.by_type.items()):
            console.print(f"  {entry_type:<10} {_money(total):>14}", highlight=False)
        if not b.consistent:
            console.print(f"[red]balance {b.credit_balance} differs from the ledger sum {b.ledger_sum}[/]")
    if not b.consistent:
        raise typer.Exit(int(ExitCode.FAILED))


@app.command("entries")
def entries(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", autocompletion=complete_tenant, help="Tenant id or name."),
    task: str | None = typer.Option(None, "--task", help="Only entries of this task."),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000, help="At most N entries, newest first."),
    as_json: bool = JSON,
) -> None:
    """Ledger entries, newest first."""
    with service_context(ctx) as app_ctx:
        task_id = _uuid(task, "task")
        rows = _service(app_ctx).entries(tenant, task_id, limit)
        total = _service(app_ctx).count_entries(tenant, task_id) if len(rows) == limit else len(rows)
    if as_json:
        emit_json(_plain(rows))
        if total > len(rows):
            print_count(len(rows), total, "ledger row(s)")
        return
    table = _table("created_at", "type", "amount", "vendor", "task_id", "business_key", "by", "reason")
    for r in rows:
        vendor = r["vendor_amount"]
        table.add_row(
            _time(r["created_at"]),
            r["entry_type"],
            _money(r["amount"]),
            "" if vendor is None else f"{_money(vendor)} {r['vendor_currency'] or ''}".strip(),
            str(r["task_id"] or ""),
            r["business_key"],
            r["created_by"],
            r["reason"] or "",
        )
    out().print(table)
    print_count(len(rows), total, "ledger row(s)")


@app.command("adjust")
def adjust(
    ctx: typer.Context,
    tenant: str = TENANT,
    amount: str = typer.Option(..., "--amount", help="Credits to add (+N) or take (-N)."),
    business_key: str = typer.Option(
        ...,
        "--business-key",
        help="Your reference for this correction (e.g. a ticket id). Booking the same key again is a no-op.",
    ),
    task: str | None = typer.Option(None, "--task", help="The task this correction is about."),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    as_json: bool = JSON,
) -> None:
    """Book one append-only ADJUSTMENT. A negative one that would take the balance below zero is refused (exit 4)."""
    try:
        value = Decimal(amount)
    except InvalidOperation:
        fail(f"--amount must be a number, got {amount!r}", ExitCode.USAGE)
    task_id = _uuid(task, "task")
    op = operation("ledger adjust", reason, dry_run, tenant=tenant, amount=amount, business_key=business_key, task=task)
    with service_context(ctx) as app_ctx:
        service = _service(app_ctx)
        if not dry_run:
            try:
                quote = service.quote_adjust(tenant, value, business_key, task_id)
            except (Conflict, InsufficientCredits):
                quote = None  # adjust() refuses it again, and audits the refusal
            if quote is not None and quote.outcome == "would_book":
                if not (as_json or yes):
                    _show_adjust(quote, preview=True)
                confirm(f"book {value:+} credits for {quote.tenant}?", yes)
        result = service.adjust(tenant, value, business_key, op, task_id)
    if as_json:
        emit_json(
            {
                "tenant_id": str(result.tenant_id),
                "tenant": result.tenant,
                "amount": result.amount,
                "business_key": result.business_key,
                "outcome": result.outcome,
                "dry_run": result.dry_run,
                "booked": result.outcome == "booked",
                "duplicate": result.outcome == "duplicate",
                "balance_before": result.balance_before,
                "balance_after": result.balance_after,
                "entry_id": str(result.entry_id) if result.entry_id else None,
            }
        )
    else:
        _show_adjust(result, preview=False)


def _show_adjust(r: AdjustResult, preview: bool) -> None:
    change = f"{r.tenant}: {_money(r.balance_before)} → {_money(r.balance_after)} credits ({r.amount:+})"
    if r.outcome == "duplicate":
        text = f"already booked under {r.business_key} (entry {r.entry_id}): nothing changed"
    elif preview:
        text = change
    elif r.dry_run:
        text = f"dry run: {change}; nothing booked"
    else:
        text = f"booked {change}, entry {r.entry_id}"
    out().print(text, highlight=False)


@app.command("reconcile")
def reconcile(
    ctx: typer.Context,
    invoice: Path = typer.Option(..., "--invoice", help="The provider's invoice as CSV (columns below)."),
    provider: str | None = typer.Option(
        None, "--provider", autocompletion=complete_provider, help="Only lines of this provider."
    ),
    apply: bool = typer.Option(
        False, "--apply", help="Book an ADJUSTMENT (0 credits) per duplicate and orphan, a REFUND per vendor credit."
    ),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    as_json: bool = JSON,
) -> None:
    """Check a provider invoice against our attempts: duplicates, orphans, missing charges.

    Invoice CSV: a header row, then one row per charge (any column order,
    other columns ignored):
    \b
      provider     required  provider name as configured (e.g. sim)
      job_id       required  the provider's job id
      amount       required  amount billed, a decimal
      billed_at    required  ISO-8601 time of the charge (UTC if no offset)
      currency     optional  e.g. USD: reported, never converted
      request_key  optional  the Idempotency-Key we sent; attributes a job
                             we never recorded to its attempt

    Reported:
    \b
      duplicates  the same job billed twice in the invoice, or two paid
                  jobs for one task (e.g. an ambiguous submit resubmitted
                  without lookup, both jobs billed)
      orphans     job ids we never recorded (attributed to a task by
                  request key when possible)
      missing     jobs we count as billable (attempt SUCCEEDED or task
                  charged) that the invoice omits: informational

      credits     jobs a closed task paid for that the vendor billed for
                  less (or credited with a negative line): the
                  difference in credits (the provider's
                  invoice_credits_per_unit × the invoice amount)

    --apply books one ADJUSTMENT of 0 credits per duplicate and attributable
    orphan (the tenant is not charged; the row records the incident and the
    vendor's amount), keyed adjustment:invoice:{provider}:{job_id}, and one
    REFUND per credit, keyed refund:invoice:{provider}:{job_id}: applying
    twice is a no-op.
    Exit 3 when --apply leaves findings nobody can be attributed to.
    """
    from aivedio_engine.services.invoice import parse_invoice

    try:
        raw = invoice.read_bytes()
    except OSError as exc:
        fail(f"cannot read {invoice}: {exc.strerror or exc}", ExitCode.USAGE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{invoice} is not UTF-8 text", ExitCode.USAGE)
    if (dry_run or yes or reason) and not apply:
        fail("--dry-run, --yes and --reason go with --apply (without it nothing is booked)", ExitCode.USAGE)
    op = None
    if apply:
        op = operation(
            "ledger reconcile",
            reason,
            dry_run,
            invoice=str(invoice),
            provider=provider,
            invoice_sha256=hashlib.sha256(raw).hexdigest(),
        )
    with service_context(ctx) as app_ctx:
        lines = parse_invoice(text)
        service = _service(app_ctx)
        report = service.reconcile(lines, provider=provider)
        bookable = [f for f in report.findings if f.business_key is not None]
        shown = False
        if op is not None and not dry_run and bookable and not yes:
            if not as_json:
                _show_report(report)
                shown = True
            refunds = sum(f.credits for f in bookable)
            confirm(f"book {len(bookable)} row(s) (ADJUSTMENT 0 credits; REFUND {_money(refunds)} credits)?", yes)
        if op is not None:
            report = service.reconcile(lines, provider=provider, op=op)
    if as_json:
        emit_json(_report_json(report, invoice))
    else:
        if not shown:
            _show_report(report)
        if report.applied:
            _show_applied(report)
    _exit_partial(report)


def _exit_partial(report: ReconcileReport) -> None:
    if report.applied and not report.dry_run and report.not_bookable:
        raise typer.Exit(int(ExitCode.PARTIAL))


def _report_json(report: ReconcileReport, invoice: Path) -> dict[str, Any]:
    apply = None
    if report.applied:
        apply = {
            "dry_run": report.dry_run,
            "entry_ids": report.booked_entry_ids,
            **{
                state: [f.business_key or f"line {f.line.line_no}" for f in report.findings if f.booking == state]
                for state in ("booked", "already_booked", "would_book", "not_bookable")
            },
        }
    return {
        "schema": "aivedio.ledger.reconcile.v1",
        "invoice": {
            "path": str(invoice),
            "lines": report.lines,
            "considered": report.considered,
            "providers": report.providers,
            "billed": {k: str(v) for k, v in report.billed.items()},
            "period": [p.isoformat() for p in report.period] if report.period else None,
        },
        "duplicates": [f.to_json() for f in report.of("duplicate_line", "duplicate_job")],
        "orphans": [f.to_json() for f in report.of("orphan")],
        "credits": [
            {**f.to_json(), "credits": str(f.credits), "vendor_net": str(f.vendor_amount)}
            for f in report.of("vendor_credit")
        ],
        "missing": _plain(report.missing),
        "apply": apply,
    }


def _show_report(report: ReconcileReport) -> None:
    console = out()
    billed = ", ".join(f"{_money(v)} {k}".strip() for k, v in report.billed.items()) or "nothing"
    console.print(
        f"{report.considered} of {report.lines} invoice line(s) checked ({', '.join(report.providers)}); "
        f"billed {billed}",
        highlight=False,
    )
    findings = report.of("duplicate_line", "duplicate_job", "orphan", "vendor_credit")
    if findings:
        table = _table("line", "kind", "job_id", "amount", "task_id", "booking", "note")
        for f in findings:
            table.add_row(
                str(f.line.line_no),
                f.kind,
                f.line.job_id,
                f"{_money(f.line.amount)} {f.line.currency or ''}",
                str(f.attempt.task_id) if f.attempt else "-",
                f.booking or "",
                f.note,
            )
        console.print(table)
    console.print(
        f"duplicates: {len(report.of('duplicate_line', 'duplicate_job'))}, orphans: "
        f"{len(report.of('orphan'))}, not attributable: {len(report.not_bookable)}, "
        f"missing charges: {len(report.missing)}, credits: {len(report.of('vendor_credit'))}",
        highlight=False,
    )
    for m in report.missing[:MISSING_SHOWN]:
        console.print(
            f"  missing: {m['provider']} job {m['job_id']} (task {m['task_id']}, {m['task_status']}; "
            f"attempt {m['submit_state']})",
            highlight=False,
        )
    if len(report.missing) > MISSING_SHOWN:
        console.print(f"  {MISSING_SHOWN} of {len(report.missing)} missing charges shown; --json lists all")


def _show_applied(report: ReconcileReport) -> None:
    counts = {
        s: sum(1 for f in report.findings if f.booking == s)
        for s in ("booked", "would_book", "already_booked", "not_bookable")
    }
    prefix = "dry run: would book" if report.dry_run else "booked"
    booked = counts["would_book"] if report.dry_run else counts["booked"]
    out().print(
        f"{prefix}: {booked}, already booked: {counts['already_booked']}, not attributable: {counts['not_bookable']}",
        highlight=False,
    )
