"""`aivedio db upgrade|status`: apply and inspect schema migrations (the work is in aivedio_engine.db.migrate)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TypeVar

import typer
from rich.table import Table

from aivedio_cli._context import state
from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_engine.config import Settings, mask_secrets
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.handles import ArgumentError, DBAPIError, Engine

app = typer.Typer(help="Database schema: apply and inspect migrations.", no_args_is_help=True)

T = TypeVar("T")
_STATE_STYLE = {
    migrate.APPLIED: "green",
    migrate.PENDING: "yellow",
    migrate.CHECKSUM_MISMATCH: "bold red",
    migrate.MISSING_FILE: "magenta",
}


@app.command("upgrade")
def upgrade(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Apply pending migrations (PostgreSQL), or create the embedded SQLite schema."""
    settings = state(ctx).settings()
    applied = _with_engine(settings, migrate.upgrade)
    if as_json:
        emit_json({"applied": applied, "database": _where(settings)})
        return
    for name in applied:
        out().print(f"applied {name}")
    if not applied:
        out().print(f"up to date: {_where(settings)}")


@app.command("status")
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every migration as applied, pending, checksum_mismatch or missing_file; exit 1 on a mismatch."""
    settings = state(ctx).settings()
    states = _with_engine(settings, migrate.status)
    if as_json:
        emit_json(
            [
                {
                    "name": s.name,
                    "state": s.state,
                    "sha256": s.sha256,
                    "applied_at": s.applied_at.isoformat() if s.applied_at else None,
                }
                for s in states
            ]
        )
    else:
        table = Table(title=f"migrations — {_where(settings)}")
        for col in ("name", "state", "applied at (UTC)", "sha256"):
            table.add_column(col, no_wrap=True)
        for s in states:
            table.add_row(s.name, f"[{_STATE_STYLE.get(s.state, '')}]{s.state}[/]", _utc(s.applied_at), s.sha256[:10])
        out().print(table)
    bad = [s.name for s in states if s.state == migrate.CHECKSUM_MISMATCH]
    if bad:
        fail(f"checksum mismatch: {', '.join(bad)} changed after being applied")


def _with_engine(settings: Settings, action: Callable[[Engine], T]) -> T:
    with _engine(settings) as engine:
        try:
            return action(engine)
        except migrate.MigrationError as exc:
            fail(str(exc))
        except DBAPIError as exc:
            fail(f"database {_where(settings)}: {_first_line(exc.orig or exc)}")


@contextmanager
def _engine(settings: Settings) -> Iterator[Engine]:
    try:
        engine = make_engine(settings)
    except ArgumentError as exc:
        fail(f"invalid database.url: {exc}", ExitCode.USAGE)
    try:
        yield engine
    finally:
        engine.dispose()


def _utc(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at else ""


def _where(settings: Settings) -> str:
    return str(mask_secrets(settings.database_url))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
