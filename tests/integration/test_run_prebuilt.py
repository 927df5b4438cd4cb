"""`db.session.run_prebuilt` on PostgreSQL: a statement built once runs on the driver connection with the values
SQLAlchemy would have bound, and what it writes commits with the caller's transaction, whichever way that was
opened (SQLAlchemy's `begin()`, a connection that has not begun yet, or `pg_transaction`'s explicit BEGIN)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import outbox
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.session import pg_transaction, run_prebuilt
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.events import EventType

pytestmark = pytest.mark.postgres
NOW = datetime(2026, 1, 1, tzinfo=UTC)
_o = outbox_events.c
#: built once, as the hot paths build theirs: a JSONB value (bind-processed) and a plain one
_SET_PAYLOAD = (
    outbox_events.update()
    .where(_o.id == sa.bindparam("row_id"))
    .values(payload=sa.bindparam("v_payload", type_=_o.payload.type), publish_attempts=sa.bindparam("v_attempts"))
    .returning(_o.id)
)


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_url}}))
    yield eng
    eng.dispose()


def _row(engine: sa.Engine) -> uuid.UUID:
    with engine.begin() as conn:
        return outbox.add(
            conn,
            EventType.TASK_STATUS_CHANGED,
            aggregate_type="task",
            aggregate_id=uuid.uuid4(),
            aggregate_version=1,
            payload={"before": True},
            now=NOW,
        )


def _read(engine: sa.Engine, row_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(_o.payload, _o.publish_attempts).where(_o.id == row_id)).one()


def _params(row_id: uuid.UUID, n: int) -> dict[str, Any]:
    return {"row_id": row_id, "v_payload": {"n": n, "nested": {"ok": [1, 2]}, "text": "é"}, "v_attempts": n}


def test_inside_begin_the_driver_runs_it_and_the_commit_keeps_it(engine: sa.Engine) -> None:
    row_id = _row(engine)
    with engine.begin() as conn:
        conn.execute(sa.select(1))  # SQLAlchemy has begun
        cur = run_prebuilt(conn, _SET_PAYLOAD, _params(row_id, 1))
        assert not isinstance(cur, sa.CursorResult)  # the driver's own cursor: SQLAlchemy was bypassed
        assert cur.fetchone()[0] == row_id
    assert tuple(_read(engine, row_id)) == ({"n": 1, "nested": {"ok": [1, 2]}, "text": "é"}, 1)


def test_as_the_first_statement_of_a_connection_it_goes_through_sqlalchemy_and_commits(engine: sa.Engine) -> None:
    row_id = _row(engine)
    with engine.connect() as conn:
        cur = run_prebuilt(conn, _SET_PAYLOAD, _params(row_id, 2))
        # psycopg's implicit BEGIN would have been left for the pool to roll back: SQLAlchemy autobegins instead
        assert isinstance(cur, sa.CursorResult)
        conn.commit()
    assert tuple(_read(engine, row_id)) == ({"n": 2, "nested": {"ok": [1, 2]}, "text": "é"}, 2)


def test_inside_pg_transaction_it_commits_with_the_explicit_commit_and_rolls_back_with_it(engine: sa.Engine) -> None:
    kept, dropped = _row(engine), _row(engine)
    with engine.connect() as conn:
        with pg_transaction(conn) as raw:
            raw.execute("BEGIN")
            run_prebuilt(conn, _SET_PAYLOAD, _params(kept, 3))
            raw.execute("COMMIT")
    with engine.connect() as conn, pytest.raises(RuntimeError):
        with pg_transaction(conn) as raw:
            raw.execute("BEGIN")
            run_prebuilt(conn, _SET_PAYLOAD, _params(dropped, 4))
            raise RuntimeError("the caller fails before its COMMIT")
    assert _read(engine, kept).publish_attempts == 3
    assert tuple(_read(engine, dropped)) == ({"before": True}, 0)
