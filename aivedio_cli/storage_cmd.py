"""`aivedio storage scan`: count the objects no row references (orphans), now. `aivedio storage gc`: delete them.

The sweeper runs the same scan every `sweeper.storage_scan_interval_s` for /metrics; this command is for when
on-call wants the figures and the keys at once (after a crash, before and after a cleanup). It records its
scan like the sweeper does, so the metrics move too. Nothing is deleted: the command only reads the store.

Exit 0 when the scan completed (whatever it found), 1 when the listing or the lookups failed (the failure is
recorded too).

`gc` deletes the orphans older than the GC's safety window (`sweeper.storage_gc_grace_s`, which the sweeper also
applies one page at a time): `--dry-run` lists them and deletes nothing, otherwise `--yes` and `--reason` are
required; both are audited. Exit 3 when some deletes failed.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from aivedio_cli._mutate import DRY_RUN, REASON, YES, confirm, operation
from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_cli._services import service_context
from aivedio_cli.tasks_cmd import print_table
from aivedio_engine.services.storage_gc import GcResult
from aivedio_engine.services.storage_scan import ScanResult

app = typer.Typer(help="The object store: orphan objects (scan, gc).", no_args_is_help=True)


@app.command("scan")
def scan(
    ctx: typer.Context,
    grace: float | None = duration_option(
        None,
        "--grace",
        help="Objects younger than this are never orphans, since their row may not "
        "be committed yet (default: the setting sweeper.storage_scan_grace_s)",
    ),
    limit: int = typer.Option(
        50,
        "--limit",
        min=0,
        help="Orphan keys printed in the table (--json prints all the scan kept; the counts are always exact).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (the stable contract)."),
) -> None:
    """List the whole object store now and report the objects no database row references; record the scan."""
    with service_context(ctx) as app_ctx:
        result = app_ctx.storage_scanner.scan(grace)
        store = f"{app_ctx.storage.kind}:{app_ctx.storage.bucket}"
    if as_json:
        emit_json(_as_json(result, store))
    else:
        _print(result, store, limit)
    if not result.ok:
        raise typer.Exit(int(ExitCode.FAILED))


@app.command("gc")
def gc(
    ctx: typer.Context,
    grace: float | None = duration_option(
        None,
        "--grace",
        help="Only orphans older than this are deleted (default: the setting sweeper.storage_gc_grace_s; at least 1h)",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Delete at most this many objects."),
    reason: str | None = REASON,
    yes: bool = YES,
    dry_run: bool = DRY_RUN,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (the stable contract)."),
) -> None:
    """Delete the orphan objects (no row references them) older than the safety window; audited."""
    if grace is not None and grace < 3600:
        fail("--grace must be at least 1h: younger objects may belong to a commit still on its way", ExitCode.USAGE)
    op = operation("storage gc", reason, dry_run, grace_s=grace, limit=limit)
    if not dry_run:
        confirm("delete every orphan object older than the safety window?", yes)
    with service_context(ctx) as app_ctx:
        result = app_ctx.storage_collector.collect(op, grace_s=grace, limit=limit)
        store = f"{app_ctx.storage.kind}:{app_ctx.storage.bucket}"
    if as_json:
        emit_json(_gc_json(result, store))
    else:
        _print_gc(result, store)
    if result.failed:
        raise typer.Exit(int(ExitCode.PARTIAL))


def _gc_json(r: GcResult, store: str) -> dict[str, Any]:
    return {
        "store": store,
        "dry_run": r.dry_run,
        "grace_s": r.grace_s,
        "listed": r.listed,
        "orphans": len(r.orphans),
        "orphan_bytes": r.orphan_bytes,
        "deleted": r.deleted,
        "deleted_bytes": r.deleted_bytes,
        "kept_on_recheck": r.kept_on_recheck,
        "failed": r.failed,
        "complete": r.complete,
        "objects": [
            {"key": o.key, "size_bytes": o.size_bytes, "modified_at": o.modified_at.isoformat()} for o in r.orphans
        ],
    }


def _print_gc(r: GcResult, store: str) -> None:
    console = out()
    if r.orphans:
        table = Table(title="Orphan objects (would be deleted)" if r.dry_run else "Orphan objects")
        table.add_column("key", overflow="fold")
        table.add_column("bytes", no_wrap=True)
        table.add_column("modified (UTC)", no_wrap=True)
        for o in r.orphans:
            table.add_row(o.key, str(o.size_bytes), o.modified_at.strftime("%Y-%m-%d %H:%M:%S"))
        print_table(table)
    orphans = f"{len(r.orphans)} orphans ({_size(r.orphan_bytes)}) older than {r.grace_s:g} s"
    head = f"{store}: {r.listed} objects listed; {orphans}"
    if r.dry_run:
        console.print(f"{head} — dry run: nothing deleted", highlight=False)
        return
    tail = f"deleted {r.deleted} ({_size(r.deleted_bytes)})"
    if r.kept_on_recheck:
        tail += f", {r.kept_on_recheck} kept (referenced by the time of the delete)"
    if r.failed:
        tail += f", {len(r.failed)} failed: {', '.join(r.failed[:5])}"
    if not r.complete:
        tail += " — stopped at --limit; run again for the rest"
    console.print(f"{head} — {tail}", highlight=False)


def _as_json(r: ScanResult, store: str) -> dict[str, Any]:
    return {
        "scan_id": str(r.id),
        "store": store,
        "ok": r.ok,
        "error": r.error,
        "started_at": r.started_at.isoformat(),
        "finished_at": r.finished_at.isoformat(),
        "grace_s": r.grace_s,
        "objects": r.objects,
        "bytes": r.bytes,
        "orphans": r.orphans,
        "orphan_bytes": r.orphan_bytes,
        "truncated": r.truncated,
        "orphan_objects": [
            {"key": o.key, "size_bytes": o.size_bytes, "modified_at": o.modified_at.isoformat()}
            for o in r.orphan_objects
        ],
    }


def _print(r: ScanResult, store: str, limit: int) -> None:
    console = out()
    if not r.ok:
        console.print(f"[bold red]scan failed[/] ({store}): {r.error} — recorded as scan {r.id}", highlight=False)
        return
    if r.orphan_objects and limit:
        table = Table(title="Orphan objects")
        table.add_column("key", overflow="fold")
        table.add_column("bytes", no_wrap=True)
        table.add_column("modified (UTC)", no_wrap=True)
        for o in r.orphan_objects[:limit]:
            table.add_row(o.key, str(o.size_bytes), o.modified_at.strftime("%Y-%m-%d %H:%M:%S"))
        print_table(table)
        if r.orphans > limit:
            console.print(f"... and {r.orphans - limit} more (see --json)", highlight=False)
    console.print(
        f"{store}: {r.objects} objects ({_size(r.bytes)}); {r.orphans} orphans ({_size(r.orphan_bytes)}) "
        f"older than {r.grace_s:g} s — recorded as scan {r.id}",
        highlight=False,
    )


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
