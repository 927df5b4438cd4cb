"""System B persistence: projects, their step rows (`workflow_tasks`) and the append-only step history.

Repositories take a `Connection` and leave the commit to the caller (the workflow service owns transactions).
Rows come back as frozen records. A step row is created only when the step becomes ready, so "due" is a plain
index scan (`ix_workflow_tasks_due`); the DAG lives in the domain, not in SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from aivedio_engine.clock import new_id
from aivedio_engine.db.step_queues import announce
from aivedio_engine.db.tables import assets, projects, review_items, workflow_task_events, workflow_tasks
from aivedio_engine.domain.project import ProjectStatus
from aivedio_engine.domain.status import AssetKind, AssetStatus, DerivativeProfile, ReviewState
from aivedio_engine.domain.step_limits import step_priority
from aivedio_engine.domain.workflow import STEP_SPECS, StepStatus, StepType

_p = projects.c
_w = workflow_tasks.c
_ev = workflow_task_events.c
_r = review_items.c
#: `conn.info` key: ids of the projects this transaction changed, signalled to their event streams after commit
CHANGED = "aivedio_projects_changed"


def _changed(conn: Connection, project_id: uuid.UUID) -> None:
    conn.info.setdefault(CHANGED, set()).add(project_id)


class StaleVersion(Exception):
    """The row moved since it was read (CAS on `version` missed)."""


@dataclass(frozen=True, slots=True)
class Project:
    id: uuid.UUID
    tenant_id: uuid.UUID
    workflow: str
    user_ref: str
    priority: int
    formal: bool
    idempotency_key: str | None
    input: dict[str, Any]
    input_hash: str
    status: ProjectStatus
    version: int
    shots: int | None
    cost_estimate: Decimal
    cost_actual: Decimal
    lock_holder: uuid.UUID | None
    lock_until: datetime | None
    result_asset_id: uuid.UUID | None
    error_code: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: the sequence number of the project's newest step event (its event stream's position)
    event_seq: int


@dataclass(frozen=True, slots=True)
class Step:
    id: uuid.UUID
    project_id: uuid.UUID
    step_key: str
    task_type: StepType
    queue: str
    priority: int
    status: StepStatus
    input_json: dict[str, Any]
    input_hash: str
    output_asset_id: uuid.UUID | None
    output_json: dict[str, Any] | None
    provider_id: str | None
    provider_request_id: str | None
    generation_task_id: uuid.UUID | None
    retry_count: int
    max_retry: int
    next_attempt_at: datetime | None
    progress: int
    cost_estimate: Decimal
    cost_actual: Decimal
    error_code: str | None
    error_message: str | None
    version: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def _project(row: Any) -> Project:
    values = dict(row._mapping)
    values["status"] = ProjectStatus(values["status"])
    return Project(**values)


def _step(row: Any) -> Step:
    values = {k: v for k, v in row._mapping.items() if k != "updated_at"}
    values["status"] = StepStatus(values["status"])
    values["task_type"] = StepType(values["task_type"])
    return Step(**values)


def insert_project(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    workflow: str,
    user_ref: str,
    priority: int,
    formal: bool,
    idempotency_key: str | None,
    input: dict[str, Any],
    input_hash: str,
    cost_estimate: Decimal,
    now: datetime,
) -> Project:
    row = conn.execute(
        projects.insert()
        .values(
            id=new_id(),
            tenant_id=tenant_id,
            workflow=workflow,
            user_ref=user_ref,
            priority=priority,
            formal=formal,
            idempotency_key=idempotency_key,
            input=input,
            input_hash=input_hash,
            cost_estimate=cost_estimate,
            created_at=now,
            updated_at=now,
        )
        .returning(*projects.c)
    ).one()
    return _project(row)


def project(
    conn: Connection, project_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *, lock: bool = False
) -> Project | None:
    stmt = sa.select(projects).where(_p.id == project_id)
    if tenant_id is not None:
        stmt = stmt.where(_p.tenant_id == tenant_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    row = conn.execute(stmt).first()
    return _project(row) if row else None


def project_by_key(conn: Connection, tenant_id: uuid.UUID, key: str) -> Project | None:
    row = conn.execute(sa.select(projects).where(_p.tenant_id == tenant_id, _p.idempotency_key == key)).first()
    return _project(row) if row else None


def open_formal_project_of(conn: Connection, tenant_id: uuid.UUID, user_ref: str) -> Project | None:
    open_states = [ProjectStatus.CREATED, ProjectStatus.RUNNING, ProjectStatus.NEEDS_ATTENTION, ProjectStatus.FAILED]
    row = conn.execute(
        sa.select(projects).where(
            _p.tenant_id == tenant_id,
            _p.user_ref == user_ref,
            _p.formal.is_(True),
            _p.status.in_([s.value for s in open_states]),
        )
    ).first()
    return _project(row) if row else None


def list_projects(
    conn: Connection, tenant_id: uuid.UUID | None, limit: int, cursor: uuid.UUID | None = None
) -> list[Project]:
    """Newest first; `cursor` (the last id of the previous page) continues after it (keyset on created_at, id)."""
    stmt = sa.select(projects).order_by(_p.created_at.desc(), _p.id.desc()).limit(limit)
    if tenant_id is not None:
        stmt = stmt.where(_p.tenant_id == tenant_id)
    if cursor is not None:
        after = sa.select(_p.created_at).where(_p.id == cursor).scalar_subquery()
        stmt = stmt.where(sa.or_(_p.created_at < after, sa.and_(_p.created_at == after, _p.id < cursor)))
    return [_project(r) for r in conn.execute(stmt)]


def update_project(conn: Connection, p: Project, now: datetime, **values: Any) -> Project:
    """CAS on version; every change bumps it (the project lock is fenced by it)."""
    row = conn.execute(
        projects.update()
        .where(_p.id == p.id, _p.version == p.version)
        .values(version=p.version + 1, updated_at=now, **values)
        .returning(*projects.c)
    ).first()
    if row is None:
        raise StaleVersion(f"project {p.id} is no longer at version {p.version}")
    _changed(conn, p.id)
    moved = _project(row)
    if moved.status is not p.status:  # the project's own history row, numbered with its steps' events
        conn.execute(
            workflow_task_events.insert().values(
                id=new_id(),
                seq=_next_seq(conn, p.id),
                workflow_task_id=None,
                project_id=p.id,
                event="status_changed",
                from_status=p.status.value,
                to_status=moved.status.value,
                error_code=moved.error_code,
                created_at=now,
            )
        )
        moved = replace(moved, event_seq=moved.event_seq + 1)
    return moved


def _next_seq(conn: Connection, project_id: uuid.UUID) -> int:
    """The project's next event number. The UPDATE locks the project row until commit, so concurrent writers of
    one project take numbers in commit order and a stream resuming after N never skips a later-committing N - 1."""
    seq = conn.execute(
        projects.update().where(_p.id == project_id).values(event_seq=_p.event_seq + 1).returning(_p.event_seq)
    ).scalar_one()
    return int(seq)


def insert_step(
    conn: Connection,
    *,
    project: Project,
    step_key: str,
    task_type: StepType,
    input_json: dict[str, Any],
    input_hash: str,
    now: datetime,
    cost_estimate: Decimal = Decimal(0),
) -> Step | None:
    """Create a step row once: None when (project, type, input_hash) — the seed's idempotency key — or the step
    key already has one (the caller reads it instead)."""
    spec = STEP_SPECS[task_type]
    values = dict(
        id=new_id(),
        project_id=project.id,
        step_key=step_key,
        task_type=task_type.value,
        queue=spec.queue.value,
        priority=step_priority(task_type, project.priority),
        input_json=input_json,
        input_hash=input_hash,
        max_retry=spec.max_retry,
        cost_estimate=cost_estimate,
        next_attempt_at=now,
        created_at=now,
        updated_at=now,
    )
    insert = pg_insert(workflow_tasks) if conn.dialect.name == "postgresql" else sqlite_insert(workflow_tasks)
    row = conn.execute(insert.values(**values).on_conflict_do_nothing().returning(*workflow_tasks.c)).first()
    if row is None:
        return None
    created = _step(row)
    announce(conn, created, now)  # its queue's consumer is woken once this commits
    return created


def steps_of(conn: Connection, project_id: uuid.UUID) -> list[Step]:
    rows = conn.execute(
        sa.select(workflow_tasks).where(_w.project_id == project_id).order_by(_w.created_at, _w.step_key)
    )
    return [_step(r) for r in rows]


def step(conn: Connection, step_id: uuid.UUID, *, lock: bool = False) -> Step | None:
    stmt = sa.select(workflow_tasks).where(_w.id == step_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    row = conn.execute(stmt).first()
    return _step(row) if row else None


def step_by_key(conn: Connection, project_id: uuid.UUID, step_key: str) -> Step | None:
    row = conn.execute(sa.select(workflow_tasks).where(_w.project_id == project_id, _w.step_key == step_key)).first()
    return _step(row) if row else None


def due_steps(
    conn: Connection,
    queues: list[str],
    now: datetime,
    limit: int,
    skip: Sequence[tuple[Sequence[StepType], Sequence[uuid.UUID]]] = (),
) -> list[Step]:
    """Pending or retrying steps whose time has come, best priority first; locked and skipped by concurrent
    claimers on PostgreSQL (SQLite serializes writers anyway). `skip`: (types, projects) whose steps of those
    types cannot start now (a project at its limit), left out so they do not crowd the others out of `limit`."""
    stmt = (
        sa.select(workflow_tasks)
        .where(
            _w.status.in_([StepStatus.PENDING.value, StepStatus.RETRYING.value]),
            _w.queue.in_(queues),
            sa.or_(_w.next_attempt_at.is_(None), _w.next_attempt_at <= now),
            *(
                sa.not_(sa.and_(_w.task_type.in_([t.value for t in types]), _w.project_id.in_(ids)))
                for types, ids in skip
                if ids
            ),
        )
        .order_by(_w.priority, _w.next_attempt_at, _w.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return [_step(r) for r in conn.execute(stmt)]


def running_steps(conn: Connection) -> list[Step]:
    rows = conn.execute(sa.select(workflow_tasks).where(_w.status == StepStatus.RUNNING.value))
    return [_step(r) for r in rows]


def move_step(
    conn: Connection,
    s: Step,
    *,
    event: str,
    to_status: StepStatus,
    now: datetime,
    payload: dict[str, Any] | None = None,
    **values: Any,
) -> Step:
    """CAS the step to `to_status` and append its history row, in the caller's transaction."""
    row = conn.execute(
        workflow_tasks.update()
        .where(_w.id == s.id, _w.version == s.version)
        .values(status=to_status.value, version=s.version + 1, updated_at=now, **values)
        .returning(*workflow_tasks.c)
    ).first()
    if row is None:
        raise StaleVersion(f"step {s.step_key} of project {s.project_id} moved since it was read")
    seq = _next_seq(conn, s.project_id)
    _changed(conn, s.project_id)
    conn.execute(
        workflow_task_events.insert().values(
            id=new_id(),
            seq=seq,
            workflow_task_id=s.id,
            project_id=s.project_id,
            event=event,
            from_status=s.status.value,
            to_status=to_status.value,
            error_code=values.get("error_code"),
            payload=payload,
            created_at=now,
        )
    )
    moved = _step(row)
    if to_status in (StepStatus.PENDING, StepStatus.RETRYING):  # due now or at its retry time: wake its queue then
        announce(conn, moved, now, at=moved.next_attempt_at)
    return moved


