"""The stored facts that say a task stopped moving (issue 14), as queries: one place for the sweeper and the audit.

Each query function returns a SELECT of the offending rows at `cutoff` (rows last touched before it): the
sweeper acts on them (`services.keep_moving`, through the readers at the end, which run them in its connection),
`aivedio audit` counts them (`services.invariants_motion`) and the alert evaluator raises one alert per subject.
SQLAlchemy Core only, so PostgreSQL and SQLite answer alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.invariants import uuid_text
from aivedio_engine.db.tables import (
    alerts,
    generation_tasks,
    outbox_events,
    provider_events,
    review_items,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import (
    TASK_TERMINAL,
    AlertStatus,
    AttemptStatus,
    EventSource,
    OutboxStatus,
    ReviewState,
    StateEventOutcome,
    TaskStatus,
)

_t, _a, _e, _pe = generation_tasks.c, task_attempts.c, task_state_events.c, provider_events.c
_o, _al, _r = outbox_events.c, alerts.c, review_items.c
TERMINAL = sorted(s.value for s in TASK_TERMINAL)
#: attempts that hold a job, are sending one, or wait to be sent: none may outlive its task's end (a NEW one also
#: counts as "the probe is on its way" for a half-open breaker, and the slot rebuild keeps a lease for it)
OPEN_ATTEMPT = (
    AttemptStatus.NEW.value,
    AttemptStatus.SENDING.value,
    AttemptStatus.ACKED.value,
    AttemptStatus.RUNNING.value,
)
_PROVIDER_SOURCES = (EventSource.CALLBACK.value, EventSource.POLLING.value)
#: task states past the provider step: the task's job is done with
_PAST_PROVIDER = (
    TaskStatus.OUTPUT_FETCHING.value,
    TaskStatus.POST_PROCESSING.value,
    TaskStatus.MANUAL_REVIEW.value,
    *TERMINAL,
)
_POLLED = (AttemptStatus.ACKED.value, AttemptStatus.RUNNING.value)
#: messages whose consumer moves the task (a status notification moves nothing)
_DRIVING = tuple(
    e.value
    for e in (
        EventType.PROVIDER_SUBMIT_REQUESTED,
        EventType.PROVIDER_STATUS_OBSERVED,
        EventType.FETCH_REQUESTED,
        EventType.MEDIA_PROCESS_REQUESTED,
    )
)


def unapplied_observations(
    cutoff: datetime, task_id: uuid.UUID | None = None, since: datetime | None = None
) -> sa.Select[Any]:
    """Provider observations stored for an attempt and received before `cutoff` (and after `since`) that the
    reducer never classified (no state event carries their dedup key): their message was lost. Oldest first."""
    classified = sa.exists().where(_e.source == _pe.source, _e.source_event_id == _pe.dedup_key)
    stmt = (
        sa.select(
            _pe.id.label("provider_event_id"),
            _pe.provider,
            _pe.provider_job_id,
            _a.task_id,
            _pe.received_at,
            _pe.observation,
        )
        .join(task_attempts, _a.id == _pe.matched_attempt_id)
        .where(sa.not_(_pe.orphan), _pe.received_at <= cutoff, sa.not_(classified))
        .order_by(_pe.received_at, _pe.id)
    )
    if since is not None:
        stmt = stmt.where(_pe.received_at > since)
    return stmt if task_id is None else stmt.where(_a.task_id == task_id)


def newer_unapplied_observations(cutoff: datetime) -> sa.Select[Any]:
    """Of `unapplied_observations`, those received after the task's newest applied provider observation (or
    with none applied yet): a fact that should have moved the task and did not."""
    u = unapplied_observations(cutoff).subquery()
    last_applied = (
        sa.select(sa.func.max(_e.created_at))
        .where(
            _e.task_id == u.c.task_id,
            _e.source.in_(_PROVIDER_SOURCES),
            _e.outcome == StateEventOutcome.APPLIED.value,
        )
        .scalar_subquery()
    )
    return sa.select(u.c.provider_event_id, u.c.provider, u.c.provider_job_id, u.c.task_id, u.c.received_at).where(
        sa.or_(last_applied.is_(None), u.c.received_at > last_applied)
    )


def bound_orphans() -> sa.Select[Any]:
    """Orphan observations whose job id an attempt owns now: their rematch was missed (it looked before they
    committed, or the reducer made them orphans after the job id was bound)."""
    return (
        sa.select(_pe.id.label("provider_event_id"), _pe.provider, _pe.provider_job_id, _a.id.label("attempt_id"))
        .join(task_attempts, sa.and_(_a.provider == _pe.provider, _a.provider_job_id == _pe.provider_job_id))
        .where(_pe.orphan)
        .order_by(_pe.received_at, _pe.id)
    )


def open_attempts_of_ended_tasks(cutoff: datetime, states: tuple[str, ...] = OPEN_ATTEMPT) -> sa.Select[Any]:
    """Attempts still NEW/SENDING/ACKED/RUNNING (or `states`), untouched since `cutoff`, whose task has ended:
    each keeps a slot (the slot rebuild counts it), its job is polled for ever, and a NEW one blocks a half-open
    breaker's probe."""
    return (
        sa.select(_a.id.label("attempt_id"), _a.task_id, _a.submit_state, _t.status.label("task_status"))
        .join(generation_tasks, _t.id == _a.task_id)
        .where(_t.status.in_(TERMINAL), _a.submit_state.in_(states), _a.updated_at <= cutoff)
        .order_by(_a.updated_at, _a.id)
    )


