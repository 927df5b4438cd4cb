"""A lost data-plane message never strands a paid output: the sweeper publishes the fetch or media request again
once the step has been idle for its own budget (`sweeper.fetch_stuck_s`, `media_stuck_s`) with nothing pending."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks, outbox_events
from aivedio_engine.domain.status import OutboxStatus
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

STUCK_S = 120


def _lost(ctx, event_type: str) -> int:  # type: ignore[no-untyped-def]
    """Rows of `event_type` that went out with nothing pending behind them: what a message that exhausted its
    broker retries (or a parked one in the Pump) leaves behind."""
    o = outbox_events.c
    with ctx.engine.connect() as conn:
        pending = conn.execute(
            sa.select(sa.func.count()).where(o.event_type == event_type, o.status == OutboxStatus.PENDING.value)
        ).scalar_one()
        sent = conn.execute(
            sa.select(sa.func.count()).where(o.event_type == event_type, o.status == OutboxStatus.PUBLISHED.value)
        ).scalar_one()
    assert pending == 0
    return int(sent)


def _statuses(ctx) -> set[str]:  # type: ignore[no-untyped-def]
    with ctx.engine.connect() as conn:
        return {r[0] for r in conn.execute(sa.select(generation_tasks.c.status))}


def test_lost_fetch_and_media_requests_are_published_again(tmp_path: Path) -> None:
    with running_sim(seed=31, job_seconds=2) as sim:
        ctx = sim_context(tmp_path, sim, sweeper={"fetch_stuck_s": STUCK_S, "media_stuck_s": STUCK_S})
        create_tasks(ctx, 3)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=3)
        drv.run_until(lambda: _statuses(ctx) == {"OUTPUT_FETCHING"})
        assert _lost(ctx, "fetch.requested") == 3  # parked by the pump: never consumed

        # idle, but not yet long enough: nothing is re-sent
        ctx.clock.advance(STUCK_S - 10)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().redriven == 0
        ctx.clock.advance(20)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().redriven == 3
        assert ctx.sweeper.sweep().redriven == 0  # pending now: one re-send per window, not one per sweep

        # the re-sent requests carry no URLs: the fetcher asks the provider for fresh ones
        queries = sim.state.calls["query"]
        fetcher = Pump(ctx)
        fetcher.held = {"media.process.requested"}
        fetcher.run()
        assert sim.state.calls["query"] >= queries + 3
        assert _statuses(ctx) == {"POST_PROCESSING"}
        assert _lost(ctx, "media.process.requested") == 3  # held back: never consumed

        ctx.clock.advance(STUCK_S + 1)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().redriven == 3
        Pump(ctx).run()
        assert _statuses(ctx) == {"SUCCEEDED"}
        ctx.close()
