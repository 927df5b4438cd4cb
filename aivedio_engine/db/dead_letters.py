"""Recording a message Dramatiq gave up on (`worker.dead_letters`): one `dead_letters` row per message id, bumped
when the same message dies again. Replaying them is `db.replay_queries`'."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import dead_letters


def upsert(conn: Connection, row: dict[str, Any]) -> None:
    """Insert the dead letter `row` (all its columns), or, for a message id already recorded, count one more
    death and keep the latest error, traceback and body."""
    insert = dialect_insert(conn)
    stmt = insert(dead_letters).values(**row)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[dead_letters.c.message_id],
            set_={
                "last_seen_at": stmt.excluded.last_seen_at,
                "seen_count": dead_letters.c.seen_count + 1,
                "error": stmt.excluded.error,
                "traceback_tail": stmt.excluded.traceback_tail,
                "message": stmt.excluded.message,
                # dead again after a replay: it needs attention again
                "replayed_at": None,
            },
        )
    )
