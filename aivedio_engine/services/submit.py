"""Submitting an attempt to its provider: short tx A → the call, outside any transaction → short tx B.

tx A moves the attempt NEW → SENDING; only the delivery that wins that CAS calls the provider, so a duplicated
broker message can never submit twice. tx B records what the call proved:
- Accepted: attempt ACKED with its job id, task SUBMITTED, first poll scheduled, orphan callbacks rematched.
- Rejected: attempt FAILED_BEFORE_ACCEPT; the failure policy decides RETRY_WAIT (with next_retry_at) or
  FAILED_FINAL (nothing was created, so the reservation is released).
- Ambiguous: attempt UNKNOWN, task SUBMIT_UNKNOWN; reconciliation decides later, never a blind resubmit.
A crash between tx A and tx B leaves a SENDING attempt; the sweeper treats it as ambiguous.
"""

from __future__ import annotations

import logging
import random
import uuid
from datetime import datetime, timedelta
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db import attempts, tasks
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.polling import PollPolicy, next_poll_at
from aivedio_engine.domain.retry import ErrorClass, ErrorOutcome, FailureContext, Step, Verdict, decide_retry
from aivedio_engine.domain.status import AttemptStatus, EventSource, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, TaskEvent
from aivedio_engine.providers.base import Accepted, Ambiguous, GenerationRequest, Provider, Rejected, SubmitResult
from aivedio_engine.services import late_jobs, observations, provider_switch
from aivedio_engine.services.provider_health import error_code_with_retry_after
from aivedio_engine.services.references import ReferenceResolver, ReferenceUnavailable
from aivedio_engine.services.transition import (
    AfterCommit,
    AttemptMove,
    Change,
    decide_and_execute,
    lock_attempt,
    lock_existing_attempt,
    move_attempt,
)
from aivedio_engine.slots.base import SlotStore
from aivedio_engine.testing.failpoints import failpoint

_log = logging.getLogger("aivedio.submit")


