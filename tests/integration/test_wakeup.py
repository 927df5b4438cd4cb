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
