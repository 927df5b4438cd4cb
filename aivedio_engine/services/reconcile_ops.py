"""`aivedio reconcile`: resolve ambiguous submits (SUBMIT_UNKNOWN) now, on an operator's word, instead of at
their next scheduled lookup (DESIGN §8, §13).

The lookups themselves are `ProviderSync.reconcile_one(force=True)`: the same code the sweeper runs, with the
same rules (a "not found" is only believed 60 s after the send; no lookup → list and match → park), so an
operator can only make the engine decide sooner, never decide differently. Each lookup is its own short
transactions around a provider call, so the audit row cannot share a transaction with them: it is written once
the set has been worked through, with what came of each task, and records the exact set even if some failed.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from aivedio_engine.clock import Clock
from aivedio_engine.db import unknown_submits
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.unknown_submits import UnknownSubmit
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.services.errors import IllegalState, InvalidInput, NotFound
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.sync import ProviderSync

log = logging.getLogger("aivedio.reconcile")
COMMAND = "reconcile"

#: ProviderSync outcomes → what the operator is told
_FOUND = {"found"}
_NOT_CREATED = {"not-created"}
_GONE = {"not-unknown", "already-resolved"}


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

    def preview(self, op: Operation, found: Sequence[Candidate]) -> None:
        """Record the dry run an operator looked at (nothing else changes, no provider is called)."""
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