def step_events(conn: Connection, project_id: uuid.UUID) -> list[dict[str, Any]]:
    c = workflow_task_events.c
    rows = conn.execute(
        sa.select(workflow_task_events)
        .where(c.project_id == project_id, c.workflow_task_id.is_not(None))
        .order_by(c.created_at, c.id)
    )
    return [dict(r._mapping) for r in rows]


def annotate_step(conn: Connection, s: Step, now: datetime, **values: Any) -> Step:
    """Record facts about a running step that are no transition (its generation task, its provider); CAS on
    version like a move."""
    row = conn.execute(
        workflow_tasks.update()
        .where(_w.id == s.id, _w.version == s.version)
        .values(version=s.version + 1, updated_at=now, **values)
        .returning(*workflow_tasks.c)
    ).first()
    if row is None:
        raise StaleVersion(f"step {s.step_key} of project {s.project_id} moved since it was read")
    return _step(row)


def due_queues(conn: Connection, queues: list[str], now: datetime) -> list[str]:
    """The queues among `queues` that hold a due step: one index scan, so a worker touches only queues with work."""
    stmt = (
        sa.select(_w.queue)
        .where(
            _w.status.in_([StepStatus.PENDING.value, StepStatus.RETRYING.value]),
            _w.queue.in_(queues),
            sa.or_(_w.next_attempt_at.is_(None), _w.next_attempt_at <= now),
        )
        .distinct()
    )
    return [r.queue for r in conn.execute(stmt)]


