"""Build the app context for one CLI invocation and turn service errors into one-line exits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from aivedio_cli._context import state
from aivedio_cli._render import exit_code_for, fail
from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.services.errors import ServiceError


@contextmanager
def service_context(ctx: typer.Context) -> Iterator[AppContext]:
    from sqlalchemy.exc import OperationalError

    app_ctx = build_context(state(ctx).settings())
    try:
        yield app_ctx
    except ServiceError as exc:
        fail(str(exc), exit_code_for(exc))
    except OperationalError as exc:
        fail(f"database unavailable: {str(exc.orig).strip().splitlines()[0] if exc.orig else exc}")
    finally:
        app_ctx.close()
