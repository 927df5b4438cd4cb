"""`sweeper.idle_grace_s`: how long a submit may sit unsent (message lost) or half-sent (worker died between the
send and recording the answer) before the sweeper steps in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks, task_attempts, task_state_events
from tests.support.app import FakeClock, make_context, tenant_with_key


def _row(ctx: Any, table: sa.Table) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(table)).one()


def _utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def test_a_sending_attempt_becomes_ambiguous_only_after_the_configured_grace(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", clock=FakeClock(), sweeper={"idle_grace_s": 300})
    try:
        who = tenant_with_key(ctx, "grace", credits=100)
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a heron", "model": "local-v1", "duration_s": 2})
        now = ctx.clock.now()
        assert ctx.dispatcher.run_once() == 1
        # the submit message must be consumed within the grace, else the sweeper publishes it again
        assert _utc(_row(ctx, generation_tasks).next_action_at) == now + timedelta(seconds=300)
        # the worker took the message, marked the attempt SENDING and died before recording the answer
        with ctx.engine.begin() as conn:
            conn.execute(task_attempts.update().values(submit_state="SENDING", updated_at=now, submitted_at=now))
        ctx.clock.advance(120)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().ambiguous == 0  # 120 s: past the old hard-coded 60 s, inside the 300 s grace
        assert _row(ctx, task_attempts).submit_state == "SENDING"
        ctx.clock.advance(181)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().ambiguous == 1
        with ctx.engine.connect() as conn:
            history = list(conn.execute(sa.select(task_state_events.c.to_status)).scalars())
        # ambiguous, then reconciled in the same sweep (the local provider never saw the job)
        assert "SUBMIT_UNKNOWN" in history
        assert _row(ctx, task_attempts).submit_state != "SENDING"
    finally:
        ctx.close()
