"""The repository contract: every function of `aivedio_engine/db/` its callers rely on, run with the same
assertions over SQLite (embedded mode) and PostgreSQL, so the embedded tests keep exercising the production
paths (issue 11, River's driver model). Where the dialects differ by design (row locks, the ledger's
append-only trigger, the database clock), the test says which dialect holds what.

This file covers the transaction-scoped repositories of the task pipeline (tasks, attempts, ledger, outbox,
reviews, alerts, tenants); `test_repositories_ops.py` covers assets, webhooks, heartbeats, local jobs and the
workflow steps' SKIP LOCKED claim.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db import alerts, attempts, balances, ledger, outbox, reviews, tasks, tenants
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.db.tables import (
    alerts as alerts_table,
)
from aivedio_engine.db.tables import (
    api_keys,
    credit_ledger,
    outbox_events,
    review_items,
    task_attempts,
    task_state_events,
)
from aivedio_engine.db.tables import tenant_balance_stripes as stripes
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.status import (
    AlertSeverity,
    AlertStatus,
    AttemptStatus,
    EventSource,
    LedgerEntryType,
    OutboxStatus,
    ReviewState,
    TaskStatus,
)
from aivedio_engine.domain.transitions import AttemptEvent, Decision, Effect, TaskEvent, decide
from tests.chaos.support import T0
from tests.contract.conftest import tenant_and_task
from tests.support.balance import balance_of, nudge_balance


def _postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _count(engine: Engine, table: sa.Table, *where: Any) -> int:
    with read_conn(engine) as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def _decision(conn: sa.Connection, task_id: uuid.UUID, event: TaskEvent) -> Decision:
    d = decide(tasks.snapshot(tasks.read(conn, task_id, lock=True)), event, T0)
    assert isinstance(d, Decision), d
    return d


# --- tasks: CAS transitions and the append-only history -------------------------------------------------------


def test_task_apply_moves_version_and_appends_its_event(engine: Engine) -> None:
    _, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        d = _decision(conn, task, TaskEvent.DISPATCH_CLAIMED)
        assert Effect.NOTIFY in d.effects
        tasks.apply(conn, task, d, source=EventSource.SCHEDULER, source_event_id="claim-1", now=T0)
    with read_conn(engine) as conn:
        row = tasks.read(conn, task)
    assert (row.status, row.version) == (TaskStatus.DISPATCHING.value, 4)
    assert (
        _count(engine, task_state_events, task_state_events.c.task_id == task, task_state_events.c.task_version == 4)
        == 1
    )
    notices = outbox_events.c.aggregate_id == task, outbox_events.c.event_type == EventType.TASK_STATUS_CHANGED.value
    assert _count(engine, outbox_events, *notices) == 1


def test_task_apply_from_a_stale_version_conflicts_and_writes_nothing(engine: Engine) -> None:
    _, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        stale = _decision(conn, task, TaskEvent.DISPATCH_CLAIMED)
        tasks.apply(conn, task, stale, source=EventSource.SCHEDULER, source_event_id="first", now=T0)
    with pytest.raises(tasks.VersionConflict), write_tx(engine) as conn:
        tasks.apply(conn, task, stale, source=EventSource.SCHEDULER, source_event_id="second", now=T0)
    assert _count(engine, task_state_events, task_state_events.c.task_id == task) == 1
    assert _count(engine, outbox_events, outbox_events.c.aggregate_id == task) == 1
    with read_conn(engine) as conn:
        assert tasks.read(conn, task).version == 4


def test_task_read_is_scoped_to_its_tenant(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    with read_conn(engine) as conn:
        assert tasks.read(conn, task, tenant).id == task
        assert tasks.read(conn, task, new_id()) is None
        assert tasks.read(conn, new_id()) is None


def test_small_reads_come_back_as_records_or_none(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        attempt = attempts.create(conn, task_id=task, attempt_no=1, provider="sim", model="m", params={}, now=T0)
        key = attempts.get(conn, attempt).provider_request_key
    with read_conn(engine) as conn:
        assert tasks.status_version(conn, task) == tasks.StatusVersion(TaskStatus.QUEUED.value, 3)
        owner = tasks.tenant_and_trace(conn, task)
        assert owner is not None and owner.tenant_id == tenant
        assert attempts.by_request_key(conn, "sim", key) == attempts.AttemptRef(attempt, task, "NEW")
        assert tasks.status_version(conn, new_id()) is None and tasks.tenant_and_trace(conn, new_id()) is None
        assert attempts.by_request_key(conn, "other", key) is None


def test_task_columns_outside_a_transition_refuse_status_and_errors(engine: Engine) -> None:
    _, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        for forbidden in ({"status": "FAILED_FINAL"}, {"version": 9}, {"last_error_class": "x"}):
            with pytest.raises(ValueError):
                tasks.set_columns(conn, task, **forbidden)
        tasks.set_columns(conn, task, next_action_at=T0 + timedelta(seconds=5))
        tasks.set_error(conn, task, ErrorClass.QUERY_FAILED, "x" * 300, T0)
    with read_conn(engine) as conn:
        row = tasks.read(conn, task)
    assert (row.status, row.version) == (TaskStatus.QUEUED.value, 3)
    assert row.last_error_class == ErrorClass.QUERY_FAILED.value and len(row.last_error_code) == 128


# --- attempts: guarded moves --------------------------------------------------------------------------------


def test_attempt_moves_only_from_the_state_it_was_read_in(engine: Engine) -> None:
    _, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        first = attempts.create(conn, task_id=task, attempt_no=1, provider="sim", model="m", params={}, now=T0)
        tasks.read(conn, task, lock=True)  # the engine's lock order: the task row, then its attempt
        read = attempts.read(conn, first, lock=True)
        moved = attempts.transition(conn, read, AttemptEvent.SEND_STARTED, T0)
        assert moved.to_status is AttemptStatus.SENDING
        with pytest.raises(attempts.AttemptConflict):  # the row it read is NEW no more
            attempts.transition(conn, read, AttemptEvent.SEND_STARTED, T0)
        with pytest.raises(attempts.AttemptConflict):  # no such edge
            attempts.transition(conn, attempts.read(conn, first), AttemptEvent.PROVIDER_RUNNING, T0)
        attempts.transition(conn, attempts.read(conn, first), AttemptEvent.PROVIDER_ACCEPTED, T0, provider_job_id="j1")
        assert attempts.by_job(conn, "sim", "j1", lock=True).id == first
        assert attempts.any_accepted(conn, task)
    with read_conn(engine) as conn:
        row = attempts.read(conn, first)
    assert (row.submit_state, row.provider_request_key) == (AttemptStatus.ACKED.value, attempts.request_key(first))


def test_one_attempt_in_flight_per_task_and_unique_numbers(engine: Engine) -> None:
    _, task = tenant_and_task(engine)

    def create(no: int) -> uuid.UUID:
        return attempts.create(conn, task_id=task, attempt_no=no, provider="sim", model="m", params={}, now=T0)

    with write_tx(engine) as conn:
        first = create(1)
    with pytest.raises(sa.exc.IntegrityError), write_tx(engine) as conn:
        create(2)  # the first is still in flight
    with write_tx(engine) as conn:
        failed = attempts.transition(
            conn, attempts.read(conn, first), AttemptEvent.REJECTED_BEFORE_ACCEPT, T0, error=ErrorClass.LOCAL_INVALID
        )
        assert failed.to_status is AttemptStatus.FAILED_BEFORE_ACCEPT
        second = create(2)
        assert attempts.current(conn, task).id == second
        assert not attempts.any_accepted(conn, task)
    with pytest.raises(sa.exc.IntegrityError), write_tx(engine) as conn:
        attempts.transition(conn, attempts.read(conn, second), AttemptEvent.REJECTED_BEFORE_ACCEPT, T0)
        create(2)  # the number is taken
    assert _count(engine, task_attempts, task_attempts.c.task_id == task) == 2


# --- ledger: idempotent, append-only, never below zero ---------------------------------------------------


def _post(conn: sa.Connection, tenant: uuid.UUID, amount: str, key: str, kind: LedgerEntryType) -> bool:
    return ledger.post(
        conn, tenant_id=tenant, entry_type=kind, amount=Decimal(amount), business_key=key, now=T0, created_by="test"
    )


def _balance(engine: Engine, tenant: uuid.UUID) -> Decimal:
    with read_conn(engine) as conn:
        return balance_of(conn, tenant)


def test_ledger_post_is_idempotent_by_business_key(engine: Engine) -> None:
    tenant, _ = tenant_and_task(engine)
    with write_tx(engine) as conn:
        assert _post(conn, tenant, "10", "adjustment:grant", LedgerEntryType.ADJUSTMENT) is True
    with write_tx(engine) as conn:  # a repeat with another amount is a no-op, not an edit
        assert _post(conn, tenant, "99", "adjustment:grant", LedgerEntryType.ADJUSTMENT) is False
        assert ledger.booked_amounts(conn, ["adjustment:grant", "nope"]) == {"adjustment:grant": Decimal("10")}
    assert _balance(engine, tenant) == Decimal("10")
    assert _count(engine, credit_ledger, credit_ledger.c.tenant_id == tenant) == 1


def test_ledger_reserve_never_takes_the_balance_below_zero(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        _post(conn, tenant, "5", "adjustment:grant", LedgerEntryType.ADJUSTMENT)
    with pytest.raises(ledger.InsufficientBalance) as refused, write_tx(engine) as conn:
        ledger.reserve(conn, tenant_id=tenant, task_id=task, amount=Decimal("6"), now=T0, created_by="test")
    assert (refused.value.balance, refused.value.needed) == (Decimal("5"), Decimal("6"))
    assert _balance(engine, tenant) == Decimal("5")  # the caller rolled back: no RESERVE row either
    assert _count(engine, credit_ledger, credit_ledger.c.entry_type == LedgerEntryType.RESERVE.value) == 0
    with write_tx(engine) as conn:
        ledger.reserve(conn, tenant_id=tenant, task_id=task, amount=Decimal("5"), now=T0, created_by="test")
    assert _balance(engine, tenant) == Decimal("0")
    # a debit past the balance by any other path is refused: by the ledger, and under it by the stripes' CHECK
    with pytest.raises(ledger.InsufficientBalance), write_tx(engine) as conn:
        _post(conn, tenant, "-1", "adjustment:overdraw", LedgerEntryType.ADJUSTMENT)
    with pytest.raises(sa.exc.IntegrityError), write_tx(engine) as conn:
        conn.execute(nudge_balance(tenant, -1))
    assert _balance(engine, tenant) == Decimal("0")


def test_a_short_stripe_draws_on_the_others_and_spreads_the_rest(engine: Engine) -> None:
    """The balance lives in striped rows (db/balances.py): a grant is spread over all of them, a reservation takes
    from its task's stripe, and one its stripe cannot cover takes from the sum and spreads what is left evenly."""
    tenant, task = tenant_and_task(engine)

    def held() -> dict[int, Decimal]:
        with read_conn(engine) as conn:
            rows = conn.execute(sa.select(stripes.c.stripe, stripes.c.balance).where(stripes.c.tenant_id == tenant))
            return {r.stripe: r.balance for r in rows}

    with write_tx(engine) as conn:
        _post(conn, tenant, "640.00000003", "adjustment:grant", LedgerEntryType.ADJUSTMENT)
    granted = held()
    assert sorted(granted) == list(range(balances.STRIPES))
    assert granted[0] == Decimal("10.00000003") and set(granted.values()) == {Decimal("10.00000003"), Decimal(10)}
    mine = balances.stripe_of(task)
    assert mine == task.bytes[15] % balances.STRIPES
    with write_tx(engine) as conn:  # covered by the task's stripe: only that one moves
        ledger.reserve(conn, tenant_id=tenant, task_id=task, amount=Decimal("4"), now=T0, created_by="test")
    assert {k: v for k, v in held().items() if v != granted[k]} == {mine: granted[mine] - 4}
    # 6 left on that stripe: a debit of 7 that lands on it draws on all of them
    key = next(k for i in range(10_000) if balances.stripe_of(key=(k := f"adjustment:take-{i}")) == mine)
    with write_tx(engine) as conn:
        _post(conn, tenant, "-7", key, LedgerEntryType.ADJUSTMENT)
    after = held()
    assert sum(after.values()) == Decimal("629.00000003") == _balance(engine, tenant)
    assert after[0] == Decimal("9.82812503") and set(after.values()) == {Decimal("9.82812503"), Decimal("9.828125")}


