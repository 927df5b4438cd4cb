"""Waking a sleeping loop the moment a commit gives it work, instead of on its next tick.

`notify(conn, channel)` is called inside the transaction that creates the work. On PostgreSQL it is
`pg_notify`, delivered to LISTENers only when (and if) the transaction commits, so a woken loop never looks
before the rows exist. In embedded mode (SQLite, one process) the channel is noted on the connection and the
channel's `threading.Event` is set once the commit has returned (`install_commit_hooks`).

Channels: OUTBOX wakes the relays (new outbox rows); DISPATCH wakes the dispatcher (a task became ready, or a
slot was freed). A missed wake-up only costs latency: every loop still runs on its fallback interval.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

log = logging.getLogger(__name__)

OUTBOX = "aivedio_outbox"
DISPATCH = "aivedio_dispatch"
_PENDING = "aivedio_wakeups"


def notify(conn: Connection, channel: str) -> None:
    """Wake `channel`'s listeners when the caller's transaction commits."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_notify(:ch, '')"), {"ch": channel})
    else:
        conn.info.setdefault(_PENDING, set()).add(channel)


def install_commit_hooks(engine: Engine, events: dict[str, threading.Event]) -> None:
    """Embedded mode: set `events[channel]` after each commit that notified `channel`.

    SQLAlchemy's "commit" event fires *before* the DBAPI commit, so a loop woken from it could read the old
    snapshot and miss the rows until its fallback tick. The event only moves the channels to a thread-local;
    the dialect's `do_commit` (a public Dialect method, wrapped on this engine's dialect instance only) sets
    the events once the commit has returned, i.e. when the rows are visible to every other connection.
    """
    pending = threading.local()

    @sa.event.listens_for(engine, "commit")
    def _before_commit(conn: Connection) -> None:
        pending.channels = conn.info.pop(_PENDING, set())

    @sa.event.listens_for(engine, "rollback")
    def _after_rollback(conn: Connection) -> None:
        conn.info.pop(_PENDING, None)

    dialect = engine.dialect
    do_commit = dialect.do_commit

    def _commit_then_wake(dbapi_connection: Any) -> None:
        channels: set[str]
        channels, pending.channels = getattr(pending, "channels", set()), set()
        do_commit(dbapi_connection)
        for channel in channels:
            event = events.get(channel)
            if event is not None:
                event.set()

    dialect.do_commit = _commit_then_wake  # type: ignore[method-assign]


class Waiter:
    """Sleep until `channel` is notified or `timeout_s` passes: LISTEN on PostgreSQL, the channel's event in
    embedded mode. A lost LISTEN connection degrades to plain sleeping and reconnects on the next wait."""

    def __init__(self, engine: Engine, channel: str, event: threading.Event | None = None) -> None:
        self._engine = engine
        self._channel = channel
        self._event = event or threading.Event()
        self._listener: Any = None

    def listen(self) -> None:
        """Start listening now (PostgreSQL), before the caller's first look at its table, so a commit racing
        with that look still wakes the next wait."""
        if self._engine.dialect.name == "postgresql" and self._listener is None:
            self._listener = self._listen()

    def wait(self, timeout_s: float) -> bool:
        if self._engine.dialect.name != "postgresql":
            woke = self._event.wait(timeout_s)
            self._event.clear()
            return woke
        self.listen()
        if self._listener is None:
            self._event.wait(timeout_s)
            return False
        try:
            woke = any(True for _ in self._listener.notifies(timeout=timeout_s, stop_after=1))
            for _ in self._listener.notifies(timeout=0):  # one pass answers a burst of commits
                pass
            return woke
        except Exception as exc:  # noqa: BLE001 - fall back to the timeout until it reconnects
            log.warning("LISTEN %s lost (%s); reconnecting", self._channel, type(exc).__name__)
            self.close()
            return False

    def _listen(self) -> Any:
        import psycopg

        url = self._engine.url.set(drivername="postgresql")
        try:
            conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True, connect_timeout=5)
            conn.execute(f"LISTEN {self._channel}")
        except Exception as exc:  # noqa: BLE001 - the fallback interval still drives the loop
            log.warning("LISTEN %s failed (%s); using the fallback interval", self._channel, type(exc).__name__)
            return None
        return conn

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:  # noqa: BLE001
                pass
            self._listener = None
