"""`aivedio generations get|wait|list|download|cancel`: a user's own generations, after `aivedio generate`.

Like `generate`: without `--api-url` the engine's data dir is used in this process (embedded: the local tenant's
tasks), with `--api-url` and `--api-key` (or AIVEDIO_API_URL / AIVEDIO_API_KEY) the commands are HTTP clients
of a running `aivedio serve`. Only `wait` runs the embedded engine (relay, worker, scheduler, sweeper) while it
waits, so the task it follows moves; the other verbs read or change the database and return.

`--json` prints one document on stdout (the same keys in both modes; `outputs` are local paths embedded and
signed URLs remote); progress and messages go to stderr. Exit codes: 0 ok, 1 failed (or, for `wait`, any end
but SUCCEEDED, or the timeout), 2 bad input, 4 refused (e.g. canceling a finished task), 5 not found.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from aivedio_cli._context import state
from aivedio_cli._params import complete_task_status, duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, parse_id

if TYPE_CHECKING:
    from aivedio_engine.client import ClientError, Snapshot, TaskClient

app = typer.Typer(help="Your generations: get, wait for, list, download, cancel.", no_args_is_help=True)

API_URL = typer.Option(
    None,
    "--api-url",
    envvar="AIVEDIO_API_URL",
    help="Talk to a running server instead of using the engine's data dir here.",
)
API_KEY = typer.Option(None, "--api-key", envvar="AIVEDIO_API_KEY", help="API key for --api-url.")
JSON = typer.Option(False, "--json", help="Print one JSON object on stdout.")
#: Ctrl-C, as shells report it (128 + SIGINT)
INTERRUPTED = 130

#: problem slug → exit code (the same mapping as service errors in `_render.exit_code_for`)
_KIND_EXIT = {
    "not-found": ExitCode.NOT_FOUND,
    "invalid-request": ExitCode.USAGE,
    "bad-request": ExitCode.USAGE,
    "conflict": ExitCode.REFUSED,
    "illegal-state": ExitCode.REFUSED,
    "insufficient-credits": ExitCode.REFUSED,
}


def _err() -> Console:
    return Console(file=sys.stderr)


def client_failed(exc: ClientError) -> NoReturn:
    fail(str(exc), _KIND_EXIT.get(exc.kind or "", ExitCode.FAILED))


@contextmanager
def task_client(
    ctx: typer.Context, api_url: str | None, api_key: str | None, *, host_engine: bool = False
) -> Iterator[TaskClient]:
    """A client of the server at `api_url`, else of the engine's data dir; `host_engine` also runs the embedded
    engine's background roles for the duration of the block (what `generate --wait` does)."""
    from aivedio_engine.client import ClientError, EmbeddedClient, RemoteClient

    if api_url:
        if not api_key:
            fail("--api-url needs --api-key (or AIVEDIO_API_KEY)", ExitCode.USAGE)
        remote = RemoteClient(api_url, api_key)
        try:
            yield remote
        except ClientError as exc:
            client_failed(exc)
        finally:
            remote.close()
        return
    from aivedio_engine import embedded
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db.handles import OperationalError
    from aivedio_engine.observability.logging import configure_logging

    configure_logging(state(ctx).settings(), default_level="WARNING")
    app_ctx = build_context(state(ctx).settings())
    try:
        if host_engine:
            with embedded.running(app_ctx) as principal:
                yield EmbeddedClient(app_ctx, principal)
        else:
            yield EmbeddedClient(app_ctx, embedded.prepare(app_ctx))
    except ClientError as exc:
        client_failed(exc)
    except embedded.SchemaOutdated as exc:
        fail(str(exc))
    except OperationalError as exc:
        fail(f"database unavailable: {str(exc.orig).strip().splitlines()[0] if exc.orig else exc}")
    finally:
        app_ctx.close()


