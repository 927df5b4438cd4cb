"""The sweeper: the database is the truth, so anything a lost message or a dead process left behind is found
here and driven on. Every scan is idempotent; running two sweepers is safe.

- RETRY_WAIT whose next_retry_at passed → `retry_due` → QUEUED (the dispatcher picks it up).
- DISPATCHING whose NEW attempt was never sent (submit message lost) → the submit event is published again.
- SENDING attempts older than the grace (crash between tx A and tx B) → treated as ambiguous: UNKNOWN.
- Tasks past `deadline_at` whose vendor has not produced an output yet → EXPIRED, the reservation closed by the
  billing rule. A held output (OUTPUT_FETCHING, POST_PROCESSING, MANUAL_REVIEW) is never expired: its steps run on
  their own budgets, and a MANUAL_REVIEW hold on the review SLA (`services.review.enforce_sla`).
- SUBMIT_UNKNOWN → reconciliation; CANCEL_REQUESTED → provider cancel; due polls.
- OUTPUT_FETCHING / POST_PROCESSING untouched for its step's budget (`fetch_stuck_s`, `media_stuck_s`) with no
  request pending (its message went to the dead letters, or the worker died holding it) → the fetch or media
  request is published again.
- A stored provider observation never applied (its message lost) → reduced again from its row; an orphan whose
  job id is bound now → rematched; an ACKED/RUNNING attempt of a task that ended → closed, its slot freed
  (`services.keep_moving`, after `observation_stuck_s`).
- Orphan provider events past their TTL → an alert (kept, never silently dropped).
- Upload sessions abandoned for a day → expired (their multipart uploads aborted, staging bytes deleted); the
  quarantined objects of closed sessions deleted when due (services.quarantine).
- Slot leases rebuilt from the in-flight attempts.
- Alert rules over live data, at most every `alerts.interval_s` (observability.alert_rules).
- The orphan object scan (services.storage_scan) when the last one is `storage_scan_interval_s` old. It lists the
  whole store inline, so it runs last; its failures are logged (and recorded by the scanner when it can),
  never raised: a broken bucket must not stop the repairs.
- One page of orphan garbage collection (services.storage_gc) every `storage_gc_interval_s`, after the scan.
- Retention of tenant data and of the engine's bookkeeping (services.retention) every `retention.interval_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, attempts, sweeps, tasks
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import AlertSeverity, AttemptStatus, EventSource, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, Decision, TaskEvent, Trigger, decide
from aivedio_engine.services import follow_on
from aivedio_engine.services.follow_on import FetchRequested, MediaProcessRequested, SubmitRequested
from aivedio_engine.services.keep_moving import KeepMoving
from aivedio_engine.services.sync import ProviderSync
from aivedio_engine.services.transition import AfterCommit, Change, execute, lock_existing_attempt, move_attempt
from aivedio_engine.slots.base import SlotStoreUnavailable
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger("aivedio.sweeper")
#: rows one scan reads per sweep
_PAGE = 500


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
    #: stored observations reduced again, orphans rematched, attempts of ended tasks closed (keep_moving)
    rereduced: int = 0
    rematched: int = 0
    attempts_closed: int = 0
    uploads_expired: int = 0
    alerts: int = 0
    slots: dict[str, Any] = field(default_factory=dict)
    #: counts of the storage scan this sweep ran (empty when none was due)
    storage_scan: dict[str, Any] = field(default_factory=dict)
    storage_gc: dict[str, Any] = field(default_factory=dict)
    #: quarantined uploads deleted (promoted, rejected past their grace, abandoned)
    quarantine_cleared: int = 0
    #: held tasks the review SLA decided (approved or rejected by `review.on_sla`)
    review_sla_decided: int = 0
    #: what retention deleted this sweep (empty when it was not due)
    retention: dict[str, Any] = field(default_factory=dict)


class Sweeper:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        sync: ProviderSync,
        keep_moving: KeepMoving,
        slot_reconciler: Any = None,
        upload_expirer: Callable[[], int] | None = None,
        alert_evaluator: Callable[[], int] | None = None,
        storage_scan: Callable[[], Any] | None = None,
        storage_gc: Callable[[], Any] | None = None,
        quarantine: Callable[[], int] | None = None,
        retention: Callable[[], Any] | None = None,
        review_sla: Callable[[], Any] | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._sync = sync
        self._slot_reconciler = slot_reconciler
        self._upload_expirer = upload_expirer
        self._alert_evaluator = alert_evaluator
        self._storage_scan = storage_scan
        self._storage_gc = storage_gc
        self._keep_moving = keep_moving
        self._quarantine = quarantine
        self._retention = retention
        self._review_sla = review_sla
        #: a SENDING attempt or an unconsumed submit message idle this long is presumed lost
        self._idle_grace = timedelta(seconds=settings.sweeper.idle_grace_s)

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
        kept = self._keep_moving.sweep()
        r.rereduced, r.rematched, r.attempts_closed = kept.rereduced, kept.rematched, kept.attempts_closed
        r.orphans_expired = self._orphans()
        r.redriven = self._redrive_data_plane()
        if self._review_sla is not None:
            r.review_sla_decided = len(self._review_sla().decided)
        if self._upload_expirer is not None:
            r.uploads_expired = self._upload_expirer()
        if self._quarantine is not None:
            r.quarantine_cleared = self._quarantine()
        if self._slot_reconciler is not None:
            r.slots = self._reconcile_slots()
        if self._alert_evaluator is not None:  # last: a failing rule must not keep the repairs above from running
            r.alerts = self._alert_evaluator()
        if self._storage_scan is not None:
            r.storage_scan = self._scan_storage()
        if self._storage_gc is not None:
            r.storage_gc = self._collect_garbage()
        if self._retention is not None:
            r.retention = self._apply_retention()
        return r

    def _reconcile_slots(self) -> dict[str, Any]:
        try:
            return dict(self._slot_reconciler())
        except SlotStoreUnavailable:  # Redis down: the alerts and scans below still run; the next pass retries
            log.warning("slot store unreachable; slots not reconciled this pass")
            return {"error": "slot store unreachable"}

    def _apply_retention(self) -> dict[str, Any]:
        try:
            result = self._retention()  # type: ignore[misc]
        except Exception:  # the store or the database refused; the next interval tries again
            log.exception("retention failed")
            return {"error": "failed"}
        return {} if result is None else dict(result.to_json())

    def _collect_garbage(self) -> dict[str, Any]:
        try:
            result = self._storage_gc()  # type: ignore[misc]
        except Exception:  # the store or the database refused; the next interval tries again
            log.exception("storage gc failed")
            return {"error": "failed"}
        if result is None:
            return {}
        return {"listed": result.listed, "deleted": result.deleted, "failed": len(result.failed)}

    def _scan_storage(self) -> dict[str, Any]:
        try:
            result = self._storage_scan()  # type: ignore[misc]
        except Exception:  # e.g. the database refused the row; the next interval tries again
            log.exception("storage scan could not be recorded")
            return {"error": "not recorded"}
        if result is None:
            return {}
        return {"objects": result.objects, "orphans": result.orphans, "error": result.error}

    def _retry_due(self) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            ids = sweeps.retry_due(conn, now, _PAGE)
        return sum(
            self._transition(i, TaskEvent.RETRY_DUE, {"next_retry_at": None, "next_action_at": now}) for i in ids
        )

    def _expire(self) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            ids = sweeps.past_deadline(conn, now, _PAGE)
        return sum(self._transition(i, TaskEvent.DEADLINE_PASSED, {"next_action_at": None}) for i in ids)

    def _transition(self, task_id: Any, event: TaskEvent, extra: dict[str, Any]) -> int:
        now = self._clock.now()
        after = AfterCommit(self._engine)
        with write_tx(self._engine) as conn:
            task = tasks.get(conn, task_id, lock=True)
            decision = decide(tasks.snapshot(task), Trigger(event, expected_version=int(task.version)), now)
            if not isinstance(decision, Decision):
                return 0
            change = Change(
                EventSource.SWEEPER,
                columns=extra,
                ledger_reason=event.value,
                created_by="sweeper",
                # expired with a live job: stop paying for it (best effort, after the commit)
                cancel_job=self._sync.cancel_job,
            )
            execute(conn, task, decision, change, now, after)
        after.run()
        return 1

    def _resend_submits(self) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            rows = sweeps.lost_submits(conn, now, _PAGE)
        for row in rows:
            with write_tx(self._engine) as conn:
                message = SubmitRequested(row.id, row.task_id, resent=True)
                follow_on.emit(conn, row, message, version=row.version, now=now)
                tasks.set_columns(conn, row.task_id, next_action_at=now + self._idle_grace)
                failpoint("sweeper.resend.before_commit")
            failpoint("sweeper.resend.after_commit")
        return len(rows)

    def _stuck_sending(self) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            ids = sweeps.stuck_sending(conn, now - self._idle_grace, _PAGE)
        after = AfterCommit(self._engine)
        for attempt_id in ids:
            with write_tx(self._engine) as conn:
                task, attempt = lock_existing_attempt(conn, attempt_id)
                if attempt.submit_state != AttemptStatus.SENDING.value:
                    continue
                error = ErrorOutcome.SENDER_LOST
                move_attempt(
                    conn,
                    attempt,
                    AttemptEvent.SUBMIT_AMBIGUOUS,
                    now,
                    tenant_id=task.tenant_id,
                    after=after,
                    error=error,
                )
                decision = decide(tasks.snapshot(task), Trigger(TaskEvent.SUBMIT_AMBIGUOUS, int(task.version)), now)
                if isinstance(decision, Decision):
                    change = Change(EventSource.SWEEPER, columns={"next_action_at": now}, error=error)
                    execute(conn, task, decision, change, now, after)
                failpoint("sweeper.stuck_sending.before_commit")
            failpoint("sweeper.stuck_sending.after_commit")
        after.run()
        return len(ids)

    def redrive_lost_data_plane(self) -> int:
        """At the start of a process whose broker is in memory (embedded): a fetch or media request a process
        killed hard still held is gone with it, and its task would wait out its step's budget. Every such
        task without a pending request is driven on now (a duplicate of a live process's run is harmless, as
        for any re-drive)."""
        return self._redrive_data_plane(stuck_before=self._clock.now())

    def _redrive_data_plane(self, stuck_before: datetime | None = None) -> int:
        now = self._clock.now()
        cfg = self._settings.sweeper
        steps = {
            TaskStatus.OUTPUT_FETCHING.value: (EventType.FETCH_REQUESTED, cfg.fetch_stuck_s),
            TaskStatus.POST_PROCESSING.value: (EventType.MEDIA_PROCESS_REQUESTED, cfg.media_stuck_s),
        }
        redriven = 0
        for status, (event_type, budget_s) in steps.items():
            idle_since = stuck_before or now - timedelta(seconds=budget_s)
            with self._engine.connect() as conn:
                stuck = sweeps.stuck_in_step(conn, status, event_type.value, idle_since, _PAGE)
            for task_id in stuck:
                with write_tx(self._engine) as conn:
                    task = tasks.get(conn, task_id, lock=True)
                    if task.status != status:
                        continue
                    for request in self._requests(conn, task, event_type):
                        follow_on.emit(conn, task, request, version=int(task.version), now=now)
                    # the clock restarts, so one stuck task is re-driven once per window, not on every sweep
                    tasks.set_columns(conn, task.id, updated_at=now)
                    failpoint("sweeper.redrive.before_commit")
                failpoint("sweeper.redrive.after_commit")
                redriven += 1
        return redriven

    def _requests(self, conn: Any, task: Task, event_type: EventType) -> list[FetchRequested | MediaProcessRequested]:
        if event_type is EventType.MEDIA_PROCESS_REQUESTED:
            output = task.output_asset_id
            if output is None:  # POST_PROCESSING is entered with the output recorded; nothing to redrive without it
                log.warning("task %s is %s without an output asset: not redriven", task.id, task.status)
                return []
            # every output of the job still without its required derivatives (a job of one: that one)
            required = {p.value for p in self._settings.media.required_profiles}
            outputs = asset_rows.raw_outputs(conn, output, self._settings.media.pipeline_version)
            pending = [o.id for o in outputs if not required <= o.ready_profiles] or [output]
            return [MediaProcessRequested(task.id, asset_id, redriven=True) for asset_id in pending]
        # no outputs: the fetcher asks the provider for fresh URLs (the old ones may have expired meanwhile)
        attempt = attempts.current(conn, task.id)
        if attempt is None:  # OUTPUT_FETCHING is entered from an attempt's success; nothing to fetch without one
            log.warning("task %s is %s without an attempt: not redriven", task.id, task.status)
            return []
        return [replace(FetchRequested.of(task.id, attempt), redriven=True)]

    def _orphans(self) -> int:
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            rows = sweeps.expired_orphans(conn, now, _PAGE)
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
                sweeps.extend_orphan(conn, row.id, now + timedelta(days=30))
        return len(rows)
