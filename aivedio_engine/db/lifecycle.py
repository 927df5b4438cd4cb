"""Persistence of the data lifecycle: what quarantine, retention and a tenant purge
select and change. Every function takes the caller's connection and does one bounded statement (or a bounded
batch of them), so the services keep each transaction short and never hold one across a storage call.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import (
    api_keys,
    assets,
    generation_tasks,
    local_jobs,
    projects,
    provider_events,
    task_attempts,
    tenants,
    upload_sessions,
    workflow_task_events,
    workflow_tasks,
)
from aivedio_engine.domain.project import PROJECT_TERMINAL
from aivedio_engine.domain.status import (
    TASK_TERMINAL,
    AssetKind,
    AssetStatus,
    TenantStatus,
    UploadSessionStatus,
)

_s, _a, _t = upload_sessions.c, assets.c, generation_tasks.c
_TERMINAL = sorted(s.value for s in TASK_TERMINAL)
_INPUTS = sorted(k.value for k in (AssetKind.INPUT_IMAGE, AssetKind.INPUT_VIDEO))
_PROJECT_DONE = sorted(s.value for s in PROJECT_TERMINAL)
_p, _w = projects.c, workflow_tasks.c
#: what a redacted prompt reads as: the column is NOT NULL, and an empty string would look like a client's choice
REDACTED = "[redacted]"
#: request parameters that carry the customer's words (the rest are numbers, ids and enum values)
PROMPT_PARAMS = ("prompt", "negative_prompt")


@dataclass(frozen=True, slots=True)
class StoredObject:
    """A row (upload session or asset) and the object key whose bytes go with it."""

    id: uuid.UUID
    object_key: str


@dataclass(frozen=True, slots=True)
class PromptHolder:
    """A task whose prompt (and prompt-like request parameters) is still to redact."""

    id: uuid.UUID
    params: dict[str, Any]


# --- quarantine -------------------------------------------------------------------------------------------------


def mark_quarantine_cleared(conn: Connection, session_id: uuid.UUID, now: datetime) -> None:
    conn.execute(
        upload_sessions.update()
        .where(_s.id == session_id, _s.quarantine_cleared_at.is_(None))
        .values(quarantine_cleared_at=now)
    )


def quarantine_due(conn: Connection, now: datetime, rejected_before: datetime, batch: int) -> list[StoredObject]:
    """Closed sessions whose quarantined object is still to delete: at once when it was promoted, abandoned or
    aborted; once `rejected_before` passed its completion when the upload was rejected."""
    rejected = _a.status == AssetStatus.REJECTED.value
    ended = sa.func.coalesce(_s.completed_at, _s.expires_at)
    return _objects(
        conn.execute(
            sa.select(_s.id, _s.object_key)
            .join(assets, _a.id == _s.asset_id)
            .where(
                _s.quarantine_cleared_at.is_(None),
                _s.status != UploadSessionStatus.OPEN.value,
                sa.or_(~rejected, _s.status != UploadSessionStatus.COMPLETED.value, ended <= rejected_before),
            )
            .order_by(_s.created_at)
            .limit(batch)
        )
    )


def quarantine_owned(conn: Connection, keys: Sequence[str]) -> set[str]:
    """Which quarantined `keys` a session still owns: open, or closed and not yet cleared (a rejected upload in
    its grace, a promoted one whose delete is still to happen). An asset row naming such a key does not count:
    a rejected asset keeps its key as a record, not as a claim on the bytes."""
    if not keys:
        return set()
    return set(
        conn.execute(
            sa.select(_s.object_key).where(_s.object_key.in_(keys), _s.quarantine_cleared_at.is_(None))
        ).scalars()
    )


# --- retention of tenant data -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantRetention:
    tenant_id: uuid.UUID
    #: the tenant's own days, None where the [retention] default applies
    outputs_days: int | None
    inputs_days: int | None
    prompts_days: int | None


def retentions(conn: Connection) -> list[TenantRetention]:
    c = tenants.c
    rows = conn.execute(
        sa.select(c.id, c.retention_outputs_days, c.retention_inputs_days, c.retention_prompts_days).order_by(c.id)
    )
    return [TenantRetention(r[0], r[1], r[2], r[3]) for r in rows]


def expired_outputs(conn: Connection, tenant_id: uuid.UUID, ended_before: datetime, batch: int) -> list[StoredObject]:
    """Raw outputs (not yet deleted) of the tenant's tasks that ended before `ended_before`."""
    return _objects(
        conn.execute(
            sa.select(_a.id, _a.object_key)
            .join(generation_tasks, _t.id == _a.task_id)
            .where(
                _a.tenant_id == tenant_id,
                _a.kind == AssetKind.RAW_OUTPUT.value,
                _a.status != AssetStatus.DELETED.value,
                _t.status.in_(_TERMINAL),
                _t.finished_at < ended_before,
                # a clip of a System B project still running is an input of its later steps (composition)
                ~sa.exists().where(_w.generation_task_id == _t.id, _w.project_id.in_(_open_projects(tenant_id))),
            )
            .order_by(_a.created_at)
            .limit(batch)
        )
    )


