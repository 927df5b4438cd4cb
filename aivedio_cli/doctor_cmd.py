"""`aivedio doctor [--json]` (can this set-up run the engine?) and `aivedio status [--json]` (its roles section:
which engine processes run, where, since when). Exit 1 when any check fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from aivedio_cli._context import state
from aivedio_cli._render import ExitCode, emit_json, out

if TYPE_CHECKING:
    from aivedio_engine.services.doctor import DoctorReport
    from aivedio_engine.services.liveness import LivenessReport

JSON = typer.Option(False, "--json", help="Print JSON.")
_MARK = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def doctor(ctx: typer.Context, as_json: bool = JSON) -> None:
    """Check ffmpeg, fonts, the database and its schema, Redis, the broker, storage, providers, the clock and the
    engine's roles; each ok / warn / fail with one line of advice. Exit 1 on any failure."""
    _run(ctx, as_json, roles_only=False)


def status(ctx: typer.Context, as_json: bool = JSON) -> None:
    """Engine processes and their roles: alive, stale (not seen lately) or stopped, with ages and backlog.
    The roles section of `aivedio doctor`; exit 1 when a required role is missing while work waits."""
    _run(ctx, as_json, roles_only=True)


def _run(ctx: typer.Context, as_json: bool, roles_only: bool) -> None:
    from aivedio_engine.bootstrap import build_context

    app_ctx = build_context(state(ctx).settings())
    try:
        report = app_ctx.doctor.roles() if roles_only else app_ctx.doctor.run()
    finally:
        app_ctx.close()
    if as_json:
        emit_json(report.to_dict())
    else:
        _print(report, roles_only)
    if not report.ok:
        raise typer.Exit(int(ExitCode.FAILED))


def _print(report: DoctorReport, roles_only: bool) -> None:
    console = out()
    if report.liveness is not None:
        _print_processes(report.liveness)
    width = max((len(c.name) for c in report.checks), default=0)
    for c in report.checks:
        advice = f"  → {c.advice}" if c.advice and c.level != "ok" else ""
        console.print(f"{_MARK[c.level]}  {c.name.ljust(width)}  {c.detail}{advice}", highlight=False)
    failed = report.failed
    what = "roles" if roles_only else "checks"
    summary = f"failed: {', '.join(failed)}" if failed else f"all {what} ok or warnings only"
    console.print(summary, highlight=False)


def _print_processes(live: LivenessReport) -> None:
    console = out()
    if not live.processes:
        console.print("no engine process has written a heartbeat recently", highlight=False)
        return
    # one line per process, ids whole: a table would cut them at 80 columns
    for p in live.processes:
        b = p.beat
        doing = "" if b.stopped_at else "; ".join(f"{k}: {v}" for k, v in sorted((b.activity or {}).items()))
        console.print(
            f"{p.state.value:<7}  {','.join(b.roles) or '-':<32}  {b.host} pid {b.pid}  {b.kind}  v{b.version}  "
            f"started {b.started_at:%Y-%m-%d %H:%M:%S}  {'stopped' if b.stopped_at else 'seen'} {p.age_s:.0f} s ago"
            + (f"  {doing}" if doing else ""),
            highlight=False,
        )
    bl = live.backlog
    console.print(
        f"backlog: {bl.pending_outbox} pending outbox rows, {bl.queued_tasks} queued, {bl.due_tasks} due, "
        f"{bl.worker_steps} in worker steps, {bl.active_tasks} active tasks",
        highlight=False,
    )
