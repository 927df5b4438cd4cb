"""`aivedio reconcile`: resolve ambiguous submits (SUBMIT_UNKNOWN) now, on an operator's word, instead of at
their next scheduled lookup.

The lookups themselves are `ProviderSync.reconcile_one(force=True)`: the same code the sweeper runs, with the
same rules (a "not found" is only believed 60 s after the send; no lookup → list and match → park), so an
operator can only make the engine decide sooner, never decide differently. Each lookup is its own short
transactions around a provider call, so the audit row cannot share a transaction with them: it is written once
the set has been worked through, with what came of each task, and records the exact set even if some failed.

An operator may also settle one ambiguous submit on their own word, for when the engine cannot decide (a vendor
without lookups, a parked task): `bind` the job they found in the vendor's console, or declare the job `not
created`. Both end in the very code a lookup's answer runs (`ProviderSync.bind_job` / `declare_not_created`), so
the task goes on as if the lookup had said so; what the engine checks first is what a lookup could not get wrong:
the vendor must know the job, and not as another request's; no other attempt may hold it; and "never created" is
refused while the request could still reach the vendor or its job not show yet.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from aivedio_engine.clock import Clock
from aivedio_engine.db import attempts, unknown_submits
from aivedio_engine.db.handles import Connection, Engine, IntegrityError
from aivedio_engine.db.records import Attempt
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.unknown_submits import UnknownSubmit
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.providers.base import NotFound as NoSuchJob
from aivedio_engine.providers.base import Observation, QueryFailed
from aivedio_engine.services.errors import IllegalState, InvalidInput, NotFound, Unavailable
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.sync import ProviderSync

log = logging.getLogger("aivedio.reconcile")
COMMAND = "reconcile"

#: ProviderSync outcomes → what the operator is told
_FOUND = {"found"}
_NOT_CREATED = {"not-created"}
_GONE = {"not-unknown", "already-resolved"}
#: the longest job id the attempt row can hold
MAX_JOB_ID = 256


@dataclass(frozen=True, slots=True)
class Candidate:
    """A task whose current attempt is UNKNOWN: the provider may or may not have its job."""

    task_id: uuid.UUID
    tenant_id: uuid.UUID
    attempt_id: uuid.UUID
    provider: str
    task_status: str
    sent_at: datetime
    lookup_count: int
    last_lookup_at: datetime | None
    next_action_at: datetime | None
    parked: bool
    #: False: the provider cannot find a job by our request key (see ProviderSync.can_look_up)
    provider_can_look_up: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    task_id: uuid.UUID
    attempt_id: uuid.UUID | None
    provider: str | None
    #: found | not_created | still_unknown | skipped | error
    result: str
    #: bound_job | new_attempt_scheduled | canceled | parked | next_lookup_scheduled | none
    action: str
    #: the engine's own word for what happened (e.g. not-found-yet, waiting-no-lookup, lookup-failed)
    detail: str
    task_status: str | None
    provider_job_id: str | None
    next_action_at: datetime | None
    parked: bool
    #: open alerts about the task or its attempt after the run (e.g. submit_unknown_parked)
    alerts: list[str]
    provider_can_look_up: bool | None


@dataclass(frozen=True, slots=True)
class Settlement:
    """An operator's word on one ambiguous submit, checked and not yet acted on (what a dry run shows)."""

    task_id: uuid.UUID
    attempt_id: uuid.UUID
    provider: str
    task_status: str
    sent_at: datetime
    parked: bool
    #: bind_job | not_created
    settle: str
    #: the job to bind (bind_job only)
    provider_job_id: str | None
    #: the job's status as the provider reported it just now (bind_job only)
    job_status: str | None
    #: from when "not created" is believed of this send (the send's bound plus the vendor's visibility lag)
    not_created_from: datetime


