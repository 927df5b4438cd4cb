"""The manual review queue (DESIGN §5, §13; seed 000 §4.2.3): list, claim, approve, reject.

A claim is a lease: `claimed_by` holds the item until `claimed_until`, after which anyone may take it over. It is
taken with one conditional UPDATE (PENDING, or CLAIMED by nobody alive, or already mine): that statement alone
decides a race between two reviewers, on both dialects (the row lock PostgreSQL takes when the item is read only
makes the loser's explanation exact; SQLite serializes writers anyway).

A decision is one transaction: the item (locked, and guarded again by its conditional UPDATE), the task's
MANUAL_REVIEW → SUCCEEDED / FAILED_FINAL transition through the state machine, the SETTLE ledger row (a
delivered output was paid for, whatever the reviewer thinks of it), the notification outbox row and the audit
row. Only the claimant decides; an item nobody holds is claimed implicitly by deciding it. An approval needs a
playable output: a task held because media processing failed has none, and approving it would be a SUCCEEDED
task a client cannot play (invariant I9) — such a task can only be rejected.

A dry run goes through exactly the same statements inside a savepoint that is rolled back, so the preview is
what the real decision would do; only its audit row is kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import Clock
from aivedio_engine.db import tasks
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import assets, generation_tasks, review_items
from aivedio_engine.domain.status import AssetKind, AssetStatus, EventSource, ReviewState, TaskStatus
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.services import billing, operations
from aivedio_engine.services.errors import Conflict, InvalidInput, NotFound
from aivedio_engine.services.operations import Operation

_r, _t, _as = review_items.c, generation_tasks.c, assets.c
DEFAULT_TTL_S = 900
MAX_TTL_S = 86_400
#: `review list --state` values; "pending" includes items whose claim has expired (anyone may take them)
LIST_STATES = ("pending", "claimed", "decided")
_OPEN = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)
_DECIDED = (ReviewState.APPROVED.value, ReviewState.REJECTED.value)
#: derivatives a player can use; one READY is what "playable" means for approval
_PLAYABLE = (AssetKind.PROXY.value, AssetKind.HLS.value)


@dataclass(frozen=True, slots=True)
class ReviewView:
    id: uuid.UUID
    task_id: uuid.UUID
    asset_id: uuid.UUID | None
    reason: str
    state: str  # pending / claimed / approved / rejected, with expired claims shown as pending
    claimed_by: str | None
    claimed_until: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    created_at: datetime
    task_status: str

    @classmethod
    def of(cls, row: Any, now: datetime) -> ReviewView:
        live_claim = (
            row.state == ReviewState.CLAIMED.value and row.claimed_until is not None and row.claimed_until > now
        )
        state = "claimed" if live_claim else ("pending" if row.state in _OPEN else row.state.lower())
        return cls(
            row.id,
            row.task_id,
            row.asset_id,
            row.reason,
            state,
            row.claimed_by if live_claim or row.state in _DECIDED else None,
            row.claimed_until if live_claim else None,
            row.decided_by,
            row.decided_at,
            row.note,
            row.created_at,
            row.task_status,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "task_id": str(self.task_id),
            "asset_id": None if self.asset_id is None else str(self.asset_id),
            "reason": self.reason,
            "state": self.state,
            "claimed_by": self.claimed_by,
            "claimed_until": _iso(self.claimed_until),
            "decided_by": self.decided_by,
            "decided_at": _iso(self.decided_at),
            "note": self.note,
            "created_at": _iso(self.created_at),
            "task_status": self.task_status,
        }


@dataclass(frozen=True, slots=True)
class Decided:
    item: ReviewView
    task_status: str
    settled: Decimal | None  # actual cost booked by the SETTLE row (None: nothing was reserved)
    dry_run: bool


class ReviewService:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    def list(self, state: str | None = None, limit: int = 200) -> list[ReviewView]:
        """Oldest first (the queue order); `state` is one of LIST_STATES, None for all."""
        now = self._clock.now()
        stmt = _select().order_by(_r.created_at, _r.id).limit(limit)
        live = sa.and_(_r.state == ReviewState.CLAIMED.value, _r.claimed_until > now)
        if state == "pending":
            stmt = stmt.where(_r.state.in_(_OPEN), sa.not_(live))
        elif state == "claimed":
            stmt = stmt.where(live)
        elif state == "decided":
            stmt = stmt.where(_r.state.in_(_DECIDED))
        elif state is not None:
            raise InvalidInput(f"state must be one of {', '.join(LIST_STATES)}, got {state!r}", field="state")
        with self._engine.connect() as conn:
            return [ReviewView.of(row, now) for row in conn.execute(stmt)]

    def claim(self, ref: uuid.UUID, reviewer: str, op: Operation, ttl_s: float = DEFAULT_TTL_S) -> ReviewView:
        """Take (or extend) the lease on an open item; Conflict if another reviewer holds a live claim."""
        reviewer = _reviewer(reviewer)
        if not 0 < ttl_s <= MAX_TTL_S:
            raise InvalidInput(f"ttl must be in (0, {MAX_TTL_S}] seconds, got {ttl_s:g}", field="ttl")
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            item = _resolve(conn, ref)
            with _maybe_rolled_back(conn, op.dry_run):
                _take(conn, item, reviewer, now, now + timedelta(seconds=ttl_s))
                view = ReviewView.of(_read(conn, item.id), now)
            operations.record(conn, op, affected_ids=[item.id], outcome="claimed", now=now)
        return view

    def approve(self, ref: uuid.UUID, reviewer: str, op: Operation) -> Decided:
        return self._decide(ref, reviewer, op, approve=True)

    def reject(self, ref: uuid.UUID, reviewer: str, op: Operation) -> Decided:
        return self._decide(ref, reviewer, op, approve=False)

    def _decide(self, ref: uuid.UUID, reviewer: str, op: Operation, *, approve: bool) -> Decided:
        reviewer = _reviewer(reviewer)
        reason = op.require_reason()
        verdict = ReviewState.APPROVED if approve else ReviewState.REJECTED
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            item = _resolve(conn, ref)
            with _maybe_rolled_back(conn, op.dry_run):
                if item.state in _DECIDED:
                    raise Conflict(f"review item {item.id} was already {item.state.lower()} by {item.decided_by}")
                task = tasks.read(conn, item.task_id, lock=True)
                if task.status != TaskStatus.MANUAL_REVIEW.value:
                    raise Conflict(f"task {task.id} is {task.status}, not MANUAL_REVIEW: nothing to decide")
                if approve and not _playable(conn, task):
                    raise Conflict(
                        f"task {task.id} has no playable output (media processing did not finish):"
                        " it can only be rejected"
                    )
                _take(conn, item, reviewer, now, now)  # only the claimant, or an unclaimed item, gets past here
                conn.execute(
                    review_items.update()
                    .where(_r.id == item.id, _r.state == ReviewState.CLAIMED.value, _r.claimed_by == reviewer)
                    .values(
                        state=verdict.value,
                        decision=verdict.value,
                        decided_by=reviewer,
                        decided_at=now,
                        note=reason or None,
                        claimed_until=None,
                    )
                )
                settled = self._move_task(conn, task, item, reviewer, reason, approve, now)
                view = ReviewView.of(_read(conn, item.id), now)
            operations.record(conn, op, affected_ids=[item.id, item.task_id], outcome=verdict.value.lower(), now=now)
        return Decided(view, view.task_status, settled, op.dry_run)

    def _move_task(
        self, conn: Connection, task: Any, item: Any, reviewer: str, reason: str, approve: bool, now: datetime
    ) -> Decimal | None:
        event = TaskEvent.REVIEW_APPROVED if approve else TaskEvent.REVIEW_REJECTED
        extra: dict[str, Any] = {"review_state": (ReviewState.APPROVED if approve else ReviewState.REJECTED).value}
        if not approve:
            # a stable code; the reviewer's words are in the review note and the state event payload
            extra.update(last_error_class="review_rejected", last_error_code="rejected_in_review")
        try:
            decision = tasks.decide_and_apply(
                conn,
                task,
                event,
                now,
                source=EventSource.ADMIN,
                extra=extra,
                payload={"review_item_id": str(item.id), "reviewer": reviewer, "reason": reason[:500]},
            )
        except tasks.VersionConflict as exc:
            raise Conflict(f"task {task.id} changed while deciding; try again ({exc})") from None
        return billing.close_reservation(conn, task, decision, now, reason=event.value, created_by=reviewer)


def _select() -> sa.Select[Any]:
    return sa.select(review_items, _t.status.label("task_status")).join(generation_tasks, _t.id == _r.task_id)


def _read(conn: Connection, item_id: uuid.UUID) -> Any:
    return conn.execute(_select().where(_r.id == item_id)).one()


def _resolve(conn: Connection, ref: uuid.UUID) -> Any:
    """The item by its id, else the open item of the task with that id (operators often hold a task id)."""
    for where in (_r.id == ref, sa.and_(_r.task_id == ref, _r.state.in_(_OPEN))):
        stmt = sa.select(review_items).where(where)
        if conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        if row is not None:
            return row
    raise NotFound(f"review item {ref} not found (neither an item id nor a task with an open item)")


def _take(conn: Connection, item: Any, reviewer: str, now: datetime, until: datetime) -> None:
    """The conditional UPDATE that makes a claim; explains the refusal when it matches nothing."""
    free = sa.or_(
        _r.state == ReviewState.PENDING.value,
        sa.and_(
            _r.state == ReviewState.CLAIMED.value,
            sa.or_(_r.claimed_until.is_(None), _r.claimed_until <= now, _r.claimed_by == reviewer),
        ),
    )
    still_under_review = sa.exists().where(_t.id == _r.task_id, _t.status == TaskStatus.MANUAL_REVIEW.value)
    values: dict[str, Any] = {"state": ReviewState.CLAIMED.value, "claimed_by": reviewer}
    if until > now:  # a decision claims implicitly without extending anyone's lease
        values["claimed_until"] = until
    won = conn.execute(
        review_items.update().where(_r.id == item.id, free, still_under_review).values(**values).returning(_r.id)
    ).first()
    if won is not None:
        return
    row = _read(conn, item.id)
    if row.state in _DECIDED:
        raise Conflict(f"review item {item.id} was already {row.state.lower()} by {row.decided_by}")
    if row.task_status != TaskStatus.MANUAL_REVIEW.value:
        raise Conflict(f"task {row.task_id} is {row.task_status}, not MANUAL_REVIEW: nothing to review")
    raise Conflict(f"review item {item.id} is claimed by {row.claimed_by} until {_iso(row.claimed_until)}")


def _playable(conn: Connection, task: Any) -> bool:
    if task.output_asset_id is None:
        return False
    return conn.execute(
        sa.select(
            sa.exists().where(
                _as.parent_asset_id == task.output_asset_id,
                _as.kind.in_(_PLAYABLE),
                _as.status == AssetStatus.READY.value,
            )
        )
    ).scalar_one()


@contextmanager
def _maybe_rolled_back(conn: Connection, dry_run: bool) -> Iterator[None]:
    """For a dry run, a savepoint rolled back at the end (errors still propagate); nothing for a real run."""
    if not dry_run:
        yield
        return
    savepoint = conn.begin_nested()
    try:
        yield
    finally:
        if savepoint.is_active:
            savepoint.rollback()


def _reviewer(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 128:
        raise InvalidInput("reviewer name must be 1-128 characters", field="as")
    return name


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
