"""`aivedio tasks list|show|tail|cancel`: what on-call looks at first.

JSON (`--json`; JSON lines for `tail`) is the stable contract; tables and lines for people may change.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import typer

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._params import complete_provider, complete_task_status, complete_tenant, duration_option
from aivedio_cli._render import ExitCode, emit_json, out, parse_id, print_count
from aivedio_cli._services import service_context, warn_if_no_engine

if TYPE_CHECKING:  # the services load SQLAlchemy: imported where a command runs, not when completion loads this
    from rich.console import Console
    from rich.table import Table


app = typer.Typer(help="Generation tasks: list, show a timeline, follow state changes, cancel.", no_args_is_help=True)

PIPED_WIDTH = 250
JSON = typer.Option(False, "--json", help="Machine-readable output (the stable contract).")


def jsonable(value: Any) -> Any:
    from aivedio_engine.services.task_ops import jsonable as to_jsonable

    return to_jsonable(value)


def id_table(id_column: str, *columns: str) -> Table:
    """A table whose first column holds ids: never wrapped, so they can be copied from a narrow terminal."""
    from rich.table import Table

    table = Table()
    table.add_column(id_column, no_wrap=True, min_width=36)
    for column in columns:
        table.add_column(column, overflow="fold")  # the others wrap at a narrow terminal; nothing is cut with "…"
    return table


def wide(console: Console) -> Console:
    """The console itself at a terminal; piped, one that lets tables take their natural width (Rich would cut
    them to 80 columns of ellipses, ids included)."""
    from rich.console import Console

    return console if console.is_terminal else Console(file=console.file, width=PIPED_WIDTH)


def print_table(table: Table) -> None:
    wide(out()).print(table)


@app.command("list")
def list_tasks(
    ctx: typer.Context,
    status: str | None = typer.Option(
        None, "--status", autocompletion=complete_task_status, help="Only tasks in this status, e.g. SUBMIT_UNKNOWN."
    ),
    tenant: str | None = typer.Option(None, "--tenant", autocompletion=complete_tenant, help="Tenant id or name."),
    provider: str | None = typer.Option(
        None, "--provider", autocompletion=complete_provider, help="Only tasks sent to this provider."
    ),
    older_than: float | None = duration_option(
        None,
        "--older-than",
        help="Only tasks not updated for at least this long: compares updated_at, so it finds stuck tasks",
    ),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000, help="At most this many, most recently updated first."),
    as_json: bool = JSON,
) -> None:
    """List tasks of every tenant, most recently updated first."""
    age = timedelta(seconds=older_than) if older_than is not None else None
    with service_context(ctx) as app_ctx:
        task_ops = app_ctx.task_ops
        rows = task_ops.list(status=status, tenant=tenant, provider=provider, older_than=age, limit=limit)
        total = len(rows)
        if total == limit:  # only a full page can have been cut by the limit
            total = task_ops.count(status=status, tenant=tenant, provider=provider, older_than=age)
    if as_json:
        emit_json({"schema": "aivedio.tasks.v1", "count": len(rows), "total": total, "tasks": jsonable(rows)})
        return
    table = id_table("task_id", "status", "tenant", "provider/model", "try", "updated_at", "note")
    for r in rows:
        note = r.parked_reason and f"parked: {r.parked_reason}" or r.last_error_class or ""
        table.add_row(
            str(r.task_id),
            r.status,
            r.tenant,
            f"{r.provider or '-'}/{r.model}",
            str(r.attempts),
            r.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
            note[:60],
        )
    print_table(table)
    print_count(len(rows), total, "task(s)")


@app.command("show")
def show(ctx: typer.Context, task_id: str = typer.Argument(..., help="Task id."), as_json: bool = JSON) -> None:
    """Show one task's timeline, merged by time.

    State events (with outcome and source), attempts, provider events, ledger rows, assets, review items,
    alerts about the task and its outbox rows.
    """
    tid = parse_id(task_id, "task")
    with service_context(ctx) as app_ctx:
        timeline = app_ctx.task_ops.timeline(tid)
    if as_json:
        emit_json({"schema": "aivedio.task.v1", "task": jsonable(timeline.task), "timeline": jsonable(timeline.items)})
        return
    t = timeline.task
    console = out()
    console.print(
        f"[bold]{t['task_id']}[/]  {t['status']} v{t['version']}  tenant {t['tenant_id']}  "
        f"{t['selected_provider'] or '-'}/{t['requested_model']}  attempts {t['current_attempt_no']}",
        highlight=False,
    )
    for key in ("parked_reason", "last_error_class", "cancel_outcome", "review_state"):
        if t[key]:
            console.print(f"  {key}: {t[key]}", highlight=False)
    from rich.table import Table

    table = Table("at", "kind")
    table.add_column("what", overflow="fold")  # wrapped, never cut: request keys and job ids are copied from here
    for item in timeline.items:
        table.add_row(item["at"].strftime("%m-%d %H:%M:%S.%f")[:-3], item["kind"], _summary(item))
    print_table(table)


def _summary(i: dict[str, Any]) -> str:
    k = i["kind"]
    if k == "state_event":
        move = f"{i['from_status'] or '∅'} → {i['to_status']}" if i["to_status"] else "(no change)"
        return f"{move}  {i['event_type']}  [{i['source']}, {i['outcome']}]"
    if k == "attempt":
        # the request key is what the vendor console is searched by when a submit's answer was lost
        last = i["last_lookup_at"]
        lookups = f"  lookups={i['lookup_count']} (last {last:%H:%M:%S})" if i["lookup_count"] and last else ""
        return (
            f"#{i['attempt_no']} {i['provider']} {i['submit_state']} job={i['provider_job_id'] or '-'}"
            f"  key={i['provider_request_key']}{lookups}"
            + ("  resubmitted after unknown" if i["resubmitted_after_unknown"] else "")
        )
    if k == "provider_event":
        match = "orphan" if i["orphan"] else "matched" if i["matched"] else "unmatched"
        return f"{i['source']} {i['status'] or '?'} job={i['provider_job_id'] or '-'} ({match})"
    if k == "ledger":
        return f"{i['entry_type']} {i['amount']:f} {i['unit']}  {i['business_key']}"
    if k == "asset":
        size = f"{i['size_bytes']} B" if i["size_bytes"] is not None else "-"
        return f"{i['asset_kind']}{'/' + i['profile'] if i['profile'] else ''} {i['status']} {size}"
    if k == "review":
        decided = f" → {i['decision']} by {i['decided_by']}" if i["decision"] else ""
        return f"review {i['state']}: {i['reason']}{decided}"
    if k == "alert":
        return f"{i['severity']} {i['rule']} ({i['status']}): {i['message']}"
    error = f" error: {i['last_error']}" if i["last_error"] else ""
    return f"{i['event_type']} → {i['target']} {i['status']}{error}"


@app.command("tail")
def tail(
    ctx: typer.Context,
    status: str | None = typer.Option(
        None, "--status", autocompletion=complete_task_status, help="Only events that move a task into this status."
    ),
    after: str | None = typer.Option(
        None, "--after", metavar="CURSOR", help="Start after this cursor (printed with each event), not at the end."
    ),
    last: int = typer.Option(10, "--last", min=0, help="Without --after: start with the newest N events."),
    interval: float = duration_option("2s", "--interval", min=0.1, help="Time between database polls"),
    once: bool = typer.Option(False, "--once", help="Print what is new, then exit (scripts and tests)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """Follow task state changes as they are recorded (polls the database). Ctrl-C stops."""
    start = parse_id(after, "cursor") if after else None
    interrupted = False
    with service_context(ctx) as app_ctx:
        follower = app_ctx.task_ops.tail(after=start, status=status, last=last)
        try:
            while True:
                for event in follower.poll():
                    _print_event(event, as_json)
                sys.stdout.flush()
                if once:
                    break
                time.sleep(interval)  # the polling cadence, not a synchronisation
        except KeyboardInterrupt:
            interrupted = True
    if follower.cursor is not None:
        print(f"cursor: {follower.cursor} (resume with --after)", file=sys.stderr)
    if interrupted:  # Ctrl-C is how a tail ends, but scripts still learn it did not end by itself
        raise typer.Exit(int(ExitCode.INTERRUPTED))


def _print_event(e: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(jsonable(e), sort_keys=True) + "\n")
        return
    move = f"{e['from_status'] or '∅'} → {e['to_status']}" if e["to_status"] else "(no change)"
    print(f"{e['at'].isoformat()}  {e['task_id']}  {move}  {e['event_type']}  [{e['source']}, {e['outcome']}]")


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., help="Task id (any tenant)."),
    reason: str | None = REASON,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Cancel a task of any tenant, as an operator (audited).

    Same rules as a client's cancel: before a provider job → CANCELED and the credits released; with a job →
    CANCEL_REQUESTED and the provider is asked to stop it.
    """
    tid = parse_id(task_id, "task")
    op = operation("tasks cancel", reason, dry_run, task_id=str(tid))
    with service_context(ctx) as app_ctx:
        task_ops = app_ctx.task_ops
        if not dry_run:
            plan = task_ops.cancel_preview(tid)
            if plan.outcome != "already":
                confirm(f"Cancel task {tid} ({plan.from_status} → {plan.to_status})?", yes)
        result = task_ops.cancel(tid, op)
        if result.outcome == "cancel_requested":
            warn_if_no_engine(app_ctx)
    if as_json:
        emit_json(jsonable(result))
        return
    said = {
        "canceled": "canceled",
        "cancel_requested": "cancel requested (the provider is asked to stop the job)",
        "already": f"already {result.to_status}; nothing changed",
        "would_cancel": "dry run: would cancel now",
        "would_request_cancel": "dry run: would request a cancel",
    }
    released = f"; {result.released} credits released" if result.released else ""
    out().print(f"{tid}: {result.from_status} → {result.to_status}: {said[result.outcome]}{released}", highlight=False)
