"""Talking to providers about jobs we already have: polling, SUBMIT_UNKNOWN reconciliation, cancellation.

Every operation is tx A (read what is due) → the provider call, outside any transaction → tx B (record what
the call proved). Statuses learnt here go through `observations.record`, i.e. the same reducer as callbacks.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, attempts, inbox, provider_sync, tasks
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.records import Attempt
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.polling import (
    LookupVerdict,
    PollPolicy,
    ReconcilePolicy,
    next_poll_at,
    not_created_from,
    reconcile_step,
)
from aivedio_engine.domain.retry import ErrorClass, ErrorOutcome, Step
from aivedio_engine.domain.status import AlertSeverity, AttemptStatus, EventSource, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, TaskEvent
from aivedio_engine.observability.metrics import PROVIDER_POLLS
from aivedio_engine.providers.base import (
    Canceled,
    JobStatus,
    JobSummary,
    NotFound,
    Observation,
    QueryFailed,
    TooLate,
    Unsupported,
)
from aivedio_engine.providers.registry import send_timeout_s
from aivedio_engine.services import late_jobs, observations, query_budget
from aivedio_engine.services.consume import DUPLICATE, Envelope, consume_once
from aivedio_engine.services.follow_on import CancelRequested
from aivedio_engine.services.transition import (
    AfterCommit,
    AttemptMove,
    Change,
    decide_and_execute,
    lock_existing_attempt,
    move_attempt,
)
from aivedio_engine.slots.base import SlotStore
from aivedio_engine.testing.failpoints import failpoint

#: the window listed around an ambiguous send: our clock and the vendor's differ, and a slow vendor may create
#: the job well after the request left (match by time window and request fingerprint)
LIST_BEFORE_SEND = timedelta(seconds=30)
LIST_AFTER_SEND = timedelta(seconds=120)
_POLL_OUTCOME = {Observation: "observed", NotFound: "not_found", QueryFailed: "failed"}
_CANCEL_OUTCOME = {Canceled: "canceled", TooLate: "too_late", Unsupported: "unsupported", QueryFailed: "failed"}
_log = logging.getLogger("aivedio.sync")
LISTED_TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.ABORTED})


class ProviderSync:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        providers: Any,
        rng: random.Random | None = None,
        slots: SlotStore | None = None,
    ) -> None:
        """`slots`: an attempt this ends (confirmed not created, also while its task is being canceled) frees its
        slot after the commit; without it the slot reconciler frees it on its next pass."""
        self._engine = engine
        self._slots = slots
        self._clock = clock
        self._settings = settings
        self._providers = providers
        self._rng = rng or random.Random()
        p = settings.polling
        self._poll = PollPolicy(p.min_interval_s, p.max_interval_s, p.jitter)
        r = settings.reconcile
        self._reconcile = ReconcilePolicy(tuple(r.lookup_after_s), r.park_after_s, r.visibility_lag_s)

    def can_look_up(self, provider: str) -> bool:
        """Whether `provider` finds a job by our request key. Without it a lookup can only list the vendor's jobs
        and match the request (when the vendor lists at all), so an operator's reconcile may decide nothing."""
        adapter = self._providers.get(provider)
        return bool(adapter is not None and adapter.capabilities.supports_lookup_by_request_key)

    # ------------------------------------------------------------------------------------------ polling
    def poll_due(self, limit: int = 100) -> int:
        now = self._clock.now()
        budget = max(1, int(self._settings.polling.provider_query_budget_per_s))
        with self._engine.connect() as conn:
            due = provider_sync.due_polls(conn, now, limit)
        per_provider: dict[str, int] = {}
        polled = 0
        for row in due:
            if per_provider.get(row.provider, 0) >= budget:
                continue  # the provider's query budget for this round is spent; the row stays due
            per_provider[row.provider] = per_provider.get(row.provider, 0) + 1
            self._poll_one(row)
            polled += 1
        return polled

    def _poll_one(self, row: provider_sync.DuePoll) -> None:
        result = self._providers[row.provider].query(row.provider_job_id)
        PROVIDER_POLLS.labels(row.provider, _POLL_OUTCOME.get(type(result), "failed")).inc()
        now = self._clock.now()
        nxt = next_poll_at(
            self._poll,
            submitted_at=row.submitted_at or now,
            now=now,
            rng=self._rng,
            url_expires_at=row.output_url_expires_at,
            cancel_pending=row.task_status == TaskStatus.CANCEL_REQUESTED.value,
        )
        values: dict[str, Any] = {"next_poll_at": nxt}
        failed = None
        if isinstance(result, QueryFailed):  # changes nothing but the schedule, within [retry.query]
            failed = query_budget.after_failure(
                self._poll,
                self._settings.retry.budget(Step.QUERY),
                row.provider_error_code,
                submitted_at=row.submitted_at,
                deadline_at=row.deadline_at,
                now=now,
                rng=self._rng,
            )
            values.update(next_poll_at=failed.next_poll_at, provider_error_code=failed.code)
        elif query_budget.streak_of(row.provider_error_code) is not None:
            values["provider_error_code"] = None  # it answered: the streak of failures is over
        with write_tx(self._engine) as conn:
            if isinstance(result, Observation):
                observations.record(conn, row.provider, result, EventSource.POLLING, now)
            # NotFound on a fresh job id means "not visible yet"
            provider_sync.record_poll(conn, row.id, **values)
            if failed is not None and failed.spent:
                query_budget.alert_spent(conn, row, failed, now)
            failpoint("poll.before_commit")
        failpoint("poll.after_commit")

    # ------------------------------------------------------------------------------------ reconciliation
    def reconcile_due(self, limit: int = 100, task_id: uuid.UUID | None = None) -> list[tuple[uuid.UUID, str]]:
        """Resolve ambiguous submits whose next lookup is due; returns (task id, outcome) per attempt looked at."""
        now = self._clock.now()
        with self._engine.connect() as conn:
            rows = provider_sync.due_lookups(conn, now, limit, task_id)
        return [(r.task_id, self.reconcile_one(r.attempt_id)) for r in rows]

    def reconcile_one(self, attempt_id: uuid.UUID, *, force: bool = False) -> str:
        """One reconciliation step. `force` (an operator's `aivedio reconcile`) asks the provider now, whatever
        the lookup schedule or the park window says; what the answer proves is then handled as usual."""
        with self._engine.connect() as conn:
            attempt = attempts.read(conn, attempt_id)
        if attempt is None or attempt.submit_state != AttemptStatus.UNKNOWN.value:
            return "not-unknown"
        now = self._clock.now()
        verdict, wait_until = self._step(attempt, now)
        if force and verdict in (LookupVerdict.WAIT, LookupVerdict.PARK):
            verdict = LookupVerdict.LOOK_UP
        if verdict is LookupVerdict.PARK and int(attempt.lookup_count) == 0:
            # never park what nobody asked about: when the reconciler itself was down past the window (a chaos run's
            # scheduler failed every pass for minutes), one lookup first — it usually finds the job
            verdict = LookupVerdict.LOOK_UP
        if verdict is LookupVerdict.WAIT:
            self._set_next_action(attempt.task_id, wait_until)
            return "waiting"
        if verdict is LookupVerdict.PARK:
            return self._park(attempt, now)
        if verdict is LookupVerdict.CONFIRMED_NOT_CREATED:
            return self._not_created(attempt, now)
        provider = self._providers[attempt.provider]
        found = provider.find(attempt.provider_request_key)
        now = self._clock.now()
        if isinstance(found, Observation):
            return self._found(attempt, found, now)
        with write_tx(self._engine) as conn:
            provider_sync.count_lookup(conn, attempt.id, now, not_found=isinstance(found, NotFound))
        if isinstance(found, Unsupported):
            return self._without_lookup(attempt, now)
        with self._engine.connect() as conn:
            attempt = attempts.get(conn, attempt_id)
        verdict, wait_until = self._step(attempt, now)
        if verdict is LookupVerdict.CONFIRMED_NOT_CREATED:
            return self._not_created(attempt, now)
        self._set_next_action(attempt.task_id, wait_until or now + timedelta(seconds=10))
        return "not-found-yet" if isinstance(found, NotFound) else "lookup-failed"

    # ------------------------------------------------------------------- an operator's word on one ambiguous submit
    def send_bound_s(self, provider: str) -> float:
        """How long after its SENDING claim a request to `provider` may still reach the vendor: a send is refused
        once `[retry.submit] send_deadline_s` has passed since the claim, and one started just before may take
        the adapter's HTTP timeouts end to end (a pooled connection, connect, write the body, read the answer)."""
        cfg = self._settings.providers.get(provider)
        timeout = send_timeout_s(cfg.adapter) if cfg is not None else 0.0
        return self._settings.retry.submit.send_deadline_s + timeout

    def not_created_from(self, provider: str, sent_at: datetime) -> datetime:
        """The earliest moment "the vendor has no such job" can be believed of a send claimed at `sent_at`."""
        return not_created_from(self._reconcile, sent_at, self.send_bound_s(provider))

    def ask_job(self, provider: str, job_id: str) -> Observation | NotFound | QueryFailed:
        return self._providers[provider].query(job_id)

    def look_up(self, attempt: Attempt) -> Observation | NotFound | Unsupported | QueryFailed:
        return self._providers[attempt.provider].find(attempt.provider_request_key)

    def bind_job(self, attempt_id: uuid.UUID, obs: Observation) -> str:
        """Bind the job `obs` describes to this UNKNOWN attempt, exactly as a lookup that found it does."""
        attempt = self._reread_id(attempt_id)
        if attempt is None or attempt.submit_state != AttemptStatus.UNKNOWN.value:
            return "not-unknown"
        return self._found(attempt, obs, self._clock.now())

    def declare_not_created(self, attempt_id: uuid.UUID) -> str:
        """Close this UNKNOWN attempt as never created, exactly as a lookup that proved it does."""
        attempt = self._reread_id(attempt_id)
        if attempt is None or attempt.submit_state != AttemptStatus.UNKNOWN.value:
            return "not-unknown"
        return self._not_created(attempt, self._clock.now())

    def _reread_id(self, attempt_id: uuid.UUID) -> Attempt | None:
        with self._engine.connect() as conn:
            return attempts.read(conn, attempt_id)

    def _step(self, attempt: Attempt, now: datetime) -> tuple[LookupVerdict, datetime | None]:
        return reconcile_step(
            self._reconcile,
            sent_at=attempt.submitted_at or attempt.created_at,
            now=now,
            lookups_done=int(attempt.lookup_count),
            last_lookup_at=attempt.last_lookup_at,
            last_not_found_at=attempt.last_not_found_at,
            send_bound_s=self.send_bound_s(attempt.provider),
        )

    def _found(self, attempt: Attempt, obs: Observation, now: datetime) -> str:
        after = AfterCommit(self._engine, self._slots)
        with write_tx(self._engine) as conn:
            task, fresh = lock_existing_attempt(conn, attempt.id)
            if fresh.submit_state != AttemptStatus.UNKNOWN.value:
                return "already-resolved"
            move = AttemptMove(
                fresh,
                AttemptEvent.PROVIDER_JOB_FOUND,
                {
                    "provider_job_id": obs.job_id,
                    "lookup_count": fresh.lookup_count + 1,
                    "last_lookup_at": now,
                    "next_poll_at": next_poll_at(
                        self._poll, submitted_at=fresh.submitted_at or now, now=now, rng=self._rng
                    ),
                },
            )
            if task.status == TaskStatus.SUBMIT_UNKNOWN.value:
                change = self._change({"job_id": obs.job_id}, columns={"next_action_at": None}, attempt=move)
                decide_and_execute(conn, task, TaskEvent.PROVIDER_JOB_FOUND, change, now, after)
            else:
                move_attempt(conn, fresh, move.event, now, tenant_id=task.tenant_id, after=after, **move.values)
            observations.rematch(conn, fresh.provider, obs.job_id, fresh.id, now)
            observations.record(conn, fresh.provider, obs, EventSource.POLLING, now)
            failpoint("reconcile.before_commit")
        failpoint("reconcile.after_commit")
        after.run()
        return "found"

    def _not_created(self, attempt: Attempt, now: datetime) -> str:
        after = AfterCommit(self._engine, self._slots)
        with write_tx(self._engine) as conn:
            task, fresh = lock_existing_attempt(conn, attempt.id)
            if fresh.submit_state != AttemptStatus.UNKNOWN.value:
                return "already-resolved"
            move = AttemptMove(fresh, AttemptEvent.CONFIRMED_NOT_CREATED, error=ErrorOutcome.CONFIRMED_NOT_CREATED)
            if task.status == TaskStatus.SUBMIT_UNKNOWN.value:
                retry = {"next_retry_at": now, "next_action_at": now}
                change = self._change({}, columns=retry, attempt=move)
                decide_and_execute(conn, task, TaskEvent.CONFIRMED_NOT_CREATED, change, now, after)
            elif task.status == TaskStatus.CANCEL_REQUESTED.value:
                change = self._change({"reason": "never created"}, attempt=move, billed=False, ledger_reason="canceled")
                decide_and_execute(conn, task, TaskEvent.CANCEL_CONFIRMED, change, now, after)
            else:
                move_attempt(conn, fresh, move.event, now, tenant_id=task.tenant_id, after=after, error=move.error)
            failpoint("reconcile.before_commit")
        failpoint("reconcile.after_commit")
        after.run()
        return "not-created"

    def _without_lookup(self, attempt: Attempt, now: datetime) -> str:
        """No lookup by request key: list the vendor's jobs around the send and match the request's fingerprint.
        A vendor that cannot list either: wait out the window, then park (or, if configured,
        resubmit with an alert). `reconcile_one` has already counted this round as a lookup."""
        provider = self._providers[attempt.provider]
        list_jobs = getattr(provider, "list_jobs", None)  # optional in the Protocol
        sent_at = attempt.submitted_at or attempt.created_at
        listing = list_jobs(sent_at - LIST_BEFORE_SEND, sent_at + LIST_AFTER_SEND) if list_jobs else Unsupported()
        now = self._clock.now()
        if isinstance(listing, Unsupported):
            return self._wait_then_park(attempt, now)
        if isinstance(listing, QueryFailed):
            return self._next_listing(attempt, now, "lookup-failed")
        return self._match_listing(attempt, provider, listing, sent_at, now)

    def _match_listing(
        self, attempt: Attempt, provider: Any, listing: list[JobSummary], sent_at: datetime, now: datetime
    ) -> str:
        fp = bytes(attempt.request_fingerprint)
        with self._engine.connect() as conn:
            task = tasks.read(conn, attempt.task_id)
            owned = provider_sync.owned_job_ids(conn, attempt.provider, [j.job_id for j in listing])
            # our other requests with the same fingerprint that may have made a listed job nobody owns yet: any
            # send early enough for its job to land in the window, still waiting for (or lacking) its answer
            window = (sent_at - LIST_BEFORE_SEND - LIST_AFTER_SEND, sent_at + LIST_AFTER_SEND)
            rivals = provider_sync.rivals(conn, attempt.id, attempt.provider, fp, window)
        if task is None or attempts.fingerprint(task.params) != fp:
            # stored before fingerprints were the vendor-visible fields: no listed job could ever match it
            return self._wait_then_park(attempt, now)
        free = [j for j in listing if j.job_id not in owned]
        candidates = [j for j in free if j.fingerprint == fp]
        if len(candidates) == 1 and not rivals:
            return self._found_listed(attempt, provider, candidates[0], now)
        if candidates:
            verdict, _ = self._step(self._reread(attempt), now)
            if verdict is not LookupVerdict.PARK and any(r.submit_state == AttemptStatus.SENDING.value for r in rivals):
                return self._next_listing(attempt, now, "ambiguous-listing")  # its answer may claim its job
            return self._park_ambiguous(attempt, candidates, rivals, now)
        if any(j.fingerprint is None for j in free):
            return self._next_listing(attempt, now, "unsure-listing")  # an unreadable job may be ours
        with write_tx(self._engine) as conn:
            attempts.update(conn, attempt.id, last_not_found_at=now)
        if now >= self.not_created_from(attempt.provider, sent_at):
            return self._not_created(attempt, now)
        return self._next_listing(attempt, now, "not-found-yet")

    def _found_listed(self, attempt: Attempt, provider: Any, job: JobSummary, now: datetime) -> str:
        # a summary has no outputs: a finished job is recorded from its full record, never from the listing
        obs = provider.query(job.job_id)
        now = self._clock.now()
        if not isinstance(obs, Observation):
            if job.status in LISTED_TERMINAL:
                return self._next_listing(attempt, now, "lookup-failed")
            obs = Observation(job_id=job.job_id, status=job.status)
        return self._found(attempt, obs, now)

    def _park_ambiguous(
        self, attempt: Attempt, candidates: list[JobSummary], rivals: Sequence[provider_sync.Rival], now: datetime
    ) -> str:
        """Several jobs could be ours: a human decides. Never resubmit here — one of them very likely is ours."""
        ids = sorted(j.job_id for j in candidates)
        reason = (
            f"ambiguous submit to {attempt.provider}: {len(ids)} listed job(s) match the request "
            f"({', '.join(ids[:10])}) and {len(rivals)} other request(s) of ours could own them; "
            "not guessing — a duplicate paid job is possible"
        )
        with write_tx(self._engine) as conn:
            tasks.set_columns(conn, attempt.task_id, parked_reason=reason, next_action_at=None, updated_at=now)
            alerts.raise_alert(
                conn,
                alerts.Rule.AMBIGUOUS_LIST_MATCH,
                AlertSeverity.CRITICAL,
                dedup_key=str(attempt.task_id),
                now=now,
                subject_type="task",
                subject_id=str(attempt.task_id),
                message=reason,
                details={
                    "attempt_id": str(attempt.id),
                    "provider": attempt.provider,
                    "candidate_job_ids": ids,
                    "rival_attempt_ids": [str(r.id) for r in rivals],
                    "request_fingerprint": bytes(attempt.request_fingerprint).hex(),
                },
            )
        return "parked-ambiguous"

    def _next_listing(self, attempt: Attempt, now: datetime, outcome: str) -> str:
        """Come back at the next scheduled lookup; at the end of the window, today's park (or resubmit)."""
        verdict, wait_until = self._step(self._reread(attempt), now)
        if verdict is LookupVerdict.PARK:
            return self._park(attempt, now)
        self._set_next_action(attempt.task_id, wait_until or now + timedelta(seconds=10))
        return outcome

    def _reread(self, attempt: Attempt) -> Attempt:
        """The attempt as it is now (attempts are never deleted: one that vanished is a LookupError)."""
        with self._engine.connect() as conn:
            return attempts.get(conn, attempt.id)

    def _wait_then_park(self, attempt: Attempt, now: datetime) -> str:
        verdict, wait_until = self._step(attempt, now)
        if verdict is not LookupVerdict.PARK:
            park_at = (attempt.submitted_at or attempt.created_at) + timedelta(seconds=self._reconcile.park_after_s)
            self._set_next_action(attempt.task_id, park_at)
            return "waiting-no-lookup"
        return self._park(attempt, now)

    def _park(self, attempt: Attempt, now: datetime) -> str:
        if (
            self._settings.reconcile.resubmit_without_lookup
            and not self._settings.providers[attempt.provider].supports_lookup_by_request_key
        ):
            with write_tx(self._engine) as conn:
                alerts.raise_alert(
                    conn,
                    alerts.Rule.RESUBMIT_WITHOUT_LOOKUP,
                    AlertSeverity.WARNING,
                    dedup_key=str(attempt.id),
                    now=now,
                    subject_type="attempt",
                    subject_id=str(attempt.id),
                    message=f"resubmitting after an ambiguous submit to {attempt.provider}, which "
                    "cannot look jobs up: a duplicate paid job is possible",
                )
            return self._not_created(attempt, now)
        with write_tx(self._engine) as conn:
            reason = f"ambiguous submit to {attempt.provider} unresolved after the reconciliation window"
            tasks.set_columns(conn, attempt.task_id, parked_reason=reason, next_action_at=None, updated_at=now)
            alerts.raise_alert(
                conn,
                alerts.Rule.SUBMIT_UNKNOWN_PARKED,
                AlertSeverity.CRITICAL,
                dedup_key=str(attempt.task_id),
                now=now,
                subject_type="task",
                subject_id=str(attempt.task_id),
                message=reason,
            )
        return "parked"

    # -------------------------------------------------------------------------------------- cancellation
    def cancel_due(self, limit: int = 100) -> int:
        now = self._clock.now()
        with self._engine.connect() as conn:
            task_ids = provider_sync.cancels_due(conn, now, limit)
        for task_id in task_ids:
            self.cancel_one(task_id)
        return len(task_ids)

    def cancel_one(self, task_id: uuid.UUID) -> str:
        with self._engine.connect() as conn:
            attempt = attempts.current(conn, task_id)
        now = self._clock.now()
        if attempt is None or attempt.submit_state in (
            AttemptStatus.NEW.value,
            AttemptStatus.FAILED_BEFORE_ACCEPT.value,
        ):
            return self._confirm_cancel(task_id, now, billed=False)
        if attempt.submit_state in (AttemptStatus.UNKNOWN.value, AttemptStatus.SENDING.value):
            self._set_next_action(task_id, now + timedelta(seconds=10))
            return "awaiting-reconciliation"
        if attempt.submit_state in (
            AttemptStatus.SUCCEEDED.value,
            AttemptStatus.FAILED.value,
            AttemptStatus.CANCELED.value,
        ):
            self._set_next_action(task_id, now + timedelta(seconds=5))
            return "awaiting-reducer"
        job_id = attempt.provider_job_id
        if job_id is None:  # accepted with no job id recorded: only a lookup by request key can find the job
            self._set_next_action(task_id, now + timedelta(seconds=10))
            return "awaiting-reconciliation"
        result = self._providers[attempt.provider].cancel(job_id)
        now = self._clock.now()
        if isinstance(result, Canceled):
            # the job's own record carries the vendor's billing verdict for the cancel; fall back to the rule
            provider = self._providers[attempt.provider]
            seen = provider.query(job_id)
            billed = seen.billed if isinstance(seen, Observation) and seen.status is JobStatus.CANCELED else None
            if billed is None:
                billed = provider.capabilities.cancel_is_billed
            with write_tx(self._engine) as conn:
                observations.record(
                    conn,
                    attempt.provider,
                    Observation(
                        job_id=job_id,
                        status=JobStatus.CANCELED,
                        provider_updated_at=now,
                        billed=billed,
                        event_id=f"cancel:{attempt.id}",
                    ),
                    EventSource.POLLING,
                    now,
                )
                failpoint("cancel.provider.before_commit")
            failpoint("cancel.provider.after_commit")
            return "canceled"
        # too late, unsupported or failed: poll soon; completion or cancellation arrives through the reducer
        with write_tx(self._engine) as conn:
            attempts.update(conn, attempt.id, next_poll_at=now)
            tasks.set_columns(conn, task_id, next_action_at=now + timedelta(seconds=30))
        return "too-late" if isinstance(result, TooLate) else "retry-later"

    def cancel_job(self, attempt: Attempt) -> None:
        """Ask the provider to stop a job whose task already ended (e.g. expired); failures are only logged."""
        try:
            self._providers[attempt.provider].cancel(attempt.provider_job_id)
        except Exception:  # best effort; the job's outcome still arrives through the reducer
            logging.getLogger("aivedio.sync").warning("cancel of an expired task's job failed", exc_info=True)

    def cancel_requested(self, envelope: Envelope) -> str:
        """A `provider.cancel.requested`: stop a duplicate job at its vendor, at most once. The inbox row commits
        before the call, so a redelivery never cancels twice; a crash in between leaves the alert saying only
        "cancel asked", which its runbook covers. The vendor's answer goes onto the duplicate's alert."""
        request = CancelRequested.parse(envelope.payload)
        now = self._clock.now()
        claimed = consume_once(
            self._engine, late_jobs.CANCEL_GROUP, envelope.event_id, request.attempt_id, lambda conn: "asked", now
        )
        if claimed == DUPLICATE:
            return "duplicate"
        adapter = self._providers.get(request.provider)
        if adapter is None or not adapter.capabilities.supports_cancel:
            outcome = "unsupported"
        else:
            try:
                result = adapter.cancel(request.job_id)
            except Exception as exc:  # noqa: BLE001 - the inbox row is in: the alert, not a retry, says what happened
                result = QueryFailed(ErrorClass.QUERY_FAILED, repr(exc))
            outcome = _CANCEL_OUTCOME[type(result)]
            if isinstance(result, QueryFailed):
                outcome = f"failed ({result.message})"
        _log.info("duplicate %s job %s: cancel %s", request.provider, request.job_id, outcome)
        with write_tx(self._engine) as conn:
            late_jobs.note_cancel(conn, request.provider, request.job_id, outcome, self._clock.now())
            inbox.keep_digest(conn, late_jobs.CANCEL_GROUP, envelope.event_id, outcome)
        return outcome

    def _confirm_cancel(self, task_id: uuid.UUID, now: datetime, billed: bool) -> str:
        with write_tx(self._engine) as conn:
            task = tasks.get(conn, task_id, lock=True)
            if task.status != TaskStatus.CANCEL_REQUESTED.value:
                return "moved"
            change = self._change({"reason": "nothing at the provider"}, billed=billed, ledger_reason="canceled")
            decide_and_execute(conn, task, TaskEvent.CANCEL_CONFIRMED, change, now)
        return "canceled"

    # ----------------------------------------------------------------------------------------- helpers
    def _set_next_action(self, task_id: uuid.UUID, at: datetime | None) -> None:
        with write_tx(self._engine) as conn:
            tasks.set_columns(conn, task_id, next_action_at=at)

    @staticmethod
    def _change(payload: dict[str, Any], **kw: Any) -> Change:
        return Change(EventSource.SWEEPER, payload=payload, **kw)
