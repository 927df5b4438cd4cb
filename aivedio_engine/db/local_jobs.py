"""Jobs of the `local` provider (migration 0014), so that a render outlives the process that started it.

The adapter (providers/local.py) is the only user. Each method is one short transaction of its own; the engine
calls providers outside its transactions, so these never nest in one. Rows are keyed by the provider's name:
two local providers on one database never see each other's jobs.

Who renders a job is the row's `owner`; every write of a render's outcome names the owner it expects, so a
process that lost a job to another (it was presumed dead) cannot overwrite what the new owner records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.db.session import dialect_insert, read_conn, write_tx
from aivedio_engine.db.tables import local_jobs
from aivedio_engine.providers.base import JobStatus

_c = local_jobs.c
#: states a job leaves only by a render's outcome, a cancel or a takeover
UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True, slots=True)
class LocalJob:
    job_id: str
    request_key: str
    params: dict[str, Any]
    state: JobStatus
    progress: int
    output_path: str | None
    size_bytes: int | None
    error_code: str | None
    error_message: str | None
    owner: str | None
    renders: int
    created_at: datetime
    updated_at: datetime

    @property
    def finished(self) -> bool:
        return self.state.value not in UNFINISHED


def _job(row: Any) -> LocalJob:
    return LocalJob(
        job_id=row.job_id,
        request_key=row.request_key,
        params=dict(row.params),
        state=JobStatus(row.state),
        progress=int(row.progress),
        output_path=row.output_path,
        size_bytes=row.size_bytes,
        error_code=row.error_code,
        error_message=row.error_message,
        owner=row.owner,
        renders=int(row.renders),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class LocalJobs:
    def __init__(self, engine: Engine, provider: str) -> None:
        self._engine = engine
        self._provider = provider

    def create(
        self, job_id: str, request_key: str, params: dict[str, Any], owner: str, now: datetime
    ) -> tuple[LocalJob, bool]:
        """The job of `request_key`: a new one owned by `owner` (True), or the one that already has the key
        (False) — whoever asked first, in this process or another, wins."""
        with write_tx(self._engine) as conn:
            insert = dialect_insert(conn)
            created = conn.execute(
                insert(local_jobs)
                .values(
                    job_id=job_id,
                    provider=self._provider,
                    request_key=request_key,
                    params=params,
                    state=JobStatus.QUEUED.value,
                    progress=0,
                    owner=owner,
                    renders=0,
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=[_c.provider, _c.request_key])
                .returning(_c.job_id)
            ).first()
            row = self._by_key(conn, request_key)
        assert row is not None  # inserted, or the conflicting row is there
        return _job(row), created is not None

    def get(self, job_id: str) -> LocalJob | None:
        with read_conn(self._engine) as conn:
            row = conn.execute(
                sa.select(local_jobs).where(_c.provider == self._provider, _c.job_id == job_id)
            ).one_or_none()
        return None if row is None else _job(row)

    def by_key(self, request_key: str) -> LocalJob | None:
        with read_conn(self._engine) as conn:
            row = self._by_key(conn, request_key)
        return None if row is None else _job(row)

    def claim(
        self, job_id: str, owner: str, orphaned: Callable[[str], bool], now: datetime, max_renders: int
    ) -> LocalJob | None:
        """Take over an unfinished job nobody renders (released, or its owner is dead by `orphaned`): it
        becomes `owner`'s, QUEUED. None when it is not there, finished or held by a live owner. A job that
        already had `max_renders` renders fails instead (None too): renders that keep dying must end somewhere.
        Renders are counted when their ffmpeg starts (`started`), so a claim a stopping process cannot act on
        costs nothing."""
        with write_tx(self._engine) as conn:
            row = conn.execute(
                sa.select(local_jobs).where(_c.provider == self._provider, _c.job_id == job_id).with_for_update()
            ).one_or_none()
            if row is None or row.state not in UNFINISHED:
                return None
            if row.owner is not None and (row.owner == owner or not orphaned(row.owner)):
                return None
            exhausted = row.renders >= max_renders
            values: dict[str, Any] = {"owner": owner, "state": JobStatus.QUEUED.value, "progress": 0}
            if exhausted:
                values.update(
                    owner=None,
                    state=JobStatus.FAILED.value,
                    error_code="render_interrupted",
                    error_message=f"{row.renders} renders of this job were each interrupted before they ended",
                )
            conn.execute(
                local_jobs.update()
                .where(_c.provider == self._provider, _c.job_id == job_id)
                .values(updated_at=now, **values)
            )
            return None if exhausted else _job(self._by_id(conn, job_id))

    def started(self, job_id: str, owner: str, now: datetime) -> bool:
        """`owner`'s render of the job has its ffmpeg running: RUNNING, one more render counted. False when the
        job is no longer `owner`'s (canceled, or taken over): the render must stop."""
        return self.record(job_id, owner, now, state=JobStatus.RUNNING, renders=_c.renders + 1)

    def record(self, job_id: str, holder: str, now: datetime, **values: Any) -> bool:
        """Write what `holder`'s render of the job did (state, progress, output, error; `owner=None` when it
        ends); False when the job is no longer `holder`'s (taken over, canceled, released): nothing is written."""
        if isinstance(values.get("state"), JobStatus):
            values["state"] = values["state"].value
        with write_tx(self._engine) as conn:
            done = conn.execute(
                local_jobs.update()
                .where(_c.provider == self._provider, _c.job_id == job_id, _c.owner == holder)
                .values(updated_at=now, **values)
            ).rowcount
        return bool(done)

    def release(self, job_ids: list[str], owner: str, now: datetime) -> int:
        """Give unfinished jobs back (the process is stopping or its render was interrupted): QUEUED and
        ownerless, for the next engine that asks for them to render again under the same job id."""
        if not job_ids:
            return 0
        with write_tx(self._engine) as conn:
            return int(
                conn.execute(
                    local_jobs.update()
                    .where(
                        _c.provider == self._provider,
                        _c.job_id.in_(job_ids),
                        _c.owner == owner,
                        _c.state.in_(UNFINISHED),
                    )
                    .values(owner=None, state=JobStatus.QUEUED.value, progress=0, updated_at=now)
                ).rowcount
            )

    def cancel(self, job_id: str, now: datetime) -> LocalJob | None:
        """Mark an unfinished job CANCELED whoever holds it (its owner sees so at its next write); the row as
        it is now, or None when unknown."""
        with write_tx(self._engine) as conn:
            conn.execute(
                local_jobs.update()
                .where(_c.provider == self._provider, _c.job_id == job_id, _c.state.in_(UNFINISHED))
                .values(state=JobStatus.CANCELED.value, owner=None, updated_at=now)
            )
            row = self._by_id(conn, job_id)
        return None if row is None else _job(row)

    def purge(self, finished_before: datetime) -> int:
        """Forget jobs finished before `finished_before` (their outputs are swept at the same age)."""
        with write_tx(self._engine) as conn:
            return int(
                conn.execute(
                    local_jobs.delete().where(
                        _c.provider == self._provider, _c.state.not_in(UNFINISHED), _c.updated_at < finished_before
                    )
                ).rowcount
            )

    def _by_key(self, conn: Connection, request_key: str) -> Any:
        return conn.execute(
            sa.select(local_jobs).where(_c.provider == self._provider, _c.request_key == request_key)
        ).one_or_none()

    def _by_id(self, conn: Connection, job_id: str) -> Any:
        return conn.execute(
            sa.select(local_jobs).where(_c.provider == self._provider, _c.job_id == job_id)
        ).one_or_none()
