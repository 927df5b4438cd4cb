"""Commit-time wake-ups (db/wakeup.py): a notify wakes a waiting loop only once its transaction commits, on
PostgreSQL (LISTEN/NOTIFY) and in embedded mode (the commit hook), and a rolled-back notify wakes nobody."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import wakeup
from aivedio_engine.db.engine import make_engine


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> sa.Engine:
    overrides: dict = {"data_dir": str(tmp_path)}
    if request.param == "postgres":
        overrides["database"] = {"url": request.getfixturevalue("pg_url")}
    eng = make_engine(load_settings(None, overrides))
    yield eng
    eng.dispose()


def test_a_committed_notify_wakes_the_waiter_and_a_rollback_does_not(engine: sa.Engine) -> None:
    event = threading.Event()
    if engine.dialect.name != "postgresql":
        wakeup.install_commit_hooks(engine, wakeup.wake_events({wakeup.DISPATCH: event}))
    waiter = wakeup.Waiter(engine, wakeup.DISPATCH, event)
    try:
        assert waiter.wait(0.05) is False  # nothing yet (this also opens the LISTEN connection first)

        class Boom(Exception):
            pass

        with pytest.raises(Boom), engine.begin() as conn:
            wakeup.notify(conn, wakeup.DISPATCH)
            raise Boom
        assert waiter.wait(0.3) is False  # rolled back: nobody was told

        committed = threading.Event()

        def commit_later() -> None:
            with engine.begin() as conn:
                wakeup.notify(conn, wakeup.DISPATCH)
            committed.set()

        threading.Thread(target=commit_later).start()
        assert waiter.wait(10) is True
        assert committed.wait(5)
        assert waiter.wait(0.05) is False  # one notify, one wake-up
    finally:
        waiter.close()


@pytest.mark.postgres
def test_a_connection_whose_backend_was_terminated_is_given_back_cleanly(tmp_path: Path, pg_url: str) -> None:
    """The rollback hook on a connection that died under its transaction (pg_terminate_backend, as a database
    failover does) must let SQLAlchemy finish closing it: before the fix the hook raised PendingRollbackError,
    the close stopped half-way, and a 500-task chaos run's scheduler failed every pass after one such kill."""
    from aivedio_engine.db.handles import OperationalError
    from aivedio_engine.db.session import read_conn

    eng = make_engine(load_settings(None, {"data_dir": str(tmp_path), "database": {"url": pg_url}}))
    assert eng.dialect.name == "postgresql"  # make_engine installed the commit hooks
    try:
        for open_conn in (eng.begin, lambda: read_conn(eng)):
            with pytest.raises(OperationalError), open_conn() as conn:
                pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
                with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as killer:
                    killer.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                conn.execute(sa.text("SELECT 1"))
            assert eng.pool.checkedout() == 0  # nothing kept checked out
            with eng.begin() as conn:  # and the engine works on
                assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        eng.dispose()


@pytest.mark.postgres
def test_a_burst_of_commits_notifies_each_channel_with_sends_spaced_and_none_lost(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of commits a second (the API's create batches) must not cost a NOTIFY per channel per commit:
    the sends are at least `gap_s` apart and each carries every channel noted since the last, in one round trip;
    the last wake-up of the burst is still sent."""
    import time

    import psycopg

    conninfo = pg_url.replace("postgresql+psycopg://", "postgresql://")
    notifier = wakeup.PgNotifier(conninfo, idle_s=1.0, gap_s=0.05)
    sends: list[tuple[float, set[str]]] = []
    real_send = notifier._send

    def recording(conn: object, channels: set[str]) -> object:
        sends.append((time.monotonic(), set(channels)))
        return real_send(conn, channels)

    monkeypatch.setattr(notifier, "_send", recording)
    with psycopg.connect(conninfo, autocommit=True) as listener:
        listener.execute(f"LISTEN {wakeup.OUTBOX}")
        listener.execute(f"LISTEN {wakeup.DISPATCH}")
        began = time.monotonic()
        for i in range(300):
            notifier({wakeup.OUTBOX} if i % 2 else {wakeup.DISPATCH})
            if i % 50 == 0:
                time.sleep(0.01)  # commits spread over a while, not all in one instant
        last_call = time.monotonic()
        notifier({wakeup.DISPATCH})  # the last commit of the burst

        def last_sent() -> bool:
            return any(t >= last_call and wakeup.DISPATCH in channels for t, channels in sends)

        heard = set()
        for note in listener.notifies(timeout=5, stop_after=100):
            heard.add(note.channel)
            if heard == set(wakeup.CHANNELS) and last_sent():
                break
    assert heard == set(wakeup.CHANNELS)
    assert last_sent()  # the burst's last wake-up was sent after it, not dropped as already sent
    gaps = [b[0] - a[0] for a, b in zip(sends, sends[1:], strict=False)]
    assert all(g >= 0.05 for g in gaps), gaps
    assert len(sends) <= (last_call - began) / 0.05 + 2, len(sends)  # 301 wake-ups
