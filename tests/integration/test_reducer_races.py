"""Concurrent observations of one job (a callback and a poll racing, 16 reducer threads): the attempt is locked
before its task, so the attempt can never be left behind the task (a finished task with a RUNNING attempt keeps
its slot and is polled forever), and the slot of every finished attempt comes back."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import EventSource
from aivedio_engine.providers.base import JobStatus, Observation, Output
from aivedio_engine.services import reducer
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.observations import to_payload
from tests.support.flow import create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

TASKS = 30


def _envelope(attempt: sa.Row, status: JobStatus, at_s: int, now: object) -> Envelope:
    outputs = (Output(url="https://cdn.example/out.mp4"),) if status is JobStatus.SUCCEEDED else ()
    obs = Observation(
        job_id=attempt.provider_job_id,
        status=status,
        outputs=outputs,
        provider_updated_at=attempt.submitted_at + timedelta(seconds=at_s),
        event_id=f"{attempt.provider_job_id}:{status.value}",
    )
    event_id = new_id()
    payload = to_payload(attempt.provider, obs, EventSource.CALLBACK, f"wh:{obs.event_id}", event_id)
    return Envelope(
        event_id=event_id,
        event_type=EventType.PROVIDER_STATUS_OBSERVED.value,
        schema_version=1,
        aggregate_id=attempt.task_id,
        aggregate_version=0,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        occurred_at=now,
        payload=payload,
    )  # type: ignore[arg-type]


@pytest.mark.postgres
def test_racing_running_and_succeeded_never_leave_the_attempt_behind(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=4, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        create_tasks(ctx, TASKS)
        assert ctx.dispatcher.run_once(max_picks=100) == TASKS
        Pump(ctx, stop_at_fetch=True).run()
        with ctx.engine.connect() as conn:
            acked = conn.execute(sa.select(task_attempts).where(task_attempts.c.submit_state == "ACKED")).all()
        assert len(acked) == TASKS and ctx.slots.counts().get("provider:sim") == TASKS
        now = ctx.clock.now()
        work = [
            e
            for a in acked
            for e in (_envelope(a, JobStatus.RUNNING, 1, now), _envelope(a, JobStatus.SUCCEEDED, 2, now))
        ]
        start, lock, errors = threading.Barrier(16), threading.Lock(), []
        take = iter(range(len(work)))

        def run() -> None:
            start.wait()
            while True:
                with lock:
                    i = next(take, None)
                if i is None:
                    return
                try:
                    done = reducer.reduce_observation(ctx.engine, work[i], now)
                    if done.finished_lease is not None:
                        ctx.slots.release(done.finished_lease)
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(repr(exc))

        threads = [threading.Thread(target=run) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        with ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(generation_tasks.c.status, task_attempts.c.submit_state).join(
                    task_attempts, task_attempts.c.task_id == generation_tasks.c.id
                )
            ).all()
        ctx.close()
    assert errors == []
    assert {(r.status, r.submit_state) for r in rows} == {("OUTPUT_FETCHING", "SUCCEEDED")}, rows
    assert ctx.slots.counts().get("provider:sim", 0) == 0
    assert len({uuid.UUID(str(a.id)) for a in acked}) == TASKS
