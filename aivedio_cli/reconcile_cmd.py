"""`aivedio reconcile`: resolve SUBMIT_UNKNOWN tasks now (DESIGN §8, §13).

Preview, confirm, act on exactly the previewed set: `--dry-run` lists the candidates without calling any
provider, `--plan-out F` saves that exact set, `--plan F` applies it later, whatever the filters would match then.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from aivedio_cli._mutate import DRY_RUN, PLAN, PLAN_OUT, REASON, YES, confirm, operation, read_plan, write_plan
from aivedio_cli._params import complete_provider, duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id
from aivedio_cli._services import service_context, warn_if_no_engine
from aivedio_cli.tasks_cmd import id_table, print_table, wide
from aivedio_engine.domain.durations import format_seconds

if TYPE_CHECKING:  # the services load SQLAlchemy: imported where the command runs, not when completion loads this
    from aivedio_engine.services.reconcile_ops import Candidate, Outcome

SCHEMA = "aivedio.reconcile.v1"
RESULTS = ("found", "not_created", "still_unknown", "skipped", "error")
SAMPLE = 10


def reconcile(
    ctx: typer.Context,
    task: str | None = typer.Option(None, "--task", metavar="ID", help="Only this task."),
    provider: str | None = typer.Option(
        None, "--provider", autocompletion=complete_provider, help="Only ambiguous submits to this provider."
    ),
    older_than: float | None = duration_option(None, "--older-than", help="Only submits sent at least this long ago"),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="At most this many tasks, oldest send first."),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    plan_out: Path | None = PLAN_OUT,
    plan: Path | None = PLAN,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (the stable contract)."),
) -> None:
    """Resolve SUBMIT_UNKNOWN tasks now: look each one up at its provider.

    Instead of waiting for the next scheduled lookup. Reports per task: found (job bound), not created (new
    attempt scheduled), or still unknown (next lookup scheduled, or parked with an alert). Parked tasks are
    included. A "not found" is only believed 60 s after the send.
    """
    if plan is not None and plan_out is not None:
        fail("--plan and --plan-out cannot be combined", ExitCode.USAGE)
    if plan is not None and (task or provider or older_than is not None):
        fail(
            "--plan applies exactly the saved set: do not combine it with --task, --provider or --older-than",
            ExitCode.USAGE,
        )
    task_id = parse_id(task, "task") if task else None
    age = timedelta(seconds=older_than) if older_than is not None else None
    preview_only = dry_run or plan_out is not None
    since_text = format_seconds(older_than) if older_than is not None else None  # as typed, near enough: "10m"
    filters = {"task": task, "provider": provider, "older_than": since_text, "limit": limit}
    from aivedio_engine.services.reconcile_ops import COMMAND

    op = operation(COMMAND, reason, preview_only, **filters, plan=str(plan) if plan else None)
    planned = _plan_ids(plan) if plan is not None else None
    with service_context(ctx) as app_ctx:
        ops = app_ctx.reconcile_ops
        found = ops.candidates(task_id=task_id, provider=provider, older_than=age, limit=limit, among=planned)
        if preview_only:
            ops.preview(op, found)
            if plan_out is not None:
                write_plan(plan_out, COMMAND, [str(c.task_id) for c in found], filters)
            _render_preview(found, as_json, plan_out)
            return
        if found:
            preview = Console(file=sys.stderr, soft_wrap=True)
            preview.print(f"{len(found)} task(s) to reconcile:")
            _preview_table(found, preview)
            _no_lookup_note(preview, {c.provider for c in found if not c.provider_can_look_up})
            confirm(f"Reconcile {len(found)} task(s) now? Each one is looked up at its provider", yes)
        outcomes = ops.run(op, planned if planned is not None else [c.task_id for c in found])
        if any(o.result in ("found", "not_created") for o in outcomes):
            warn_if_no_engine(app_ctx)
    _render_outcomes(outcomes, as_json)
    errors = sum(1 for o in outcomes if o.result == "error")
    if errors:
        raise typer.Exit(int(ExitCode.FAILED if errors == len(outcomes) else ExitCode.PARTIAL))


def _plan_ids(path: Path) -> list[uuid.UUID]:
    from aivedio_engine.services.reconcile_ops import COMMAND

    return [parse_id(i, "task (in the plan)") for i in read_plan(path, COMMAND)]


def _render_preview(found: list[Candidate], as_json: bool, plan_out: Path | None) -> None:
    from aivedio_engine.services.task_ops import jsonable

    if as_json:
        emit_json(
            {
                "schema": SCHEMA,
                "dry_run": True,
                "count": len(found),
                "tasks": jsonable(found),
                "plan": str(plan_out) if plan_out else None,
            }
        )
        return
    console = out()
    if not found:
        console.print("nothing to reconcile: no task has an ambiguous submit matching these filters")
        return
    _preview_table(found, console, sample=None)
    console.print(
        f"dry run: {len(found)} task(s) would be looked up; nothing changed"
        + (f"; plan saved to {plan_out}" if plan_out else ""),
        highlight=False,
    )
    _no_lookup_note(console, {c.provider for c in found if not c.provider_can_look_up})


def _preview_table(found: list[Candidate], console: Console, sample: int | None = SAMPLE) -> None:
    shown = found if sample is None else found[:sample]
    table = id_table("task_id", "provider", "status", "sent_at", "lookups", "parked")
    for c in shown:
        table.add_row(
            str(c.task_id),
            c.provider,
            c.task_status,
            c.sent_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(c.lookup_count),
            "yes" if c.parked else "",
        )
    wide(console).print(table)
    if len(found) > len(shown):
        console.print(f"... and {len(found) - len(shown)} more ({len(found)} in all)")


def _render_outcomes(outcomes: list[Outcome], as_json: bool) -> None:
    from aivedio_engine.services.task_ops import jsonable

    counts = Counter(o.result for o in outcomes)
    summary = {r: counts.get(r, 0) for r in RESULTS}
    if as_json:
        emit_json(
            {
                "schema": SCHEMA,
                "dry_run": False,
                "count": len(outcomes),
                "summary": summary,
                "tasks": jsonable(outcomes),
            }
        )
        return
    console = out()
    if not outcomes:
        console.print("nothing to reconcile: no task has an ambiguous submit matching these filters")
        return
    table = id_table("task_id", "provider", "result", "action", "details")
    for o in outcomes:
        table.add_row(str(o.task_id), o.provider or "-", o.result, o.action, _details(o))
    print_table(table)
    console.print("  ".join(f"{k}={v}" for k, v in summary.items() if v), highlight=False)
    blind = {o.provider for o in outcomes if o.provider and o.provider_can_look_up is False}
    _no_lookup_note(console, blind)


def _no_lookup_note(console: Console, providers: set[str]) -> None:
    """Without a lookup by request key a reconcile rarely decides anything: say so, and where to look instead."""
    for name in sorted(providers):
        console.print(
            f"note: {name} cannot look jobs up by request key: a lookup can only list its jobs and match the "
            "request, so a task may stay unknown until it is parked; search the vendor console for the attempt's "
            "request key (aivedio tasks show ID)",
            highlight=False,
        )


def _details(o: Outcome) -> str:
    parts: list[Any] = []
    if o.action == "bound_job":
        parts.append(f"job {o.provider_job_id}")
    if o.action == "next_lookup_scheduled" and o.next_action_at:
        parts.append(f"next lookup {o.next_action_at:%H:%M:%S}")
    if o.alerts:
        parts.append("alerts: " + ", ".join(o.alerts))
    parts.append(f"({o.detail}; task {o.task_status})")
    return " ".join(str(p) for p in parts)
