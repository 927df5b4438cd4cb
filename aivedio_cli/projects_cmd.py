"""`aivedio projects run|list|show|cancel|retry-step`: System B projects (multi-step workflows).

`run` hosts the engine in this command (embedded, like `aivedio generate`): it uploads the photo through the
normal asset upload path, creates the project (idempotently with `--key`: a re-run follows the same project), and
with `--wait` keeps the engine running while it shows each step's status on stderr, then prints the path of the
delivered MP4 on stdout. Without `--wait` the project continues with the next engine that runs (`aivedio serve`).
The other commands read or change the database directly; they never run steps.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from aivedio_cli._context import state
from aivedio_cli._render import ExitCode, emit_json, fail, out, parse_id
from aivedio_cli._services import service_context

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.workflows import ProjectView

app = typer.Typer(help="System B projects: run a workflow (photo + script → video) and follow its steps.")

_WAIT_POLL_S = 0.5
_STOP_WAITING = frozenset({"succeeded", "cancelled", "failed", "needs_attention"})


def parse_inputs(items: list[str]) -> dict[str, str]:
    """`--input photo=PATH --input script=TEXT|@file` → {"photo": PATH, "script": TEXT}."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail(f"--input {item!r}: expected NAME=VALUE", ExitCode.USAGE)
        if value.startswith("@"):
            path = Path(value[1:])
            try:
                value = path.read_text(encoding="utf-8")
            except OSError as exc:
                fail(f"--input {name}: cannot read {path}: {exc.strerror or exc}", ExitCode.USAGE)
        found[name.strip()] = value
    return found


def _project_json(view: ProjectView, result: str | None = None) -> dict[str, Any]:
    p = view.project
    return {
        "id": str(p.id),
        "workflow": p.workflow,
        "status": p.status.value,
        "user_ref": p.user_ref,
        "shots": p.shots,
        "cost_estimate": str(p.cost_estimate),
        "cost_actual": str(p.cost_actual),
        "result_asset_id": str(p.result_asset_id) if p.result_asset_id else None,
        "result": result,
        "created_at": p.created_at.isoformat(),
        "finished_at": p.finished_at.isoformat() if p.finished_at else None,
        "steps": [
            {
                "key": s.step_key,
                "type": s.task_type.value,
                "queue": s.queue,
                "status": s.status.value,
                "retry_count": s.retry_count,
                "cost_actual": str(s.cost_actual),
                "generation_task_id": str(s.generation_task_id) if s.generation_task_id else None,
                "error_code": s.error_code,
                "error_message": s.error_message,
                "started_at": s.started_at.isoformat() if s.started_at else None,
                "finished_at": s.finished_at.isoformat() if s.finished_at else None,
            }
            for s in view.steps
        ],
    }


def _result_path(app_ctx: AppContext, view: ProjectView) -> str | None:
    """Where the delivered MP4 is on this machine (fs store), else its object key."""
    if view.project.result_asset_id is None:
        return None
    delivery = next((s for s in view.steps if s.step_key == "delivery"), None)
    key = (delivery.output_json or {}).get("key") if delivery else None
    if not isinstance(key, str):
        return None
    local = getattr(app_ctx.storage, "local_path", None)
    path = local(key) if local else None
    return str(path) if path else key


def _print_steps(view: ProjectView) -> None:
    p = view.project
    table = Table(
        title=f"project {p.id} · {p.workflow} · {p.status}",
        caption=f"cost {p.cost_actual:f} credits of {p.cost_estimate:f} estimated",
    )
    for col in ("step", "queue", "status", "retries", "cost", "error"):
        table.add_column(col)
    for s in view.steps:
        err = f"{s.error_code}: {s.error_message}" if s.error_code else ""
        table.add_row(s.step_key, s.queue, s.status.value, str(s.retry_count), f"{s.cost_actual:f}", err[:80])
    out().print(table)


