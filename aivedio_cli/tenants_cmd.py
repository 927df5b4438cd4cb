"""`aivedio tenants ...` and `aivedio keys ...`: who may call the API, and with how many credits."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import typer
from rich.table import Table

from aivedio_cli._mutate import DRY_RUN, YES, confirm, operation
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id
from aivedio_cli._services import service_context
from aivedio_engine.services.operations import Operation

#: creating is additive and reversible, so its reason is optional; it is audited either way
REASON_OPTIONAL = typer.Option(None, "--reason", help="Why (stored in the audit log).")

tenants_app = typer.Typer(help="Tenants: create and list.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys: create (shown once) and revoke.", no_args_is_help=True)


@tenants_app.command("create")
def create_tenant(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique tenant name."),
    credits: str | None = typer.Option(
        None, "--credits", help="Initial credits (default: limits.tenant_default_credits)."
    ),
    max_upload_bytes: int | None = typer.Option(
        None, "--max-upload-bytes", min=1, help="This tenant's upload size cap (default: api.max_upload_bytes)."
    ),
    as_json: bool = typer.Option(False, "--json"),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON_OPTIONAL,
) -> None:
    """Create a tenant with an initial credit grant (booked as a ledger ADJUSTMENT). Audited."""
    amount = None
    if credits is not None:
        try:
            amount = Decimal(credits)
        except InvalidOperation:
            fail(f"--credits must be a number, got {credits!r}", ExitCode.USAGE)
    op = Operation(
        "tenants create",
        reason,
        dry_run=dry_run,
        args={"name": name, "credits": credits, "max_upload_bytes": max_upload_bytes},
    )
    with service_context(ctx) as app:
        tenant = app.tenants.create(name, amount, op=op, max_upload_bytes=max_upload_bytes)
    if as_json:
        emit_json(
            {
                "tenant_id": None if dry_run else str(tenant.id),
                "name": tenant.name,
                "credit_balance": str(tenant.credit_balance),
                "dry_run": dry_run,
            }
        )
    elif dry_run:
        out().print(f"dry run: would create tenant [bold]{tenant.name}[/] with {tenant.credit_balance} credits")
    else:
        out().print(f"created tenant [bold]{tenant.name}[/] {tenant.id} with {tenant.credit_balance} credits")


@tenants_app.command("list")
def list_tenants(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """List tenants with their balance and live key count."""
    with service_context(ctx) as app:
        rows = app.tenants.list()
    if as_json:
        emit_json(
            [
                {
                    "tenant_id": str(t.id),
                    "name": t.name,
                    "status": t.status,
                    "credit_balance": str(t.credit_balance),
                    "active_keys": t.active_keys,
                }
                for t in rows
            ]
        )
        return
    table = Table("tenant_id", "name", "status", "credits", "keys")
    for t in rows:
        table.add_row(str(t.id), t.name, t.status, str(t.credit_balance), str(t.active_keys))
    out().print(table)


@keys_app.command("create")
def create_key(
    ctx: typer.Context,
    tenant: str = typer.Option(..., "--tenant", help="Tenant id."),
    name: str | None = typer.Option(None, "--name", help="A label for the key."),
    as_json: bool = typer.Option(False, "--json"),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON_OPTIONAL,
) -> None:
    """Create an API key. It is printed once; only its hash is stored. Audited (never the key)."""
    op = Operation("keys create", reason, dry_run=dry_run, args={"tenant": tenant, "name": name})
    with service_context(ctx) as app:
        key_id, key = app.tenants.create_key(parse_id(tenant, "tenant"), name, op=op)
    if dry_run:
        if as_json:
            emit_json({"tenant_id": tenant, "dry_run": True})
        else:
            out().print(f"dry run: would create a key for tenant {tenant}")
        return
    if as_json:
        emit_json({"api_key": key, "key_id": str(key_id), "tenant_id": tenant})
    else:
        out().print(f"key id {key_id}\napi key (shown once): {key}", highlight=False)


@keys_app.command("revoke")
def revoke_key(
    ctx: typer.Context,
    key_id: str = typer.Argument(..., help="Key id (from `keys create`)."),
    as_json: bool = typer.Option(False, "--json"),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = typer.Option(None, "--reason", help="Why (required unless --dry-run; audited)."),
) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    op = operation("keys revoke", reason, dry_run, key_id=key_id)
    kid = parse_id(key_id, "key")
    if not dry_run:
        confirm(f"revoke API key {key_id}?", yes)
    with service_context(ctx) as app:
        changed = app.tenants.revoke_key(kid, op=op)
    if as_json:
        emit_json({"key_id": key_id, "revoked": not dry_run, "changed": changed and not dry_run, "dry_run": dry_run})
    elif dry_run:
        out().print(f"dry run: would revoke {key_id}" if changed else f"{key_id} is already revoked")
    else:
        out().print(f"revoked {key_id}" if changed else f"{key_id} was already revoked")
