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

import random
import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db import attempts, tasks
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.polling import PollPolicy, next_poll_at
from aivedio_engine.domain.retry import ErrorClass, FailureContext, Step, Verdict, decide_retry
from aivedio_engine.domain.status import AttemptStatus, EventSource, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, Decision, TaskEvent
from aivedio_engine.providers.base import Accepted, Ambiguous, GenerationRequest, Provider, Rejected, SubmitResult
from aivedio_engine.services import billing, observations
from aivedio_engine.services.provider_health import error_code_with_retry_after
from aivedio_engine.services.references import ReferenceResolver, ReferenceUnavailable
from aivedio_engine.testing.failpoints import failpoint


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
    ) -> None:
        self._engine = engine
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
        """Returns what happened, for the inbox digest: 'skipped:<state>' | 'accepted' | 'rejected' | 'ambiguous'."""
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
        result = provider.submit(request, attempt.provider_request_key)
        failpoint("submit.after_call")
        self._record(attempt_id, result)
        return type(result).__name__.lower()

    # tx A
    def _claim(self, attempt_id: uuid.UUID) -> tuple[Any, Any, list[asset_rows.InputAsset | None]] | str:
        with write_tx(self._engine) as conn:
            attempt = attempts.read(conn, attempt_id, lock=True)
            if attempt is None:
                return "skipped:missing"
            if attempt.submit_state != AttemptStatus.NEW.value:
                return f"skipped:{attempt.submit_state}"
            task = tasks.read(conn, attempt.task_id)
            if task.status != TaskStatus.DISPATCHING.value:
                # canceled (or expired) between dispatch and send: the attempt never leaves
                attempts.transition(
                    conn,
                    attempt,
                    AttemptEvent.REJECTED_BEFORE_ACCEPT,
                    self._clock.now(),
                    last_error_class="not_sent_task_moved",
                )
                return f"skipped:task-{task.status}"
            now = self._clock.now()
            attempts.transition(conn, attempt, AttemptEvent.SEND_STARTED, now, submitted_at=now)
            inputs = asset_rows.inputs_of(conn, task.tenant_id, task.params.get("asset_ids") or ())
            return attempts.read(conn, attempt_id), task, inputs

    def _request(self, task: Any, provider: Provider, inputs: list[asset_rows.InputAsset | None]) -> GenerationRequest:
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
            reference_urls=images,
            reference_video_urls=videos,
            callback_url=callback,
        )

    # tx B
    def _record(self, attempt_id: uuid.UUID, result: SubmitResult) -> None:
        with write_tx(self._engine) as conn:
            attempt = attempts.read(conn, attempt_id, lock=True)
            task = tasks.read(conn, attempt.task_id, lock=True)
            now = self._clock.now()
            if isinstance(result, Accepted):
                self._accepted(conn, attempt, task, result, now)
            elif isinstance(result, Rejected):
                self._rejected(conn, attempt, task, result, now)
            else:
                self._ambiguous(conn, attempt, task, result, now)

    def _accepted(self, conn: Connection, attempt: Any, task: Any, result: Accepted, now: datetime) -> None:
        attempts.transition(
            conn,
            attempt,
            AttemptEvent.PROVIDER_ACCEPTED,
            now,
            provider_job_id=result.job_id,
            next_poll_at=next_poll_at(self._poll, submitted_at=attempt.submitted_at or now, now=now, rng=self._rng),
        )
        if task.status == TaskStatus.DISPATCHING.value:
            self._apply(conn, task, TaskEvent.PROVIDER_ACCEPTED, now, attempt.id, {"job_id": result.job_id})
        observations.rematch(conn, attempt.provider, result.job_id, attempt.id, now)

    def _rejected(self, conn: Connection, attempt: Any, task: Any, result: Rejected, now: datetime) -> None:
        attempts.transition(
            conn,
            attempt,
            AttemptEvent.REJECTED_BEFORE_ACCEPT,
            now,
            last_error_class=result.error_class.value,
            provider_error_code=error_code_with_retry_after(result.code, result.retry_after_s),
        )
        if task.status != TaskStatus.DISPATCHING.value:
            return
        verdict = decide_retry(
            self._failure_context(conn, task, result, now), self._settings.retry.budget(Step.SUBMIT), now, self._rng
        )
        detail = {"error_class": result.error_class.value, "code": result.code, "reason": verdict.reason}
        extra: dict[str, Any] = {"last_error_class": result.error_class.value, "last_error_code": result.code}
        if verdict.verdict is Verdict.RETRY:
            extra.update(next_retry_at=verdict.retry_at, next_action_at=verdict.retry_at)
            self._apply(conn, task, TaskEvent.RETRYABLE_FAILURE, now, attempt.id, detail, extra)
        else:
            decision = self._apply(conn, task, TaskEvent.FINAL_FAILURE, now, attempt.id, detail, extra)
            billing.close_reservation(conn, task, decision, now, reason="submit_failed", billed=False)

    def _ambiguous(self, conn: Connection, attempt: Any, task: Any, result: Ambiguous, now: datetime) -> None:
        attempts.transition(conn, attempt, AttemptEvent.SUBMIT_AMBIGUOUS, now, last_error_class="submit_ambiguous")
        first_lookup = now + timedelta(seconds=self._settings.reconcile.lookup_after_s[0])
        if task.status == TaskStatus.DISPATCHING.value:
            self._apply(
                conn,
                task,
                TaskEvent.SUBMIT_AMBIGUOUS,
                now,
                attempt.id,
                {"reason": result.reason},
                {"next_action_at": first_lookup, "last_error_class": "submit_ambiguous"},
            )
        else:
            conn.execute(
                generation_tasks.update().where(generation_tasks.c.id == task.id).values(next_action_at=first_lookup)
            )

    def _failure_context(self, conn: Connection, task: Any, result: Rejected, now: datetime) -> FailureContext:
        failed = conn.execute(
            sa.select(sa.func.count(), sa.func.min(task_attempts.c.updated_at)).where(
                task_attempts.c.task_id == task.id,
                task_attempts.c.submit_state == AttemptStatus.FAILED_BEFORE_ACCEPT.value,
            )
        ).one()
        return FailureContext(
            error_class=result.error_class,
            attempts_made=int(failed[0]),
            first_failure_at=failed[1] or now,
            step_started_at=task.created_at,
            task_deadline_at=task.deadline_at,
            retry_after_s=result.retry_after_s,
        )

    def _apply(
        self,
        conn: Connection,
        task: Any,
        event: TaskEvent,
        now: datetime,
        attempt_id: uuid.UUID,
        payload: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> Decision:
        return tasks.decide_and_apply(
            conn,
            task,
            event,
            now,
            source=EventSource.WORKER,
            extra=extra,
            payload={"attempt_id": str(attempt_id), **payload},
        )