def expired_inputs(conn: Connection, tenant_id: uuid.UUID, created_before: datetime, batch: int) -> list[StoredObject]:
    """Uploaded inputs (not yet deleted) created before `created_before`, minus those an unfinished task of the
    tenant names: its submit or a retry may still send them to a provider."""
    rows = conn.execute(
        sa.select(_a.id, _a.object_key)
        .where(
            _a.tenant_id == tenant_id,
            _a.kind.in_(_INPUTS),
            _a.status != AssetStatus.DELETED.value,
            _a.created_at < created_before,
        )
        .order_by(_a.created_at)
        .limit(batch)
    ).all()
    if not rows:
        return []
    in_use: set[str] = set()
    for (params,) in conn.execute(sa.select(_t.params).where(_t.tenant_id == tenant_id, _t.status.not_in(_TERMINAL))):
        in_use.update(str(i) for i in (params or {}).get("asset_ids") or ())
    # a System B project still running: its input names its photo asset, its steps' outputs feed later steps
    for (project_input,) in conn.execute(sa.select(_p.input).where(_p.id.in_(_open_projects(tenant_id)))):
        in_use.update(str(v) for v in (project_input or {}).values() if isinstance(v, str))
    in_use.update(
        str(i)
        for i in conn.execute(
            sa.select(_w.output_asset_id).where(
                _w.project_id.in_(_open_projects(tenant_id)), _w.output_asset_id.is_not(None)
            )
        ).scalars()
    )
    return [StoredObject(r.id, r.object_key) for r in rows if str(r.id) not in in_use]


def _objects(rows: Iterable[Any]) -> list[StoredObject]:
    return [StoredObject(row_id, key) for row_id, key in rows]


def _open_projects(tenant_id: uuid.UUID) -> sa.Select[Any]:
    return sa.select(_p.id).where(_p.tenant_id == tenant_id, _p.status.not_in(_PROJECT_DONE))


