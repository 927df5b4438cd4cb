"""Follow-on outbox messages: one typed payload per event type, one builder each, and one way to retry a step
through a delayed outbox row.

Every writer of `provider.submit.requested`, `provider.cancel.requested`, `fetch.requested` and
`media.process.requested` (the transition executor, the sweeper's re-drives, the fetch and media retries, a
recorded duplicate job) builds its payload here, and every consumer parses it here, so the fields cannot drift
between writers. `task.status.changed` is written by
`db.tasks.apply` with the transition itself.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from aivedio_engine.db import outbox, tasks
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.domain.events import EventType, Route
from aivedio_engine.domain.retry import ErrorClass, FailureContext, RetryBudget, RetryDecision, Verdict, decide_retry
from aivedio_engine.services.consume import Envelope


@dataclass(frozen=True, slots=True)
class StepTries:
    """Where a retried step stands; carried from one delayed message to the next."""

    tried: int = 1
    first_failure_at: datetime | None = None
    step_started_at: datetime | None = None

    @classmethod
    def parse(cls, p: dict[str, Any]) -> StepTries:
        return cls(int(p.get("try", 1)), _ts(p.get("first_failure_at")), _ts(p.get("step_started_at")))

    def fields(self) -> dict[str, Any]:
        if self.first_failure_at is None:
            return {}
        return {
            "try": self.tried,
            "first_failure_at": self.first_failure_at.isoformat(),
            "step_started_at": (self.step_started_at or self.first_failure_at).isoformat(),
        }


@dataclass(frozen=True, slots=True)
class SubmitRequested:
    attempt_id: uuid.UUID
    task_id: uuid.UUID
    resent: bool = False

    event_type = EventType.PROVIDER_SUBMIT_REQUESTED
    aggregate_type = "attempt"

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.attempt_id

    @classmethod
    def parse(cls, p: dict[str, Any]) -> SubmitRequested:
        return cls(uuid.UUID(p["attempt_id"]), uuid.UUID(p["task_id"]), bool(p.get("resent")))

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {"attempt_id": str(self.attempt_id), "task_id": str(self.task_id)}
        if self.resent:
            p["resent"] = True
        return p


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """Stop one vendor job the engine will not use (a duplicate of a closed attempt): asked where the job id is
    learnt, in that transaction, and done by whoever holds the adapter (`ProviderSync.cancel_requested`)."""

    attempt_id: uuid.UUID
    task_id: uuid.UUID
    provider: str
    job_id: str

    event_type = EventType.PROVIDER_CANCEL_REQUESTED
    aggregate_type = "attempt"

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.attempt_id

    @classmethod
    def parse(cls, p: dict[str, Any]) -> CancelRequested:
        return cls(uuid.UUID(p["attempt_id"]), uuid.UUID(p["task_id"]), str(p["provider"]), str(p["job_id"]))

    def payload(self) -> dict[str, Any]:
        return {
            "attempt_id": str(self.attempt_id),
            "task_id": str(self.task_id),
            "provider": self.provider,
            "job_id": self.job_id,
        }


@dataclass(frozen=True, slots=True)
class FetchRequested:
    task_id: uuid.UUID
    attempt_id: uuid.UUID
    provider: str
    job_id: str | None
    #: as observed: [{"url", "index", "expires_at"}]; empty makes the fetcher ask the provider for fresh URLs
    outputs: tuple[dict[str, Any], ...] = ()
    tries: StepTries = StepTries()
    redriven: bool = False

    event_type = EventType.FETCH_REQUESTED
    aggregate_type = "task"

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.task_id

    @classmethod
    def of(
        cls, task_id: uuid.UUID, attempt: Attempt, outputs: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()
    ) -> FetchRequested:
        return cls(task_id, attempt.id, attempt.provider, attempt.provider_job_id, tuple(outputs))

    @classmethod
    def parse(cls, p: dict[str, Any]) -> FetchRequested:
        return cls(
            uuid.UUID(p["task_id"]),
            uuid.UUID(p["attempt_id"]),
            p.get("provider", ""),
            p.get("job_id"),
            tuple(p.get("outputs") or ()),
            StepTries.parse(p),
            bool(p.get("redriven")),
        )

    def expiries(self) -> list[datetime | None]:
        return [_ts(o.get("expires_at")) for o in self.outputs]

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {
            "task_id": str(self.task_id),
            "attempt_id": str(self.attempt_id),
            "provider": self.provider,
            "job_id": self.job_id,
            "outputs": list(self.outputs),
            **self.tries.fields(),
        }
        if self.redriven:
            p["redriven"] = True
        return p


@dataclass(frozen=True, slots=True)
class MediaProcessRequested:
    task_id: uuid.UUID
    asset_id: uuid.UUID
    tries: StepTries = StepTries()
    redriven: bool = False
    #: rebuild the failed derivatives of a task that already SUCCEEDED on its proxy (services/media_partial.py)
    derivatives_only: bool = False

    event_type = EventType.MEDIA_PROCESS_REQUESTED
    aggregate_type = "task"

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.task_id

    @classmethod
    def parse(cls, p: dict[str, Any]) -> MediaProcessRequested:
        return cls(
            uuid.UUID(p["task_id"]),
            uuid.UUID(p["asset_id"]),
            StepTries.parse(p),
            bool(p.get("redriven")),
            bool(p.get("derivatives_only")),
        )

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {"task_id": str(self.task_id), "asset_id": str(self.asset_id), **self.tries.fields()}
        if self.redriven:
            p["redriven"] = True
        if self.derivatives_only:
            p["derivatives_only"] = True
        return p


Message = SubmitRequested | CancelRequested | FetchRequested | MediaProcessRequested
RetriedStep = FetchRequested | MediaProcessRequested


class Owner(Protocol):
    """What a message's outbox row takes from the task it belongs to (a task record, or a row carrying both)."""

    @property
    def tenant_id(self) -> uuid.UUID: ...
    @property
    def trace_id(self) -> str | None: ...


