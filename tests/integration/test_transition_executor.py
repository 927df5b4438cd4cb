"""The transition executor on both dialects: every effect of a decision is carried out in the caller's transaction,
an effect it cannot carry out stops the transition before anything is written, `last_error_class` takes no free
strings, and a finished attempt's slot is freed only once the transaction has committed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db import attempts, tasks
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import (
    credit_ledger,
    generation_tasks,
    outbox_events,
    review_items,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain import admission
from aivedio_engine.domain.retry import ErrorClass, ErrorOutcome
from aivedio_engine.domain.status import EventSource, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, Effect, TaskEvent
from aivedio_engine.services import transition
from aivedio_engine.services.transition import (
    AfterCommit,
    AttemptMove,
    Change,
    FetchOrder,
    ReviewOrder,
    UnhandledEffect,
    VersionConflict,
    decide_and_execute,
)
from tests.chaos.support import insert_tasks, insert_tenant
from tests.support.app import FakeClock, make_context


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    context = make_context(tmp_path / "data", url, clock=FakeClock())
    yield context
    context.close()


def seed(ctx: AppContext, status: TaskStatus, *, reserved: str = "5") -> uuid.UUID:
    with ctx.engine.begin() as conn:
        tenant = insert_tenant(conn)
        [task_id] = insert_tasks(conn, tenant, 1, status=status, version=7)
        conn.execute(
            generation_tasks.update().where(generation_tasks.c.id == task_id).values(reserved_amount=Decimal(reserved))
        )
    return task_id


def add_attempt(
    ctx: AppContext, task_id: uuid.UUID, state: str, *, fence: int | None = 11, attempt_id: uuid.UUID | None = None
) -> Any:
    with ctx.engine.begin() as conn:
        attempt_id = attempts.create(
            conn,
            task_id=task_id,
            attempt_no=1,
            provider="local",
            model="local-v1",
            params={},
            now=ctx.clock.now(),
            fencing_token=fence,
            attempt_id=attempt_id,
        )
        conn.execute(task_attempts.update().where(task_attempts.c.id == attempt_id).values(submit_state=state))
        conn.execute(generation_tasks.update().where(generation_tasks.c.id == task_id).values(current_attempt_no=1))
        return attempts.read(conn, attempt_id)


def rows(ctx: AppContext, table: sa.Table, *where: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(table).where(*where)).all()


def run(ctx: AppContext, task_id: uuid.UUID, event: TaskEvent, change: Change, after: AfterCommit | None = None) -> Any:
    after = after or AfterCommit(ctx.engine)
    with write_tx(ctx.engine) as conn:
        task = tasks.read(conn, task_id, lock=True)
        done = decide_and_execute(conn, task, event, change, ctx.clock.now(), after)
    after.run()
    return done


def test_every_effect_has_exactly_one_handler() -> None:
    assert set(transition._HANDLERS) == set(Effect)


def test_success_writes_the_fetch_request_with_the_transition(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.RUNNING)
    attempt = add_attempt(ctx, task_id, "SUCCEEDED")
    outputs = ({"url": "https://example.test/o.mp4", "index": 0, "expires_at": None},)
    done = run(
        ctx,
        task_id,
        TaskEvent.PROVIDER_SUCCEEDED,
        Change(EventSource.CALLBACK, fetch=FetchOrder(attempt, outputs, urgent_within_s=900)),
    )
    assert done.decision.to_status is TaskStatus.OUTPUT_FETCHING
    task = rows(ctx, generation_tasks, generation_tasks.c.id == task_id)[0]
    assert (task.status, task.version) == ("OUTPUT_FETCHING", 8)
    sent = {r.event_type: r for r in rows(ctx, outbox_events, outbox_events.c.aggregate_id == task_id)}
    assert set(sent) == {"fetch.requested", "task.status.changed"}
    assert sent["fetch.requested"].payload == {
        "task_id": str(task_id),
        "attempt_id": str(attempt.id),
        "provider": "local",
        "job_id": None,
        "outputs": list(outputs),
    }
    assert sent["fetch.requested"].aggregate_version == 8
    [event] = rows(ctx, task_state_events, task_state_events.c.task_id == task_id)
    assert (event.event_type, event.to_status, event.task_version) == ("provider_succeeded", "OUTPUT_FETCHING", 8)


def test_an_effect_it_cannot_carry_out_stops_the_transition_before_any_write(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.RUNNING)
    with pytest.raises(UnhandledEffect, match="request_output_fetch"):
        run(ctx, task_id, TaskEvent.PROVIDER_SUCCEEDED, Change(EventSource.CALLBACK))  # no Change.fetch
    task = rows(ctx, generation_tasks, generation_tasks.c.id == task_id)[0]
    assert (task.status, task.version) == ("RUNNING", 7)
    assert rows(ctx, outbox_events) == [] and rows(ctx, task_state_events) == []


def test_a_decision_effect_without_a_handler_is_an_error(ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    task_id = seed(ctx, TaskStatus.POST_PROCESSING)
    monkeypatch.delitem(transition._HANDLERS, Effect.SETTLE_CREDITS)
    with pytest.raises(UnhandledEffect, match="no handler for settle_credits"):
        run(ctx, task_id, TaskEvent.PLAYABLE_ASSET_READY, Change(EventSource.WORKER, delivered=1))
    assert rows(ctx, credit_ledger) == [] and rows(ctx, task_state_events) == []


def test_a_success_that_does_not_say_what_it_delivered_is_refused_before_any_write(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.POST_PROCESSING)
    with pytest.raises(ValueError, match="how many outputs it delivered"):
        run(ctx, task_id, TaskEvent.PLAYABLE_ASSET_READY, Change(EventSource.WORKER))
    assert rows(ctx, credit_ledger) == [] and rows(ctx, task_state_events) == []


def test_a_closing_edge_books_the_ledger_and_a_typed_error(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.QUEUED)
    change = Change(EventSource.SWEEPER, error=ErrorClass.PROVIDER_REJECTED, error_code="nope", ledger_reason="t")
    done = run(ctx, task_id, TaskEvent.FINAL_FAILURE, change)
    assert done.booked == 0  # nothing was sent: the whole reservation returns
    task = rows(ctx, generation_tasks, generation_tasks.c.id == task_id)[0]
    assert (task.status, task.reserved_amount, task.last_error_class, task.last_error_code) == (
        "FAILED_FINAL",
        0,
        "provider_rejected",
        "nope",
    )
    [entry] = rows(ctx, credit_ledger, credit_ledger.c.task_id == task_id)
    assert (entry.entry_type, entry.amount) == ("RELEASE", Decimal(5))


def test_last_error_class_takes_no_free_strings(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.QUEUED)
    with pytest.raises(ValueError, match="error"):
        run(ctx, task_id, TaskEvent.FINAL_FAILURE, Change(EventSource.SWEEPER, columns={"last_error_class": "oops"}))
    with pytest.raises(TypeError):
        run(ctx, task_id, TaskEvent.FINAL_FAILURE, Change(EventSource.SWEEPER, error="oops"))  # type: ignore[arg-type]
    attempt = add_attempt(ctx, task_id, "NEW")
    with write_tx(ctx.engine) as conn, pytest.raises(TypeError):
        attempts.transition(conn, attempt, AttemptEvent.SEND_STARTED, ctx.clock.now(), last_error_class="x")
    assert rows(ctx, task_state_events) == []


def test_review_item_opens_with_manual_review_and_closes_when_the_task_leaves_it_otherwise(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.POST_PROCESSING)
    run(ctx, task_id, TaskEvent.REVIEW_REQUIRED, Change(EventSource.WORKER, review=ReviewOrder(None, "held")))
    [item] = rows(ctx, review_items, review_items.c.task_id == task_id)
    assert (item.state, item.reason) == ("PENDING", "held")
    assert rows(ctx, generation_tasks)[0].review_state == "PENDING"
    with ctx.engine.begin() as conn:
        conn.execute(generation_tasks.update().values(deadline_at=ctx.clock.now()))
    # the deadline does not govern a held output
    with pytest.raises(VersionConflict, match="no transition from MANUAL_REVIEW on deadline_passed"):
        run(ctx, task_id, TaskEvent.DEADLINE_PASSED, Change(EventSource.SWEEPER, created_by="sweeper"))
    run(ctx, task_id, TaskEvent.FINAL_FAILURE, Change(EventSource.SWEEPER, created_by="sweeper"))
    [item] = rows(ctx, review_items, review_items.c.task_id == task_id)
    assert (item.state, item.decided_by) == ("EXPIRED", "sweeper")
    task = rows(ctx, generation_tasks)[0]
    assert (task.status, task.review_state, task.reserved_amount) == ("FAILED_FINAL", "EXPIRED", 0)


def test_a_finished_attempt_frees_its_slot_only_after_the_commit(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.DISPATCHING)
    with ctx.engine.connect() as conn:
        tenant_id = tasks.read(conn, task_id).tenant_id
    attempt_id = uuid.uuid4()
    chain = [(name, 10) for name in admission.scope_names(str(tenant_id), "local", "local-v1")]
    lease = ctx.slots.acquire(chain, str(attempt_id), 60)
    assert lease is not None
    attempt = add_attempt(ctx, task_id, "SENDING", fence=lease.fence, attempt_id=attempt_id)
    before = ctx.slots.counts().get("provider:local")
    move = AttemptMove(attempt, AttemptEvent.REJECTED_BEFORE_ACCEPT, error=ErrorClass.PROVIDER_REJECTED)

    # rolled back: the slot stays taken
    after = AfterCommit(ctx.engine, ctx.slots)
    with pytest.raises(RuntimeError), write_tx(ctx.engine) as conn:
        task = tasks.read(conn, task_id, lock=True)
        change = Change(EventSource.WORKER, attempt=move, error=ErrorClass.PROVIDER_REJECTED, billed=False)
        decide_and_execute(conn, task, TaskEvent.FINAL_FAILURE, change, ctx.clock.now(), after)
        raise RuntimeError("crash before the commit")
    assert ctx.slots.counts().get("provider:local") == before == 1

    # committed: freed once `after` runs, and only then
    after = AfterCommit(ctx.engine, ctx.slots)
    with write_tx(ctx.engine) as conn:
        task = tasks.read(conn, task_id, lock=True)
        change = Change(EventSource.WORKER, attempt=move, error=ErrorClass.PROVIDER_REJECTED, billed=False)
        decide_and_execute(conn, task, TaskEvent.FINAL_FAILURE, change, ctx.clock.now(), after)
        assert ctx.slots.counts().get("provider:local") == 1
    assert ctx.slots.counts().get("provider:local") == 1
    after.run()
    assert ctx.slots.counts().get("provider:local", 0) == 0
    [row] = rows(ctx, task_attempts, task_attempts.c.id == attempt.id)
    assert (row.submit_state, row.last_error_class) == ("FAILED_BEFORE_ACCEPT", "provider_rejected")


def test_confirmed_not_created_marks_the_attempt_and_schedules_the_retry(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.SUBMIT_UNKNOWN)
    attempt = add_attempt(ctx, task_id, "UNKNOWN")
    with pytest.raises(UnhandledEffect, match="mark_resubmitted_after_unknown"):
        run(ctx, task_id, TaskEvent.CONFIRMED_NOT_CREATED, Change(EventSource.SWEEPER))
    move = AttemptMove(attempt, AttemptEvent.CONFIRMED_NOT_CREATED)
    with pytest.raises(UnhandledEffect, match="schedule_retry"):  # when to retry is the caller's policy
        run(ctx, task_id, TaskEvent.CONFIRMED_NOT_CREATED, Change(EventSource.SWEEPER, attempt=move))
    retry_at = ctx.clock.now()
    change = Change(EventSource.SWEEPER, attempt=move, columns={"next_retry_at": retry_at})
    run(ctx, task_id, TaskEvent.CONFIRMED_NOT_CREATED, change)
    task = rows(ctx, generation_tasks)[0]
    assert task.status == "RETRY_WAIT" and task.next_retry_at == task.next_action_at
    assert task.next_retry_at is not None
    [row] = rows(ctx, task_attempts)
    assert (row.submit_state, row.last_error_class) == ("FAILED_BEFORE_ACCEPT", ErrorOutcome.CONFIRMED_NOT_CREATED)


def test_work_for_after_the_commit_needs_an_after_commit(ctx: AppContext) -> None:
    task_id = seed(ctx, TaskStatus.DISPATCHING)
    attempt = add_attempt(ctx, task_id, "SENDING")
    move = AttemptMove(attempt, AttemptEvent.SUBMIT_AMBIGUOUS, error=ErrorClass.SUBMIT_AMBIGUOUS)
    with write_tx(ctx.engine) as conn, pytest.raises(UnhandledEffect, match="AfterCommit"):
        task = tasks.read(conn, task_id, lock=True)
        decide_and_execute(
            conn, task, TaskEvent.SUBMIT_AMBIGUOUS, Change(EventSource.WORKER, attempt=move), ctx.clock.now()
        )
    assert rows(ctx, task_attempts)[0].submit_state == "SENDING" and rows(ctx, task_state_events) == []