def running_vendor_steps(conn: Connection, generation_task_id: uuid.UUID | None = None) -> list[Step]:
    """Running steps that wait on a generation task (they finish when it does); or on that one task."""
    stmt = sa.select(workflow_tasks).where(_w.status == StepStatus.RUNNING.value, _w.generation_task_id.is_not(None))
    if generation_task_id is not None:
        stmt = stmt.where(_w.generation_task_id == generation_task_id)
    return [_step(r) for r in conn.execute(stmt)]


def insert_result_asset(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    bucket: str,
    object_key: str,
    size_bytes: int,
    sha256: str | None,
    duration_ms: int | None,
    width: int | None,
    height: int | None,
    pipeline_version: int,
    now: datetime,
) -> uuid.UUID:
    """The asset row of a project's delivered video: a playable MP4 of its own (a PROXY profile without a
    parent: it was made by the workflow, not derived from a provider output)."""
    asset_id = new_id()
    conn.execute(
        assets.insert().values(
            id=asset_id,
            tenant_id=tenant_id,
            kind=AssetKind.PROXY.value,
            profile=DerivativeProfile.PROXY_MP4.value,
            pipeline_version=pipeline_version,
            status=AssetStatus.READY.value,
            bucket=bucket,
            object_key=object_key,
            size_bytes=size_bytes,
            checksum_algorithm="sha256" if sha256 else None,
            checksum_value=sha256,
            mime_detected="video/mp4",
            duration_ms=duration_ms,
            width=width,
            height=height,
            created_at=now,
            ready_at=now,
        )
    )
    return asset_id


