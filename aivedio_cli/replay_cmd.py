"""`aivedio replay dlq|orphans|outbox|observations`: show exactly what matches (count + sample), then replay it.

Every subcommand previews first; `--plan-out F` saves the previewed ids and stops, `--plan F` later replays
exactly those ids (rows that no longer qualify are skipped and reported). Replays are safe to repeat: see
`aivedio_engine/services/replay.py` for why re-publishing with the original event id cannot apply a message twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from aivedio_cli._mutate import DRY_RUN, PLAN, PLAN_OUT, REASON, YES, confirm, operation, read_plan, write_plan
from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_cli._services import service_context, warn_if_no_engine

if TYPE_CHECKING:
    from aivedio_engine.services.keep_moving import ObservationReplay
    from aivedio_engine.services.replay import Preview, ReplayResult

SCHEMA = "aivedio.replay.v1"
#: rows shown in the human table; --json always carries every selected row
SAMPLE_ROWS = 20

app = typer.Typer(
    help="Replay dead letters, orphan provider events, DEAD outbox rows and lost provider observations.",
    no_args_is_help=True,
)

ACTOR = typer.Option(None, "--actor", help="Only messages for this actor (e.g. on_generation_queued).")
ERROR_CLASS = typer.Option(
    None,
    "--error-class",
    help="Only rows whose error matches: an exception class or any part of the error text, case-insensitive.",
)
SINCE = typer.Option(None, "--since", help="Only rows since then: a duration (30m, 2h, 7d) or an ISO-8601 time.")
LIMIT = typer.Option(
    100,
    "--limit",
    min=1,
    max=10_000,
    help="Act on at most N rows, oldest first (the match count shown is still exact).",
)
JSON = typer.Option(False, "--json", help="One JSON document on stdout (schema aivedio.replay.v1).")


@app.command("dlq")
def dlq(
    ctx: typer.Context,
    actor: str | None = ACTOR,
    error_class: str | None = ERROR_CLASS,
    since: str | None = SINCE,
    limit: int = LIMIT,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    plan_out: Path | None = PLAN_OUT,
    plan: Path | None = PLAN,
    as_json: bool = JSON,
) -> None:
    """Re-publish dead letters (not yet replayed) through the outbox under their original event ids.

    Consumers dedupe on the event id: a message already processed is a no-op, any other is processed once.

    Each letter is marked replayed; if it dies again, it is listed here again.
    """
    _run(
        ctx,
        "dlq",
        {"actor": actor, "error_class": error_class, "since": since, "limit": limit},
        dry_run=dry_run,
        yes=yes,
        reason=reason,
        plan_out=plan_out,
        plan=plan,
        as_json=as_json,
    )


@app.command("orphans")
def orphans(
    ctx: typer.Context,
    provider: str | None = typer.Option(None, "--provider", help="Only events from this provider."),
    since: str | None = SINCE,
    limit: int = LIMIT,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    plan_out: Path | None = PLAN_OUT,
    plan: Path | None = PLAN,
    as_json: bool = JSON,
) -> None:
    """Attach orphan provider events to the attempt that owns their job id now, and hand them to the reducer.

    Reports which were rematched and which still match no attempt (a job nobody here created).
    """
    _run(
        ctx,
        "orphans",
        {"provider": provider, "since": since, "limit": limit},
        dry_run=dry_run,
        yes=yes,
        reason=reason,
        plan_out=plan_out,
        plan=plan,
        as_json=as_json,
    )


@app.command("outbox")
def outbox(
    ctx: typer.Context,
    actor: str | None = ACTOR,
    error_class: str | None = ERROR_CLASS,
    since: str | None = SINCE,
    limit: int = LIMIT,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    plan_out: Path | None = PLAN_OUT,
    plan: Path | None = PLAN,
    as_json: bool = JSON,
) -> None:
    """Put DEAD outbox rows (the relay could not enqueue them) back to PENDING with their attempts reset."""
    _run(
        ctx,
        "outbox",
        {"actor": actor, "error_class": error_class, "since": since, "limit": limit},
        dry_run=dry_run,
        yes=yes,
        reason=reason,
        plan_out=plan_out,
        plan=plan,
        as_json=as_json,
    )


@app.command("observations")
def observations(
    ctx: typer.Context,
    task: str | None = typer.Option(None, "--task", help="Only observations of this task (its id)."),
    limit: int = LIMIT,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    as_json: bool = JSON,
) -> None:
    """Reduce again the provider observations stored but never applied (their message was lost).

    The reducer dedupes by the observation's key, so one applied meanwhile is a no-op. The sweeper does the same
    for observations older than sweeper.observation_stuck_s; this does it now.
    """
    import uuid

    try:
        task_id = uuid.UUID(task) if task else None
    except ValueError:
        fail(f"--task: {task!r} is not a task id", ExitCode.USAGE)
    op = operation("replay observations", reason, dry_run, task=task, limit=limit)
    with service_context(ctx) as app_ctx:
        if not dry_run:
            preview = app_ctx.keep_moving.preview(task_id, limit)
            if not as_json:
                _show_observations(preview)
            if preview.items:
                confirm(f"reduce {len(preview.items)} stored observation(s) again?", yes)
        result: ObservationReplay = app_ctx.keep_moving.replay(op, task_id, limit)
        if result.done:
            warn_if_no_engine(app_ctx)
    if as_json:
        emit_json(
            {
                "schema": SCHEMA,
                "kind": "observations",
                "filters": {"task": task, "limit": limit},
                "total": result.total,
                "selected": len(result.items),
                "items": result.items,
                "result": {
                    "dry_run": result.dry_run,
                    "outcome": result.outcome,
                    "rereduced": [d.__dict__ for d in result.done],
                    "failed": [d.__dict__ for d in result.failed],
                },
            }
        )
    else:
        if dry_run:
            _show_observations(result)
        done = f"dry run: would reduce {len(result.items)}" if result.dry_run else f"rereduced: {len(result.done)}"
        out().print(f"{done}, failed: {len(result.failed)}", highlight=False)
        for d in result.done:
            out().print(f"  {d.provider_event_id} (task {d.task_id}): {d.outcome}", highlight=False)
    if result.failed:
        raise typer.Exit(int(ExitCode.PARTIAL if len(result.failed) < len(result.done) else ExitCode.FAILED))


def _show_observations(preview: ObservationReplay) -> None:
    console = out()
    head = f"{preview.total} stored observation(s) never applied match"
    if preview.total > len(preview.items):
        head += f"; selected the oldest {len(preview.items)} (--limit)"
    console.print(head, highlight=False)
    if not preview.items:
        return
    table = Table()
    for column in ("id", "task_id", "provider", "status", "received_at"):
        table.add_column(column, overflow="fold")
    for item in preview.items[:SAMPLE_ROWS]:
        table.add_row(*(_cell(c, item.get(c)) for c in ("id", "task_id", "provider", "status", "received_at")))
    console.print(table)


_NOUN = {"dlq": "dead letter(s)", "orphans": "orphan provider event(s)", "outbox": "DEAD outbox row(s)"}
_VERB = {"dlq": "replay", "orphans": "rematch", "outbox": "re-publish"}


def _run(
    ctx: typer.Context,
    kind: str,
    filters: dict[str, Any],
    *,
    dry_run: bool,
    yes: bool,
    reason: str | None,
    plan_out: Path | None,
    plan: Path | None,
    as_json: bool,
) -> None:
    from aivedio_engine.services.replay import ReplayFilter, parse_since

    command = f"replay {kind}"
    if plan is not None and plan_out is not None:
        fail("--plan and --plan-out exclude each other", ExitCode.USAGE)
    if plan is not None and any(v is not None for k, v in filters.items() if k != "limit"):
        fail("--plan replays exactly the saved set: drop the filters", ExitCode.USAGE)
    dry = dry_run or plan_out is not None
    op = operation(command, reason, dry, **filters, plan=str(plan) if plan else None)
    with service_context(ctx) as app_ctx:
        service = app_ctx.replay
        since = parse_since(filters["since"], app_ctx.clock.now()) if filters.get("since") else None
        flt = ReplayFilter(**{**filters, "since": since})
        if plan is not None:
            ids = read_plan(plan, command)
            preview = service.preview_ids(kind, ids)  # type: ignore[arg-type]
        else:
            preview = service.preview(kind, flt)  # type: ignore[arg-type]
            ids = preview.ids
        if plan_out is not None:
            write_plan(plan_out, command, ids, flt.as_args())
        if not as_json:
            _show_preview(preview, limited=plan is None and preview.total > len(ids))
        if ids and not dry:
            confirm(f"{_VERB[kind]} {len(ids)} {_NOUN[kind]}?", yes)
        result = service.replay(kind, ids, op)  # type: ignore[arg-type]
        if result.done and not result.dry_run:
            warn_if_no_engine(app_ctx)
    if as_json:
        emit_json(
            {
                "schema": SCHEMA,
                "kind": kind,
                "filters": {"plan": str(plan)} if plan else flt.as_args(),
                "total": preview.total,
                "selected": len(ids),
                "items": preview.items,
                "plan_out": str(plan_out) if plan_out else None,
                "result": result.to_json(),
            }
        )
    else:
        _show_result(result, plan_out)
    if result.failed and not result.dry_run:
        raise typer.Exit(int(ExitCode.PARTIAL if result.done else ExitCode.FAILED))


def _show_preview(preview: Preview, limited: bool) -> None:
    console = out()
    noun = _NOUN[preview.kind]
    head = f"{preview.total} {noun} match"
    if limited:
        head += f"; selected the oldest {len(preview.items)} (--limit)"
    console.print(head + " (times in UTC)" if preview.items else head, highlight=False)
    if not preview.items:
        return
    columns = {
        "dlq": ("id", "task_id", "actor", "error", "seen_count", "last_seen_at"),
        "orphans": ("id", "provider", "job_id", "status", "received_at"),
        "outbox": ("id", "event_type", "target", "publish_attempts", "last_error"),
    }[preview.kind]
    table = Table()
    for column in columns:
        # an id cut short by "…" is useless to copy: long values fold; short words stay whole
        table.add_column(column, no_wrap=column in ("seen_count", "publish_attempts", "status"), overflow="fold")
    for item in preview.items[:SAMPLE_ROWS]:
        table.add_row(*(_cell(c, item.get(c)) for c in columns))
    console.print(table)
    if len(preview.items) > SAMPLE_ROWS:
        console.print(f"… and {len(preview.items) - SAMPLE_ROWS} more (--json lists all)", highlight=False)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column.endswith("_at"):
        return str(value)[:19].replace("T", " ")  # to the second, UTC: the table must fit a terminal
    return str(value)


def _show_result(result: ReplayResult, plan_out: Path | None) -> None:
    from aivedio_engine.services.replay import DONE_KEY

    console = out()
    verb = _VERB[result.kind]
    if plan_out is not None:
        console.print(
            f"plan saved to {plan_out}: {len(result.done) + len(result.failed) + len(result.still_orphan)}"
            f" row(s); apply it with --plan {plan_out}",
            highlight=False,
        )
    done = len(result.done)
    line = f"dry run: would {verb} {done}" if result.dry_run else f"{DONE_KEY[result.kind]}: {done}"
    if result.kind == "orphans":
        line += f", still orphan: {len(result.still_orphan)}"
    line += f", skipped: {len(result.skipped)}, failed: {len(result.failed)}"
    console.print(line, highlight=False)
    for item in result.skipped:
        console.print(f"  skipped {item['id']}: {item['reason']}", highlight=False)
    for item in result.failed:
        console.print(f"  failed  {item['id']}: {item['reason']}", highlight=False)


# `aivedio replay webhooks` lives with the other webhook commands; registered here, where the group is built
from aivedio_cli.webhooks_cmd import replay_webhooks  # noqa: E402

app.command("webhooks")(replay_webhooks)
