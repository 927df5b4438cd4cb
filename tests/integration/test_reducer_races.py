"""Concurrent observations of one job (a callback and a poll racing, 16 reducer threads): the task and then its
attempt are locked before either is read for a decision, so the attempt can never be left behind the task (a
finished task with a RUNNING attempt keeps its slot and is polled forever), and the slot of every finished attempt
comes back. A reducer holding a stale attempt is refused as a whole; an attempt locked before its task is refused."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.providers.base import JobStatus
from aivedio_engine.services import reducer
from aivedio_engine.services.invariants import InvariantService
from tests.support.flow import create_tasks, sim_context
from tests.support.observed import status_envelope
from tests.support.pump import Pump
from tests.support.sim import running_sim

TASKS = 30


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
            for e in (status_envelope(a, JobStatus.RUNNING, 1, now), status_envelope(a, JobStatus.SUCCEEDED, 2, now))
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
        audit = InvariantService(ctx.engine, ctx.clock).run(grace_s=0, only=["I2.4", "I7.4"])
        ctx.close()
    assert errors == []
    # never a task past its provider step with an attempt in flight (nor SUCCEEDED with a RUNNING attempt)
    assert {(r.status, r.submit_state) for r in rows} == {("OUTPUT_FETCHING", "SUCCEEDED")}, rows
    assert {r.id: r.violations for r in audit.results} == {"I2.4": 0, "I7.4": 0}
    assert ctx.slots.counts().get("provider:sim", 0) == 0
    assert len({uuid.UUID(str(a.id)) for a in acked}) == TASKS


@pytest.mark.postgres
def test_a_reducer_holding_a_stale_attempt_is_refused_as_a_whole(tmp_path: Path, pg_url: str) -> None:
    """The half-apply of issue 14: the attempt was read, a concurrent reducer moved it, and the attempt's CAS
    conflict used to be swallowed while the task transition was still applied (a task past its provider step
    with a RUNNING attempt). Now the conflict refuses the whole transaction, and the message is retried."""
    from aivedio_engine.db import attempts, tasks
    from aivedio_engine.db.session import write_tx
    from aivedio_engine.services.after_commit import AfterCommit

    with running_sim(seed=5, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        create_tasks(ctx, 1)
        assert ctx.dispatcher.run_once(max_picks=10) == 1
        Pump(ctx, stop_at_fetch=True).run()
        with ctx.engine.connect() as conn:
            (stale,) = conn.execute(sa.select(task_attempts)).all()
        assert stale.submit_state == "ACKED"
        with write_tx(ctx.engine) as conn:  # the concurrent reducer: RUNNING, committed
            conn.execute(task_attempts.update().values(submit_state="RUNNING"))
        now = ctx.clock.now()
        succeeded = status_envelope(stale, JobStatus.SUCCEEDED, 2, now).payload
        with pytest.raises(attempts.AttemptConflict):
            with write_tx(ctx.engine) as conn:
                task = tasks.read(conn, stale.task_id, lock=True)
                reducer.reduce_locked(conn, stale, task, succeeded, now, 900, AfterCommit(ctx.engine))
        with ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(generation_tasks.c.status, task_attempts.c.submit_state).join(
                    task_attempts, task_attempts.c.task_id == generation_tasks.c.id
                )
            ).all()
        # nothing of it was applied: the retried delivery reads both rows under their locks and applies both
        assert [tuple(r) for r in rows] == [("SUBMITTED", "RUNNING")]
        assert reducer.reduce_observation(ctx.engine, status_envelope(stale, JobStatus.SUCCEEDED, 2, now), now)
        with ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(generation_tasks.c.status, task_attempts.c.submit_state).join(
                    task_attempts, task_attempts.c.task_id == generation_tasks.c.id
                )
            ).all()
        assert [tuple(r) for r in rows] == [("OUTPUT_FETCHING", "SUCCEEDED")]
        ctx.close()


@pytest.mark.postgres
def test_an_attempt_is_never_locked_before_its_task(tmp_path: Path, pg_url: str) -> None:
    """One lock order for the whole engine: the task row, then its attempt (db/lock_order.py)."""
    from aivedio_engine.db import attempts
    from aivedio_engine.db.lock_order import LockOrderViolation
    from aivedio_engine.db.session import write_tx
    from aivedio_engine.services.transition import lock_attempt

    with running_sim(seed=6, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        create_tasks(ctx, 1)
        assert ctx.dispatcher.run_once(max_picks=10) == 1
        with ctx.engine.connect() as conn:
            (attempt,) = conn.execute(sa.select(task_attempts)).all()
        with pytest.raises(LockOrderViolation):
            with write_tx(ctx.engine) as conn:
                attempts.read(conn, attempt.id, lock=True)
        with write_tx(ctx.engine) as conn:
            task, locked = lock_attempt(conn, attempt.id)
            assert (task.id, locked.id) == (attempt.task_id, attempt.id)
        with write_tx(ctx.engine) as conn:  # the note of a lock does not outlive its transaction
            with pytest.raises(LockOrderViolation):
                attempts.read(conn, attempt.id, lock=True)
        ctx.close()
