"""Running the whole engine inside one command (`aivedio generate`, `aivedio batch run` without `--api-url`).

First use creates what a fresh machine lacks: the data directory, the schema (embedded: SQLite; PostgreSQL must
already be migrated — that is an operator's decision) and the local tenant with its key. The background roles
(relay, worker, scheduler, sweeper) run as threads of this process until the block ends; tasks left unfinished
stay in the database and continue with the next run or `aivedio serve`.

The block ends the same way whether the task finished or the user pressed Ctrl-C: media children still running
are stopped as interruptions (`media.sandbox.stopping`: their step is retried by the next engine, never failed)
and no new one starts, then the roles shut down in order; messages the in-memory broker still held go back to
the outbox (`worker.undelivered`), so the next run publishes them at once instead of waiting for the sweeper.
A process killed hard hands nothing back; the next one to host the engine drives its fetch and media steps on
as it starts (`Sweeper.redrive_lost_data_plane`) and renders its cut-short `local` jobs again under their ids.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from aivedio_engine.db import migrate
from aivedio_engine.media import sandbox

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.tenants import Principal

BACKGROUND_ROLES = frozenset({"relay", "worker", "scheduler", "sweeper"})


class SchemaOutdated(Exception):
    pass


def prepare(ctx: AppContext) -> Principal:
    """Data dir, schema and local tenant, each created only when missing."""
    Path(ctx.settings.data_dir).mkdir(parents=True, exist_ok=True)
    if ctx.settings.is_postgres:
        behind = [s.name for s in migrate.status(ctx.engine) if s.state != migrate.APPLIED]
        if behind:
            raise SchemaOutdated(
                f"database schema is not up to date ({', '.join(behind)}): run `aivedio db upgrade` first"
            )
    else:
        migrate.upgrade(ctx.engine)
    return ctx.tenants.local_principal()


@contextmanager
def running(ctx: AppContext) -> Iterator[Principal]:
    """The engine's background roles running in this process for the duration of the block."""
    from aivedio_engine.worker.runtime import Runtime

    principal = prepare(ctx)
    runtime = Runtime(ctx, BACKGROUND_ROLES, threading.Event(), kind="embedded")
    runtime.start()
    try:
        yield principal
    finally:
        with sandbox.stopping():
            try:
                runtime.shutdown()
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting for the roles, keep what they held
                runtime.stop.set()
                runtime.hand_back_undelivered()
                runtime.stop_heartbeat()
                raise
    if runtime.failed is not None:
        raise RuntimeError(f"an engine role failed: {runtime.failed}") from runtime.failed
