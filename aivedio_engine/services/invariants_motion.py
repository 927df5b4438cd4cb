"""`aivedio audit`'s invariants about motion (issue 14): every task keeps moving, and nothing it left behind holds
a slot or a fact. Registered into `invariants.CHECKS` like the others; each also has an alert rule, raised by the
sweeper's alert evaluator (`findings`) for each offending subject once the sweeper's own repair had its budget.

- I2.4: no attempt SENDING/ACKED/RUNNING while its task is terminal (it keeps a slot, its job is polled for ever);
- I2.5: every non-terminal task has a message in flight, a due time, or a parked alert (or a person holding it);
- I7.4: no slot held for an attempt that is not in flight: the slot rebuild keeps a lease for every NEW, SENDING,
  ACKED or RUNNING attempt, so one whose task is past its provider step (or ended, or moved on to another
  attempt) holds a slot nobody uses. (UNKNOWN attempts may be running at the provider: they keep theirs.)
- I10.3: no stored provider observation newer than the task's last applied one left unapplied past the budget.

The budget is the audit's grace (`--grace`); the sweeper repairs the first and the last after
`sweeper.observation_stuck_s`, so a clean run after a sweep passes them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from aivedio_engine.config import Settings
from aivedio_engine.db import stalled
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.tables import (
    alerts,
    generation_tasks,
    outbox_events,
    review_items,
    task_attempts,
)
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import (
    AlertSeverity,
    AlertStatus,
    AttemptStatus,
    OutboxStatus,
    ReviewState,
    TaskStatus,
)
from aivedio_engine.services.invariants import CHECKS, Scope, check, uuid_text

_t, _a, _o, _al, _r = generation_tasks.c, task_attempts.c, outbox_events.c, alerts.c, review_items.c
#: attempts the slot rebuild keeps a lease for that can be told not in flight from the rows (UNKNOWN cannot)
_LEASED = (AttemptStatus.NEW.value, AttemptStatus.SENDING.value, AttemptStatus.ACKED.value, AttemptStatus.RUNNING.value)
#: task states past the provider step: the task's job is done with
_PAST_PROVIDER = (
    TaskStatus.OUTPUT_FETCHING.value,
    TaskStatus.POST_PROCESSING.value,
    TaskStatus.MANUAL_REVIEW.value,
    *stalled.TERMINAL,
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


@check("I2.4", "no attempt NEW, SENDING, ACKED or RUNNING while its task is terminal (past the grace)")
def _i2_4(s: Scope) -> sa.Select[Any]:
    return stalled.open_attempts_of_ended_tasks(s.cutoff)


@check("I2.5", "every non-terminal task has a message in flight, a due time, or a parked alert")
def _i2_5(s: Scope) -> sa.Select[Any]:
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
            sa.and_(_o.status == OutboxStatus.PUBLISHED.value, _o.published_at >= s.cutoff),
        ),
    )
    polled = sa.exists().where(_a.task_id == _t.id, _a.submit_state.in_(_POLLED), _a.next_poll_at >= s.cutoff)
    due = sa.or_(
        _t.status == TaskStatus.QUEUED.value,  # the dispatcher's scan is its due list
        # NULL-safe: under NOT, one unknown comparison would hide the whole row
        sa.and_(_t.next_action_at.is_not(None), _t.next_action_at >= s.cutoff),
        sa.and_(_t.next_retry_at.is_not(None), _t.next_retry_at >= s.cutoff),
        polled,
    )
    told = sa.exists().where(_al.subject_id == uuid_text(s, _t.id), _al.status != AlertStatus.RESOLVED.value)
    held = sa.exists().where(_r.task_id == _t.id, _r.state.in_((ReviewState.PENDING.value, ReviewState.CLAIMED.value)))
    parked = sa.or_(sa.and_(_t.parked_reason.is_not(None), told), sa.and_(_t.status == "MANUAL_REVIEW", held))
    return sa.select(_t.id.label("task_id"), _t.status, _t.updated_at).where(
        _t.status.not_in(stalled.TERMINAL),
        _t.updated_at < s.cutoff,
        sa.not_(sa.or_(in_flight, due, parked)),
    )


@check("I7.4", "no slot held for an attempt that is not in flight (its task ended, moved past it, or on)")
def _i7_4(s: Scope) -> sa.Select[Any]:
    return (
        sa.select(_a.id.label("attempt_id"), _a.task_id, _a.submit_state, _t.status.label("task_status"))
        .join(generation_tasks, _t.id == _a.task_id)
        .where(
            _a.submit_state.in_(_LEASED),
            _a.updated_at < s.cutoff,
            sa.or_(_t.status.in_(_PAST_PROVIDER), _a.attempt_no != sa.func.coalesce(_t.current_attempt_no, 0)),
        )
    )


@check("I10.3", "no stored provider observation newer than the task's last applied one left unapplied")
def _i10_3(s: Scope) -> sa.Select[Any]:
    return stalled.newer_unapplied_observations(s.cutoff)


#: the alert rule of each check, and what its subject is
RULES: dict[str, tuple[Rule, str, str]] = {
    "I2.4": (Rule.ATTEMPT_OPEN_AFTER_TASK_ENDED, "attempt", "attempt_id"),
    "I2.5": (Rule.TASK_NOT_MOVING, "task", "task_id"),
    "I7.4": (Rule.SLOT_HELD_NOT_IN_FLIGHT, "attempt", "attempt_id"),
    "I10.3": (Rule.OBSERVATION_UNAPPLIED, "provider_event", "provider_event_id"),
}
#: subjects alerted per rule and evaluation: the audit lists the rest
ALERT_ROWS = 20


def alert_grace(settings: Settings) -> timedelta:
    """How long the alerts wait: the longest step budget plus two sweeps, so the sweeper's repair came first."""
    sw = settings.sweeper
    return timedelta(seconds=max(sw.observation_stuck_s, sw.fetch_stuck_s, sw.media_stuck_s) + 2 * sw.interval_s)


def findings(conn: Connection, settings: Settings, now: datetime) -> list[Any]:
    """One finding per offending subject of each motion invariant (`observability.alert_rules.Finding`)."""
    from aivedio_engine.observability.alert_rules import Finding

    scope = Scope(conn.dialect.name, now, alert_grace(settings))
    found = []
    for check_id, (rule, subject_type, key) in RULES.items():
        c = CHECKS[check_id]
        for row in conn.execute(c.query(scope).limit(ALERT_ROWS)):
            subject = str(row._mapping[key])
            found.append(
                Finding(
                    rule,
                    AlertSeverity.WARNING,
                    dedup_key=f"{check_id}:{subject}",
                    message=f"{check_id} {c.description}: {subject_type} {subject}",
                    subject_type=subject_type,
                    subject_id=subject,
                    details={k: str(v) for k, v in row._mapping.items() if k != "observation"},
                )
            )
    return found
