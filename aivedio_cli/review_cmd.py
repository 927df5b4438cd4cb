"""`aivedio review list|claim|approve|reject`: the manual review queue from the command line."""

from __future__ import annotations

from typing import Any

import typer

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id, print_count
from aivedio_cli._services import service_context
from aivedio_engine.domain.durations import format_seconds
from aivedio_engine.services.operations import Operation, current_operator
from aivedio_engine.services.review import DEFAULT_TTL_S, LIST_STATES, Decided

app = typer.Typer(help="Manual review queue: list, claim, approve, reject.", no_args_is_help=True)

ITEM = typer.Argument(..., help="Review item id (or the id of a task with an open review item).")
AS = typer.Option(None, "--as", help="Reviewer name (default: $AIVEDIO_OPERATOR, else user@host).")
JSON = typer.Option(False, "--json", help="Print JSON.")


@app.command("list")
def list_items(
    ctx: typer.Context,
    state: str | None = typer.Option(None, "--state", help=f"One of: {', '.join(LIST_STATES)}. Default: all."),
    limit: int = typer.Option(200, "--limit", min=1, max=10_000, help="At most this many, oldest first."),
    as_json: bool = JSON,
) -> None:
    """The queue, oldest first. An expired claim shows as pending: anyone may take it over."""
    if state is not None and state not in LIST_STATES:
        fail(f"--state must be one of {', '.join(LIST_STATES)}, got {state!r}", ExitCode.USAGE)
    with service_context(ctx) as app_ctx:
        service = app_ctx.review
        items = service.list(state, limit)
        total = service.count(state) if len(items) == limit else len(items)
    if as_json:
        emit_json([i.to_dict() for i in items])
        if total > len(items):
            print_count(len(items), total, "review item(s)")
        return
    console = out()
    if not items:
        console.print("no review items" + (f" in state {state}" if state else ""))
    # one line per item rather than a table: ids stay whole (copyable, greppable) at any terminal width
    for i in items:
        holder = ""
        if i.state == "claimed":
            until = i.claimed_until.isoformat(timespec="seconds") if i.claimed_until else "?"
            holder = f" by {i.claimed_by} until {until}"
        elif i.decided_by:
            holder = f" by {i.decided_by}"
        console.print(f"{i.id}  {i.state}{holder}  {i.subject} ({i.task_status})  {i.reason}", highlight=False)
    if items:
        print_count(len(items), total, "review item(s)")


@app.command("claim")
def claim(
    ctx: typer.Context,
    item: str = ITEM,
    as_: str | None = AS,
    ttl: float = duration_option(
        format_seconds(DEFAULT_TTL_S), "--ttl", help="How long the claim holds; after that others may take it"
    ),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Claim an item so no other reviewer decides it; claiming your own item again extends the claim."""
    ref = parse_id(item, "review item or task")
    reviewer = as_ or current_operator()
    op = Operation(
        command="review claim", reason=None, dry_run=dry_run, args={"item": item, "reviewer": reviewer, "ttl_s": ttl}
    )
    with service_context(ctx) as app_ctx:
        view = app_ctx.review.claim(ref, reviewer, op, ttl)
    if as_json:
        emit_json({"dry_run": dry_run, "item": view.to_dict()})
        return
    until = view.claimed_until.isoformat(timespec="seconds") if view.claimed_until else "?"
    prefix = "dry run: would claim" if dry_run else "claimed"
    out().print(f"{prefix} review item {view.id} ({view.subject}) for {reviewer} until {until}", highlight=False)


@app.command("approve")
def approve(
    ctx: typer.Context,
    item: str = ITEM,
    reason: str | None = REASON,
    as_: str | None = AS,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Approve the held output: the task SUCCEEDS and its credits are settled."""
    _decide(ctx, "approve", item, reason, as_, yes, dry_run, as_json)


@app.command("reject")
def reject(
    ctx: typer.Context,
    item: str = ITEM,
    reason: str | None = REASON,
    as_: str | None = AS,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Reject the held output: the task FAILS (FAILED_FINAL); the provider's cost is still settled."""
    _decide(ctx, "reject", item, reason, as_, yes, dry_run, as_json)


def _decide(
    ctx: typer.Context,
    verb: str,
    item: str,
    reason: str | None,
    as_: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    ref = parse_id(item, "review item or task")
    reviewer = as_ or current_operator()
    op = operation(f"review {verb}", reason, dry_run, item=item, reviewer=reviewer)
    if not dry_run:
        confirm(f"{verb} review item {item} as {reviewer}?", yes)
    with service_context(ctx) as app_ctx:
        service = app_ctx.review
        result = (service.approve if verb == "approve" else service.reject)(ref, reviewer, op)
    if as_json:
        emit_json(_decided_json(result))
        return
    settled = "nothing was reserved" if result.settled is None else f"settled at {result.settled} credits"
    prefix = f"dry run: would {verb}" if dry_run else {"approve": "approved", "reject": "rejected"}[verb]
    out().print(
        f"{prefix} review item {result.item.id}: {result.item.subject} → {result.task_status}, {settled}",
        highlight=False,
    )


def _decided_json(result: Decided) -> dict[str, Any]:
    return {
        "dry_run": result.dry_run,
        "item": result.item.to_dict(),
        "task_status": result.task_status,
        "settled": None if result.settled is None else str(result.settled),
    }
