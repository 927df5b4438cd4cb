"""`aivedio storage scan`: count the objects no row references (orphans), now.

The sweeper runs the same scan every `sweeper.storage_scan_interval_s` for /metrics; this command is for when
on-call wants the figures and the keys at once (after a crash, before and after a cleanup). It records its
scan like the sweeper does, so the metrics move too. Nothing is deleted: the command only reads the store.

Exit 0 when the scan completed (whatever it found), 1 when the listing or the lookups failed (the failure is
recorded too).
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from aivedio_cli._render import ExitCode, emit_json, out
from aivedio_cli._services import service_context
from aivedio_cli.tasks_cmd import duration_opt, print_table
from aivedio_engine.services.storage_scan import ScanResult

app = typer.Typer(help="The object store: orphan objects.", no_args_is_help=True)


@app.command("scan")
def scan(
    ctx: typer.Context,
    grace: str | None = typer.Option(
        None,
        "--grace",
        metavar="D",
        help="Objects younger than this are never orphans, since their row may not "
        "be committed yet (default: sweeper.storage_scan_grace_s; e.g. 30m, 1h).",
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
    grace_td = duration_opt(grace, "--grace")
    with service_context(ctx) as app_ctx:
        result = app_ctx.storage_scanner.scan(None if grace_td is None else grace_td.total_seconds())
        store = f"{app_ctx.storage.kind}:{app_ctx.storage.bucket}"
    if as_json:
        emit_json(_as_json(result, store))
    else:
        _print(result, store, limit)
    if not result.ok:
        raise typer.Exit(int(ExitCode.FAILED))


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
        table = Table("key", "bytes", "modified (UTC)", title="Orphan objects")
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
