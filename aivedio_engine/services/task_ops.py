"""Operator views of generation tasks (`aivedio tasks...`): list with filters, one task's timeline,
a live stream of state changes, and cancellation by an operator.

Unlike `GenerationService`, nothing here is scoped to a tenant: these are the on-call engineer's tools, and every
change they make carries an `Operation` and leaves an audit row in the same transaction.
Results are plain dataclasses and dicts whose keys are the JSON contract of `--json` (see `jsonable`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.db import task_admin, tasks
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.task_admin import TaskFilter, TaskRow
from aivedio_engine.domain.durations import parse_seconds
from aivedio_engine.domain.status import EventSource, TaskStatus
from aivedio_engine.domain.transitions import Decision, Rejection, RejectionKind, TaskEvent, decide
from aivedio_engine.services.errors import IllegalState, InvalidInput, NotFound
from aivedio_engine.services.generations import apply_cancel
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.task_timeline import Timeline, build_timeline

#: how far behind the newest event a live tail re-reads: a transaction that took its (time-ordered) id earlier
#: may commit after a later one, and a tail that only looked past its cursor would never show it
TAIL_GRACE = timedelta(seconds=5)

__all__ = ["CancelResult", "EventTail", "TaskOps", "TaskRow", "Timeline", "jsonable", "parse_duration", "prefix_range"]


def parse_duration(text: str) -> timedelta:
    """`90`, `90s`, `10m`, `2h`, `1d` → timedelta."""
    try:
        return timedelta(seconds=parse_seconds(text))
    except ValueError as exc:
        raise InvalidInput(str(exc), field="duration") from None


def prefix_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The smallest and largest id starting with `prefix` (hex digits, dashes ignored): a range the primary key
    index answers, where `id::text LIKE 'prefix%'` would read every row."""
    digits = prefix.strip().lower().replace("-", "")
    if not digits or len(digits) > 32 or any(c not in "0123456789abcdef" for c in digits):
        raise InvalidInput(f"{prefix.strip()!r} is not the start of an id (hex digits)", field="id_prefix")
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def parse_status(text: str) -> TaskStatus:
    try:
        return TaskStatus(text.strip().upper())
    except ValueError:
        raise InvalidInput(
            f"unknown status {text!r} (one of: {', '.join(s.value for s in TaskStatus)})", field="status"
        ) from None


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes, Decimals and UUIDs → the JSON the CLI and TUI print (ISO times, exact money)."""
    if hasattr(value, "__dataclass_fields__"):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")  # "0.00000000", never "0E-8"
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return value


@dataclass(frozen=True, slots=True)
class CancelResult:
    task_id: uuid.UUID
    tenant_id: uuid.UUID
    from_status: str
    #: where the task is (or, for a dry run, would be) after the cancel
    to_status: str
    #: canceled | cancel_requested | already | would_cancel | would_request_cancel
    outcome: str
    dry_run: bool
    #: credits given back by this cancel (None when nothing was booked)
    released: Decimal | None


class TaskOps:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    # --------------------------------------------------------------------------------------------- list
    def list(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        provider: str | None = None,
        older_than: timedelta | None = None,
        id_prefix: str | None = None,
        limit: int = 50,
    ) -> list[TaskRow]:
        """Most recently changed first. `older_than` compares `updated_at`: a task nothing touched for that long
        (the question on-call asks: what is stuck?), not merely one created long ago. `id_prefix`: the tasks
        whose id starts with these hex digits (what an operator copied from a narrow screen or a ticket)."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1", field="limit")
        with self._engine.connect() as conn:
            where = self._filter(conn, status, tenant, provider, older_than)
            id_range = prefix_range(id_prefix) if id_prefix is not None else None
            return task_admin.list_tasks(conn, where, id_range=id_range, limit=limit)

    def count(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        provider: str | None = None,
        older_than: timedelta | None = None,
    ) -> int:
        """How many tasks `list` would return without its limit (a list cut by --limit says so)."""
        with self._engine.connect() as conn:
            return task_admin.count_tasks(conn, self._filter(conn, status, tenant, provider, older_than))

    def _filter(
        self,
        conn: Connection,
        status: str | None,
        tenant: str | None,
        provider: str | None,
        older_than: timedelta | None,
    ) -> TaskFilter:
        return TaskFilter(
            status=parse_status(status).value if status is not None else None,
            provider=provider,
            updated_before=self._clock.now() - older_than if older_than is not None else None,
            tenant_id=self._tenant_id(conn, tenant) if tenant is not None else None,
        )

    @staticmethod
    def _tenant_id(conn: Connection, tenant: str) -> uuid.UUID:
        """A tenant given by id or by name; an unknown name is NotFound rather than an empty list."""
        try:
            return uuid.UUID(tenant)
        except ValueError:
            pass
        found = task_admin.tenant_id_by_name(conn, tenant)
        if found is None:
            raise NotFound(f"tenant {tenant!r} not found")
        return found

    def prompt(self, task_id: uuid.UUID) -> str:
        """What the client asked for: a reviewer judges the output against it (the timeline leaves it out)."""
        with self._engine.connect() as conn:
            row = tasks.read(conn, task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return str(row.prompt)

    # ----------------------------------------------------------------------------------------- timeline
    def timeline(self, task_id: uuid.UUID) -> Timeline:
        with self._engine.connect() as conn:
            found = build_timeline(conn, task_id)
        if found is None:
            raise NotFound(f"task {task_id} not found")
        return found

    # --------------------------------------------------------------------------------------------- tail
    def tail(self, *, after: uuid.UUID | None = None, status: str | None = None, last: int = 10) -> EventTail:
        return EventTail(self._engine, after=after, to_status=parse_status(status).value if status else None, last=last)

    # ------------------------------------------------------------------------------------------- cancel
    def cancel_preview(self, task_id: uuid.UUID) -> CancelResult:
        """What `cancel` would do now; reads only (the confirmation prompt shows it)."""
        with self._engine.connect() as conn:
            row = tasks.read(conn, task_id)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            return self._decide_cancel(row, dry_run=True)[0]

    def cancel(self, task_id: uuid.UUID, op: Operation) -> CancelResult:
        """Cancel as an operator, for any tenant: the same decision and bookings as a client's cancel
        (`GenerationService.cancel`), recorded from source `admin` with the operator and reason, and the audit
        row in the same transaction. Repeating it is harmless; a finished task is IllegalState."""
        reason = op.require_reason()
        with write_tx(self._engine) as conn:
            row = tasks.read(conn, task_id, lock=True)
            if row is None:
                raise NotFound(f"task {task_id} not found")
            now = self._clock.now()
            result, decision = self._decide_cancel(row, dry_run=op.dry_run)
            if decision is not None and not op.dry_run:
                released = apply_cancel(
                    conn,
                    row,
                    decision,
                    now,
                    source=EventSource.ADMIN,
                    created_by=f"operator:{op.actor}"[:128],
                    payload={"requested_by": op.actor, "reason": reason},
                )
                if released is not None:
                    result = replace(result, released=Decimal(row.reserved_amount) - released)
            record(conn, op, affected_ids=[task_id], outcome=result.outcome, now=now)
            return result

    def _decide_cancel(self, row: Task, *, dry_run: bool) -> tuple[CancelResult, Decision | None]:
        decision = decide(tasks.snapshot(row), TaskEvent.CANCEL_REQUESTED, self._clock.now())

        def result(to_status: str, outcome: str) -> CancelResult:
            return CancelResult(row.id, row.tenant_id, row.status, to_status, outcome, dry_run, released=None)

        if isinstance(decision, Rejection):
            if row.status in (TaskStatus.CANCELED.value, TaskStatus.CANCEL_REQUESTED.value):
                return result(row.status, "already"), None
            why = "finished" if decision.kind is RejectionKind.TERMINAL else "past the point of cancellation"
            raise IllegalState(f"task {row.id} is {row.status}: {why}", current_status=row.status)
        direct = decision.to_status is TaskStatus.CANCELED
        outcome = (
            ("would_cancel" if direct else "would_request_cancel")
            if dry_run
            else ("canceled" if direct else "cancel_requested")
        )
        return result(decision.to_status.value, outcome), decision


class EventTail:
    """Follows `task_state_events` in id order (ids are UUIDv7, i.e. time-ordered). It starts after `after`, or
    with the newest `last` events like tail(1), and re-reads a short grace window behind its cursor, skipping
    events it already returned, so an event whose transaction committed late still shows up once. Nothing at or
    before the starting point is ever returned (that history is what `--after` / `last` chose to skip)."""

    def __init__(self, engine: Engine, *, after: uuid.UUID | None, to_status: str | None, last: int = 10) -> None:
        self._engine = engine
        self._to_status = to_status
        self._last = max(0, last)
        self.cursor: uuid.UUID | None = after
        self._start: uuid.UUID | None = after
        self._started = after is not None
        self._seen: set[uuid.UUID] = set()

    def poll(self, limit: int = 500) -> list[dict[str, Any]]:
        rows: Sequence[Any]
        with self._engine.connect() as conn:
            if not self._started:
                rows = list(reversed(task_admin.newest_events(conn, self._to_status, self._last)))
                self._start = rows[-1].id if rows else task_admin.newest_event_id(conn)
                self.cursor = self._start
                self._started = True
            else:
                floors = [f for f in (_grace_floor(self.cursor), self._start) if f is not None]
                floor = max(floors) if floors else None
                rows = task_admin.events_after(conn, self._to_status, floor, limit + len(self._seen))
        fresh = [r for r in rows if r.id not in self._seen][:limit]
        if fresh:
            self.cursor = max(fresh[-1].id, self.cursor) if self.cursor else fresh[-1].id
            floor = _grace_floor(self.cursor)
            self._seen = {i for i in self._seen | {r.id for r in fresh} if floor is None or i > floor}
        return [_event(r) for r in fresh]


def _grace_floor(cursor: uuid.UUID | None) -> uuid.UUID | None:
    """The smallest UUIDv7 of TAIL_GRACE before `cursor`'s millisecond timestamp."""
    if cursor is None:
        return None
    ms = max(0, (cursor.int >> 80) - int(TAIL_GRACE.total_seconds() * 1000))
    return uuid.UUID(int=ms << 80)


def _event(r: Any) -> dict[str, Any]:
    return {
        "cursor": r.id,
        "at": r.created_at,
        "task_id": r.task_id,
        "attempt_id": r.attempt_id,
        "source": r.source,
        "event_type": r.event_type,
        "from_status": r.from_status,
        "to_status": r.to_status,
        "task_version": int(r.task_version),
        "outcome": r.outcome,
    }
