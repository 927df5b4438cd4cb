"""The batched reducer (`services.reducer_batch`, the `reduce_provider_statuses` actor): many observations in one
transaction on PostgreSQL, one by one on SQLite, with exactly the effects of reducing them one at a time — a
re-delivery in the same batch applies nothing, a job's RUNNING and SUCCEEDED in one batch both apply in order,
every ended attempt's slot comes back — and an event that fails never holds the others: the batch falls back to
one transaction per event, and the failing event is handed back to be sent again alone."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import sqlalchemy as sa
from dramatiq.brokers.stub import StubBroker

from aivedio_engine.db.tables import generation_tasks, inbox_dedup, task_attempts, task_state_events
from aivedio_engine.domain.events import REDUCE_BATCH, ROUTES, EventType
from aivedio_engine.domain.status import EventSource
from aivedio_engine.observability.metrics import REDUCER_BATCH_FALLBACKS
from aivedio_engine.providers.base import JobStatus
from aivedio_engine.services import reducer_batch
from aivedio_engine.services.consume import DUPLICATE, PROCESSED
from aivedio_engine.worker.actors import declare_actors
from tests.support.flow import create_tasks, sim_context
from tests.support.observed import outbox_row, status_envelope
from tests.support.pump import Pump
from tests.support.sim import running_sim

TASKS = 6


def _acked(ctx: Any) -> list[Any]:
    create_tasks(ctx, TASKS)
    assert ctx.dispatcher.run_once(max_picks=100) == TASKS
    Pump(ctx, stop_at_fetch=True).run()
    with ctx.engine.connect() as conn:
        acked = conn.execute(sa.select(task_attempts).order_by(task_attempts.c.id)).all()
    assert [a.submit_state for a in acked] == ["ACKED"] * TASKS
    return acked


def _state(ctx: Any) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        tasks = conn.execute(
            sa.select(generation_tasks.c.status, task_attempts.c.submit_state).join(
                task_attempts, task_attempts.c.task_id == generation_tasks.c.id
            )
        ).all()
        applied = conn.execute(
            sa.select(task_state_events.c.task_id, task_state_events.c.to_status).where(
                task_state_events.c.outcome == "applied", task_state_events.c.source == EventSource.CALLBACK.value
            )
        ).all()
        inbox = conn.execute(sa.select(sa.func.count()).select_from(inbox_dedup)).scalar_one()
    return {"tasks": sorted(map(tuple, tasks)), "applied": len(applied), "inbox": inbox}


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_batch_has_the_effects_of_its_events_reduced_one_by_one(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    with running_sim(seed=11, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, url)
        acked = _acked(ctx)
        now = ctx.clock.now()
        running = [status_envelope(a, JobStatus.RUNNING, 1, now) for a in acked]
        succeeded = [status_envelope(a, JobStatus.SUCCEEDED, 2, now) for a in acked]
        # the first job's SUCCEEDED before its RUNNING in the list: the batch takes a job's events in their order
        # of arrival, so its RUNNING (sent later) is stale, exactly as one message after the other
        batch = [succeeded[0], *running, running[1], *succeeded[1:]]
        assert ctx.slots.counts().get("provider:sim") == TASKS
        done = reducer_batch.reduce_many(ctx.engine, batch, now, slots=ctx.slots)
        state = _state(ctx)
        again = reducer_batch.reduce_many(ctx.engine, batch, now, slots=ctx.slots)  # the whole message re-delivered
        after_again = _state(ctx)
        ctx.close()
    assert done.together is (backend == "postgresql")
    assert done.failed == [] and again.failed == []
    # running[1] twice: the second is a re-delivery of the same event
    assert done.outcomes == [PROCESSED] * (1 + TASKS) + [DUPLICATE] + [PROCESSED] * (TASKS - 1)
    assert again.outcomes == [DUPLICATE] * len(batch)
    assert state["tasks"] == [("OUTPUT_FETCHING", "SUCCEEDED")] * TASKS
    # every task: RUNNING then OUTPUT_FETCHING applied, except the first, whose RUNNING came after its SUCCEEDED
    assert state["applied"] == 2 * TASKS - 1
    assert state["inbox"] == 2 * TASKS
    assert after_again == state
    assert ctx.slots.counts().get("provider:sim", 0) == 0  # every ended attempt's slot came back


@pytest.mark.postgres
def test_a_failing_event_falls_back_to_one_transaction_each_and_is_handed_back(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=12, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        acked = _acked(ctx)
        now = ctx.clock.now()
        good = [status_envelope(a, JobStatus.RUNNING, 1, now) for a in acked]
        bad = status_envelope(acked[0], JobStatus.SUCCEEDED, 2, now)
        bad.payload["status"] = "EXPLODED"  # no JobStatus: the reducer raises on it, in a batch and alone
        fallbacks = REDUCER_BATCH_FALLBACKS.labels("ValueError")._value.get()
        done = reducer_batch.reduce_many(ctx.engine, [*good[:3], bad, *good[3:]], now, slots=ctx.slots)
        state = _state(ctx)
        with ctx.engine.connect() as conn:
            bad_inbox = conn.execute(
                sa.select(sa.func.count()).select_from(inbox_dedup).where(inbox_dedup.c.event_id == bad.event_id)
            ).scalar_one()
        ctx.close()
    assert done.together is False
    assert REDUCER_BATCH_FALLBACKS.labels("ValueError")._value.get() == fallbacks + 1  # on call sees why
    assert [e.event_id for e, _ in done.failed] == [bad.event_id]
    assert isinstance(done.failed[0][1], ValueError)
    assert done.outcomes == [PROCESSED] * 3 + [None] + [PROCESSED] * (TASKS - 3)
    assert state["tasks"] == [("RUNNING", "RUNNING")] * TASKS  # every good event applied, once
    assert state["applied"] == TASKS and state["inbox"] == TASKS
    assert bad_inbox == 0  # the failed event left nothing: its retry starts from scratch


@pytest.mark.postgres
def test_the_batch_actor_sends_a_failing_event_again_alone(tmp_path: Path, pg_url: str) -> None:
    """The actor's part: an event that failed alone too goes back on the broker as a one-event message (with
    that actor's delay), where it has its own retries and dead letter; the message of the batch succeeds."""
    with running_sim(seed=13, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        acked = _acked(ctx)
        now = ctx.clock.now()
        good = [status_envelope(a, JobStatus.RUNNING, 1, now) for a in acked[:2]]
        bad = status_envelope(acked[2], JobStatus.RUNNING, 1, now)
        bad.payload["status"] = "EXPLODED"
        broker = StubBroker()
        broker.emit_after("process_boot")
        actors = declare_actors(broker, ctx)
        actors[REDUCE_BATCH.actor].fn([good[0].to_dict(), bad.to_dict(), good[1].to_dict(), {"not": "an envelope"}])
        queued = [dramatiq.Message.decode(m) for m in broker.queues[f"{REDUCE_BATCH.queue.value}.DQ"].queue]
        state = _state(ctx)
        ctx.close()
    single = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor
    assert sorted((m.actor_name, str(m.args[0].get("event_id"))) for m in queued) == sorted(
        [(single, "None"), (single, str(bad.event_id))]
    )
    assert all(m.options.get("eta") for m in queued)  # delayed by the one-event actor's min_backoff
    assert state["applied"] == 2 and state["inbox"] == 2


def test_relay_groups_the_reducer_rows_of_a_claim_and_sends_the_others_alone() -> None:
    from aivedio_engine.worker.relay import messages

    observed = [outbox_row(payload={"n": 1}) for _ in range(5)]
    fetch = outbox_row(EventType.FETCH_REQUESTED)
    unroutable = outbox_row(EventType.FETCH_REQUESTED, target="no_such_actor")
    out = messages([observed[0], fetch, *observed[1:], unroutable], reducer_batch=2)
    carried = [[r.id for r in rows] for rows, _ in out]
    kinds = [m.actor_name if isinstance(m, dramatiq.Message) else type(m).__name__ for _, m in out]
    single = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor
    assert kinds == ["fetch_output", REDUCE_BATCH.actor, REDUCE_BATCH.actor, "ValueError", single]
    assert carried == [
        [fetch.id],
        [observed[0].id, observed[1].id],
        [observed[2].id, observed[3].id],
        [unroutable.id],
        [observed[4].id],  # a batch of one goes as the one-event message
    ]
    batch_message = out[1][1]
    assert isinstance(batch_message, dramatiq.Message)
    assert [b["event_id"] for b in batch_message.args[0]] == [str(observed[0].id), str(observed[1].id)]
    assert batch_message.message_id not in {str(r.id) for r in observed}  # never an event's own id
    # reducer_batch = 1: every row alone, as before
    assert [m.actor_name for _, m in messages(observed, reducer_batch=1)] == [single] * 5  # type: ignore[union-attr]


def test_a_dead_batch_message_replays_as_one_outbox_row_per_event(tmp_path: Path) -> None:
    """Replay reads a dead batch message's envelopes: each event goes back to its own outbox row, to the one-event
    actor (the relay groups them again); a message whose list does not parse is refused as a whole."""
    from aivedio_engine.db.tables import dead_letters, outbox_events
    from aivedio_engine.services.operations import Operation
    from aivedio_engine.worker import dead_letters as dead
    from aivedio_engine.worker.relay import messages
    from tests.support.app import make_context

    ctx = make_context(tmp_path / "data")
    now = ctx.clock.now()
    rows = [outbox_row(payload={"provider": "sim", "job_id": f"j{i}"}, created_at=now) for i in range(3)]
    ((_, message),) = messages(rows, reducer_batch=3)
    assert isinstance(message, dramatiq.Message)
    broken = message.copy(args=([{"event_id": "not a uuid"}],), message_id=str(uuid.uuid4()))
    dead.record(ctx.engine, message, now)
    dead.record(ctx.engine, broken, now)
    with ctx.engine.connect() as conn:
        letters = {r.message_id: r.id for r in conn.execute(sa.select(dead_letters)).all()}
    op = Operation("replay dlq", "test", actor="oncall@example")
    done = ctx.replay.replay("dlq", [str(letters[message.message_id]), str(letters[broken.message_id])], op)
    with ctx.engine.connect() as conn:
        outbox = {r.id: r.target for r in conn.execute(sa.select(outbox_events)).all()}
    ctx.close()
    single = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor
    assert outbox == {r.id: single for r in rows}
    assert [d["event_id"] for d in done.done] == [str(r.id) for r in rows]
    assert [f["id"] for f in done.failed] == [str(letters[broken.message_id])]
    assert "invalid envelope" in done.failed[0]["reason"]


def test_the_in_memory_broker_hands_back_each_event_of_an_unfinished_batch_message() -> None:
    """Embedded mode: `Undelivered` counts a batch message's events, not its own id (no outbox row has it)."""
    from aivedio_engine.worker.relay import messages
    from aivedio_engine.worker.undelivered import Undelivered

    rows = [outbox_row() for _ in range(2)]
    ((_, message),) = messages(rows, reducer_batch=2)
    tracker = Undelivered()
    broker = StubBroker()
    tracker.after_enqueue(broker, message, None)
    assert tracker.open_ids() == sorted(str(r.id) for r in rows)
    tracker.after_ack(broker, message)
    assert tracker.open_ids() == []


@pytest.mark.postgres
def test_each_event_of_a_batch_logs_under_its_own_task_id(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an on-call engineer greps for: a line the reducer logs while on an event carries that event's task id,
    in a batch as from the one-event actor."""
    import structlog

    from aivedio_engine.services import reducer

    seen: list[tuple[str, str | None]] = []
    real = reducer.reduce_locked

    def spying(conn: Any, attempt: Any, task: Any, *args: Any, **kw: Any) -> str:
        seen.append((str(task.id), structlog.contextvars.get_contextvars().get("task_id")))
        return real(conn, attempt, task, *args, **kw)

    monkeypatch.setattr(reducer, "reduce_locked", spying)
    with running_sim(seed=14, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        acked = _acked(ctx)
        now = ctx.clock.now()
        running = [status_envelope(a, JobStatus.RUNNING, 1, now) for a in acked]
        done = reducer_batch.reduce_many(ctx.engine, running, now)
        ctx.close()
    assert done.together and len(seen) == TASKS
    assert all(task == logged for task, logged in seen), seen
