"""Waking a sleeping loop the moment a commit gives it work, instead of on its next tick.

`notify(conn, channel)` is called inside the transaction that creates the work; it only notes the channel on
the connection. Once the commit has returned (so a woken loop never looks before the rows exist), the channels
go to the engine's waker:
- PostgreSQL: a per-engine background thread sends `NOTIFY` on its own autocommit connection, coalescing a
  burst of commits into one notification per channel, at most one send per few milliseconds. `pg_notify` inside
  the writing transaction took a cluster-wide lock held through the commit flush
  (docs/decisions/0011-create-path.md); after the commit it costs the writer nothing.
- Embedded mode (SQLite, one process): the channel's `threading.Event` is set.

Channels: OUTBOX wakes the relays (new outbox rows); DISPATCH wakes the dispatcher (a task became ready, or a
slot was freed). A missed wake-up (a process killed between its commit and the NOTIFY) only costs latency:
every loop still runs on its fallback interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

log = logging.getLogger(__name__)

OUTBOX = "aivedio_outbox"
DISPATCH = "aivedio_dispatch"
CHANNELS = (OUTBOX, DISPATCH)
_PENDING = "aivedio_wakeups"
_WAKER = "aivedio_waker"


def notify(conn: Connection, channel: str) -> None:
    """Wake `channel`'s listeners once the caller's transaction has committed."""
    conn.info.setdefault(_PENDING, set()).add(channel)


def committed(engine: Engine, channels: Iterable[str]) -> None:
    """For writers that commit on the driver connection directly (the prepared hot paths): wake as a commit would."""
    waker = engine.dialect.__dict__.get(_WAKER)
    channels = set(channels)
    if waker is not None and channels:
        waker(channels)


def flush_noted(engine: Engine, conn: Connection) -> None:
    """After a commit made on the driver connection (SQLAlchemy saw no commit): wake what the statements noted."""
    committed(engine, conn.info.pop(_PENDING, set()))


def install_commit_hooks(engine: Engine, wake: Callable[[set[str]], None]) -> None:
    """Call `wake(channels)` after each commit that notified them.

    SQLAlchemy's "commit" event fires *before* the DBAPI commit, so a loop woken from it could read the old
    snapshot and miss the rows until its fallback tick. The event only moves the channels to a thread-local;
    the dialect's `do_commit` (a public Dialect method, wrapped on this engine's dialect instance only) wakes
    once the commit has returned, i.e. when the rows are visible to every other connection.
    """
    pending = threading.local()

    @sa.event.listens_for(engine, "commit")
    def _before_commit(conn: Connection) -> None:
        pending.channels = conn.info.pop(_PENDING, set())

    @sa.event.listens_for(engine, "rollback")
    def _after_rollback(conn: Connection) -> None:
        try:
            conn.info.pop(_PENDING, None)
        except sa.exc.InvalidRequestError:
            # the connection died under its transaction (e.g. the backend was terminated): its info goes with it.
            # Raising here would abort SQLAlchemy's close half-way and keep the caller's connection checked out
            # (seen in a chaos run: the scheduler's every pass then failed with PendingRollbackError)
            pass

    dialect = engine.dialect
    do_commit = dialect.do_commit

    def _commit_then_wake(dbapi_connection: Any) -> None:
        channels: set[str]
        channels, pending.channels = getattr(pending, "channels", set()), set()
        do_commit(dbapi_connection)
        if channels:
            wake(channels)

    dialect.do_commit = _commit_then_wake  # type: ignore[method-assign]
    dialect.__dict__[_WAKER] = wake


def wake_events(events: dict[str, threading.Event]) -> Callable[[set[str]], None]:
    """Embedded mode's waker: set each channel's event."""

    def wake(channels: set[str]) -> None:
        for channel in channels:
            event = events.get(channel)
            if event is not None:
                event.set()

    return wake


class PgNotifier:
    """Sends the NOTIFYs of committed transactions from one background thread, coalesced per channel.

    The thread starts on the first wake-up and ends after `idle_s` without one (closing its connection), so an
    engine that is only used briefly leaves nothing running. Under load it sends at most one round trip (every
    channel due, one transaction) per `gap_s`: the API commits a create batch several hundred times a second, and
    one NOTIFY per channel per commit cost the API process a thread switch each, the database a transaction
    each, and every listener a wake-up each, for work the first wake-up already announced."""

    def __init__(self, dsn: str, idle_s: float = 10.0, gap_s: float = 0.005) -> None:
        self._dsn = dsn
        self._idle_s = idle_s
        self._gap_s = gap_s
        self._dirty: set[str] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def __call__(self, channels: set[str]) -> None:
        with self._cond:
            if channels <= self._dirty:  # already due to be sent, and the thread already told: the hot path's case
                return
            self._dirty |= channels
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pg-notify", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        conn: Any = None
        try:
            while True:
                with self._cond:
                    if not self._dirty and not self._cond.wait_for(lambda: self._dirty, timeout=self._idle_s):
                        self._thread = None
                        return
                    channels, self._dirty = self._dirty, set()
                conn = self._send(conn, channels)
                # what commits meanwhile waits for the next send: one wake-up per gap at most, none lost
                time.sleep(self._gap_s)
        finally:
            if conn is not None:
                conn.close()

    def _send(self, conn: Any, channels: set[str]) -> Any:
        import psycopg

        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
            # no parameters: one simple query, one round trip and one transaction for every channel
            conn.execute("; ".join(f"NOTIFY {channel}" for channel in sorted(channels)))
            return conn
        except Exception as exc:  # noqa: BLE001 - a lost wake-up costs latency only; the next one reconnects
            log.warning("NOTIFY %s failed (%s)", ",".join(sorted(channels)), type(exc).__name__)
            if conn is not None:
                conn.close()
            return None


def install_pg_notifier(engine: Engine) -> None:
    url = engine.url.set(drivername="postgresql")
    install_commit_hooks(engine, PgNotifier(url.render_as_string(hide_password=False)))


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