class SubmitService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        providers: Any,
        rng: random.Random | None = None,
        callback_base: str | None = None,
        references: ReferenceResolver | None = None,
        slots: SlotStore | None = None,
    ) -> None:
        self._engine = engine
        self._slots = slots
        self._references = references
        self._clock = clock
        self._settings = settings
        self._providers = providers
        self._rng = rng or random.Random()
        self._callback_base = callback_base
        self._poll = PollPolicy(
            settings.polling.min_interval_s, settings.polling.max_interval_s, settings.polling.jitter
        )

    def submit(self, attempt_id: uuid.UUID) -> str:
        """Returns what happened, for the inbox digest: 'skipped:<state>' | 'accepted' | 'rejected' | 'ambiguous' |
        'refused:late' (past `send_deadline_s`: not sent) | 'duplicate' (a late job of an attempt already closed)."""
        claimed = self._claim(attempt_id)
        if isinstance(claimed, str):
            return claimed
        attempt, task, inputs = claimed
        provider: Provider = self._providers[attempt.provider]
        try:
            request = self._request(task, provider, inputs)
        except ReferenceUnavailable as exc:  # nothing was sent, so nothing can be billed
            self._record(attempt_id, Rejected(ErrorClass.LOCAL_INVALID, "reference_unavailable", str(exc)))
            return "rejected"
        failpoint("submit.before_call")
        if self._past_send_deadline(attempt):
            return "refused:late"
        failpoint("submit.after_deadline_check")
        result = provider.submit(request, attempt.provider_request_key)
        failpoint("submit.after_call")
        return self._record(attempt_id, result) or type(result).__name__.lower()

    def _past_send_deadline(self, attempt: Attempt) -> bool:
        """Read immediately before the call: a send this late may follow the sweeper calling the attempt ambiguous
        and a lookup finding nothing, so it could make a second paid job. Nothing is sent and nothing recorded;
        the SENDING attempt goes to the sweeper and the reconciler like a worker that died before the call."""
        claimed_at = attempt.submitted_at or attempt.updated_at
        late = (self._clock.now() - claimed_at).total_seconds() > self._settings.retry.submit.send_deadline_s
        if late:
            _log.warning("attempt %s: send refused, claimed more than send_deadline_s ago", attempt.id)
        return late

    # tx A
    def _claim(self, attempt_id: uuid.UUID) -> tuple[Attempt, Task, list[asset_rows.InputAsset | None]] | str:
        after = AfterCommit(self._engine, self._slots)
        with write_tx(self._engine) as conn:
            task, attempt = lock_attempt(conn, attempt_id)
            if task is None or attempt is None:
                return "skipped:missing"
            if attempt.submit_state != AttemptStatus.NEW.value:
                return f"skipped:{attempt.submit_state}"
            if task.status != TaskStatus.DISPATCHING.value:
                # canceled (or expired) between dispatch and send: the attempt never leaves, its slot is freed
                move_attempt(
                    conn,
                    attempt,
                    AttemptEvent.REJECTED_BEFORE_ACCEPT,
                    self._clock.now(),
                    tenant_id=task.tenant_id,
                    after=after,
                    error=ErrorOutcome.NOT_SENT_TASK_MOVED,
                )
                claimed: tuple[Attempt, Task, list[asset_rows.InputAsset | None]] | str = f"skipped:task-{task.status}"
            else:
                now = self._clock.now()
                attempts.transition(conn, attempt, AttemptEvent.SEND_STARTED, now, submitted_at=now)
                inputs = asset_rows.inputs_of(conn, task.tenant_id, task.params.get("asset_ids") or ())
                claimed = attempts.get(conn, attempt_id), task, inputs
            failpoint("submit.claim.before_commit")
        failpoint("submit.claim.after_commit")
        after.run()
        return claimed

    def _request(self, task: Task, provider: Provider, inputs: list[asset_rows.InputAsset | None]) -> GenerationRequest:
        p = task.params
        callback = None
        if self._callback_base and provider.capabilities.supports_callbacks:
            callback = f"{self._callback_base.rstrip('/')}/v1/callbacks/{provider.name}"
        images: tuple[str, ...] = ()
        videos: tuple[str, ...] = ()
        if inputs:
            if self._references is None:
                raise ReferenceUnavailable("this process has no object store to read references from")
            refs = self._references.resolve(
                inputs, p["asset_ids"], now=self._clock.now(), transport=provider.capabilities.reference_transport
            )
            images, videos = refs.images, refs.videos
        return GenerationRequest(
            prompt=p["prompt"],
            model=p["model"],
            duration_s=p["duration_s"],
            resolution=p["resolution"],
            aspect_ratio=p["aspect_ratio"],
            seed=p.get("seed"),
            n=int(p.get("n") or 1),
            reference_urls=images,
            reference_video_urls=videos,
            callback_url=callback,
        )

    # tx B
    def _record(self, attempt_id: uuid.UUID, result: SubmitResult) -> str | None:
        """None, or what replaced the usual recording: 'duplicate' / 'late-answer' (see `_late`)."""
        after = AfterCommit(self._engine, self._slots)
        outcome = None
        with write_tx(self._engine) as conn:
            task, attempt = lock_existing_attempt(conn, attempt_id)
            now = self._clock.now()
            if late_jobs.is_closed(attempt) or (
                isinstance(result, Accepted) and attempt.provider_job_id == result.job_id
            ):
                outcome = self._late(conn, attempt, task, result, now)
            elif isinstance(result, Accepted):
                self._accepted(conn, attempt, task, result, now, after)
            elif isinstance(result, Rejected):
                self._rejected(conn, attempt, task, result, now, after)
            else:
                self._ambiguous(conn, attempt, task, result, now, after)
            failpoint("submit.record.before_commit")
        failpoint("submit.record.after_commit")
        after.run()  # a rejected attempt's slot is free once this has committed
        return outcome

    def _late(self, conn: Connection, attempt: Attempt, task: Task, result: SubmitResult, now: datetime) -> str:
        """The answer to a send whose attempt was settled meanwhile. The job a lookup already bound to it: nothing
        to add. A job made for an attempt closed as never created (a send that left past every bound): recorded
        as a duplicate, booked as platform cost, alerted, and its cancel asked (`late_jobs.record`)."""
        if isinstance(result, Accepted) and attempt.provider_job_id == result.job_id:
            return "late-answer"
        if isinstance(result, Accepted):
            late_jobs.record(conn, task, attempt, result.job_id, now, how="the late send's own answer")
            return "duplicate"
        if isinstance(result, Ambiguous):  # a job may exist that nobody will ever ask about
            late_jobs.alert_unknown(conn, task, attempt, now, reason=result.reason)
        return "late-answer"

    def _accepted(
        self, conn: Connection, attempt: Attempt, task: Task, result: Accepted, now: datetime, after: AfterCommit
    ) -> None:
        move = AttemptMove(
            attempt,
            AttemptEvent.PROVIDER_ACCEPTED,
            {
                "provider_job_id": result.job_id,
                "next_poll_at": next_poll_at(
                    self._poll, submitted_at=attempt.submitted_at or now, now=now, rng=self._rng
                ),
            },
        )
        if task.status == TaskStatus.DISPATCHING.value:
            change = self._change(attempt, {"job_id": result.job_id}, attempt_move=move)
            decide_and_execute(conn, task, TaskEvent.PROVIDER_ACCEPTED, change, now, after)
        else:
            move_attempt(conn, attempt, move.event, now, tenant_id=task.tenant_id, after=after, **move.values)
        observations.rematch(conn, attempt.provider, result.job_id, attempt.id, now)

    def _rejected(
        self, conn: Connection, attempt: Attempt, task: Task, result: Rejected, now: datetime, after: AfterCommit
    ) -> None:
        # the attempt moves first: the retry budget counts this failure among the task's failed attempts
        move_attempt(
            conn,
            attempt,
            AttemptEvent.REJECTED_BEFORE_ACCEPT,
            now,
            tenant_id=task.tenant_id,
            after=after,
            error=result.error_class,
            provider_error_code=error_code_with_retry_after(result.code, result.retry_after_s),
        )
        if task.status != TaskStatus.DISPATCHING.value:
            return
        verdict = decide_retry(
            self._failure_context(conn, task, result, now), self._settings.retry.budget(Step.SUBMIT), now, self._rng
        )
        detail = {"error_class": result.error_class.value, "code": result.code, "reason": verdict.reason}
        error, code = result.error_class, result.code
        if verdict.verdict is Verdict.RETRY:
            retry_at = verdict.retry_at
            retry: dict[str, Any] = {}
            moved = provider_switch.after_rejection(conn, self._settings, task.id, attempt.provider, result.error_class)
            if moved.provider is not None:  # the backoff was for the provider that failed, not for the next one
                retry_at = now
                retry["selected_provider"] = moved.provider
                detail["switched"] = moved.reason
            retry.update(next_retry_at=retry_at, next_action_at=retry_at)
            change = self._change(attempt, detail, columns=retry, error=error, error_code=code)
            decide_and_execute(conn, task, TaskEvent.RETRYABLE_FAILURE, change, now, after)
        else:
            change = self._change(
                attempt, detail, error=error, error_code=code, billed=False, ledger_reason="submit_failed"
            )
            decide_and_execute(conn, task, TaskEvent.FINAL_FAILURE, change, now, after)

    def _ambiguous(
        self, conn: Connection, attempt: Attempt, task: Task, result: Ambiguous, now: datetime, after: AfterCommit
    ) -> None:
        first_lookup = now + timedelta(seconds=self._settings.reconcile.lookup_after_s[0])
        move = AttemptMove(attempt, AttemptEvent.SUBMIT_AMBIGUOUS, error=ErrorClass.SUBMIT_AMBIGUOUS)
        if task.status == TaskStatus.DISPATCHING.value:
            change = self._change(
                attempt,
                {"reason": result.reason},
                attempt_move=move,
                columns={"next_action_at": first_lookup},
                error=ErrorClass.SUBMIT_AMBIGUOUS,
            )
            decide_and_execute(conn, task, TaskEvent.SUBMIT_AMBIGUOUS, change, now, after)
        else:
            move_attempt(conn, attempt, move.event, now, tenant_id=task.tenant_id, after=after, error=move.error)
            tasks.set_columns(conn, task.id, next_action_at=first_lookup)

    def _failure_context(self, conn: Connection, task: Task, result: Rejected, now: datetime) -> FailureContext:
        made, first_failure_at = attempts.failed_before_accept(conn, task.id)
        return FailureContext(
            error_class=result.error_class,
            attempts_made=made,
            first_failure_at=first_failure_at or now,
            step_started_at=task.created_at,
            task_deadline_at=task.deadline_at,
            retry_after_s=result.retry_after_s,
        )

    @staticmethod
    def _change(
        attempt: Attempt, payload: dict[str, Any], *, attempt_move: AttemptMove | None = None, **kw: Any
    ) -> Change:
        return Change(
            EventSource.WORKER, payload={"attempt_id": str(attempt.id), **payload}, attempt=attempt_move, **kw
        )
