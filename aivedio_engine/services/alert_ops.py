"""Alerts for on-call (`aivedio alerts`, the TUI's Alerts screen): list, acknowledge, resolve — audited.

Acknowledging says "someone is on it": the alert stays unresolved, a repeat of its condition only bumps
`last_seen_at` (db.alerts.raise_alert), so the on-call engineer is not paged twice for one incident. Resolving
closes it; if the condition still holds, the engine raises a fresh alert, which is what should happen. The
alert of a task that is still parked is refused resolution: nothing would raise it again, and it is the only
trace that the task (possibly a paid job) waits for a human.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.db import alerts
from aivedio_engine.db.alerts import AlertState, AlertView
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import ALERT_LIST_STATUSES, AlertSeverity, AlertStatus
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.operations import Operation, record

UNRESOLVED = (AlertStatus.OPEN.value, AlertStatus.ACKNOWLEDGED.value)
#: `list` filters by these names
LIST_STATUSES = ALERT_LIST_STATUSES
_STATUS_FILTER: dict[str, tuple[str, ...]] = {
    "unresolved": UNRESOLVED,
    "open": (AlertStatus.OPEN.value,),
    "acknowledged": (AlertStatus.ACKNOWLEDGED.value,),
    "resolved": (AlertStatus.RESOLVED.value,),
    "all": tuple(s.value for s in AlertStatus),
}
MAX_IDS = 1000
NOT_FOUND = "not found"


@dataclass(frozen=True)
class AlertChange:
    changed: list[uuid.UUID]
    #: (id, why it was left alone: "not found", "already RESOLVED"): nothing to do
    skipped: list[tuple[uuid.UUID, str]]
    dry_run: bool
    #: (id, why the change is not allowed): e.g. the alert of a task that is still parked
    refused: list[tuple[uuid.UUID, str]] = field(default_factory=list)


class AlertOps:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    def list(
        self, status: str = "unresolved", rule: str | None = None, severity: str | None = None, limit: int = 100
    ) -> list[AlertView]:
        """Newest first."""
        if status not in _STATUS_FILTER:
            raise InvalidInput(f"status must be one of {', '.join(LIST_STATUSES)}, got {status!r}", field="status")
        if severity is not None and severity not in {s.value for s in AlertSeverity}:
            raise InvalidInput(
                f"severity must be one of {', '.join(s.value for s in AlertSeverity)}, got {severity!r}",
                field="severity",
            )
        if not 1 <= limit <= 10_000:
            raise InvalidInput("limit must be between 1 and 10000", field="limit")
        return alerts.find(self._engine, _STATUS_FILTER[status], rule, severity, limit=limit)

    def count(self, status: str = "unresolved", rule: str | None = None, severity: str | None = None) -> int:
        """How many alerts `list` would return without its limit (a list cut by --limit says so)."""
        return alerts.count(self._engine, _STATUS_FILTER[status], rule, severity)

    def acknowledge(self, ids: Sequence[uuid.UUID], op: Operation) -> AlertChange:
        """OPEN → ACKNOWLEDGED, by `op.actor`."""
        return self._change(
            ids, op, allowed=(AlertStatus.OPEN.value,), to=AlertStatus.ACKNOWLEDGED, outcome="acknowledged"
        )

    def resolve(self, ids: Sequence[uuid.UUID], op: Operation) -> AlertChange:
        """OPEN or ACKNOWLEDGED → RESOLVED."""
        return self._change(ids, op, allowed=UNRESOLVED, to=AlertStatus.RESOLVED, outcome="resolved")

    def _change(
        self, ids: Sequence[uuid.UUID], op: Operation, *, allowed: tuple[str, ...], to: AlertStatus, outcome: str
    ) -> AlertChange:
        op.require_reason()
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            raise InvalidInput("name at least one alert id", field="ids")
        if len(wanted) > MAX_IDS:
            raise InvalidInput(f"at most {MAX_IDS} alerts per change", field="ids")
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            found = alerts.lock_states(conn, wanted)
            skipped = [
                (i, NOT_FOUND if i not in found else f"already {found[i].status}")
                for i in wanted
                if i not in found or found[i].status not in allowed
            ]
            changing = [i for i in wanted if i in found and found[i].status in allowed]
            refused: list[tuple[uuid.UUID, str]] = []
            if to is AlertStatus.RESOLVED:
                held = _parked_tasks(conn, [found[i] for i in changing])
                refused = [
                    (
                        i,
                        f"task {found[i].subject_id} is still parked ({held[found[i].subject_id]}): "
                        "acknowledge instead, or reconcile/cancel the task first",
                    )
                    for i in changing
                    if found[i].subject_id in held
                ]
                changing = [i for i in changing if found[i].subject_id not in held]
            if changing and not op.dry_run:
                values: dict[str, Any] = {"status": to.value}
                if to is AlertStatus.ACKNOWLEDGED:
                    values |= {"acknowledged_by": op.actor[:128], "acknowledged_at": now}
                else:
                    values["resolved_at"] = now
                alerts.set_status(conn, changing, allowed=allowed, values=values)
            record(
                conn,
                op,
                affected_ids=[] if op.dry_run else changing,
                outcome=(
                    "dry_run" if op.dry_run else outcome if changing else "refused" if refused else "nothing_to_do"
                ),
                now=now,
            )
        return AlertChange(changing, skipped, op.dry_run, refused)


def _parked_tasks(conn: Connection, rows: Sequence[AlertState]) -> dict[str | None, str]:
    """subject id → parked reason, for the alerts' tasks that are still parked and unfinished: the alert is then
    the only sign a human must act (audit I2.2), so it may be acknowledged but not resolved."""
    ids: dict[uuid.UUID, str | None] = {}
    for r in rows:
        if r.subject_type == "task" and r.subject_id:
            try:
                ids[uuid.UUID(r.subject_id)] = r.subject_id
            except ValueError:
                continue
    if not ids:
        return {}
    parked = alerts.parked_unfinished(conn, list(ids))
    return {ids[task_id]: reason for task_id, reason in parked.items()}
