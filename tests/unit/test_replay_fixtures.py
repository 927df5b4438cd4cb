"""Deterministic replay: provider-event streams recorded by a chaos run (`bench/run chaos --save-replay`), kept in
tests/fixtures/replay/, fed through the reducer again in the order the live reducer took them. The reducer must
apply the same transitions, record the same outcome for every observation up to the last one it applied, and
leave the task in the same state: a regression net for every change of the reducer.

Each stream is replayed on a fresh task with one acknowledged attempt (the sim job it was submitted as); only the
job id is rewritten to that attempt's. After its last applied transition the live task went on (fetch, media)
while the replayed one stays where the reducer left it, so later observations are not compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import generation_tasks, task_attempts, task_state_events
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import EventSource
from aivedio_engine.services import reducer
from aivedio_engine.services.consume import Envelope
from tests.support.flow import create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "replay").glob("*.json"))
_PROVIDER_SOURCES = (EventSource.CALLBACK.value, EventSource.POLLING.value)


def _envelope(task_id: Any, obs: dict[str, Any], now: Any) -> Envelope:
    return Envelope(
        event_id=new_id(),
        event_type=EventType.PROVIDER_STATUS_OBSERVED.value,
        schema_version=1,
        aggregate_id=task_id,
        aggregate_version=0,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        occurred_at=now,
        payload=obs,
    )


def test_fixtures_exist() -> None:
    assert len(FIXTURES) >= 3, "tests/fixtures/replay/ lost its recorded streams"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_recorded_stream_replays_to_the_same_states(tmp_path: Path, path: Path) -> None:
    doc = json.loads(path.read_text())
    with running_sim(seed=4, job_seconds=300) as sim:
        ctx = sim_context(tmp_path, sim)
        try:
            (task_id,) = create_tasks(ctx, 1)
            assert ctx.dispatcher.run_once(max_picks=10) == 1
            Pump(ctx, stop_at_fetch=True).run()
            with ctx.engine.connect() as conn:
                attempt = conn.execute(sa.select(task_attempts).where(task_attempts.c.task_id == task_id)).one()
            assert attempt.submit_state == "ACKED"
            for step in doc["steps"]:
                obs = {**step["observation"], "job_id": attempt.provider_job_id}
                reducer.reduce_observation(ctx.engine, _envelope(task_id, obs, ctx.clock.now()), ctx.clock.now())
            with ctx.engine.connect() as conn:
                se = task_state_events.c
                rows = conn.execute(
                    sa.select(se.outcome, se.to_status)
                    .where(se.task_id == task_id, se.source.in_(_PROVIDER_SOURCES))
                    .order_by(se.created_at, se.id)
                ).all()
                status = conn.execute(
                    sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)
                ).scalar_one()
        finally:
            ctx.close()
    live = [s["live_outcome"] for s in doc["steps"]]
    applied = [r.to_status for r in rows if r.outcome == "applied"]
    assert applied == doc["live_applied"]
    assert status == doc["live_applied"][-1]
    last = max(i for i, outcome in enumerate(live) if outcome == "applied")
    assert [r.outcome for r in rows][: last + 1] == live[: last + 1]