@app.command("run")
def run(
    ctx: typer.Context,
    workflow: str = typer.Argument(..., help="Workflow name (see `aivedio workflows list`)."),
    inputs: list[str] = typer.Option([], "--input", help="NAME=VALUE; photo=PATH, script=TEXT or script=@FILE."),
    user: str = typer.Option("local", "--user", help="The end user the project is for (user_ref)."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key: running again follows the same project."),
    wait: bool = typer.Option(False, "--wait", help="Run the engine here until the project ends; print the MP4."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    timeout: float = typer.Option(900, "--timeout", min=1, help="Seconds --wait waits before giving up."),
) -> None:
    """Start a project (embedded engine). Exit 0 when it succeeded (or, without --wait, was accepted)."""
    from aivedio_engine import embedded
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.client import ClientError, EmbeddedClient
    from aivedio_engine.observability.logging import configure_logging
    from aivedio_engine.services.errors import ServiceError
    from aivedio_engine.workflows import catalog

    try:
        catalog.get(workflow)
    except KeyError as exc:
        fail(str(exc.args[0]), ExitCode.NOT_FOUND)
    values = parse_inputs(inputs)
    photo, script = values.get("photo"), values.get("script")
    if not photo or not script or not script.strip():
        fail("give --input photo=PATH and --input script=TEXT (or script=@FILE)", ExitCode.USAGE)
    if not Path(photo).is_file():
        fail(f"--input photo: {photo}: no such file", ExitCode.USAGE)
    configure_logging(state(ctx).settings(), default_level="WARNING")
    app_ctx = build_context(state(ctx).settings())
    err = sys.stderr
    project = None
    try:
        with embedded.running(app_ctx) as principal:
            svc = app_ctx.workflows
            existing = svc.find(principal.tenant_id, key) if key else None
            if existing is None:
                asset_id = EmbeddedClient(app_ctx, principal).upload(Path(photo))
                project, _ = svc.create(
                    principal.tenant_id,
                    workflow,
                    user_ref=user,
                    input={catalog.PHOTO_INPUT: asset_id, "script": script.strip()},
                    idempotency_key=key,
                )
            else:
                project = existing
            if not as_json:
                print(f"project {project.id} is {project.status}", file=err, flush=True)
            view = svc.get(project.id)
            if wait:
                view = _follow(app_ctx, project.id, timeout, quiet=as_json)
            result = _result_path(app_ctx, view)
    except (embedded.SchemaOutdated, ClientError, ServiceError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        # Ctrl-C stops following, not the project: its steps continue with the next engine that runs
        where = f"`aivedio projects show {project.id}`" if project is not None else "`aivedio projects list`"
        print(f"interrupted — the project continues when an engine runs; see {where}", file=err, flush=True)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    finally:
        app_ctx.close()
    status = view.project.status.value
    if as_json:
        emit_json(_project_json(view, result))
    elif result:
        typer.echo(result)
    elif wait:
        _print_steps(view)
    if wait and status != "succeeded":
        raise typer.Exit(int(ExitCode.FAILED))


def _follow(app_ctx: AppContext, project_id: uuid.UUID, timeout: float, *, quiet: bool) -> ProjectView:
    """Poll the project until it stops needing the engine (or `timeout`); one stderr line per step change."""
    seen: dict[str, str] = {}
    started = time.monotonic()
    deadline = started + timeout
    while True:
        view = app_ctx.workflows.get(project_id)
        for s in view.steps:
            state_text = s.status.value + (f" ({s.error_code})" if s.error_code and s.status.value != "success" else "")
            if seen.get(s.step_key) != state_text:
                seen[s.step_key] = state_text
                if not quiet:
                    print(
                        f"  {time.monotonic() - started:6.1f}s  {s.step_key:<14} {state_text}",
                        file=sys.stderr,
                        flush=True,
                    )
        if view.project.status.value in _STOP_WAITING or time.monotonic() > deadline:
            return view
        time.sleep(_WAIT_POLL_S)


@app.command("list")
def list_projects(
    ctx: typer.Context,
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Recent projects, newest first."""
    with service_context(ctx) as app_ctx:
        projects = app_ctx.workflows.list_projects(limit=limit)
    if as_json:
        emit_json(
            [
                {
                    "id": str(p.id),
                    "workflow": p.workflow,
                    "status": p.status.value,
                    "user_ref": p.user_ref,
                    "created_at": p.created_at.isoformat(),
                }
                for p in projects
            ]
        )
        return
    table = Table(title="projects")
    for col in ("id", "workflow", "status", "user", "created"):
        table.add_column(col)
    for p in projects:
        table.add_row(str(p.id), p.workflow, p.status.value, p.user_ref, p.created_at.isoformat(timespec="seconds"))
    out().print(table)


@app.command("show")
def show(
    ctx: typer.Context, project_id: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")
) -> None:
    """A project with its steps (status, retries, errors)."""
    pid = parse_id(project_id, "project")
    with service_context(ctx) as app_ctx:
        view = app_ctx.workflows.get(pid)
        result = _result_path(app_ctx, view)
    if as_json:
        emit_json(_project_json(view, result))
        return
    _print_steps(view)
    if result:
        typer.echo(result)


@app.command("cancel")
def cancel(ctx: typer.Context, project_id: str = typer.Argument(...)) -> None:
    """Cancel a project and its open steps (a running generation settles by its own rules)."""
    pid = parse_id(project_id, "project")
    with service_context(ctx) as app_ctx:
        project = app_ctx.workflows.cancel(pid)
    typer.echo(f"project {project.id} is {project.status}")


@app.command("retry-step")
def retry_step(
    ctx: typer.Context,
    project_id: str = typer.Argument(...),
    step: str = typer.Argument(..., help="Step key, e.g. clip[1]."),
    reason: str = typer.Option(..., "--reason", help="Why (kept with the step's history)."),
) -> None:
    """Put a failed or manual_required step back to pending (same row, fresh retry budget)."""
    pid = parse_id(project_id, "project")
    if not reason.strip():
        fail("--reason must not be empty", ExitCode.USAGE)
    with service_context(ctx) as app_ctx:
        moved = app_ctx.workflows.retry_step(pid, step, reason=reason.strip())
    typer.echo(f"step {moved.step_key} of project {pid} is {moved.status} ({reason.strip()})")
