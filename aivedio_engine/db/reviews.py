"""Review items written by task transitions: opened when a task enters MANUAL_REVIEW, closed when it leaves
MANUAL_REVIEW without a reviewer's decision (expiry, failure); and the statements of the review service's queue
(list, claim, decide). The rules of claiming and deciding stay in that service."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db.records import ReviewItem, ReviewRow
from aivedio_engine.db.tables import assets, generation_tasks, review_items, workflow_tasks
from aivedio_engine.domain.status import AssetKind, AssetStatus, ReviewState, TaskStatus
from aivedio_engine.domain.workflow import StepStatus

_r, _t, _as, _w = review_items.c, generation_tasks.c, assets.c, workflow_tasks.c
_OPEN = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)
_DECIDED = (ReviewState.APPROVED.value, ReviewState.REJECTED.value)
#: derivatives a player can use; one READY is what "playable" means for approval
_PLAYABLE = (AssetKind.PROXY.value, AssetKind.HLS.value)


def open_item(conn: Connection, *, task_id: uuid.UUID, asset_id: uuid.UUID | None, reason: str, now: datetime) -> None:
    conn.execute(
        review_items.insert().values(
            id=new_id(),
            task_id=task_id,
            asset_id=asset_id,
            reason=reason[:2000],
            state=ReviewState.PENDING.value,
            created_at=now,
        )
    )


def expire_open(conn: Connection, task_id: uuid.UUID, *, by: str, note: str, now: datetime) -> None:
    """Nobody can approve or reject an item whose task has left MANUAL_REVIEW: it closes with the task. An item
    already decided (the SLA's verdict is recorded before the task moves) keeps its verdict."""
    closed = conn.execute(
        review_items.update()
        .where(_r.task_id == task_id, _r.state.in_(_OPEN))
        .values(state=ReviewState.EXPIRED.value, decided_by=by, decided_at=now, note=note)
        .returning(_r.id)
    ).all()
    if closed:
        conn.execute(
            generation_tasks.update()
            .where(generation_tasks.c.id == task_id)
            .values(review_state=ReviewState.EXPIRED.value)
        )


def open_task_items(conn: Connection, opened_before: datetime, *, limit: int) -> list[ReviewItem]:
    """Open items about generation tasks held since before `opened_before`, oldest first (the SLA's scan)."""
    rows = conn.execute(
        sa.select(review_items)
        .where(_r.task_id.is_not(None), _r.state.in_(_OPEN), _r.created_at <= opened_before)
        .order_by(_r.created_at, _r.id)
        .limit(limit)
    ).all()
    return [ReviewItem(*row) for row in rows]


# ------------------------------------------------------------------------------------ the review service's


@dataclass(frozen=True, slots=True)
class StepRef:
    project_id: uuid.UUID
    step_key: str


def list_items(conn: Connection, state: str | None, now: datetime, *, limit: int) -> list[ReviewRow]:
    """Items with their subject's status, oldest first; `state` is pending, claimed, decided or None (all)."""
    stmt = _in_state(_select().order_by(_r.created_at, _r.id).limit(limit), state, now)
    return [ReviewRow(*row) for row in conn.execute(stmt)]


def count_items(conn: Connection, state: str | None, now: datetime) -> int:
    return int(conn.execute(_in_state(sa.select(sa.func.count()).select_from(review_items), state, now)).scalar_one())


def read_item(conn: Connection, item_id: uuid.UUID) -> ReviewRow:
    """The item with its subject's status (`task_status`), project and step key."""
    return ReviewRow(*conn.execute(_select().where(_r.id == item_id)).one())


def resolve(conn: Connection, ref: uuid.UUID) -> ReviewItem | None:
    """The item by its id, else the open item of the task (or step) with that id; locked on PostgreSQL."""
    for where in (
        _r.id == ref,
        sa.and_(_r.task_id == ref, _r.state.in_(_OPEN)),
        sa.and_(_r.workflow_task_id == ref, _r.state.in_(_OPEN)),
    ):
        stmt = sa.select(review_items).where(where)
        if conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        if row is not None:
            return ReviewItem(*row)
    return None


def take(conn: Connection, item_id: uuid.UUID, reviewer: str, now: datetime, until: datetime) -> bool:
    """The conditional UPDATE that makes a claim (PENDING, or CLAIMED by nobody alive, or already mine, and the
    subject still under review); False when it matched nothing."""
    free = sa.or_(
        _r.state == ReviewState.PENDING.value,
        sa.and_(
            _r.state == ReviewState.CLAIMED.value,
            sa.or_(_r.claimed_until.is_(None), _r.claimed_until <= now, _r.claimed_by == reviewer),
        ),
    )
    still_under_review = sa.or_(
        sa.exists().where(_t.id == _r.task_id, _t.status == TaskStatus.MANUAL_REVIEW.value),
        sa.exists().where(_w.id == _r.workflow_task_id, _w.status == StepStatus.MANUAL_REQUIRED.value),
    )
    values: dict[str, Any] = {"state": ReviewState.CLAIMED.value, "claimed_by": reviewer}
    if until > now:  # a decision claims implicitly without extending anyone's lease
        values["claimed_until"] = until
    won = conn.execute(
        review_items.update().where(_r.id == item_id, free, still_under_review).values(**values).returning(_r.id)
    ).first()
    return won is not None


def record_decision(
    conn: Connection, item_id: uuid.UUID, reviewer: str, verdict: ReviewState, note: str | None, now: datetime
) -> None:
    """The claimant's verdict on the item (guarded: still CLAIMED by `reviewer`)."""
    conn.execute(
        review_items.update()
        .where(_r.id == item_id, _r.state == ReviewState.CLAIMED.value, _r.claimed_by == reviewer)
        .values(
            state=verdict.value,
            decision=verdict.value,
            decided_by=reviewer,
            decided_at=now,
            note=note,
            claimed_until=None,
        )
    )


def step_of(conn: Connection, workflow_task_id: uuid.UUID) -> StepRef:
    step = conn.execute(sa.select(_w.project_id, _w.step_key).where(_w.id == workflow_task_id)).one()
    return StepRef(step.project_id, step.step_key)


def has_playable(conn: Connection, output_asset_id: uuid.UUID) -> bool:
    """Whether the output has a READY derivative a player can use."""
    return bool(
        conn.execute(
            sa.select(
                sa.exists().where(
                    _as.parent_asset_id == output_asset_id,
                    _as.kind.in_(_PLAYABLE),
                    _as.status == AssetStatus.READY.value,
                )
            )
        ).scalar_one()
    )


def _in_state(stmt: Any, state: str | None, now: datetime) -> Any:
    live = sa.and_(_r.state == ReviewState.CLAIMED.value, _r.claimed_until > now)
    if state == "pending":
        return stmt.where(_r.state.in_(_OPEN), sa.not_(live))
    if state == "claimed":
        return stmt.where(live)
    if state == "decided":
        return stmt.where(_r.state.in_(_DECIDED))
    if state == "expired":
        return stmt.where(_r.state == ReviewState.EXPIRED.value)
    return stmt


def _select() -> sa.Select[Any]:
    return (
        sa.select(
            review_items,
            sa.func.coalesce(_t.status, _w.status).label("task_status"),
            _w.project_id,
            _w.step_key,
        )
        .outerjoin(generation_tasks, _t.id == _r.task_id)
        .outerjoin(workflow_tasks, _w.id == _r.workflow_task_id)
    )