def emit(
    conn: Connection,
    task: Owner,
    message: Message,
    *,
    version: int,
    now: datetime,
    available_at: datetime | None = None,
    route: Route | None = None,
) -> uuid.UUID:
    """Write `message` as a PENDING outbox row in the caller's transaction."""
    return outbox.add(
        conn,
        message.event_type,
        aggregate_type=message.aggregate_type,
        aggregate_id=message.aggregate_id,
        aggregate_version=version,
        tenant_id=task.tenant_id,
        trace_id=task.trace_id,
        now=now,
        available_at=available_at,
        route=route,
        payload=message.payload(),
    )


def inline_envelope(
    task: Owner, message: Message, *, event_id: uuid.UUID, version: int, now: datetime, causation_id: uuid.UUID | None
) -> Envelope:
    """The envelope `message` would carry through the broker, for a step the same worker runs at once instead
    of writing it to the outbox. There is no row: the step's inbox row records `event_id` like any delivery's,
    and `causation_id` names the step that led to it."""
    return Envelope(
        event_id=event_id,
        event_type=message.event_type.value,
        schema_version=1,
        aggregate_id=message.aggregate_id,
        aggregate_version=version,
        tenant_id=task.tenant_id,
        trace_id=task.trace_id,
        causation_id=causation_id,
        occurred_at=now,
        payload=message.payload(),
    )


def retry_step(
    conn: Connection,
    task: Task,
    message: RetriedStep,
    failure: ErrorClass | None,
    code: str,
    *,
    budget: RetryBudget,
    now: datetime,
    rng: random.Random,
    url_refreshed: bool = False,
    at_once: bool = False,
    route_for: Any = None,
) -> RetryDecision:
    """A data-plane step (fetch, media) failed: decide by the retry matrix and the step's budget whether it runs
    again, and if so record the error on the task and write the same request again, delayed, with its try count
    advanced. No state change: the task stays where it is. `failure=None` is a refusal no retry can fix.
    `at_once` (a stop, not a fault) keeps the budget but drops the backoff. The caller handles the other verdicts
    (give up, ask a human) with a transition."""
    tries = message.tries
    first = tries.first_failure_at or now
    if failure is None:
        return RetryDecision(Verdict.GIVE_UP, None, f"{code}: output refused by fetch policy")
    # the task's deadline governs only until the vendor produced the output: these steps hold that output and
    # run on their own budget (its deadline_s, manual_confirmation_required), never expiring a paid result
    decision = decide_retry(
        FailureContext(failure, tries.tried, first, tries.step_started_at or first, url_refreshed=url_refreshed),
        budget,
        now,
        rng,
    )
    if decision.verdict not in (Verdict.RETRY, Verdict.REFRESH_URL):
        return decision
    retry_at = now if at_once else (decision.retry_at or now)
    tasks.set_error(conn, task.id, failure, code, now)
    again = replace(message, tries=StepTries(tries.tried + 1, first, tries.step_started_at or first))
    route = route_for(again, retry_at) if route_for is not None else None
    emit(conn, task, again, version=int(task.version), now=now, available_at=retry_at, route=route)
    return RetryDecision(decision.verdict, retry_at, decision.reason)


def _ts(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value
