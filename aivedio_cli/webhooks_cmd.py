"""`aivedio webhooks add|list|remove|rotate|deliveries` and `aivedio replay webhooks`: a tenant's signed client
webhooks (Standard Webhooks) and their delivery log. The same endpoints are under `/v1/webhook-endpoints`."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from aivedio_cli._mutate import DRY_RUN, PLAN, PLAN_OUT, REASON, YES, confirm, operation, read_plan, write_plan
from aivedio_cli._params import complete_tenant, complete_webhook_state
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id
from aivedio_cli._services import service_context

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.webhooks import EndpointView

app = typer.Typer(help="Signed webhooks to a tenant's endpoints, and their delivery log.", no_args_is_help=True)

JSON = typer.Option(False, "--json", help="One JSON document on stdout.")
TENANT = typer.Option(None, "--tenant", autocompletion=complete_tenant, help="Tenant id or name.")


def _tenant(app_ctx: AppContext, ref: str | None) -> uuid.UUID | None:
    return None if ref is None else app_ctx.webhooks.tenant_id(ref)


@app.command("add")
def add(
    ctx: typer.Context,
    tenant: str = typer.Option(..., "--tenant", autocompletion=complete_tenant, help="Tenant id or name."),
    url: str = typer.Option(..., "--url", help="Where to POST the signed messages (http or https)."),
    events: list[str] = typer.Option(
        [],
        "--events",
        help="Task statuses to send (repeat or comma-separate, e.g. SUCCEEDED,FAILED_FINAL); default all.",
    ),
    reason: str | None = typer.Option(None, "--reason", help="Why (stored in the audit log)."),
    as_json: bool = typer.Option(False, "--json", help='Print {"id", "secret"} only.'),
) -> None:
    """Register an endpoint. Its `whsec_` secret is printed once: store it where the receiver can verify with it."""
    from aivedio_engine.services.operations import Operation

    op = Operation("webhooks add", reason, args={"tenant": tenant, "url": _redact(url), "events": events})
    with service_context(ctx) as app_ctx:
        created = app_ctx.webhooks.add(app_ctx.webhooks.tenant_id(tenant), url, events, op)
    if as_json:
        emit_json({"id": str(created.endpoint.id), "secret": created.secret})
        return
    console = out()
    console.print(f"endpoint {created.endpoint.id}  {created.endpoint.url}  events: {_events(created.endpoint)}")
    console.print(f"secret (shown once): {created.secret}", highlight=False)


@app.command("list")
def list_endpoints(ctx: typer.Context, tenant: str | None = TENANT, as_json: bool = JSON) -> None:
    """Live endpoints (of one tenant, or of all). Secrets are never shown again."""
    with service_context(ctx) as app_ctx:
        views = app_ctx.webhooks.list_endpoints(_tenant(app_ctx, tenant))
    if as_json:
        emit_json({"data": [v.to_json() for v in views]})
        return
    if not views:
        out().print("no webhook endpoints")
        return
    table = Table()
    for column in ("id", "tenant", "url", "events", "old secret signs until"):
        table.add_column(column, overflow="fold")
    for v in views:
        until = v.previous_secret_until.isoformat()[:19] if v.previous_secret_until else ""
        table.add_row(str(v.id), str(v.tenant_id), v.url, _events(v), until)
    out().print(table)


@app.command("remove")
def remove(
    ctx: typer.Context,
    endpoint_id: str = typer.Argument(..., help="Endpoint id."),
    tenant: str | None = TENANT,
    yes: bool = YES,
    reason: str | None = typer.Option(None, "--reason", help="Why (stored in the audit log)."),
    as_json: bool = JSON,
) -> None:
    """Stop sending to an endpoint; its undelivered messages become DEAD (the log keeps them)."""
    from aivedio_engine.services.operations import Operation

    eid = parse_id(endpoint_id, "webhook endpoint")
    op = Operation("webhooks remove", reason, args={"endpoint": endpoint_id, "tenant": tenant})
    with service_context(ctx) as app_ctx:
        owner = _tenant(app_ctx, tenant)
        view = app_ctx.webhooks.get(owner, eid)
        confirm(f"remove webhook endpoint {view.id} ({view.url})?", yes)
        app_ctx.webhooks.remove(owner, eid, op)
    if as_json:
        emit_json({"id": str(eid), "removed": True})
    else:
        out().print(f"removed {eid}", highlight=False)


@app.command("rotate")
def rotate(
    ctx: typer.Context,
    endpoint_id: str = typer.Argument(..., help="Endpoint id."),
    tenant: str | None = TENANT,
    reason: str | None = typer.Option(None, "--reason", help="Why (stored in the audit log)."),
    as_json: bool = typer.Option(False, "--json", help='Print {"id", "secret", "previous_secret_until"}.'),
) -> None:
    """Give an endpoint a new secret, printed once. The old one keeps signing (a second signature) for
    `client_webhooks.rotation_grace_s`, so the receiver can switch without losing a message."""
    from aivedio_engine.services.operations import Operation

    eid = parse_id(endpoint_id, "webhook endpoint")
    op = Operation("webhooks rotate", reason, args={"endpoint": endpoint_id, "tenant": tenant})
    with service_context(ctx) as app_ctx:
        rotated = app_ctx.webhooks.rotate(_tenant(app_ctx, tenant), eid, op)
    until = rotated.endpoint.previous_secret_until
    if as_json:
        emit_json({"id": str(eid), "secret": rotated.secret, "previous_secret_until": until and until.isoformat()})
        return
    console = out()
    console.print(f"new secret (shown once): {rotated.secret}", highlight=False)
    console.print(f"the old secret also signs until {until.isoformat() if until else 'now (no grace period)'}")


@app.command("deliveries")
def deliveries(
    ctx: typer.Context,
    endpoint: str | None = typer.Option(None, "--endpoint", help="Only this endpoint's deliveries."),
    state: list[str] = typer.Option(
        [], "--state", autocompletion=complete_webhook_state, help="PENDING, DELIVERED, FAILED or DEAD (repeatable)."
    ),
    tenant: str | None = TENANT,
    task: str | None = typer.Option(None, "--task", help="Only deliveries about this task."),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000, help="At most N rows, newest first."),
    as_json: bool = JSON,
) -> None:
    """The delivery log: one row per endpoint × status change, with attempts, the next attempt and the last
    answer or error."""
    from aivedio_engine.services.webhooks import delivery_json

    endpoint_id = parse_id(endpoint, "webhook endpoint") if endpoint else None
    task_id = parse_id(task, "task") if task else None
    with service_context(ctx) as app_ctx:
        rows = app_ctx.webhooks.deliveries(
            tenant_id=_tenant(app_ctx, tenant), endpoint_id=endpoint_id, states=state, task_id=task_id, limit=limit
        )
    items = [delivery_json(d) for d in rows]
    if as_json:
        emit_json({"data": items})
        return
    _table(items, ("id", "task_id", "status", "state", "attempts", "last_status_code", "last_error"))


def _table(items: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    console = out()
    if not items:
        console.print("no deliveries match")
        return
    table = Table()
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column in ("state", "attempts", "last_status_code"))
    for item in items:
        table.add_row(*("" if item.get(c) is None else str(item[c]) for c in columns))
    console.print(table)


def _redact(url: str) -> str:
    from aivedio_engine.fetch.policy import redact

    return redact(url)


def _events(view: EndpointView) -> str:
    return ",".join(view.events) or "*"


def replay_webhooks(
    ctx: typer.Context,
    endpoint: str | None = typer.Option(None, "--endpoint", help="Only this endpoint's deliveries."),
    state: list[str] = typer.Option([], "--state", help="DEAD or FAILED (default: both)."),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000, help="Act on at most N deliveries, oldest first."),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
    plan_out: Path | None = PLAN_OUT,
    plan: Path | None = PLAN,
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout (schema aivedio.replay.v1)."),
) -> None:
    """Send DEAD (and FAILED) client webhook deliveries again, now, with a fresh retry budget.

    Each keeps its webhook-id, so a receiver that did get it before can drop the duplicate.
    """
    command = "replay webhooks"
    if plan is not None and plan_out is not None:
        fail("--plan and --plan-out exclude each other", ExitCode.USAGE)
    if plan is not None and (endpoint or state):
        fail("--plan replays exactly the saved set: drop the filters", ExitCode.USAGE)
    dry = dry_run or plan_out is not None
    filters = {"endpoint": endpoint, "state": ",".join(state) or None, "limit": limit}
    op = operation(command, reason, dry, **filters, plan=str(plan) if plan else None)
    endpoint_id = parse_id(endpoint, "webhook endpoint") if endpoint else None
    from aivedio_engine.services.webhooks import delivery_json

    with service_context(ctx) as app_ctx:
        if plan is not None:
            ids = read_plan(plan, command)
            rows = app_ctx.webhooks.preview_ids(ids)
            total = len(ids)
        else:
            total, rows = app_ctx.webhooks.replay_preview(endpoint_id=endpoint_id, states=state, limit=limit)
            ids = [str(d.id) for d in rows]
        items = [delivery_json(d) for d in rows]
        if plan_out is not None:
            write_plan(plan_out, command, ids, filters)
        if not as_json:
            head = f"{total} dead or failed delivery(ies) match"
            if plan is None and total > len(ids):
                head += f"; selected the oldest {len(ids)} (--limit)"
            out().print(head, highlight=False)
            if items:
                _table(items, ("id", "task_id", "status", "state", "attempts", "last_error"))
        if ids and not dry:
            confirm(f"replay {len(ids)} webhook delivery(ies)?", yes)
        result = app_ctx.webhooks.replay([uuid.UUID(i) for i in ids], op)
    if as_json:
        emit_json(
            {
                "schema": "aivedio.replay.v1",
                "kind": "webhooks",
                "filters": {"plan": str(plan)} if plan else filters,
                "total": total,
                "selected": len(ids),
                "items": items,
                "plan_out": str(plan_out) if plan_out else None,
                "result": {"dry_run": dry, **result},
            }
        )
    else:
        if plan_out is not None:
            out().print(f"plan saved to {plan_out}: {len(ids)} row(s); apply it with --plan {plan_out}")
        verb = "dry run: would replay" if dry else "replayed"
        out().print(f"{verb}: {len(result['done'])}, skipped: {len(result['skipped'])}", highlight=False)
        for item in result["skipped"]:
            out().print(f"  skipped {item['id']}: {item['reason']}", highlight=False)