class ReconcileOps:
    def __init__(self, engine: Engine, clock: Clock, sync: ProviderSync) -> None:
        self._engine = engine
        self._clock = clock
        self._sync = sync

    def candidates(
        self,
        *,
        task_id: uuid.UUID | None = None,
        provider: str | None = None,
        older_than: timedelta | None = None,
        limit: int = 100,
        among: Sequence[uuid.UUID] | None = None,
    ) -> list[Candidate]:
        """Tasks with an UNKNOWN attempt, parked ones included (they are the ones waiting for a human), oldest
        send first. `older_than` compares the time of the ambiguous send; `among` (a saved plan) restricts to
        those tasks and lifts the limit."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1", field="limit")
        if among is not None:
            limit = max(1, len(among))
        sent_before = self._clock.now() - older_than if older_than is not None else None
        with self._engine.connect() as conn:
            if task_id is not None:
                self._check_task(conn, task_id)
            rows = unknown_submits.unknown_submits(
                conn, limit=limit, among=among, provider=provider, sent_before=sent_before, task_id=task_id
            )
        return [_candidate(r, self._sync.can_look_up(r.provider)) for r in rows]

    def _check_task(self, conn: Connection, task_id: uuid.UUID) -> None:
        """`--task ID` names one task: say why there is nothing to do rather than print an empty list."""
        status = unknown_submits.task_status(conn, task_id)
        if status is None:
            raise NotFound(f"task {task_id} not found")
        if unknown_submits.unknown_submit(conn, task_id) is None:
            raise IllegalState(
                f"task {task_id} is {status}: it has no ambiguous submit to reconcile", current_status=status
            )

    def preview(self, op: Operation, found: Sequence[Candidate | Settlement]) -> None:
        """Record the dry run an operator looked at (nothing else changes)."""
        if not op.dry_run:
            raise InvalidInput("preview is for dry runs")
        with write_tx(self._engine) as conn:
            record(conn, op, affected_ids=[c.task_id for c in found], outcome="previewed", now=self._clock.now())

    def run(self, op: Operation, task_ids: Sequence[uuid.UUID]) -> list[Outcome]:
        """Look up exactly these tasks now, in order. A task resolved meanwhile is skipped, one whose lookup
        raised is reported as an error and the rest go on; then one audit row for the whole set."""
        op.require_reason()
        if op.dry_run:
            raise InvalidInput("a dry run is recorded with preview(), not run()")
        outcomes = [self._one(task_id) for task_id in dict.fromkeys(task_ids)]
        counts = Counter(o.result for o in outcomes)
        errors = counts.get("error", 0)
        verdict = "nothing" if not outcomes else "failed" if errors == len(outcomes) else "partial" if errors else "ok"
        resolved = [o.task_id for o in outcomes if o.result in ("found", "not_created")]
        with write_tx(self._engine) as conn:
            if resolved:
                # the engine parks without ever un-parking: a task resolved on an operator's word is no longer
                # waiting for a human, and a stale reason would send the next on-call engineer after it
                unknown_submits.unpark(conn, resolved)
            audited = replace(op, args={**op.args, "results": dict(sorted(counts.items()))})
            record(conn, audited, affected_ids=[o.task_id for o in outcomes], outcome=verdict, now=self._clock.now())
        return outcomes

    # ------------------------------------------------------------------------- one task, on an operator's word
    def check_bind(self, task_id: uuid.UUID, job_id: str) -> Settlement:
        """What binding `job_id` to the task's ambiguous submit would do; asks the provider for the job (a read)
        and raises when the bind would be refused. Changes nothing."""
        return self._checked_bind(task_id, job_id)[0]

    def bind(self, op: Operation, task_id: uuid.UUID, job_id: str) -> Outcome:
        """Bind the job found in the vendor's console: the task goes on from the job's state, as after a lookup
        that found it. Audited with the outcome."""
        self._require_change(op)
        plan, obs = self._checked_bind(task_id, job_id)
        try:
            said = self._sync.bind_job(plan.attempt_id, obs)
        except IntegrityError:  # bound to another attempt since the check: the unique job id refused it
            raise self._held_elsewhere(plan, job_id) from None
        return self._settled(op, plan, said)

    def check_not_created(self, task_id: uuid.UUID) -> Settlement:
        """What declaring the task's ambiguous submit never created would do; raises when it would be refused
        (the send may still be in flight, or the provider finds the job). Changes nothing."""
        row = self._unknown(task_id)
        plan = self._settlement(row, "not_created")
        now = self._clock.now()
        if now < plan.not_created_from:
            bound = self._sync.send_bound_s(row.provider)
            lag = (plan.not_created_from - row.sent_at).total_seconds() - bound
            raise IllegalState(
                f"the submit of task {task_id} may still be in flight: sent at {_utc(row.sent_at)}, a request can "
                f"reach {row.provider} for {bound:g} s and its job take {lag:g} s more to show; "
                f"--not-created is allowed from {_utc(plan.not_created_from)}; nothing changed",
                current_status=row.task_status,
            )
        if self._sync.can_look_up(row.provider):
            attempt = self._attempt(row.attempt_id)
            found = self._sync.look_up(attempt)
            if isinstance(found, Observation):
                raise IllegalState(
                    f"{row.provider} has job {found.job_id} for this attempt's request key: bind it with "
                    f"--job-id {found.job_id}; nothing changed",
                    current_status=row.task_status,
                )
        return plan

    def not_created(self, op: Operation, task_id: uuid.UUID) -> Outcome:
        """Declare the vendor never created the job: the attempt is FAILED_BEFORE_ACCEPT and the task takes a new
        attempt (or, being canceled, releases its credits), as after a lookup that proved it. Audited."""
        self._require_change(op)
        plan = self.check_not_created(task_id)
        return self._settled(op, plan, self._sync.declare_not_created(plan.attempt_id))

    def _require_change(self, op: Operation) -> None:
        op.require_reason()
        if op.dry_run:
            raise InvalidInput("a dry run is recorded with preview(), not acted on")

    def _checked_bind(self, task_id: uuid.UUID, job_id: str) -> tuple[Settlement, Observation]:
        job_id = job_id.strip()
        if not job_id or len(job_id) > MAX_JOB_ID or not job_id.isprintable():
            raise InvalidInput(f"--job-id must be 1..{MAX_JOB_ID} printable characters", field="job_id")
        row = self._unknown(task_id)
        plan = self._settlement(row, "bind_job", job_id)
        with self._engine.connect() as conn:
            holder = unknown_submits.job_holder(conn, row.provider, job_id)
        if holder is not None and holder.attempt_id != row.attempt_id:
            raise self._held_elsewhere(plan, job_id, holder)
        obs = self._sync.ask_job(row.provider, job_id)
        if isinstance(obs, NoSuchJob):
            raise NotFound(f"{row.provider} has no job {job_id}: check the id in the vendor console; nothing changed")
        if isinstance(obs, QueryFailed):
            raise Unavailable(
                f"could not ask {row.provider} for job {job_id} ({obs.message or obs.error_class}); nothing "
                "changed, try again"
            )
        key = self._attempt(row.attempt_id).provider_request_key
        if obs.request_key is not None and obs.request_key != key:
            raise IllegalState(
                f"{row.provider} says job {job_id} was made for request {obs.request_key}, not this attempt's "
                f"{key}: refusing to bind another request's job; nothing changed",
                current_status=row.task_status,
            )
        return replace(plan, job_status=obs.status.value), obs

    def _held_elsewhere(
        self, plan: Settlement, job_id: str, holder: unknown_submits.JobHolder | None = None
    ) -> IllegalState:
        if holder is None:
            with self._engine.connect() as conn:
                holder = unknown_submits.job_holder(conn, plan.provider, job_id)
        who = f"attempt {holder.attempt_id} of task {holder.task_id}" if holder else "another attempt"
        return IllegalState(
            f"job {job_id} at {plan.provider} is already held by {who}: one job belongs to one attempt; "
            "nothing changed",
            current_status=plan.task_status,
        )

    def _unknown(self, task_id: uuid.UUID) -> UnknownSubmit:
        with self._engine.connect() as conn:
            self._check_task(conn, task_id)
            row = unknown_submits.unknown_submit(conn, task_id)
        if row is None:  # resolved since the check
            raise IllegalState(f"task {task_id} has no ambiguous submit to reconcile")
        return row

    def _attempt(self, attempt_id: uuid.UUID) -> Attempt:
        with self._engine.connect() as conn:
            return attempts.get(conn, attempt_id)

    def _settlement(self, row: UnknownSubmit, settle: str, job_id: str | None = None) -> Settlement:
        return Settlement(
            task_id=row.task_id,
            attempt_id=row.attempt_id,
            provider=row.provider,
            task_status=row.task_status,
            sent_at=row.sent_at,
            parked=bool(row.parked_reason),
            settle=settle,
            provider_job_id=job_id,
            job_status=None,
            not_created_from=self._sync.not_created_from(row.provider, row.sent_at),
        )

    def _settled(self, op: Operation, plan: Settlement, said: str) -> Outcome:
        result = _result_of(said)
        resolved = result in ("found", "not_created")
        with write_tx(self._engine) as conn:
            if resolved:  # a person decided: the task no longer waits for one
                unknown_submits.unpark(conn, [plan.task_id])
            audited = replace(op, args={**op.args, "results": {result: 1}})
            verdict = "ok" if resolved else "nothing"
            record(conn, audited, affected_ids=[plan.task_id], outcome=verdict, now=self._clock.now())
        return self._describe(plan.task_id, plan.attempt_id, result, said)

    def _one(self, task_id: uuid.UUID) -> Outcome:
        with self._engine.connect() as conn:
            row = unknown_submits.unknown_submit(conn, task_id)
        if row is None:
            return self._describe(task_id, None, "skipped", "not-unknown")
        try:
            said = self._sync.reconcile_one(row.attempt_id, force=True)
        except Exception as exc:  # one provider's failure must not abandon the rest of the set
            log.warning("reconcile of task %s failed", task_id, exc_info=True)
            return self._describe(task_id, row.attempt_id, "error", f"{type(exc).__name__}: {exc}"[:300])
        return self._describe(task_id, row.attempt_id, _result_of(said), said)

    def _describe(self, task_id: uuid.UUID, attempt_id: uuid.UUID | None, result: str, detail: str) -> Outcome:
        with self._engine.connect() as conn:
            seen = unknown_submits.after_lookup(conn, task_id, attempt_id)
        status = seen.task_status
        parked = bool(seen.parked_reason)
        return Outcome(
            task_id=task_id,
            attempt_id=attempt_id,
            provider=seen.provider,
            result=result,
            action=_action(result, status, parked),
            detail=detail,
            task_status=status,
            provider_job_id=seen.provider_job_id,
            next_action_at=seen.next_action_at,
            parked=parked,
            alerts=seen.open_alerts,
            provider_can_look_up=self._sync.can_look_up(seen.provider) if seen.provider is not None else None,
        )


def _utc(at: datetime) -> str:
    return f"{(at.astimezone(UTC) if at.tzinfo else at):%Y-%m-%d %H:%M:%S} UTC"


def _candidate(r: UnknownSubmit, can_look_up: bool) -> Candidate:
    return Candidate(
        task_id=r.task_id,
        tenant_id=r.tenant_id,
        attempt_id=r.attempt_id,
        provider=r.provider,
        task_status=r.task_status,
        sent_at=r.sent_at,
        lookup_count=r.lookup_count,
        last_lookup_at=r.last_lookup_at,
        next_action_at=r.next_action_at,
        parked=bool(r.parked_reason),
        provider_can_look_up=can_look_up,
    )


def _result_of(said: str) -> str:
    if said in _FOUND:
        return "found"
    if said in _NOT_CREATED:
        return "not_created"
    if said in _GONE:
        return "skipped"
    return "still_unknown"


def _action(result: str, task_status: str | None, parked: bool) -> str:
    if result == "found":
        return "bound_job"
    if result == "not_created":
        return "canceled" if task_status == TaskStatus.CANCELED.value else "new_attempt_scheduled"
    if result == "still_unknown":
        # a parked task gets no more scheduled lookups (the sweeper skips it): a human decides
        return "parked" if parked else "next_lookup_scheduled"
    return "none"