def test_ledger_settled_reads_reserved_and_charged(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        _post(conn, tenant, "10", "adjustment:grant", LedgerEntryType.ADJUSTMENT)
        ledger.reserve(conn, tenant_id=tenant, task_id=task, amount=Decimal("5"), now=T0, created_by="test")
        assert ledger.settled(conn, task) is None
        ledger.post(
            conn,
            tenant_id=tenant,
            entry_type=LedgerEntryType.SETTLE,
            amount=Decimal("2"),
            business_key=f"settle:{task}",
            now=T0,
            created_by="test",
            task_id=task,
        )
        assert ledger.settled(conn, task) == (Decimal("5"), Decimal("3"))
    assert _balance(engine, tenant) == Decimal("7")


def test_ledger_rows_are_append_only(engine: Engine) -> None:
    """Both dialects: the repository has no way to change a row (a repeat is a no-op, above). PostgreSQL also
    refuses an UPDATE or DELETE by trigger (migration 0005); the SQLite mirror has no trigger, so there the
    guarantee is the repository's alone."""
    tenant, _ = tenant_and_task(engine)
    with write_tx(engine) as conn:
        _post(conn, tenant, "10", "adjustment:grant", LedgerEntryType.ADJUSTMENT)
    assert not any(hasattr(ledger, name) for name in ("update", "delete", "edit", "remove"))
    if _postgres(engine):
        for stmt in (credit_ledger.update().values(amount=Decimal(1)), credit_ledger.delete()):
            with pytest.raises(sa.exc.DBAPIError, match="append-only"), write_tx(engine) as conn:
                conn.execute(stmt)
    with read_conn(engine) as conn:
        assert conn.execute(sa.select(credit_ledger.c.amount)).scalar_one() == Decimal("10")


# --- outbox ---------------------------------------------------------------------------------------------------


def test_outbox_add_writes_one_pending_row_on_its_route(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    later = T0 + timedelta(seconds=30)
    with write_tx(engine) as conn:
        now_id = outbox.add(conn, EventType.TASK_STATUS_CHANGED, aggregate_type="task", aggregate_id=task,
                            aggregate_version=3, payload={"a": 1}, now=T0, tenant_id=tenant)  # fmt: skip
        outbox.add(conn, EventType.TASK_STATUS_CHANGED, aggregate_type="task", aggregate_id=task,
                   aggregate_version=4, payload={}, now=T0, available_at=later)  # fmt: skip
    with read_conn(engine) as conn:
        row = conn.execute(sa.select(outbox_events).where(outbox_events.c.id == now_id)).one()
        assert outbox.oldest_due(conn, T0) == T0
        assert outbox.oldest_due(conn, T0 - timedelta(seconds=1)) is None
    assert (row.status, row.target, row.payload) == (
        OutboxStatus.PENDING.value,
        ROUTES[EventType.TASK_STATUS_CHANGED].actor,
        {"a": 1},
    )


# --- reviews --------------------------------------------------------------------------------------------------


def test_review_items_one_open_per_task_expiring_with_it(engine: Engine) -> None:
    _, task = tenant_and_task(engine, TaskStatus.MANUAL_REVIEW)
    decided = review_items.c.reason == "decided"
    with write_tx(engine) as conn:
        reviews.open_item(conn, task_id=task, asset_id=None, reason="decided", now=T0)
        conn.execute(review_items.update().where(decided).values(state=ReviewState.APPROVED.value))
        reviews.open_item(conn, task_id=task, asset_id=None, reason="r" * 3000, now=T0)
    with pytest.raises(sa.exc.IntegrityError), write_tx(engine) as conn:
        reviews.open_item(conn, task_id=task, asset_id=None, reason="twice", now=T0)
    with write_tx(engine) as conn:
        reviews.expire_open(conn, task, by="sweeper", note="deadline", now=T0)
    with read_conn(engine) as conn:
        rows = {r.reason[:7]: r for r in conn.execute(sa.select(review_items))}
        assert tasks.read(conn, task).review_state == ReviewState.EXPIRED.value
    assert (rows["decided"].state, rows["rrrrrrr"].state) == (ReviewState.APPROVED.value, ReviewState.EXPIRED.value)
    assert (len(rows["rrrrrrr"].reason), rows["rrrrrrr"].decided_by) == (2000, "sweeper")


# --- alerts ---------------------------------------------------------------------------------------------------


def test_alerts_deduplicate_while_open_and_reopen_after_resolution(engine: Engine) -> None:
    def fire(at: Any) -> None:
        with write_tx(engine) as conn:
            alerts.raise_alert(
                conn, alerts.Rule.QUEUE_BACKLOG, AlertSeverity.WARNING, dedup_key="q", message="m", now=at
            )

    fire(T0)
    fire(T0 + timedelta(minutes=1))
    with read_conn(engine) as conn:
        (only,) = alerts.open_alerts(conn, alerts.Rule.QUEUE_BACKLOG)
        assert alerts.open_alerts(conn, alerts.Rule.COST_ANOMALY) == []
    assert (only.raised_at, only.last_seen_at) == (T0, T0 + timedelta(minutes=1))
    with write_tx(engine) as conn:
        conn.execute(alerts_table.update().values(status=AlertStatus.RESOLVED.value))
    fire(T0 + timedelta(minutes=2))
    assert _count(engine, alerts_table) == 2
    assert _count(engine, alerts_table, alerts_table.c.status == AlertStatus.OPEN.value) == 1


# --- tenants --------------------------------------------------------------------------------------------------


def test_tenant_limits_round_trip_and_refuse_unknown_columns(engine: Engine) -> None:
    tenant, _ = tenant_and_task(engine)
    with write_tx(engine) as conn:
        assert tenants.limits(conn, new_id()) is None
        assert tenants.set_limits(conn, tenant, {"max_concurrency": 3, "rate_limit_per_s": 2.5}, T0) == 1
        with pytest.raises(ValueError, match="not a tenant limit"):
            tenants.set_limits(conn, tenant, {"credit_balance": 1}, T0)
        got = tenants.limits(conn, tenant, lock=True)
        conn.execute(api_keys.insert(), [_key(tenant, revoked) for revoked in (None, T0)])
    assert got is not None and (got.max_concurrency, got.rate_limit_per_s, got.rate_limit_burst) == (3, 2.5, None)
    with read_conn(engine) as conn:
        (summary,) = tenants.summaries(conn)
    assert (summary.id, summary.active_keys, summary.limits) == (tenant, 1, got)


def _key(tenant: uuid.UUID, revoked_at: Any) -> dict[str, Any]:
    return dict(
        id=new_id(), tenant_id=tenant, key_hash=new_id().bytes, prefix="k", created_at=T0, revoked_at=revoked_at
    )