def mark_assets_deleted(conn: Connection, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """The assets and every derivative of them become DELETED, their probe documents (which carry the upload's
    file name and the media's own metadata tags) dropped. Returns every id marked."""
    ids = list(ids)
    if not ids:
        return []
    marked = list(
        conn.execute(
            sa.select(_a.id).where(
                sa.or_(_a.id.in_(ids), _a.parent_asset_id.in_(ids)), _a.status != AssetStatus.DELETED.value
            )
        ).scalars()
    )
    if marked:
        conn.execute(assets.update().where(_a.id.in_(marked)).values(status=AssetStatus.DELETED.value, probe=sa.null()))
    return marked


def prompts_due(
    conn: Connection, tenant_id: uuid.UUID, ended_before: datetime | None, batch: int
) -> list[PromptHolder]:
    """Tasks of the tenant whose prompt is still there and that ended before `ended_before` (None: every task,
    finished or not — a purge)."""
    where = [_t.tenant_id == tenant_id, _t.prompt_redacted_at.is_(None)]
    if ended_before is not None:
        where += [_t.status.in_(_TERMINAL), _t.finished_at < ended_before]
    rows = conn.execute(sa.select(_t.id, _t.params).where(*where).order_by(_t.id).limit(batch))
    return [PromptHolder(task_id, params) for task_id, params in rows]


def redact_prompts(conn: Connection, rows: Sequence[PromptHolder], now: datetime) -> int:
    """Replace the prompt and the prompt-like request parameters of these tasks, and of the local provider's
    jobs made for them (their request carries the same words). Ids, amounts and statuses stay."""
    for row in rows:
        params = {k: (REDACTED if k in PROMPT_PARAMS else v) for k, v in (row.params or {}).items()}
        conn.execute(
            generation_tasks.update()
            .where(_t.id == row.id)
            .values(prompt=REDACTED, params=params, prompt_redacted_at=now)
        )
    request_keys = list(
        conn.execute(
            sa.select(task_attempts.c.provider_request_key).where(task_attempts.c.task_id.in_([r.id for r in rows]))
        ).scalars()
    )
    if request_keys:
        for job_id, params in conn.execute(
            sa.select(local_jobs.c.job_id, local_jobs.c.params).where(local_jobs.c.request_key.in_(request_keys))
        ).all():
            clean = {k: (REDACTED if k in PROMPT_PARAMS else v) for k, v in (params or {}).items()}
            conn.execute(local_jobs.update().where(local_jobs.c.job_id == job_id).values(params=clean))
    return len(rows)


# --- a tenant purge ---------------------------------------------------------------------------------------------


def unfinished_work(conn: Connection, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(unfinished tasks, unfinished System B projects) of the tenant."""
    tasks = conn.execute(
        sa.select(sa.func.count()).where(_t.tenant_id == tenant_id, _t.status.not_in(_TERMINAL))
    ).scalar_one()
    open_projects = conn.execute(sa.select(sa.func.count()).select_from(_open_projects(tenant_id).subquery()))
    return int(tasks), int(open_projects.scalar_one())


def project_ids(conn: Connection, tenant_id: uuid.UUID) -> list[uuid.UUID]:
    return list(conn.execute(sa.select(_p.id).where(_p.tenant_id == tenant_id)).scalars())


def redact_projects(conn: Connection, ids: Sequence[uuid.UUID]) -> int:
    """System B content of these projects: the project's input (photo, script), each step's input and output
    documents and error texts, the step events' payloads. Ids, statuses, costs and times stay."""
    if not ids:
        return 0
    conn.execute(projects.update().where(_p.id.in_(ids)).values(input={}))
    conn.execute(
        workflow_tasks.update()
        .where(_w.project_id.in_(ids))
        .values(input_json={}, output_json=sa.null(), error_message=None)
    )
    conn.execute(
        workflow_task_events.update().where(workflow_task_events.c.project_id.in_(ids)).values(payload=sa.null())
    )
    return len(ids)


def close_tenant(conn: Connection, tenant_id: uuid.UUID, now: datetime) -> int:
    """Suspend the tenant, revoke its keys and close its open uploads: nothing new arrives while it is purged.
    Returns the keys revoked."""
    conn.execute(
        tenants.update()
        .where(tenants.c.id == tenant_id)
        .values(status=TenantStatus.SUSPENDED.value, purged_at=now, updated_at=now)
    )
    conn.execute(
        upload_sessions.update()
        .where(_s.tenant_id == tenant_id, _s.status == UploadSessionStatus.OPEN.value)
        .values(status=UploadSessionStatus.ABORTED.value)
    )
    return int(
        conn.execute(
            api_keys.update()
            .where(api_keys.c.tenant_id == tenant_id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now)
        ).rowcount
    )


def purge_counts(conn: Connection, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(prompts not yet redacted, assets not yet deleted) of the tenant: what a purge would change."""
    prompts = conn.execute(
        sa.select(sa.func.count()).where(_t.tenant_id == tenant_id, _t.prompt_redacted_at.is_(None))
    ).scalar_one()
    live = conn.execute(
        sa.select(sa.func.count()).where(_a.tenant_id == tenant_id, _a.status != AssetStatus.DELETED.value)
    ).scalar_one()
    return int(prompts), int(live)


def live_assets(conn: Connection, tenant_id: uuid.UUID, batch: int) -> list[uuid.UUID]:
    return list(
        conn.execute(
            sa.select(_a.id)
            .where(_a.tenant_id == tenant_id, _a.status != AssetStatus.DELETED.value, _a.parent_asset_id.is_(None))
            .limit(batch)
        ).scalars()
    )


def clear_sessions(conn: Connection, tenant_id: uuid.UUID, now: datetime) -> None:
    conn.execute(
        upload_sessions.update()
        .where(_s.tenant_id == tenant_id, _s.quarantine_cleared_at.is_(None))
        .values(quarantine_cleared_at=now)
    )


def local_outputs(conn: Connection, tenant_id: uuid.UUID) -> list[tuple[str, str]]:
    """(job id, file) of the local provider's rendered outputs for the tenant's attempts: the vendor's own copy."""
    mine = sa.select(task_attempts.c.provider_request_key).join(generation_tasks, _t.id == task_attempts.c.task_id)
    j = local_jobs.c
    rows = conn.execute(
        sa.select(j.job_id, j.output_path).where(
            j.request_key.in_(mine.where(_t.tenant_id == tenant_id)), j.output_path.is_not(None)
        )
    )
    return [(str(job_id), str(path)) for job_id, path in rows]


def forget_local_output(conn: Connection, job_id: str) -> None:
    conn.execute(local_jobs.update().where(local_jobs.c.job_id == job_id).values(output_path=None))


def drop_provider_bodies(conn: Connection, tenant_id: uuid.UUID, batch: int) -> int:
    """Provider callbacks and poll answers about the tenant's jobs keep their ids and times, not their bodies
    (a vendor may echo the prompt back)."""
    pe = provider_events.c
    mine = sa.select(task_attempts.c.id).join(generation_tasks, _t.id == task_attempts.c.task_id)
    ids = list(
        conn.execute(
            sa.select(pe.id)
            .where(
                pe.matched_attempt_id.in_(mine.where(_t.tenant_id == tenant_id)),
                sa.or_(pe.body.is_not(None), pe.observation.is_not(None)),
            )
            .limit(batch)
        ).scalars()
    )
    if ids:
        conn.execute(provider_events.update().where(pe.id.in_(ids)).values(body=None, observation=sa.null()))
    return len(ids)
