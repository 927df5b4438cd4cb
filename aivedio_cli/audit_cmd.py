"""`aivedio audit`: run the invariant checks against the live database.

Exit 0 when every check holds, 1 with the offending rows when any is violated. The checks that need the
simulator's ground truth or the object store are listed as skipped, with why, so nobody reads "0 violations" as
"everything was verified".
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_cli._services import service_context
from aivedio_engine.domain.durations import format_seconds
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.invariants import DEFAULT_GRACE_S, AuditReport, parse_vendor_jobs


def audit(
    ctx: typer.Context,
    grace: float = duration_option(
        format_seconds(DEFAULT_GRACE_S),
        "--grace",
        help="How long a live system may lag (in-flight work, sweeper interval) before a "
        "time-based check counts a row as stuck",
    ),
    limit: int = typer.Option(20, "--limit", min=1, help="Offending rows shown per check (all are counted)."),
    checks: list[str] = typer.Option([], "--check", help="Run only this check id (repeatable), e.g. --check I4.2."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    vendor_jobs: Path | None = typer.Option(
        None,
        "--vendor-jobs",
        help="The vendor's own list of jobs as CSV (provider,job_id,request_key): I3.5 then also finds jobs of "
        "our tasks that no attempt holds.",
    ),
) -> None:
    """Check the invariants I1-I10 that our own tables can answer; exit 1 with the offending rows on a violation.

    When work waits and no engine process runs the role it needs, the summary says so instead of a clean bill."""
    listed: list[tuple[str, str, str | None]] = []
    if vendor_jobs is not None:
        try:
            listed = parse_vendor_jobs(vendor_jobs.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {vendor_jobs}: {getattr(exc, 'strerror', None) or exc}", ExitCode.USAGE)
        except InvalidInput as exc:
            fail(str(exc), ExitCode.USAGE)
    with service_context(ctx) as app_ctx:
        report = app_ctx.invariants.run(grace_s=grace, limit=limit, only=checks or None, vendor_jobs=listed)
        # the invariants can all hold on a system where nothing moves: say so instead of a clean bill
        stalled = app_ctx.liveness.report().stalled()
    if as_json:
        emit_json({**_as_json(report), "stalled": stalled})
    else:
        _print(report, stalled)
    # a stall is said, not counted: it is a fact about processes, and the exit code stays the invariants' verdict
    if not report.ok:
        raise typer.Exit(int(ExitCode.FAILED))


def _as_json(report: AuditReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "checks": [
            {
                "id": r.id,
                "description": r.description,
                "status": "ok" if r.ok else "violated",
                "violations": r.violations,
                "rows": r.rows,
            }
            for r in report.results
        ],
        "skipped": [{"id": s.id, "description": s.description, "why": s.why} for s in report.skipped],
    }


def _print(report: AuditReport, stalled: list[str]) -> None:
    console = out()
    table = Table("check", "status", "violations", "invariant", title="Invariant audit")
    for r in report.results:
        status = "[green]ok[/]" if r.ok else "[bold red]VIOLATED[/]"
        table.add_row(r.id, status, str(r.violations), r.description)
    console.print(table)
    for r in report.results:
        if r.ok:
            continue
        shown = f"first {len(r.rows)} of {r.violations}" if len(r.rows) < r.violations else str(r.violations)
        rows = Table(title=f"{r.id} — {r.description} ({shown} offending rows)")
        for column in r.rows[0]:
            rows.add_column(column, overflow="fold")  # ids wrap at a narrow terminal, never cut with "…"
        for row in r.rows:
            rows.add_row(*(_cell(v) for v in row.values()))
        console.print(rows)
    if report.skipped:
        skipped = Table("check", "invariant", "why skipped", title="Not checked here")
        for s in report.skipped:
            skipped.add_row(s.id, s.description, s.why)
        console.print(skipped)
    failed = sum(1 for r in report.results if not r.ok)
    summary = "all checks hold" if failed == 0 else f"{failed} of {len(report.results)} checks violated"
    if stalled:
        # not a clean bill: work waits and no engine process will take it
        verdict = "the invariants hold" if failed == 0 else summary
        summary = f"{verdict}, but {'; '.join(stalled)}: start `aivedio serve` (`aivedio status` shows the roles)"
    console.print(f"{summary}; {len(report.skipped)} skipped", highlight=False)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return format(value, "f") if isinstance(value, Decimal) else str(value)  # 0.00000000, not 0E-8
