"""Attempt persistence: creation, guarded state changes, and lookups by provider job id."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import task_attempts
from aivedio_engine.domain.status import AttemptStatus
from aivedio_engine.domain.transitions import AttemptDecision, AttemptEvent, Rejection, decide_attempt
from aivedio_engine.providers.fingerprint import request_fingerprint

_a = task_attempts.c


class AttemptConflict(Exception):
    """The attempt is no longer in the state the caller read."""


def request_key(attempt_id: uuid.UUID) -> str:
    """The key the provider dedupes on: derived from the attempt, so a retried send reuses it."""
    return f"avd-{attempt_id.hex}"


def fingerprint(params: dict[str, Any]) -> bytes:
    """The vendor-visible fingerprint of the task's normalised params: what list-and-match reconciliation compares
    with a listed job's echoed request, so it must be the adapters' function over the same fields."""
    return request_fingerprint(params)


def create(
    conn: Connection,
    *,
    task_id: uuid.UUID,
    attempt_no: int,
    provider: str,
    model: str,
    params: dict[str, Any],
    now: datetime,
    fencing_token: int | None = None,
    resubmitted_after_unknown: bool = False,
    attempt_id: uuid.UUID | None = None,
) -> uuid.UUID:
    attempt_id = attempt_id or new_id()
    conn.execute(
        task_attempts.insert().values(
            id=attempt_id,
            task_id=task_id,
            attempt_no=attempt_no,
            provider=provider,
            model=model,
            provider_request_key=request_key(attempt_id),
            submit_state=AttemptStatus.NEW.value,
            request_fingerprint=fingerprint(params),
            fencing_token=fencing_token,
            resubmitted_after_unknown=resubmitted_after_unknown,
            created_at=now,
            updated_at=now,
        )
    )
    return attempt_id


def read(conn: Connection, attempt_id: uuid.UUID, *, lock: bool = False) -> Any:
    stmt = sa.select(task_attempts).where(_a.id == attempt_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).first()


def by_job(conn: Connection, provider: str, job_id: str, *, lock: bool = False) -> Any:
    stmt = sa.select(task_attempts).where(_a.provider == provider, _a.provider_job_id == job_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).first()


def current(conn: Connection, task_id: uuid.UUID) -> Any:
    """The task's latest attempt (highest attempt_no), or None."""
    return conn.execute(
        sa.select(task_attempts).where(_a.task_id == task_id).order_by(_a.attempt_no.desc()).limit(1)
    ).first()


def transition(conn: Connection, attempt: Any, event: AttemptEvent, now: datetime, **values: Any) -> AttemptDecision:
    """Move an attempt by its machine, guarded by its current state (CAS); raises AttemptConflict."""
    result = decide_attempt(AttemptStatus(attempt.submit_state), event)
    if isinstance(result, Rejection):
        raise AttemptConflict(result.reason)
    done = conn.execute(
        task_attempts.update()
        .where(_a.id == attempt.id, _a.submit_state == attempt.submit_state)
        .values(submit_state=result.to_status.value, updated_at=now, **values)
    )
    if done.rowcount != 1:
        raise AttemptConflict(f"attempt {attempt.id} changed concurrently")
    return result


def update(conn: Connection, attempt_id: uuid.UUID, **values: Any) -> None:
    conn.execute(task_attempts.update().where(_a.id == attempt_id).values(**values))
