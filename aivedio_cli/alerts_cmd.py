"""`aivedio alerts list|ack|resolve`: the engine's own alerts for on-call."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._render import ExitCode, emit_json, out, parse_id, print_count
from aivedio_cli._services import service_context
from aivedio_engine.domain.status import ALERT_LIST_STATUSES as LIST_STATUSES

if TYPE_CHECKING:  # the services load SQLAlchemy: imported where a command runs, not when completion loads this
    from aivedio_engine.services.alert_ops import AlertChange

app = typer.Typer(help="Engine alerts: list, acknowledge, resolve.", no_args_is_help=True)

IDS = typer.Argument(..., help="Alert ids (from `aivedio alerts list`).")
JSON = typer.Option(False, "--json", help="Print JSON.")


def _complete_status(incomplete: str) -> list[str]:
    return [s for s in LIST_STATUSES if s.startswith(incomplete.lower())]


@app.command("list")
def list_alerts(
    ctx: typer.Context,
    status: str = typer.Option(
        "unresolved", "--status", autocompletion=_complete_status, help=f"One of: {', '.join(LIST_STATUSES)}."
    ),
    rule: str | None = typer.Option(None, "--rule", help="Only this rule, e.g. submit_unknown_parked."),
    severity: str | None = typer.Option(None, "--severity", help="info, warning or critical."),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000),
    as_json: bool = JSON,
) -> None:
    """Alerts, newest first (default: not yet resolved)."""
    with service_context(ctx) as app_ctx:
        alert_ops = app_ctx.alert_ops
        rows = alert_ops.list(status, rule, severity, limit)
        total = alert_ops.count(status, rule, severity) if len(rows) == limit else len(rows)
    if as_json:
        emit_json([a.to_dict() for a in rows])
        if total > len(rows):
            print_count(len(rows), total, "alert(s)")
        return
    if not rows:
        out().print(f"no {status} alerts")
        return
    console = out()
    # one line per alert rather than a table: ids stay whole (copyable into `alerts ack`) at any terminal width
    for a in rows:
        subject = f"  {a.subject_type}:{a.subject_id}" if a.subject_id else ""
        by = f"  (acknowledged by {a.acknowledged_by})" if a.acknowledged_by else ""
        console.print(
            f"{a.id}  {a.status}  {a.severity}  {a.rule}{subject}  raised "
            f"{a.raised_at.isoformat(timespec='seconds')}  {a.message}{by}",
            highlight=False,
        )
    print_count(len(rows), total, "alert(s)")


@app.command("ack")
def acknowledge(
    ctx: typer.Context,
    ids: list[str] = IDS,
    reason: str | None = REASON,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Acknowledge: someone is on it. The alert stays unresolved; repeats of its condition do not re-open it."""
    _change(ctx, "ack", ids, reason, yes, dry_run, as_json)


@app.command("resolve")
def resolve(
    ctx: typer.Context,
    ids: list[str] = IDS,
    reason: str | None = REASON,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Resolve: the condition is handled. If it still holds, the engine raises a new alert."""
    _change(ctx, "resolve", ids, reason, yes, dry_run, as_json)


def _change(
    ctx: typer.Context, verb: str, ids: list[str], reason: str | None, yes: bool, dry_run: bool, as_json: bool
) -> None:
    alert_ids = [parse_id(i, "valid alert") for i in ids]
    op = operation(f"alerts {verb}", reason, dry_run, ids=[str(i) for i in alert_ids])
    if not dry_run:
        confirm(f"{verb} {len(alert_ids)} alert(s)?", yes)
    with service_context(ctx) as app_ctx:
        service = app_ctx.alert_ops
        change = (service.acknowledge if verb == "ack" else service.resolve)(alert_ids, op)
    if as_json:
        emit_json(
            {
                "dry_run": change.dry_run,
                "changed": [str(i) for i in change.changed],
                "skipped": [{"id": str(i), "why": why} for i, why in change.skipped],
                "refused": [{"id": str(i), "why": why} for i, why in change.refused],
            }
        )
    else:
        done = {"ack": "acknowledged", "resolve": "resolved"}[verb]
        console = out()
        console.print(
            f"{'dry run: would have ' if dry_run else ''}{done} {len(change.changed)} alert(s)"
            + (f", skipped {len(change.skipped)}" if change.skipped else "")
            + (f", refused {len(change.refused)}" if change.refused else ""),
            highlight=False,
        )
        for i, why in [*change.skipped, *change.refused]:
            console.print(f"  {i}: {why}", highlight=False)
    code = _exit_code(change)
    if code is not ExitCode.OK:
        raise typer.Exit(int(code))


def _exit_code(change: AlertChange) -> ExitCode:
    """Already acknowledged/resolved is a no-op (0). Unknown ids alone → not found (5), refusals alone → refused
    (4); either beside ids that changed or were no-ops → partial (3)."""
    from aivedio_engine.services.alert_ops import NOT_FOUND

    missing = [i for i, why in change.skipped if why == NOT_FOUND]
    if not missing and not change.refused:
        return ExitCode.OK
    progressed = change.changed or len(missing) < len(change.skipped)  # changed, or already as asked
    if progressed or (missing and change.refused):
        return ExitCode.PARTIAL
    return ExitCode.NOT_FOUND if missing else ExitCode.REFUSED
