"""Provider callbacks that failed verification (`services.callbacks`): one `callback_rejections` row per provider,
reason and window, bumped by each further failure; the alert rule reads the windows back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import callback_rejections

_r = callback_rejections.c
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the detail is the verifier's one-line message; the request is unauthenticated, so it is capped
DETAIL_CHARS = 200


def window_start(now: datetime, window_s: float) -> datetime:
    """The start of the fixed window of `window_s` seconds that `now` falls in (windows are aligned to the epoch,
    so every process files a failure under the same window)."""
    offset = (now - _EPOCH).total_seconds()
    return _EPOCH + timedelta(seconds=offset - offset % window_s)


def record(conn: Connection, provider: str, reason: str, detail: str, now: datetime, window_s: float) -> None:
    """Count one failure of `provider`'s callbacks for `reason` in the window of `now`."""
    insert = dialect_insert(conn)
    stmt = insert(callback_rejections).values(
        id=new_id(),
        provider=provider,
        reason=reason,
        window_start=window_start(now, window_s),
        failures=1,
        first_at=now,
        last_at=now,
        detail=detail[:DETAIL_CHARS],
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[_r.provider, _r.reason, _r.window_start],
            set_={"failures": _r.failures + 1, "last_at": stmt.excluded.last_at, "detail": stmt.excluded.detail},
        )
    )


def recent_windows(conn: Connection, since: datetime) -> list[sa.Row[tuple[str, datetime, int, str]]]:
    """Per provider and window starting at or after `since`: the failures and the reasons seen (comma-separated)."""
    reasons = sa.func.string_agg if conn.dialect.name == "postgresql" else sa.func.group_concat
    return list(
        conn.execute(
            sa.select(
                _r.provider,
                _r.window_start,
                sa.func.sum(_r.failures).label("failures"),
                reasons(_r.reason, ",").label("reasons"),
            )
            .where(_r.window_start >= since)
            .group_by(_r.provider, _r.window_start)
            .order_by(_r.provider, _r.window_start)
        )
    )
