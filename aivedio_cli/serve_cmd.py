"""`aivedio serve [--role api,relay,worker,scheduler,sweeper | all]`: run process roles until SIGTERM/SIGINT.

The work is in `aivedio_engine.worker.runtime`; this module parses options, prepares the database and maps the
outcome to an exit code. Heavy modules (dramatiq, the HTTP stack) load only when the command runs.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING

import typer

from aivedio_cli._context import state
from aivedio_cli._render import ExitCode, fail
from aivedio_engine.config import Settings

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.db.handles import Engine


def serve(
    ctx: typer.Context,
    role: str = typer.Option(
        "all",
        "--role",
        metavar="ROLES",
        help="Comma list of api, relay, worker, scheduler, sweeper, or all (one process runs everything).",
    ),
    host: str | None = typer.Option(None, "--host", help="API listen address (default: api.host)."),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="API listen port (default: api.port)."),
    queues: str | None = typer.Option(
        None,
        "--queues",
        metavar="QUEUES",
        help=(
            "Worker role: consume only these queues (comma list: broker queues such as state,fetch and System B "
            "step queues such as video,ffmpeg; default all)."
        ),
    ),
    processes: int = typer.Option(
        1,
        "--processes",
        min=1,
        max=64,
        help="Worker processes: this one plus N-1 children running the worker role (distributed broker only).",
    ),
) -> None:
    """Run aivedio's process roles until SIGTERM or Ctrl-C, then shut down cleanly."""
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.worker import processes as worker_processes
    from aivedio_engine.worker import runtime

    try:
        roles = runtime.parse_roles(role)
        queue_set = runtime.parse_queues(queues)
    except ValueError as exc:
        fail(str(exc), ExitCode.USAGE)
    cli = state(ctx)
    settings = cli.settings()
    if processes > 1 and ("worker" not in roles or settings.broker.kind == "stub"):
        fail(
            "--processes needs the worker role and a distributed broker (broker.kind = rabbitmq or redis): the "
            "in-process broker cannot share messages between processes",
            ExitCode.USAGE,
        )
    if "api" in roles:
        _check_listen(host or settings.api.host, port or settings.api.port)
    _configure_logging(settings)
    app_ctx = build_context(settings)
    children = None
    try:
        _prepare_database(app_ctx.engine, settings)
        if roles & {"api", "sweeper"}:
            _prepare_storage(app_ctx)
        if processes > 1:
            children = worker_processes.WorkerChildren(
                worker_processes.child_argv(cli.config_path, cli.set_items, queues), processes - 1
            )
            children.start()
        code = runtime.run(
            app_ctx,
            roles,
            threading.Event(),
            api_host=host,
            api_port=port,
            queues=queue_set,
            on_tick=children.watch if children is not None else None,
        )
    finally:
        if children is not None and children.stop():
            code = 1
        app_ctx.close()
    if code:
        raise typer.Exit(code)


def _check_listen(host: str, port: int) -> None:
    """Fail in one line before anything starts when the API could not listen (port taken, address not ours):
    found later, in the API's thread, it was a traceback from deep inside the HTTP server."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, OverflowError) as exc:
        fail(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}", ExitCode.USAGE, "bad_address")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server sets it: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            fail(
                f"cannot listen on {host}:{port}: {'the port is already in use' if busy else exc.strerror or exc}",
                ExitCode.FAILED,
                "port_in_use" if busy else "cannot_listen",
            )


def _prepare_database(engine: Engine, settings: Settings) -> None:
    """Embedded: create the SQLite schema (one command must just work). PostgreSQL: refuse an outdated schema."""
    from aivedio_engine.db import migrate

    if not settings.is_postgres:
        migrate.upgrade(engine)
        return
    behind = [s.name for s in migrate.status(engine) if s.state in (migrate.PENDING, migrate.CHECKSUM_MISMATCH)]
    if behind:
        fail(f"database schema is not up to date ({', '.join(behind)}): run `aivedio db upgrade` first")


def _prepare_storage(app_ctx: AppContext) -> None:
    """S3: the bucket rule that aborts multipart uploads abandoned for a day (U23's backstop for uploads whose
    session row is gone). Idempotent, merged with the operator's rules; a bucket policy that forbids it costs
    only storage, so it is a warning, not a refusal to start."""
    ensure = getattr(app_ctx.storage, "ensure_multipart_lifecycle", None)
    if ensure is None:
        return
    try:
        ensure()
    except Exception as exc:  # noqa: BLE001 - see docstring
        logging.getLogger("aivedio.serve").warning(
            "could not set the bucket rule that aborts abandoned multipart uploads: %s", type(exc).__name__
        )


def _configure_logging(settings: Settings) -> None:
    from aivedio_engine.observability.logging import configure_logging

    configure_logging(settings)