def events_after(
    conn: Connection, project_id: uuid.UUID, after_seq: int | None, limit: int = 500
) -> list[dict[str, Any]]:
    """A project's history rows with a sequence number above `after_seq`, in order (the SSE stream's source):
    step transitions with their step's key and type, and the project's own (`step_key` None)."""
    stmt = (
        sa.select(workflow_task_events, _w.step_key, _w.task_type, _w.retry_count, _w.error_message)
        .outerjoin(workflow_tasks, _w.id == _ev.workflow_task_id)
        .where(_ev.project_id == project_id, _ev.seq.is_not(None))
        .order_by(_ev.seq)
        .limit(limit)
    )
    if after_seq is not None:
        stmt = stmt.where(_ev.seq > after_seq)
    return [dict(r._mapping) for r in conn.execute(stmt)]


# --- review items of steps (manual_required steps wait in the one review queue) -------------------

_OPEN_REVIEW = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)


def open_review(conn: Connection, s: Step, reason: str, now: datetime) -> None:
    """Queue a manual_required step for a reviewer; a step with an open item keeps it (one open item per step)."""
    exists = conn.execute(sa.select(_r.id).where(_r.workflow_task_id == s.id, _r.state.in_(_OPEN_REVIEW))).first()
    if exists is None:
        conn.execute(
            review_items.insert().values(
                id=new_id(),
                workflow_task_id=s.id,
                asset_id=s.output_asset_id,
                reason=reason[:2000],
                state=ReviewState.PENDING.value,
                created_at=now,
            )
        )


def close_review(
    conn: Connection, step_id: uuid.UUID, state: ReviewState, now: datetime, by: str | None, note: str | None
) -> None:
    """Close the step's open item: APPROVED / REJECTED by a decision, EXPIRED when the step left manual_required
    another way (retried, cancelled)."""
    decided = state in (ReviewState.APPROVED, ReviewState.REJECTED)
    conn.execute(
        review_items.update()
        .where(_r.workflow_task_id == step_id, _r.state.in_(_OPEN_REVIEW))
        .values(
            state=state.value,
            decision=state.value if decided else None,
            decided_by=by,
            decided_at=now,
            note=note or None,
            claimed_until=None,
        )
    )


