"""Every task keeps moving from the database's facts alone (issue 14): a stored observation whose message was lost is
reduced again by the sweeper, an attempt an ended task left open is closed and its slot freed, an early callback is
kept as an orphan and replayed when the job id is bound — and the audit's motion invariants (I2.4, I2.5, I7.4,
I10.3) fail on each seeded bad row, raise their alerts, and pass once the sweeper has done its work."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import generation_tasks, provider_events, task_attempts
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import EventSource
from aivedio_engine.providers.base import Accepted, JobStatus, Observation, Output
from aivedio_engine.services import observations
from aivedio_engine.services.invariants import InvariantService
from tests.support.flow import create_tasks, lose_messages, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

MOTION = ["I2.4", "I2.5", "I7.4", "I10.3"]
#: polls far apart, so that only what a test does reaches the reducer
QUIET_POLLS = {"min_interval_s": 600, "max_interval_s": 600, "jitter": 0.0}


def _submitted(tmp_path: Path, sim: Any, pg_url: str, n: int) -> Any:
    ctx = sim_context(tmp_path, sim, pg_url, polling=QUIET_POLLS)
    create_tasks(ctx, n)
    assert ctx.dispatcher.run_once(max_picks=100) == n
    Pump(ctx, stop_at_fetch=True).run()
    return ctx


def _rows(ctx: Any, table: sa.Table, *where: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(table).where(*where).order_by(table.c.id)))


def _violations(ctx: Any, grace_s: float = 0) -> dict[str, int]:
    report = InvariantService(ctx.engine, ctx.clock).run(grace_s=grace_s, only=MOTION)
    return {r.id: r.violations for r in report.results}


def _store(ctx: Any, attempt: Any, status: JobStatus, event_id: str, *, request_key: str | None = None) -> None:
    outputs = (Output(url="https://cdn.example/out.mp4"),) if status is JobStatus.SUCCEEDED else ()
    obs = Observation(
        job_id=attempt.provider_job_id or "job-early",
        status=status,
        outputs=outputs,
        provider_updated_at=ctx.clock.now(),
        event_id=event_id,
        request_key=request_key,
    )
    with write_tx(ctx.engine) as conn:
        assert observations.record(conn, attempt.provider, obs, EventSource.CALLBACK, ctx.clock.now())


def _lose_observed_messages(ctx: Any) -> int:
    return lose_messages(ctx, EventType.PROVIDER_STATUS_OBSERVED)


def test_a_lost_observation_is_reduced_again_from_its_row(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=41, job_seconds=3000) as sim:
        ctx = _submitted(tmp_path, sim, pg_url, 2)
        lost, other = _rows(ctx, task_attempts)
        assert _violations(ctx) == dict.fromkeys(MOTION, 0)  # a clean run

        _store(ctx, lost, JobStatus.SUCCEEDED, "evt-lost")
        assert _lose_observed_messages(ctx) == 1
        assert _violations(ctx)["I10.3"] == 1  # stored, newer than anything applied, never applied

        # within its budget (sweeper.observation_stuck_s = 30 s) the message may still come: nothing is done
        assert ctx.sweeper.sweep().rereduced == 0
        ctx.clock.advance(31)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().rereduced == 1
        assert ctx.sweeper.sweep().rereduced == 0  # classified now: once

        tasks = {r.id: r.status for r in _rows(ctx, generation_tasks)}
        assert (tasks[lost.task_id], tasks[other.task_id]) == ("OUTPUT_FETCHING", "SUBMITTED")
        assert {r.id: r.submit_state for r in _rows(ctx, task_attempts)} == {lost.id: "SUCCEEDED", other.id: "ACKED"}
        assert ctx.slots.counts().get("provider:sim") == 1  # the finished attempt's slot came back
        assert _violations(ctx) == dict.fromkeys(MOTION, 0)
        ctx.close()


def test_an_attempt_left_open_by_an_ended_task_is_closed_and_its_slot_freed(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=42, job_seconds=3000) as sim:
        ctx = _submitted(tmp_path, sim, pg_url, 3)
        expired, succeeded, healthy = _rows(ctx, task_attempts)
        assert ctx.slots.counts().get("provider:sim") == 3
        with write_tx(ctx.engine) as conn:
            # the leak of issue 14: the task took the job's success, its attempt stayed RUNNING
            conn.execute(
                task_attempts.update().where(task_attempts.c.id == succeeded.id).values(submit_state="RUNNING")
            )
            conn.execute(
                generation_tasks.update()
                .where(generation_tasks.c.id == succeeded.task_id)
                .values(status="SUCCEEDED", next_action_at=None)
            )
            conn.execute(
                generation_tasks.update()
                .where(generation_tasks.c.id == expired.task_id)
                .values(deadline_at=ctx.clock.now() - timedelta(seconds=1))
            )
        ctx.clock.advance(1)  # type: ignore[attr-defined]
        assert ctx.sweeper.sweep().expired == 1  # EXPIRED with its job still ACKED: the cancel goes after commit
        bad = _violations(ctx)
        assert (bad["I2.4"], bad["I7.4"]) == (2, 2)

        # left past the alerts' grace (the longest step budget + two sweeps) without the sweeper: both alerted
        ctx.clock.advance(400)  # type: ignore[attr-defined]
        raised = {(f.rule, f.subject_id) for f in ctx.alert_evaluator.evaluate_now()}
        for attempt in (expired, succeeded):
            assert (Rule.ATTEMPT_OPEN_AFTER_TASK_ENDED, str(attempt.id)) in raised
            assert (Rule.SLOT_HELD_NOT_IN_FLIGHT, str(attempt.id)) in raised

        closed = ctx.keep_moving.close_left_attempts(ctx.clock.now())
        assert closed == 2
        states = {r.id: r.submit_state for r in _rows(ctx, task_attempts)}
        assert states == {expired.id: "CANCELED", succeeded.id: "SUCCEEDED", healthy.id: "ACKED"}
        assert ctx.slots.counts().get("provider:sim") == 1  # freed after the commit, not by the reconciler
        assert ctx.sweeper.sweep().attempts_closed == 0
        bad = _violations(ctx)
        assert (bad["I2.4"], bad["I7.4"]) == (0, 0)
        ctx.close()


def test_a_task_with_nothing_in_flight_nothing_due_and_no_alert_is_reported(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=43, job_seconds=3000) as sim:
        ctx = _submitted(tmp_path, sim, pg_url, 2)
        stuck, other = _rows(ctx, task_attempts)
        ctx.clock.advance(60)  # type: ignore[attr-defined]
        assert _violations(ctx, grace_s=30)["I2.5"] == 0  # both are polled (next_poll_at ahead)
        with write_tx(ctx.engine) as conn:
            # nothing scheduled any more: no poll, no action (a lost schedule), and no message in flight
            conn.execute(task_attempts.update().where(task_attempts.c.id == stuck.id).values(next_poll_at=None))
            conn.execute(
                generation_tasks.update().where(generation_tasks.c.id == stuck.task_id).values(next_action_at=None)
            )
        report = InvariantService(ctx.engine, ctx.clock).run(grace_s=30, only=["I2.5"])
        assert report.results[0].violations == 1
        assert report.results[0].rows[0]["task_id"] == stuck.task_id

        # past the alerts' grace without a sweep, each motion invariant's subject is alerted: this task, and a
        # lost observation of the other one
        _store(ctx, other, JobStatus.RUNNING, "evt-lost")
        assert _lose_observed_messages(ctx) == 1
        ctx.clock.advance(400)  # type: ignore[attr-defined]
        raised = {(f.rule, f.subject_id) for f in ctx.alert_evaluator.evaluate_now()}
        (lost,) = _rows(ctx, provider_events)
        assert (Rule.TASK_NOT_MOVING, str(stuck.task_id)) in raised
        assert (Rule.OBSERVATION_UNAPPLIED, str(lost.id)) in raised
        ctx.close()


def test_an_early_callback_is_kept_as_an_orphan_and_replayed_when_the_job_id_is_bound(
    tmp_path: Path, pg_url: str
) -> None:
    """The README: "Early callbacks are kept as orphans and replayed when the job id is recorded." A callback
    that names our request key before the submit's answer is recorded matches an attempt by key, but the reducer
    finds no attempt by its job id: it used to be consumed as `unmatched` and lost."""
    with running_sim(seed=44, job_seconds=3000) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, polling=QUIET_POLLS)
        create_tasks(ctx, 1)
        assert ctx.dispatcher.run_once(max_picks=10) == 1
        (attempt,) = _rows(ctx, task_attempts)
        with write_tx(ctx.engine) as conn:  # tx A committed, the send is under way
            conn.execute(task_attempts.update().where(task_attempts.c.id == attempt.id).values(submit_state="SENDING"))
        _store(ctx, attempt, JobStatus.RUNNING, "evt-early", request_key=attempt.provider_request_key)
        (early,) = _rows(ctx, provider_events)
        assert early.orphan and early.matched_attempt_id is None
        # the same early event, had it reached the reducer (an older build emitted it): an orphan again, not lost
        with write_tx(ctx.engine) as conn:
            conn.execute(provider_events.update().values(orphan=False, matched_attempt_id=attempt.id))
            from aivedio_engine.services import reducer
            from aivedio_engine.services.after_commit import AfterCommit

            digest = reducer.reduce(conn, dict(early.observation), ctx.clock.now(), 900, AfterCommit(ctx.engine))
        assert digest == "unmatched"
        assert _rows(ctx, provider_events)[0].orphan

        ctx.submitter._record(attempt.id, Accepted(job_id="job-early"))  # tx B: binds the job id, rematches
        Pump(ctx, stop_at_fetch=True).run()
        (task,) = _rows(ctx, generation_tasks)
        (event,) = _rows(ctx, provider_events)
        assert task.status == "RUNNING"
        assert (event.orphan, event.matched_attempt_id) == (False, attempt.id)
        assert _violations(ctx) == dict.fromkeys(MOTION, 0)
        ctx.close()
