"""Attempt persistence: creation, guarded state changes, and lookups by provider job id."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db import lock_order
from aivedio_engine.db.records import Attempt
from aivedio_engine.db.session import run_prebuilt
from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.retry import LastError, last_error_value
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


def read(conn: Connection, attempt_id: uuid.UUID, *, lock: bool = False) -> Attempt | None:
    """The attempt; with `lock`, under its row lock, which needs its task's lock first (`db.lock_order`)."""
    return _locked(conn, sa.select(task_attempts).where(_a.id == attempt_id), lock)


def get(conn: Connection, attempt_id: uuid.UUID, *, lock: bool = False) -> Attempt:
    """`read` of an attempt that must exist (one a message or a row names)."""
    attempt = read(conn, attempt_id, lock=lock)
    if attempt is None:
        raise LookupError(f"attempt {attempt_id} does not exist")
    return attempt


def by_job(conn: Connection, provider: str, job_id: str, *, lock: bool = False) -> Attempt | None:
    return _locked(conn, sa.select(task_attempts).where(_a.provider == provider, _a.provider_job_id == job_id), lock)


def task_of(conn: Connection, attempt_id: uuid.UUID) -> uuid.UUID | None:
    """The attempt's task (never changes, so it may be read before any lock is taken)."""
    return conn.execute(sa.select(_a.task_id).where(_a.id == attempt_id)).scalar_one_or_none()


def unknown_by_request_key(conn: Connection, provider: str, key: str) -> uuid.UUID | None:
    """The SUBMIT_UNKNOWN attempt the provider knows by this request key, if any; read before any lock (the caller
    locks its task, then the attempt, and checks the state again)."""
    found = conn.execute(
        sa.select(_a.id).where(
            _a.provider == provider, _a.provider_request_key == key, _a.submit_state == AttemptStatus.UNKNOWN.value
        )
    ).first()
    return None if found is None else found.id


def failed_before_accept(conn: Connection, task_id: uuid.UUID) -> tuple[int, datetime | None]:
    """How many of the task's attempts the provider rejected before accepting, and when the first of them ended."""
    failed = conn.execute(
        sa.select(sa.func.count(), sa.func.min(_a.updated_at)).where(
            _a.task_id == task_id, _a.submit_state == AttemptStatus.FAILED_BEFORE_ACCEPT.value
        )
    ).one()
    return int(failed[0]), failed[1]


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Which attempt a request key names, its task, and where it stands."""

    id: uuid.UUID
    task_id: uuid.UUID
    submit_state: str


def by_request_key(conn: Connection, provider: str, key: str) -> AttemptRef | None:
    """The attempt a provider request key names, or None."""
    row = conn.execute(
        sa.select(_a.id, _a.task_id, _a.submit_state).where(_a.provider == provider, _a.provider_request_key == key)
    ).first()
    return None if row is None else AttemptRef(*row)


@dataclass(frozen=True, slots=True)
class LeaseFacts:
    """What freeing an attempt's slot needs: the attempt's lease fields and state, and its task's tenant."""

    id: uuid.UUID
    submit_state: str
    provider: str
    model: str
    fencing_token: int | None
    tenant_id: uuid.UUID


def lease_facts(conn: Connection, attempt_id: uuid.UUID) -> LeaseFacts | None:
    row = conn.execute(
        sa.select(_a.id, _a.submit_state, _a.provider, _a.model, _a.fencing_token, generation_tasks.c.tenant_id)
        .join(generation_tasks, generation_tasks.c.id == _a.task_id)
        .where(_a.id == attempt_id)
    ).first()
    return None if row is None else LeaseFacts(*row)


def _locked(conn: Connection, stmt: sa.Select[Any], lock: bool) -> Attempt | None:
    if not (lock and conn.dialect.name == "postgresql"):
        return Attempt.of(conn.execute(stmt).first())
    row = conn.execute(stmt.with_for_update()).first()
    if row is not None:
        lock_order.require_task_locked(conn, row.task_id, row.id)
    return Attempt.of(row)


def current(conn: Connection, task_id: uuid.UUID) -> Attempt | None:
    """The task's latest attempt (highest attempt_no), or None."""
    return Attempt.of(
        conn.execute(
            sa.select(task_attempts).where(_a.task_id == task_id).order_by(_a.attempt_no.desc()).limit(1)
        ).first()
    )