# --- observability: /metrics gauges and the alert facts ------------------------------------------

#: step statuses the gauges count (finished steps accumulate forever; their totals are in the history instead)
OPEN_STEP = (
    StepStatus.PENDING.value,
    StepStatus.RUNNING.value,
    StepStatus.RETRYING.value,
    StepStatus.FAILED.value,
    StepStatus.MANUAL_REQUIRED.value,
)
_FAILED_STEP = (StepStatus.FAILED.value, StepStatus.MANUAL_REQUIRED.value)
#: what a run of a step can end in; everything but success counts as a failed run
_RUN_OUTCOME = (
    StepStatus.SUCCESS.value,
    StepStatus.FAILED.value,
    StepStatus.RETRYING.value,
    StepStatus.MANUAL_REQUIRED.value,
)


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    queue: str
    #: steps due now (pending, or retrying past their delay)
    due: int
    #: when the longest-waiting of them became due
    oldest_due_at: datetime | None


@dataclass(frozen=True, slots=True)
class ProjectCost:
    project_id: uuid.UUID
    tenant_id: uuid.UUID
    estimate: Decimal
    actual: Decimal


def projects_by_status(conn: Connection) -> dict[str, int]:
    rows = conn.execute(sa.select(_p.status, sa.func.count()).group_by(_p.status))
    return {str(s): int(n) for s, n in rows}


def open_steps_by_queue(conn: Connection) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        sa.select(_w.queue, _w.status, sa.func.count()).where(_w.status.in_(OPEN_STEP)).group_by(_w.queue, _w.status)
    )
    return {(str(q), str(s)): int(n) for q, s, n in rows}


def backlog(conn: Connection, now: datetime) -> list[QueueBacklog]:
    """Due steps per queue (`ix_workflow_tasks_due`): the workflow queues' depth and age."""
    due_at = sa.func.coalesce(_w.next_attempt_at, _w.created_at)
    rows = conn.execute(
        sa.select(_w.queue, sa.func.count(), sa.func.min(due_at))
        .where(_w.status.in_([StepStatus.PENDING.value, StepStatus.RETRYING.value]), due_at <= now)
        .group_by(_w.queue)
    )
    return [QueueBacklog(str(q), int(n), oldest) for q, n, oldest in rows]


def failed_steps_since(conn: Connection, since: datetime, id_floor: uuid.UUID) -> int:
    """Steps that failed for good or went to a person within the window (each counted once)."""
    return int(
        conn.execute(
            sa.select(sa.func.count(sa.distinct(_ev.workflow_task_id))).where(
                _ev.id >= id_floor,
                _ev.created_at >= since,
                _ev.workflow_task_id.is_not(None),
                _ev.to_status.in_(_FAILED_STEP),
            )
        ).scalar_one()
    )


def run_outcomes_since(conn: Connection, task_type: StepType, since: datetime, id_floor: uuid.UUID) -> tuple[int, int]:
    """(finished runs, failed runs) of one step type within the window: every end of a running step counts."""
    rows = conn.execute(
        sa.select(_ev.to_status, sa.func.count())
        .join(workflow_tasks, _w.id == _ev.workflow_task_id)
        .where(
            _ev.id >= id_floor,
            _ev.created_at >= since,
            _ev.from_status == StepStatus.RUNNING.value,
            _ev.to_status.in_(_RUN_OUTCOME),
            _w.task_type == task_type.value,
        )
        .group_by(_ev.to_status)
    )
    counts = {str(s): int(n) for s, n in rows}
    finished = sum(counts.values())
    return finished, finished - counts.get(StepStatus.SUCCESS.value, 0)


def project_costs(conn: Connection, since: datetime) -> list[ProjectCost]:
    """Estimated and actual (the sum of the steps') cost of the projects that moved within the window."""
    rows = conn.execute(
        sa.select(_p.id, _p.tenant_id, _p.cost_estimate, sa.func.coalesce(sa.func.sum(_w.cost_actual), 0))
        .select_from(projects.join(workflow_tasks, _w.project_id == _p.id))
        .where(_p.updated_at >= since)
        .group_by(_p.id, _p.tenant_id, _p.cost_estimate)
    )
    return [ProjectCost(pid, tid, Decimal(est), Decimal(act)) for pid, tid, est, act in rows]