def snapshot_doc(snap: Snapshot) -> dict[str, Any]:
    """The JSON of one task: `generate --json`'s keys plus what a listing needs."""
    return {
        "id": snap.id,
        "status": snap.status,
        "version": snap.version,
        "progress": snap.progress,
        "error": snap.error,
        "outputs": snap.outputs,
        "model": snap.model,
        "provider": snap.provider,
        "cancel_outcome": snap.cancel_outcome,
        "created_at": snap.created_at,
        "updated_at": snap.updated_at,
        "finished_at": snap.finished_at,
        "variants": snap.variants,
    }


def _print_task(snap: Snapshot) -> None:
    rows = [
        ("id", snap.id),
        ("status", snap.status),
        ("version", str(snap.version)),
        ("progress", f"{snap.progress}%"),
        ("model", f"{snap.model or '-'} ({snap.provider or 'not chosen yet'})"),
        ("error", snap.error or "-"),
        ("created", snap.created_at or "-"),
        ("updated", snap.updated_at or "-"),
    ]
    if snap.finished_at:
        rows.append(("finished", snap.finished_at))
    if snap.cancel_outcome:
        rows.append(("cancel", snap.cancel_outcome))
    for label, value in rows:
        typer.echo(f"{label:<9} {value}")
    for profile, where in sorted(snap.outputs.items()):
        typer.echo(f"{profile}: {where}")
    if len(snap.variants) > 1:  # a request for n outputs: `outputs` above is the first; list the others
        for variant in snap.variants[1:]:
            for profile, where in sorted(variant["outputs"].items()):
                typer.echo(f"v{variant['index']} {profile}: {where}")


def _task_id(value: str) -> str:
    return str(parse_id(value, "generation"))


@app.command("get")
def get(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., metavar="ID", help="Generation id."),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Show one generation: status, version, error and (once SUCCEEDED) its outputs."""
    tid = _task_id(task_id)
    with task_client(ctx, api_url, api_key) as client:
        snap = client.get(tid)
    if as_json:
        emit_json(snapshot_doc(snap))
    else:
        _print_task(snap)


@app.command("wait")
def wait(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., metavar="ID", help="Generation id."),
    timeout: float = duration_option("15m", "--timeout", help="How long to wait before giving up"),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Follow a generation to its end with a live display on stderr. Exit 0 only when it SUCCEEDED; 1 when it
    ended otherwise or is still running after --timeout (it continues; wait again)."""
    tid = _task_id(task_id)
    err = _err()
    with task_client(ctx, api_url, api_key) as client:
        snap = client.get(tid)  # an unknown id is a 5 before any engine starts
    if not snap.finished:
        from aivedio_cli.generate_cmd import ctrl_c_stops, follow_with_progress, interrupted_line
        from aivedio_engine.jobs import StopFlag

        stop = StopFlag()  # the first Ctrl-C stops following; the embedded engine then shuts down gracefully
        try:
            # embedded: the engine runs here while we wait, or nothing would move the task
            with ctrl_c_stops(stop), task_client(ctx, api_url, api_key, host_engine=True) as client:
                snap = follow_with_progress(client, client.get(tid), err, timeout, stop)
        except KeyboardInterrupt:  # the second Ctrl-C, during the engine's shutdown
            stop.set()
        if stop.is_set() and not snap.finished:
            interrupted_line(f"the task continues; follow it with `aivedio generations wait {tid}`")
            raise typer.Exit(INTERRUPTED)
    else:  # already over: the display's last line, so a wait always ends on the state it found
        err.print(f"  {snap.status}")
    from aivedio_cli.generate_cmd import timed_out_text

    timed_out = None if snap.finished else timed_out_text(snap, timeout, remote=bool(api_url))
    if as_json:
        doc = snapshot_doc(snap)
        if timed_out:
            doc |= {"error": timed_out, "error_type": "timeout"}
        emit_json(doc)
    else:
        _print_result(snap, err)
    if timed_out:
        fail(timed_out, ExitCode.FAILED, "timeout")
    if snap.status != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.FAILED))


