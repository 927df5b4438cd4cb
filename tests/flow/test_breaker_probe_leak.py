"""A half-open breaker's probe must not wait on an attempt nobody will send (found by a 500-task chaos run: 283
tasks stayed QUEUED for 5+ minutes after the last fault).

A task canceled between dispatch and send leaves its attempt NEW; the submit actor closes it when its message
arrives, but when the broker lost that message nothing did, so it stayed NEW for good. The breaker counts NEW
and SENDING attempts as "the probe is already on its way", so once the breaker went half-open it waited for that
probe forever and the provider got no submit again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.events import EventType
from tests.support.flow import Driver, create_tasks, lose_messages, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def _attempt_states(ctx: Any, task_id: Any) -> list[str]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(sa.select(task_attempts.c.submit_state).where(task_attempts.c.task_id == task_id)).scalars()
        )


def _status(ctx: Any, task_id: Any) -> str:
    with ctx.engine.connect() as conn:
        return str(
            conn.execute(sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)).scalar_one()
        )


def test_a_canceled_tasks_unsent_attempt_does_not_block_the_half_open_probe(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=53, faults="5xx=1", job_seconds=2) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            max_concurrency=20,
            retry={"submit": {"max_attempts": 10, "base_delay_s": 1, "max_delay_s": 1}},
        )
        (lost,) = create_tasks(ctx, 1, prefix="lost")
        assert ctx.dispatcher.run_once(max_picks=1) == 1
        assert lose_messages(ctx, EventType.PROVIDER_SUBMIT_REQUESTED) == 1
        who = next(iter(ctx.tenants.list()))
        ctx.generations.cancel(who.id, lost)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=2)
        create_tasks(ctx, 20)
        drv.round()  # 20 submits, all 5xx: the breaker opens
        for _ in range(10):
            drv.round()
        assert _status(ctx, lost) in ("CANCEL_REQUESTED", "CANCELED")
        sim.set_faults("")
        for _ in range(8):  # past the 30 s cooldown: half-open, one probe, it succeeds, the rest flow
            drv.round()
        drv.run_until(lambda: drv.statuses()["OUTPUT_FETCHING"] == 20)
        assert _status(ctx, lost) == "CANCELED"
        assert _attempt_states(ctx, lost) == ["FAILED_BEFORE_ACCEPT"]  # closed, never sent
        assert len(sim.truth()["jobs"]) == 20
        ctx.close()
