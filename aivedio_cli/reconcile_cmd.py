"""`aivedio reconcile`: resolve SUBMIT_UNKNOWN tasks now.

Preview, confirm, act on exactly the previewed set: `--dry-run` lists the candidates without calling any
provider, `--plan-out F` saves that exact set, `--plan F` applies it later, whatever the filters would match then.
`--task T --job-id J` and `--task T --not-created` settle one submit on the operator's word instead of a lookup.
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
    from aivedio_engine.services.reconcile_ops import Candidate, Outcome, Settlement

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
    job_id: str | None = typer.Option(
        None,
        "--job-id",
        metavar="JOB",
        help="Bind this job (found in the vendor's console) to the task's ambiguous submit. Needs --task.",
    ),
    not_created: bool = typer.Option(
        False,
        "--not-created",
        help="Declare the vendor never created the task's job: a new attempt, or a release. Needs --task.",
    ),
) -> None:
    """Resolve SUBMIT_UNKNOWN tasks now: look each one up at its provider.

    Instead of waiting for the next scheduled lookup. Reports per task: found (job bound), not created (new
    attempt scheduled), or still unknown (next lookup scheduled, or parked with an alert). Parked tasks are
    included. A "not found" is only believed 60 s after the send.

    When the engine cannot decide, settle one task by hand: `--task ID --job-id JOB` binds the job found in the
    vendor's console (the provider is asked for it; a job another attempt holds, or that the vendor made for
    another request, is refused); `--task ID --not-created` closes the attempt as never created, refused until
    the send can no longer be in flight plus `reconcile.visibility_lag_s`.
    """
    if job_id is not None or not_created:
        _settle(
            ctx,
            task,
            job_id,
            not_created,
            refused={"--plan": plan, "--plan-out": plan_out, "--provider": provider, "--older-than": older_than},
            dry_run=dry_run,
            yes=yes,
            reason=reason,
            as_json=as_json,
        )
        return
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


def _settle(
    ctx: typer.Context,
    task: str | None,
    job_id: str | None,
    not_created: bool,
    *,
    refused: dict[str, Any],
    dry_run: bool,
    yes: bool,
    reason: str | None,
    as_json: bool,
) -> None:
    """One task settled on the operator's word: `job_id` is the job to bind, None the vendor never created it."""
    flag = "--not-created" if job_id is None else "--job-id"
    if job_id is not None and not_created:
        fail("--job-id and --not-created are two different answers: give one", ExitCode.USAGE)
    given = [name for name, value in refused.items() if value is not None]
    if given:
        fail(f"{flag} settles one named task: it cannot be combined with {', '.join(given)}", ExitCode.USAGE)
    if task is None:
        fail(f"{flag} settles one task: name it with --task ID", ExitCode.USAGE)
    task_id = parse_id(task, "task")
    from aivedio_engine.services.reconcile_ops import COMMAND

    op = operation(COMMAND, reason, dry_run, task=task, job_id=job_id, not_created=job_id is None)
    with service_context(ctx) as app_ctx:
        ops = app_ctx.reconcile_ops
        plan = ops.check_not_created(task_id) if job_id is None else ops.check_bind(task_id, job_id)
        if dry_run:
            ops.preview(op, [plan])
            _render_settlement(plan, as_json)
            return
        Console(file=sys.stderr, soft_wrap=True).print(_settlement_text(plan), highlight=False)
        confirm("Settle this submit now?", yes)
        outcome = ops.not_created(op, task_id) if job_id is None else ops.bind(op, task_id, job_id)
        if outcome.result in ("found", "not_created"):
            warn_if_no_engine(app_ctx)
    _render_outcomes([outcome], as_json)


def _settlement_text(plan: Settlement) -> str:
    parked = ", parked" if plan.parked else ""
    who = f"task {plan.task_id} ({plan.task_status}{parked}; attempt {plan.attempt_id} at {plan.provider})"
    if plan.settle == "bind_job":
        return f"{who}: bind job {plan.provider_job_id}, {plan.job_status} at {plan.provider}; the task goes on from it"
    return (
        f"{who}: close the attempt as never created (FAILED_BEFORE_ACCEPT); a new attempt follows, or the "
        "credits are released, as after a lookup that found nothing"
    )


def _render_settlement(plan: Settlement, as_json: bool) -> None:
    from aivedio_engine.services.task_ops import jsonable

    if as_json:
        emit_json({"schema": SCHEMA, "dry_run": True, "count": 1, "tasks": [jsonable(plan)]})
        return
    out().print(f"dry run: {_settlement_text(plan)}; nothing changed", highlight=False)


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