def _print_result(snap: Snapshot, err: Console) -> None:
    if snap.status == "SUCCEEDED":
        err.print(f"[green]SUCCEEDED[/green] {snap.id}")
        for profile, where in sorted(snap.outputs.items()):
            typer.echo(f"{profile}: {where}")
    elif snap.finished:
        err.print(f"[red]{snap.status}[/red] {snap.id}" + (f" ({snap.error})" if snap.error else ""))


@app.command("list")
def list_generations(
    ctx: typer.Context,
    status: str | None = typer.Option(
        None, "--status", autocompletion=complete_task_status, help="Only generations in this status, e.g. QUEUED."
    ),
    limit: int = typer.Option(20, "--limit", min=1, max=10_000, help="At most this many, newest first."),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """List your generations, newest first."""
    from aivedio_engine.domain.status import TaskStatus

    known = [s.value for s in TaskStatus]
    if status is not None and status.upper() not in known:
        fail(f"unknown status {status!r} (known: {', '.join(known)})", ExitCode.USAGE)
    with task_client(ctx, api_url, api_key) as client:
        snaps = client.list_generations(status.upper() if status else None, limit)
    if as_json:
        emit_json({"data": [snapshot_doc(s) for s in snaps]})
        return
    table = Table()
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("status", "model", "progress", "created", "error"):
        table.add_column(column)
    for s in snaps:
        table.add_row(s.id, s.status, s.model or "-", f"{s.progress}%", (s.created_at or "-")[:19], s.error or "")
    console = Console(file=sys.stdout, soft_wrap=True)
    (console if console.is_terminal else Console(file=sys.stdout, width=200)).print(table)
    print(f"{len(snaps)} generation(s)", file=sys.stderr)


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., metavar="ID", help="Generation id."),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Cancel a generation: before dispatch it is CANCELED at once and its credits released; after, the provider
    is asked to stop (CANCEL_REQUESTED). Repeating is harmless; a finished generation is refused (exit 4)."""
    tid = _task_id(task_id)
    with task_client(ctx, api_url, api_key) as client:
        snap = client.cancel(tid)
    if as_json:
        emit_json(snapshot_doc(snap))
        return
    typer.echo(f"{snap.id} {snap.status}")
    if snap.status == "CANCEL_REQUESTED":
        where = "the server" if api_url else "the engine (`aivedio generations wait ID` or `aivedio serve`)"
        print(f"the provider is being asked to stop; {where} finishes the cancel", file=sys.stderr)


@app.command("download")
def download(
    ctx: typer.Context,
    task_id: str = typer.Argument(..., metavar="ID", help="Generation id."),
    out: Path | None = typer.Option(None, "--out", help="Folder to write to (default: ./ID)."),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """Write a SUCCEEDED generation's files (proxy MP4, HLS playlist and segments, thumbnail, waveform and,
    without --api-url, the original output) to a folder, each checked against the SHA-256 its asset row
    recorded. Exit 1 when a file differs (it is not kept)."""
    from aivedio_engine.download import download as run_download

    tid = _task_id(task_id)
    folder = out if out is not None else Path(tid)
    if folder.exists() and not folder.is_dir():
        fail(f"--out {folder}: not a folder", ExitCode.USAGE)
    with task_client(ctx, api_url, api_key) as client:
        try:
            result = run_download(client, tid, folder)
        except OSError as exc:
            fail(f"cannot write under {folder}: {exc.strerror or exc}")
    if as_json:
        emit_json(result.as_dict())
    else:
        err = Console(file=sys.stderr, soft_wrap=True, highlight=False)
        for f in result.files:
            verdict = (
                f"[red]{f.problem}[/red] (not kept)"
                if f.problem
                else "sha256 ok"
                if f.verified
                else f"sha256 {f.sha256[:12]}… (no record to check)"
            )
            err.print(f"{f.profile:<10} {f.size_bytes:>10}  {f.path}  {verdict}")
        for note in result.notes:
            err.print(note)
    if result.bad:
        fail(
            f"{len(result.bad)} file(s) differ from their recorded checksum and were not kept: "
            + "; ".join(f"{f.path.name}: {f.problem}" for f in result.bad)
        )
    if not as_json:
        typer.echo(str(folder))
