"""The sweeper: the database is the truth, so anything a lost message or a dead process left behind is found
here and driven on (DESIGN §3). Every scan is idempotent; running two sweepers is safe.

- RETRY_WAIT whose next_retry_at passed → `retry_due` → QUEUED (the dispatcher picks it up).
- DISPATCHING whose NEW attempt was never sent (submit message lost) → the submit event is published again.
- SENDING attempts older than the grace (crash between tx A and tx B) → treated as ambiguous: UNKNOWN.
- Non-terminal tasks past `deadline_at` → EXPIRED, the reservation closed by the billing rule.
- SUBMIT_UNKNOWN → reconciliation; CANCEL_REQUESTED → provider cancel; due polls.
- OUTPUT_FETCHING / POST_PROCESSING untouched for `data_plane_stuck_s` with no request pending (its message
  went to the dead letters, or the worker died holding it) → the fetch or media request is published again.
- Orphan provider events past their TTL → an alert (kept, never silently dropped).
- Upload sessions abandoned for a day → expired (their multipart uploads aborted, staging bytes deleted).
- Slot leases rebuilt from the in-flight attempts.
- Alert rules over live data (seed 004 §17), at most every `alerts.interval_s` (observability.alert_rules).
- The orphan object scan (services.storage_scan) when the last one is `storage_scan_interval_s` old. It lists the
  whole store inline, so it runs last; its failures are logged (and recorded by the scanner when it can),
  never raised: a broken bucket must not stop the repairs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, attempts, outbox, tasks
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import generation_tasks, outbox_events, provider_events, review_items, task_attempts
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import (
    TASK_TERMINAL,
    AlertSeverity,
    AttemptStatus,
    EventSource,
    OutboxStatus,
    ReviewState,
    TaskStatus,
)
from aivedio_engine.domain.transitions import AttemptEvent, Decision, Effect, TaskEvent, Trigger, decide
from aivedio_engine.services import billing
from aivedio_engine.services.sync import ProviderSync
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger("aivedio.sweeper")
_t = generation_tasks.c
_a = task_attempts.c
SENDING_GRACE = timedelta(seconds=60)


@dataclass
class SweepReport:
    retried: int = 0
    resent: int = 0
    ambiguous: int = 0
    expired: int = 0
    reconciled: int = 0
    cancels: int = 0
    polled: int = 0
    orphans_expired: int = 0
    redriven: int = 0
    uploads_expired: int = 0
    alerts: int = 0
    slots: dict[str, Any] = field(default_factory=dict)
    #: counts of the storage scan this sweep ran (empty when none was due)
    storage_scan: dict[str, Any] = field(default_factory=dict)


class Sweeper:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        sync: ProviderSync,
        slot_reconciler: Any = None,
        upload_expirer: Callable[[], int] | None = None,
        alert_evaluator: Callable[[], int] | None = None,
        storage_scan: Callable[[], Any] | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._sync = sync
        self._slot_reconciler = slot_reconciler
        self._upload_expirer = upload_expirer
        self._alert_evaluator = alert_evaluator
        self._storage_scan = storage_scan

    def sweep(self) -> SweepReport:
        r = SweepReport()
        r.expired = self._expire()
        r.retried = self._retry_due()
        r.resent = self._resend_submits()
        r.ambiguous = self._stuck_sending()
        failpoint("sweeper.mid_batch")
        r.reconciled = len(self._sync.reconcile_due())
        r.cancels = self._sync.cancel_due()
        r.polled = self._sync.poll_due()
        r.orphans_expired = self._orphans()
        r.redriven = self._redrive_data_plane()
        if self._upload_expirer is not None:
            r.uploads_expired = self._upload_expirer()
        if self._slot_reconciler is not None:
            r.slots = dict(self._slot_reconciler())
        if self._alert_evaluator is not None:  # last: a failing rule must not keep the repairs above from running
            r.alerts = self._alert_evaluator()
        if self._storage_scan is not None:
            r.storage_scan = self._scan_storage()
        return r

    def _scan_storage(self) -> dict[str, Any]:
        try:
            result = self._storage_scan()  # type: ignore[misc]
        except Exception:  # e.g. the database refused the row; the next interval tries again
            log.exception("storage scan could not be recorded")
            return {"error": "not recorded"}
        if result is None:
            return {}
        return {"objects": result.objects, "orphans": result.orphans, "error": result.error}

    def _ids(self, stmt: sa.Select[Any]) -> list[Any]:
        with self._engine.connect() as conn:
            return [row[0] for row in conn.execute(stmt.limit(500))]

    def _retry_due(self) -> int:
        now = self._clock.now()
        ids = self._ids(sa.select(_t.id).where(_t.status == TaskStatus.RETRY_WAIT.value, _t.next_retry_at <= now))
        return sum(
            self._transition(i, TaskEvent.RETRY_DUE, {"next_retry_at": None, "next_action_at": now}) for i in ids
        )

    def _expire(self) -> int:
        now = self._clock.now()
        terminal = [s.value for s in TASK_TERMINAL]
        ids = self._ids(sa.select(_t.id).where(_t.status.not_in(terminal), _t.deadline_at <= now))
        return sum(self._transition(i, TaskEvent.DEADLINE_PASSED, {"next_action_at": None}) for i in ids)

    def _transition(self, task_id: Any, event: TaskEvent, extra: dict[str, Any]) -> int:
        now = self._clock.now()
        live_job = None
        with write_tx(self._engine) as conn:
            task = tasks.read(conn, task_id, lock=True)
            decision = decide(tasks.snapshot(task), Trigger(event, expected_version=int(task.version)), now)
            if not isinstance(decision, Decision):
                return 0
            tasks.apply(
                conn,
                task_id,
                decision,
                source=EventSource.SWEEPER,
                source_event_id=f"{task_id}:{decision.version}",
                now=now,
                extra=extra,
            )
            billing.close_reservation(conn, task, decision, now, reason=event.value, created_by="sweeper")
            if decision.from_status is TaskStatus.MANUAL_REVIEW:
                _close_review_items(conn, task_id, now)
            if Effect.REQUEST_PROVIDER_CANCEL in decision.effects:
                current = attempts.current(conn, task_id)
                if current is not None and current.provider_job_id:
                    live_job = current
        if live_job is not None:
            # expired with a live job: stop paying for it (best effort, outside the transaction)
            self._sync.cancel_job(live_job)
        return 1

    def _resend_submits(self) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(_a.id, _a.task_id, _t.tenant_id, _t.trace_id, _t.version)
                .join(generation_tasks, _t.id == _a.task_id)
                .where(
                    _t.status == TaskStatus.DISPATCHING.value,
                    _a.submit_state == AttemptStatus.NEW.value,
                    _t.next_action_at <= now,
                )
                .limit(500)
            ).all()
        for row in rows:
            with write_tx(self._engine) as conn:
                outbox.add(
                    conn,
                    EventType.PROVIDER_SUBMIT_REQUESTED,
                    aggregate_type="attempt",
                    aggregate_id=row.id,
                    aggregate_version=int(row.version),
                    tenant_id=row.tenant_id,
                    trace_id=row.trace_id,
                    now=now,
                    payload={"attempt_id": str(row.id), "task_id": str(row.task_id), "resent": True},
                )
                conn.execute(
                    generation_tasks.update().where(_t.id == row.task_id).values(next_action_at=now + SENDING_GRACE)
                )
        return len(rows)

    def _stuck_sending(self) -> int:
        now = self._clock.now()
        ids = self._ids(
            sa.select(_a.id).where(_a.submit_state == AttemptStatus.SENDING.value, _a.updated_at <= now - SENDING_GRACE)
        )
        for attempt_id in ids:
            with write_tx(self._engine) as conn:
                attempt = attempts.read(conn, attempt_id, lock=True)
                if attempt.submit_state != AttemptStatus.SENDING.value:
                    continue
                attempts.transition(conn, attempt, AttemptEvent.SUBMIT_AMBIGUOUS, now, last_error_class="sender_lost")
                task = tasks.read(conn, attempt.task_id, lock=True)
                decision = decide(tasks.snapshot(task), Trigger(TaskEvent.SUBMIT_AMBIGUOUS, int(task.version)), now)
                if isinstance(decision, Decision):
                    tasks.apply(
                        conn,
                        task.id,
                        decision,
                        source=EventSource.SWEEPER,
                        source_event_id=f"{task.id}:{decision.version}",
                        now=now,
                        extra={"next_action_at": now, "last_error_class": "sender_lost"},
                    )
        return len(ids)

    def _redrive_data_plane(self) -> int:
        now = self._clock.now()
        stuck_before = now - timedelta(seconds=self._settings.sweeper.data_plane_stuck_s)
        o = outbox_events.c
        steps = {
            TaskStatus.OUTPUT_FETCHING.value: EventType.FETCH_REQUESTED,
            TaskStatus.POST_PROCESSING.value: EventType.MEDIA_PROCESS_REQUESTED,
        }
        redriven = 0
        for status, event_type in steps.items():
            pending = sa.exists().where(
                o.aggregate_id == _t.id, o.event_type == event_type.value, o.status == OutboxStatus.PENDING.value
            )
            for task_id in self._ids(
                sa.select(_t.id).where(_t.status == status, _t.updated_at <= stuck_before, ~pending)
            ):
                with write_tx(self._engine) as conn:
                    task = tasks.read(conn, task_id, lock=True)
                    if task.status != status:
                        continue
                    payload = self._request_payload(conn, task, event_type)
                    outbox.add(
                        conn,
                        event_type,
                        aggregate_type="task",
                        aggregate_id=task.id,
                        aggregate_version=int(task.version),
                        tenant_id=task.tenant_id,
                        trace_id=task.trace_id,
                        now=now,
                        payload={**payload, "redriven": True},
                    )
                    # the clock restarts, so one stuck task is re-driven once per window, not on every sweep
                    conn.execute(generation_tasks.update().where(_t.id == task.id).values(updated_at=now))
                    redriven += 1
        return redriven

    @staticmethod
    def _request_payload(conn: Any, task: Any, event_type: EventType) -> dict[str, Any]:
        if event_type is EventType.MEDIA_PROCESS_REQUESTED:
            return {"task_id": str(task.id), "asset_id": str(task.output_asset_id)}
        attempt = attempts.current(conn, task.id)
        # no outputs: the fetcher asks the provider for fresh URLs (the old ones may have expired meanwhile)
        return {
            "task_id": str(task.id),
            "attempt_id": str(attempt.id),
            "provider": attempt.provider,
            "job_id": attempt.provider_job_id,
            "outputs": [],
        }

    def _orphans(self) -> int:
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            rows = conn.execute(
                sa.select(provider_events.c.id, provider_events.c.provider, provider_events.c.provider_job_id)
                .where(provider_events.c.orphan, provider_events.c.expires_at <= now)
                .limit(500)
            ).all()
            for row in rows:
                alerts.raise_alert(
                    conn,
                    alerts.Rule.ORPHAN_CALLBACK_EXPIRED,
                    AlertSeverity.WARNING,
                    dedup_key=str(row.id),
                    now=now,
                    subject_type="provider_event",
                    subject_id=str(row.id),
                    message=f"{row.provider} event for unknown job {row.provider_job_id} expired "
                    "unmatched: a job we never recorded may exist (possible orphan cost)",
                )
                conn.execute(
                    provider_events.update()
                    .where(provider_events.c.id == row.id)
                    .values(expires_at=now + timedelta(days=30))
                )
        return len(rows)


def _close_review_items(conn: Any, task_id: Any, now: Any) -> None:
    """An expired task's open review item closes with it: nobody can approve or reject it any more."""
    conn.execute(
        review_items.update()
        .where(
            review_items.c.task_id == task_id,
            review_items.c.state.in_([ReviewState.PENDING.value, ReviewState.CLAIMED.value]),
        )
        .values(
            state=ReviewState.EXPIRED.value,
            decided_by="sweeper",
            decided_at=now,
            note="task expired while waiting for review",
        )
    )
    conn.execute(generation_tasks.update().where(_t.id == task_id).values(review_state=ReviewState.EXPIRED.value))
