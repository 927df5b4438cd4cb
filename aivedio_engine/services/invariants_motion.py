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

from aivedio_engine.config import Settings
from aivedio_engine.db import invariants as q
from aivedio_engine.db import stalled
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.invariants import Scope
from aivedio_engine.domain.status import AlertSeverity
from aivedio_engine.services.invariants import CHECKS, check

check(
    "I2.4",
    "no attempt NEW, SENDING, ACKED or RUNNING while its task is terminal (past the grace)",
    lambda s: stalled.open_attempts_of_ended_tasks(s.cutoff),
)
check(
    "I2.5",
    "every non-terminal task has a message in flight, a due time, or a parked alert",
    lambda s: stalled.tasks_not_moving(s.cutoff, s.dialect),
)
check(
    "I7.4",
    "no slot held for an attempt that is not in flight (its task ended, moved past it, or on)",
    lambda s: stalled.leases_not_in_flight(s.cutoff),
)
check(
    "I10.3",
    "no stored provider observation newer than the task's last applied one left unapplied",
    lambda s: stalled.newer_unapplied_observations(s.cutoff),
)


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
        for row in q.sample(conn, c.query(scope), ALERT_ROWS):
            subject = str(row[key])
            found.append(
                Finding(
                    rule,
                    AlertSeverity.WARNING,
                    dedup_key=f"{check_id}:{subject}",
                    message=f"{check_id} {c.description}: {subject_type} {subject}",
                    subject_type=subject_type,
                    subject_id=subject,
                    details={k: str(v) for k, v in row.items() if k != "observation"},
                )
            )
    return found
