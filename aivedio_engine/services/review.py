"""The manual review queue: list, claim, approve, reject.

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

An item about a System B step (a manual_required step) is decided the same way, but the decision
moves the step instead of a task: approve → success, reject → failed, through the WorkflowService in the same
transaction as the item and the audit row. No credits move: a step's cost was settled by its own generation task.

A dry run goes through exactly the same statements inside a savepoint that is rolled back, so the preview is
what the real decision would do; only its audit row is kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, reviews, tasks
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import ReviewItem, ReviewRow, Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import AlertSeverity, EventSource, ReviewState, TaskStatus
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.domain.workflow import StepEvent, StepStatus
from aivedio_engine.services import operations
from aivedio_engine.services.delivery import delivered_outputs
from aivedio_engine.services.errors import Conflict, IllegalState, InvalidInput, NotFound
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.transition import Change, VersionConflict, decide_and_execute
from aivedio_engine.services.workflows import WorkflowService

DEFAULT_TTL_S = 900
MAX_TTL_S = 86_400
#: `review list --state` values; "pending" includes items whose claim has expired (anyone may take them)
LIST_STATES = ("pending", "claimed", "decided", "expired")
#: who the review SLA's verdicts are recorded as (the item's decided_by, the audit's actor)
SLA_REVIEWER = "review-sla"
_SLA_PAGE = 200
_OPEN = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)
_DECIDED = (ReviewState.APPROVED.value, ReviewState.REJECTED.value)


@dataclass(frozen=True, slots=True)
class ReviewView:
    id: uuid.UUID
    #: the generation task under review; None for an item about a workflow step
    task_id: uuid.UUID | None
    asset_id: uuid.UUID | None
    reason: str
    state: str  # pending / claimed / approved / rejected, with expired claims shown as pending
    claimed_by: str | None
    claimed_until: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    created_at: datetime
    #: the subject's status: the task's, or the step's (manual_required while it waits)
    task_status: str
    workflow_task_id: uuid.UUID | None = None
    project_id: uuid.UUID | None = None
    step_key: str | None = None

    @property
    def subject(self) -> str:
        """What is under review, for one-line renderings."""
        if self.workflow_task_id is not None:
            return f"project {self.project_id} step {self.step_key}"
        return f"task {self.task_id}"

    @classmethod
    def of(cls, row: ReviewRow, now: datetime) -> ReviewView:
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
            row.workflow_task_id,
            row.project_id,
            row.step_key,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "task_id": None if self.task_id is None else str(self.task_id),
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
            "workflow_task_id": None if self.workflow_task_id is None else str(self.workflow_task_id),
            "project_id": None if self.project_id is None else str(self.project_id),
            "step_key": self.step_key,
        }


@dataclass(frozen=True, slots=True)
class Decided:
    item: ReviewView
    task_status: str
    settled: Decimal | None  # actual cost booked by the SETTLE row (None: nothing was reserved)
    dry_run: bool


def _check_state(state: str | None) -> None:
    if state is not None and state not in LIST_STATES:
        raise InvalidInput(f"state must be one of {', '.join(LIST_STATES)}, got {state!r}", field="state")


class ReviewService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings, workflows: WorkflowService) -> None:
        self._engine = engine
        self._clock = clock
        self._media = settings.media
        self._review = settings.review
        # the context's: a verdict on a workflow step must reach the notifier the project streams listen on
        self._workflows = workflows

    def list(self, state: str | None = None, limit: int = 200) -> list[ReviewView]:
        """Oldest first (the queue order); `state` is one of LIST_STATES, None for all."""
        now = self._clock.now()
        _check_state(state)
        with self._engine.connect() as conn:
            return [ReviewView.of(row, now) for row in reviews.list_items(conn, state, now, limit=limit)]

    def count(self, state: str | None = None) -> int:
        """How many items `list` would return without its limit (a list cut by --limit says so)."""
        now = self._clock.now()
        _check_state(state)
        with self._engine.connect() as conn:
            return reviews.count_items(conn, state, now)

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
        settled: Decimal | None = None
        with write_tx(self._engine) as conn:
            item = _resolve(conn, ref)
            with _maybe_rolled_back(conn, op.dry_run):
                if item.state in _DECIDED:
                    raise Conflict(f"review item {item.id} was already {item.state.lower()} by {item.decided_by}")
                if item.workflow_task_id is not None:
                    view = self._decide_step(conn, item, reviewer, reason, approve, now)
                else:
                    view, settled = self._decide_task(conn, item, reviewer, reason, approve, now)
            subject = item.task_id or item.workflow_task_id
            operations.record(conn, op, affected_ids=[item.id, subject], outcome=verdict.value.lower(), now=now)
        if view.project_id is not None and not op.dry_run:
            self._workflows.signal(view.project_id)
        return Decided(view, view.task_status, settled, op.dry_run)

    def _decide_task(
        self, conn: Connection, item: ReviewItem, reviewer: str, reason: str, approve: bool, now: datetime
    ) -> tuple[ReviewView, Decimal | None]:
        verdict = ReviewState.APPROVED if approve else ReviewState.REJECTED
        assert item.task_id is not None, "an item without a step is about a task (one_subject)"
        task = tasks.get(conn, item.task_id, lock=True)
        if task.status != TaskStatus.MANUAL_REVIEW.value:
            raise Conflict(f"task {task.id} is {task.status}, not MANUAL_REVIEW: nothing to decide")
        if approve and not _playable(conn, task):
            raise Conflict(
                f"task {task.id} has no playable output (media processing did not finish): it can only be rejected"
            )
        _take(conn, item, reviewer, now, now)  # only the claimant, or an unclaimed item, gets past here
        reviews.record_decision(conn, item.id, reviewer, verdict, reason or None, now)
        settled = self._move_task(conn, task, item, reviewer, reason, approve, now)
        return ReviewView.of(_read(conn, item.id), now), settled

    def enforce_sla(self) -> SlaReport:
        """The sweeper's scan of held tasks: `review_sla_near` for items past `review.sla_near_fraction` of the
        SLA, and the SLA's verdict for items past it — `review.on_sla` for a playable output, a reject for a hold
        without one. A live claim defers the verdict until it lapses: a reviewer is deciding."""
        now = self._clock.now()
        sla = timedelta(seconds=self._review.sla_s)
        report = SlaReport()
        with write_tx(self._engine) as conn:
            for item in reviews.open_task_items(conn, now - sla * self._review.sla_near_fraction, limit=_SLA_PAGE):
                if item.created_at > now - sla:
                    report.near += _raise_sla_near(conn, item, item.created_at + sla, now)
        with self._engine.connect() as conn:
            due = reviews.open_task_items(conn, now - sla, limit=_SLA_PAGE)
        for item in due:
            with write_tx(self._engine) as conn:
                verdict = self._sla_verdict(conn, item, now)
            if verdict is not None:
                report.decided.append((item.id, verdict))
        return report

    def _sla_verdict(self, conn: Connection, item: ReviewItem, now: datetime) -> ReviewState | None:
        assert item.task_id is not None, "the SLA scan reads items about tasks only"
        task = tasks.get(conn, item.task_id, lock=True)
        if task.status != TaskStatus.MANUAL_REVIEW.value:
            return None
        if not reviews.take(conn, item.id, SLA_REVIEWER, now, now):
            return None  # decided meanwhile, or a reviewer's claim is live
        delivered = delivered_outputs(conn, task, self._media)
        approve = self._review.on_sla == "approve" and delivered > 0 and _playable(conn, task)
        verdict = ReviewState.APPROVED if approve else ReviewState.REJECTED
        why = f"no verdict within the review SLA of {self._review.sla_s:g}s: " + (
            f"review.on_sla = {self._review.on_sla}" if delivered else "no playable output, never approved"
        )
        reviews.record_decision(conn, item.id, SLA_REVIEWER, verdict, why, now)
        change = Change(
            EventSource.SWEEPER,
            columns={"review_state": verdict.value},
            payload={"review_item_id": str(item.id), "reviewer": SLA_REVIEWER, "reason": why},
            error=None if approve else ErrorOutcome.REVIEW_SLA_PASSED,
            error_code=None if approve else "review_sla_passed",
            ledger_reason="review_sla_approved" if approve else "review_sla_passed",
            delivered=delivered if approve else None,
            created_by=SLA_REVIEWER,
        )
        # a reject by the SLA is not a person's verdict on the output: the tenant is not charged (FINAL_FAILURE)
        decide_and_execute(conn, task, TaskEvent.REVIEW_APPROVED if approve else TaskEvent.FINAL_FAILURE, change, now)
        return verdict

    def _decide_step(
        self, conn: Connection, item: ReviewItem, reviewer: str, reason: str, approve: bool, now: datetime
    ) -> ReviewView:
        """Inside `_decide`'s transaction (and dry-run savepoint): the step moves and its item closes together."""
        assert item.workflow_task_id is not None, "called for an item about a step"
        step = reviews.step_of(conn, item.workflow_task_id)
        _take(conn, item, reviewer, now, now)
        event = StepEvent.APPROVED if approve else StepEvent.REJECTED
        try:
            self._workflows.decide_in(conn, step.project_id, step.step_key, event, by=reviewer, note=reason)
        except IllegalState as exc:
            raise Conflict(str(exc)) from None
        return ReviewView.of(_read(conn, item.id), now)

    def _move_task(
        self, conn: Connection, task: Task, item: ReviewItem, reviewer: str, reason: str, approve: bool, now: datetime
    ) -> Decimal | None:
        event = TaskEvent.REVIEW_APPROVED if approve else TaskEvent.REVIEW_REJECTED
        if not approve and not _playable(conn, task):
            # held because our fetch or media gave up: nothing was delivered, and the reject only says so, so the
            # tenant is not charged (FINAL_FAILURE: released, the vendor's bill is platform cost)
            event = TaskEvent.FINAL_FAILURE
        change = Change(
            EventSource.ADMIN,
            columns={"review_state": (ReviewState.APPROVED if approve else ReviewState.REJECTED).value},
            payload={"review_item_id": str(item.id), "reviewer": reviewer, "reason": reason[:500]},
            # a stable code; the reviewer's words are in the review note and the state event payload
            error=None if approve else ErrorOutcome.REVIEW_REJECTED,
            error_code=None if approve else "rejected_in_review",
            delivered=delivered_outputs(conn, task, self._media) if approve else None,
            created_by=reviewer,
        )
        try:
            return decide_and_execute(conn, task, event, change, now).booked
        except VersionConflict as exc:
            raise Conflict(f"task {task.id} changed while deciding; try again ({exc})") from None


