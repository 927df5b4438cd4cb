"""`aivedio tenants ...` and `aivedio keys ...`: who may call the API, and with how many credits."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal, InvalidOperation
from typing import Any

import typer

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id
from aivedio_cli._services import service_context
from aivedio_cli.tasks_cmd import id_table
from aivedio_engine.db.tenants import TenantLimits
from aivedio_engine.services.operations import Operation

#: creating is additive and reversible, so its reason is optional; it is audited either way
REASON_OPTIONAL = typer.Option(None, "--reason", help="Why (stored in the audit log).")

tenants_app = typer.Typer(help="Tenants: create, list and set their limits.", no_args_is_help=True)
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
                "credit_balance": tenant.credit_balance,
                "dry_run": dry_run,
            }
        )
    elif dry_run:
        out().print(f"dry run: would create tenant [bold]{tenant.name}[/] with {tenant.credit_balance} credits")
    else:
        out().print(f"created tenant [bold]{tenant.name}[/] {tenant.id} with {tenant.credit_balance} credits")


@tenants_app.command("list")
def list_tenants(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """List tenants with their balance, live key count and limits ("default" = the config's value)."""
    with service_context(ctx) as app:
        rows = app.tenants.list()
        effective = {t.id: app.tenants.effective(t.limits) for t in rows if t.limits is not None}
    if as_json:
        emit_json(
            [
                {
                    "tenant_id": str(t.id),
                    "name": t.name,
                    "status": t.status,
                    "credit_balance": t.credit_balance,
                    "active_keys": t.active_keys,
                    # the tenant's own values; null = the config's default, which `effective` resolves
                    "limits": _own(t.limits),
                    "effective": dataclasses.asdict(effective[t.id]) if t.id in effective else None,
                }
                for t in rows
            ]
        )
        return
    columns = ("name", "status", "credits", "keys", "rate/s", "burst", "concurrency", "tier", "upload")
    table = id_table("tenant_id", *columns)
    for t in rows:
        own, eff = _own(t.limits), effective.get(t.id)
        shown = [
            _shown(own.get(name), getattr(eff, name, None))
            for name in ("rate_limit_per_s", "rate_limit_burst", "max_concurrency", "priority_tier", "max_upload_bytes")
        ]
        table.add_row(str(t.id), t.name, t.status, str(t.credit_balance), str(t.active_keys), *shown)
    out().print(table)


def _own(limits: TenantLimits | None) -> dict[str, Any]:
    if limits is None:
        return {}
    own = dataclasses.asdict(limits)
    own.pop("tenant_id")
    return own


def _shown(own: Any, effective: Any) -> str:
    if own is not None:
        return f"{own:g}" if isinstance(own, float) else str(own)
    if effective is None:
        return "default"
    return f"{effective:g} (default)" if isinstance(effective, float) else f"{effective} (default)"


_DEFAULT_WORDS = ("default", "none")


def _parse_limit(value: str | None, option: str, *, per_second: bool = False) -> float | int | None | _Unset:
    """ "N" (or "N/s" for a rate) sets a tenant's own limit; "default" clears it back to the config's value."""
    if value is None:
        return _UNSET
    text = value.strip().lower()
    if text in _DEFAULT_WORDS:
        return None
    if per_second and text.endswith("/s"):
        text = text[:-2].strip()
    try:
        number = float(text) if per_second else int(text)
    except ValueError:
        unit = "a number of requests per second (e.g. 5 or 0.5/s)" if per_second else "a whole number"
        fail(f"{option} must be {unit} or 'default', got {value!r}", ExitCode.USAGE)
    if not math.isfinite(number) or number <= 0:
        fail(f"{option} must be > 0 (or 'default'), got {value!r}", ExitCode.USAGE)
    return number


class _Unset:
    pass


_UNSET = _Unset()


@tenants_app.command("update")
def update_tenant(
    ctx: typer.Context,
    tenant_id: str = typer.Argument(..., help="Tenant id (from `tenants list`)."),
    rate_limit: str | None = typer.Option(
        None, "--rate-limit", help="Requests/s to POST /v1/generations, e.g. 5 or 0.5/s; 'default' = api setting."
    ),
    burst: str | None = typer.Option(None, "--burst", help="Requests at once after an idle spell; 'default'."),
    max_concurrency: str | None = typer.Option(
        None, "--max-concurrency", help="Tasks in flight at a provider at once; 'default'."
    ),
    tier: int | None = typer.Option(
        None, "--tier", min=1, max=5, help="1 custom project, 2 paid, 3 preview, 4 free preview, 5 cleanup (1 first)."
    ),
    max_upload_bytes: str | None = typer.Option(None, "--max-upload-bytes", help="Upload size cap; 'default'."),
    retention_outputs: str | None = typer.Option(
        None, "--retention-outputs", help="Days outputs are kept after their task ended; 'default' = [retention]."
    ),
    retention_inputs: str | None = typer.Option(None, "--retention-inputs", help="Days uploads are kept; 'default'."),
    retention_prompts: str | None = typer.Option(
        None, "--retention-prompts", help="Days prompts are kept after their task ended; 'default'."
    ),
    as_json: bool = typer.Option(False, "--json"),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
) -> None:
    """Set a tenant's rate limit, burst, concurrency, tier, upload cap or retention (days). Audited with the values
    before and after. API processes apply a new rate within api.auth_cache_ttl_s; the dispatcher, the next round;
    the sweeper applies retention on its next retention run."""
    parsed = {
        "rate_limit_per_s": _parse_limit(rate_limit, "--rate-limit", per_second=True),
        "rate_limit_burst": _parse_limit(burst, "--burst"),
        "max_concurrency": _parse_limit(max_concurrency, "--max-concurrency"),
        "priority_tier": _UNSET if tier is None else tier,
        "max_upload_bytes": _parse_limit(max_upload_bytes, "--max-upload-bytes"),
        "retention_outputs_days": _parse_limit(retention_outputs, "--retention-outputs"),
        "retention_inputs_days": _parse_limit(retention_inputs, "--retention-inputs"),
        "retention_prompts_days": _parse_limit(retention_prompts, "--retention-prompts"),
    }
    changes = {k: v for k, v in parsed.items() if not isinstance(v, _Unset)}
    if not changes:
        fail(
            "nothing to change: give --rate-limit, --burst, --max-concurrency, --tier, --max-upload-bytes or "
            "--retention-outputs/--retention-inputs/--retention-prompts"
        )
    op = operation("tenants update", reason, dry_run, tenant_id=tenant_id, **changes)
    tid = parse_id(tenant_id, "tenant")
    if not dry_run:
        confirm(f"change the limits of tenant {tenant_id}?", yes)
    with service_context(ctx) as app:
        result = app.tenants.update_limits(tid, changes, op)
    before, after = _own(result.before), _own(result.after)
    if as_json:
        emit_json(
            {"tenant_id": tenant_id, "changed": result.changed, "dry_run": dry_run, "before": before, "after": after}
        )
        return
    verb = "would change" if dry_run else "changed"
    if not result.changed:
        out().print(f"tenant {tenant_id}: nothing to change (the limits already have these values)")
    for name in changes:
        old, new = before[name], after[name]
        if old != new:
            out().print(f"{verb} {name}: {_shown(old, None)} -> {_shown(new, None)}", highlight=False)


@tenants_app.command("purge")
def purge_tenant(
    ctx: typer.Context,
    tenant_id: str = typer.Argument(..., help="Tenant id (from `tenants list`)."),
    as_json: bool = typer.Option(False, "--json"),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    reason: str | None = REASON,
) -> None:
    """Delete a tenant's data: every object (inputs, uploads, outputs, derivatives), its prompts redacted. The
    tenant is suspended and its keys revoked; ledger and audit rows stay (amounts and ids). Refused while the
    tenant has unfinished tasks. Audited with the counts; safe to run again."""
    op = operation("tenants purge", reason, dry_run, tenant_id=tenant_id)
    tid = parse_id(tenant_id, "tenant")
    if not dry_run:
        confirm(f"delete every object and prompt of tenant {tenant_id}? This cannot be undone", yes)
    with service_context(ctx) as app:
        result = app.tenant_purger.purge(tid, op)
    if as_json:
        emit_json(result.to_json())
    elif dry_run:
        out().print(
            f"dry run: would delete {result.objects} objects ({result.object_bytes} bytes), mark "
            f"{result.assets} assets deleted and redact {result.prompts} prompts of tenant {tenant_id}",
            highlight=False,
        )
    else:
        out().print(
            f"purged tenant {tenant_id}: {result.objects_deleted} objects deleted, {result.assets} assets marked "
            f"deleted, {result.prompts} prompts redacted, {result.keys_revoked} keys revoked",
            highlight=False,
        )
    if result.objects_left:
        fail(f"{result.objects_left} objects are left under the tenant's prefix: run the purge again", ExitCode.PARTIAL)


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
