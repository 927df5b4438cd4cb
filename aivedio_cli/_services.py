"""Build the app context for one CLI invocation and turn service errors into one-line exits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from aivedio_cli._context import state
from aivedio_cli._render import error_type_for, exit_code_for, fail

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.config import Settings


def build_context(settings: Settings) -> AppContext:
    """The engine's wiring, imported when a command runs (tests replace this to inject a clock)."""
    from aivedio_engine.bootstrap import build_context as build

    return build(settings)


def warn_if_no_engine(app_ctx: AppContext) -> None:
    """One line on stderr when the work a command just enqueued has no engine process to carry it out."""
    import sys

    from aivedio_engine.db.handles import SQLAlchemyError
    from aivedio_engine.services.liveness import NO_ENGINE

    try:
        alive = app_ctx.liveness.engine_alive()
    except SQLAlchemyError:  # a schema without heartbeats (not upgraded yet): say nothing rather than guess
        return
    if not alive:
        print(NO_ENGINE, file=sys.stderr)


@contextmanager
def service_context(ctx: typer.Context) -> Iterator[AppContext]:
    # imported here, not at the top: command modules import this one, and completion imports them
    from aivedio_engine.db.handles import OperationalError
    from aivedio_engine.services.errors import ServiceError

    app_ctx = build_context(state(ctx).settings())
    try:
        yield app_ctx
    except ServiceError as exc:
        fail(str(exc), exit_code_for(exc), error_type_for(exc))
    except OperationalError as exc:
        fail(
            f"database unavailable: {str(exc.orig).strip().splitlines()[0] if exc.orig else exc}",
            error_type="database_unavailable",
        )
    finally:
        app_ctx.close()