@dataclass
class SlaReport:
    #: items that raised (or bumped) `review_sla_near`
    near: int = 0
    #: items the SLA decided, with the verdict
    decided: list[tuple[uuid.UUID, ReviewState]] = field(default_factory=list)


def _raise_sla_near(conn: Connection, item: ReviewItem, due: datetime, now: datetime) -> int:
    alerts.raise_alert(
        conn,
        alerts.Rule.REVIEW_SLA_NEAR,
        AlertSeverity.WARNING,
        dedup_key=str(item.id),
        now=now,
        subject_type="task",
        subject_id=str(item.task_id),
        message=f"review item {item.id} has no verdict; the review SLA decides it at {_iso(due)}",
        details={"review_item_id": str(item.id), "sla_due_at": _iso(due)},
    )
    return 1


def _read(conn: Connection, item_id: uuid.UUID) -> ReviewRow:
    return reviews.read_item(conn, item_id)


def _resolve(conn: Connection, ref: uuid.UUID) -> ReviewItem:
    """The item by its id, else the open item of the task (or step) with that id (operators often hold those)."""
    row = reviews.resolve(conn, ref)
    if row is not None:
        return row
    raise NotFound(f"review item {ref} not found (neither an item id nor a task with an open item)")


def _take(conn: Connection, item: ReviewItem, reviewer: str, now: datetime, until: datetime) -> None:
    """The conditional UPDATE that makes a claim; explains the refusal when it matches nothing."""
    if reviews.take(conn, item.id, reviewer, now, until):
        return
    row = _read(conn, item.id)
    if row.state in _DECIDED:
        raise Conflict(f"review item {item.id} was already {row.state.lower()} by {row.decided_by}")
    if row.workflow_task_id is not None and row.task_status != StepStatus.MANUAL_REQUIRED.value:
        raise Conflict(f"step {row.step_key} is {row.task_status}, not manual_required: nothing to review")
    if row.task_id is not None and row.task_status != TaskStatus.MANUAL_REVIEW.value:
        raise Conflict(f"task {row.task_id} is {row.task_status}, not MANUAL_REVIEW: nothing to review")
    raise Conflict(f"review item {item.id} is claimed by {row.claimed_by} until {_iso(row.claimed_until)}")


def _playable(conn: Connection, task: Task) -> bool:
    if task.output_asset_id is None:
        return False
    return reviews.has_playable(conn, task.output_asset_id)


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