def transition(
    conn: Connection,
    attempt: Attempt,
    event: AttemptEvent,
    now: datetime,
    *,
    error: LastError | None = None,
    **values: Any,
) -> AttemptDecision:
    """Move an attempt by its machine, guarded by its current state (CAS); raises AttemptConflict. Its
    `last_error_class` is written only from `error`, an ErrorClass or ErrorOutcome."""
    if "last_error_class" in values:
        raise TypeError("pass error=ErrorClass.X / ErrorOutcome.X, not a last_error_class string")
    if error is not None:
        values["last_error_class"] = last_error_value(error)
    result = decide_attempt(AttemptStatus(attempt.submit_state), event)
    if isinstance(result, Rejection):
        raise AttemptConflict(result.reason)
    values.update(submit_state=result.to_status.value, updated_at=now)
    params = {f"v_{c}": v for c, v in values.items()}
    params.update(attempt_id=attempt.id, from_state=attempt.submit_state)
    done = run_prebuilt(conn, _transition_statement(tuple(values)), params)
    if done.rowcount != 1:
        raise AttemptConflict(f"attempt {attempt.id} changed concurrently")
    return result


@functools.cache
def _transition_statement(columns: tuple[str, ...]) -> Any:
    """The CAS update of `transition` for one set of columns, built once and bound per call."""
    return (
        task_attempts.update()
        .where(_a.id == sa.bindparam("attempt_id"), _a.submit_state == sa.bindparam("from_state"))
        .values({c: sa.bindparam(f"v_{c}", type_=_a[c].type) for c in columns})
    )


def update(conn: Connection, attempt_id: uuid.UUID, **values: Any) -> None:
    conn.execute(task_attempts.update().where(_a.id == attempt_id).values(**values))


# --- the vendor's bill (0015_billed_units) -----------------------------------------------------------------

#: attempts the provider accepted: under the usual vendor rule these are billed even when they fail later
ACCEPTED = (
    AttemptStatus.ACKED.value,
    AttemptStatus.RUNNING.value,
    AttemptStatus.SUCCEEDED.value,
    AttemptStatus.FAILED.value,
    AttemptStatus.CANCELED.value,
    AttemptStatus.UNKNOWN.value,
)


@dataclass(frozen=True, slots=True)
class VendorBill:
    """What the vendor reported it billed for one attempt's job (all None: it said nothing)."""

    attempt_id: uuid.UUID
    billed: bool | None
    seconds: Decimal | None
    outputs: int | None
    vendor_cost: Decimal | None
    refunded: bool | None


def bill_values(obs: Mapping[str, Any]) -> dict[str, Any]:
    """The attempt columns an observation's billing facts set (only those it reports: a later observation that
    says nothing never erases what an earlier one said)."""
    values: dict[str, Any] = {}
    for column, key in (
        ("vendor_billed", "billed"),
        ("billed_seconds", "billed_seconds"),
        ("billed_outputs", "billed_outputs"),
        ("vendor_cost", "vendor_cost"),
        ("vendor_refunded", "refunded"),
    ):
        value = obs.get(key)
        if value is None:
            continue
        if column in ("billed_seconds", "vendor_cost"):
            value = Decimal(str(value))
            if value < 0:
                continue  # a negative charge is no bill: ignore it rather than fail the reducer on the CHECK
        elif column == "billed_outputs":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                continue
        elif not isinstance(value, bool):
            continue
        values[column] = value
    return values


def bill_of(conn: Connection, task_id: uuid.UUID) -> VendorBill | None:
    """The bill of the task's latest attempt (the one whose job decides its cost), or None without attempts."""
    row = conn.execute(
        sa.select(_a.id, _a.vendor_billed, _a.billed_seconds, _a.billed_outputs, _a.vendor_cost, _a.vendor_refunded)
        .where(_a.task_id == task_id)
        .order_by(_a.attempt_no.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    return VendorBill(
        row.id,
        row.vendor_billed,
        None if row.billed_seconds is None else Decimal(row.billed_seconds),
        row.billed_outputs,
        None if row.vendor_cost is None else Decimal(row.vendor_cost),
        row.vendor_refunded,
    )


def any_accepted(conn: Connection, task_id: uuid.UUID) -> bool:
    """Whether the provider accepted some attempt of the task."""
    count = conn.execute(
        sa.select(sa.func.count())
        .select_from(task_attempts)
        .where(_a.task_id == task_id, _a.submit_state.in_(ACCEPTED))
    ).scalar_one()
    return int(count) > 0