def tasks_not_moving(cutoff: datetime, dialect: str) -> sa.Select[Any]:
    """Non-terminal tasks untouched since `cutoff` with no driving message in flight, no due time and no parked
    alert (nor a person holding them in review): nothing will ever move them."""
    own = sa.or_(
        _o.aggregate_id == _t.id,
        # the submit message's aggregate is the attempt
        _o.aggregate_id.in_(sa.select(_a.id).where(_a.task_id == _t.id).correlate(generation_tasks).scalar_subquery()),
    )
    in_flight = sa.exists().where(
        own,
        _o.event_type.in_(_DRIVING),
        sa.or_(
            _o.status == OutboxStatus.PENDING.value,
            sa.and_(_o.status == OutboxStatus.PUBLISHED.value, _o.published_at >= cutoff),
        ),
    )
    polled = sa.exists().where(_a.task_id == _t.id, _a.submit_state.in_(_POLLED), _a.next_poll_at >= cutoff)
    due = sa.or_(
        _t.status == TaskStatus.QUEUED.value,  # the dispatcher's scan is its due list
        # NULL-safe: under NOT, one unknown comparison would hide the whole row
        sa.and_(_t.next_action_at.is_not(None), _t.next_action_at >= cutoff),
        sa.and_(_t.next_retry_at.is_not(None), _t.next_retry_at >= cutoff),
        polled,
    )
    told = sa.exists().where(_al.subject_id == uuid_text(dialect, _t.id), _al.status != AlertStatus.RESOLVED.value)
    held = sa.exists().where(_r.task_id == _t.id, _r.state.in_((ReviewState.PENDING.value, ReviewState.CLAIMED.value)))
    parked = sa.or_(sa.and_(_t.parked_reason.is_not(None), told), sa.and_(_t.status == "MANUAL_REVIEW", held))
    return sa.select(_t.id.label("task_id"), _t.status, _t.updated_at).where(
        _t.status.not_in(TERMINAL),
        _t.updated_at < cutoff,
        sa.not_(sa.or_(in_flight, due, parked)),
    )


def leases_not_in_flight(cutoff: datetime) -> sa.Select[Any]:
    """Attempts the slot rebuild keeps a lease for (NEW, SENDING, ACKED, RUNNING: UNKNOWN ones may be running at
    the provider), untouched since `cutoff`, whose task is past its provider step or on another attempt."""
    return (
        sa.select(_a.id.label("attempt_id"), _a.task_id, _a.submit_state, _t.status.label("task_status"))
        .join(generation_tasks, _t.id == _a.task_id)
        .where(
            _a.submit_state.in_(OPEN_ATTEMPT),
            _a.updated_at < cutoff,
            sa.or_(_t.status.in_(_PAST_PROVIDER), _a.attempt_no != sa.func.coalesce(_t.current_attempt_no, 0)),
        )
    )


# --- the sweeper's reads of the above (services.keep_moving) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnappliedObservation:
    provider_event_id: uuid.UUID
    provider: str
    provider_job_id: str | None
    task_id: uuid.UUID
    received_at: datetime
    #: the stored observation (JSON), reduced again as it is
    observation: Any


@dataclass(frozen=True, slots=True)
class BoundOrphan:
    provider: str
    provider_job_id: str
    attempt_id: uuid.UUID


def count_unapplied(conn: Connection, cutoff: datetime, task_id: uuid.UUID | None = None) -> int:
    """How many rows `unapplied_observations(cutoff, task_id)` has (all of them, no limit)."""
    query = unapplied_observations(cutoff, task_id)
    return int(conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar_one())


def unapplied_rows(
    conn: Connection, cutoff: datetime, task_id: uuid.UUID | None, since: datetime | None, limit: int
) -> list[UnappliedObservation]:
    """The oldest `limit` rows of `unapplied_observations`."""
    rows = conn.execute(unapplied_observations(cutoff, task_id, since).limit(limit))
    return [
        UnappliedObservation(
            provider_event_id=r.provider_event_id,
            provider=r.provider,
            provider_job_id=r.provider_job_id,
            task_id=r.task_id,
            received_at=r.received_at,
            observation=r.observation,
        )
        for r in rows
    ]


def bound_orphan_rows(conn: Connection, limit: int) -> list[BoundOrphan]:
    """The oldest `limit` rows of `bound_orphans`."""
    rows = conn.execute(bound_orphans().limit(limit)).all()
    return [BoundOrphan(provider=r.provider, provider_job_id=r.provider_job_id, attempt_id=r.attempt_id) for r in rows]


def open_attempt_ids_of_ended_tasks(
    conn: Connection, cutoff: datetime, states: tuple[str, ...], limit: int
) -> list[uuid.UUID]:
    """The attempt ids of the oldest `limit` rows of `open_attempts_of_ended_tasks`."""
    return [r.attempt_id for r in conn.execute(open_attempts_of_ended_tasks(cutoff, states).limit(limit))]
