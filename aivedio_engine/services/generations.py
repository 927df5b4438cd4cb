"""Generation tasks: idempotent creation with credit reservation, reads, and cancellation.

Creation is ONE transaction (seed 000 §4.9.2 "事务 1"): RESERVE ledger row + task + its state events + the
`generation.queued` outbox row commit together or not at all (`db.creation`). Idempotency is per tenant and
key: the same key with the same normalized request returns the original task; with another request it is a
409. Concurrent duplicates wait on the unique (tenant, key) index for the first and then replay it; a duplicate
whose twin has not committed in time is told the first is still in flight.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import creation, tasks
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.db.tables import assets, generation_tasks
from aivedio_engine.domain.requests import Catalog, InvalidRequest, estimate_cost, normalize, request_hash
from aivedio_engine.domain.status import AssetKind, AssetStatus, EventSource, TaskStatus
from aivedio_engine.domain.transitions import (
    Decision,
    Effect,
    Rejection,
    RejectionKind,
    TaskEvent,
    TaskSnapshot,
    decide,
)
from aivedio_engine.services import billing
from aivedio_engine.services.errors import (
    BadRequest,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    IllegalState,
    InsufficientCredits,
    InvalidInput,
    MissingIdempotencyKey,
    NotFound,
    Overloaded,
)
from aivedio_engine.services.shedding import BacklogGate

MAX_IDEMPOTENCY_KEY = 255
_t = generation_tasks.c


@dataclass(frozen=True, slots=True)
class TaskView:
    id: uuid.UUID
    tenant_id: uuid.UUID
    status: str
    version: int
    progress: int
    model: str
    provider: str | None
    priority: int
    estimated_cost: Decimal
    reserved_amount: Decimal
    actual_cost: Decimal | None
    params: dict[str, Any]
    cancel_outcome: str | None
    last_error_class: str | None
    parked_reason: str | None
    deadline_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> TaskView:
        return cls(
            id=row.id,
            tenant_id=row.tenant_id,
            status=row.status,
            version=int(row.version),
            progress=int(row.progress),
            model=row.requested_model,
            provider=row.selected_provider,
            priority=row.priority,
            estimated_cost=row.estimated_cost,
            reserved_amount=row.reserved_amount,
            actual_cost=row.actual_cost,
            params=row.params,
            cancel_outcome=row.cancel_outcome,
            last_error_class=row.last_error_class,
            parked_reason=row.parked_reason,
            deadline_at=row.deadline_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            finished_at=row.finished_at,
        )


@dataclass(frozen=True, slots=True)
class Created:
    task: TaskView
    replayed: bool


class GenerationService:
    def __init__(self, engine: Engine, clock: Clock, catalog: Catalog, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._catalog = catalog
        self._settings = settings
        self._gate = BacklogGate(settings.limits)

    # ------------------------------------------------------------------------------------------- create
    def create(
        self, tenant_id: uuid.UUID, idempotency_key: str | None, body: dict[str, Any], trace_id: str | None = None
    ) -> Created:
        key = _check_key(idempotency_key)
        try:
            params = normalize(body, self._catalog)
        except InvalidRequest as exc:
            raise InvalidInput(str(exc), field=exc.field) from None
        spec = self._catalog.find(params.model, params.provider)
        cost = estimate_cost(params, spec)
        digest = request_hash(params)
        try:
            self._gate.check(self._engine, tenant_id, self._clock.now())
        except Overloaded:
            existing = creation.by_key(self._engine, tenant_id, key)
            if existing is None:
                raise
            return _replay(existing, digest)  # a client retrying a request that did get in still sees its task
        if params.asset_ids:
            try:
                with self._engine.connect() as conn:
                    self._check_assets(conn, tenant_id, params.asset_ids)
            except (NotFound, InvalidInput):
                existing = creation.by_key(self._engine, tenant_id, key)
                if existing is None:
                    raise
                return _replay(existing, digest)  # made while its assets were still READY
        try:
            task = creation.create(
                self._engine, self._new_task(tenant_id, key, params.canonical(), digest, cost, trace_id)
            )
        except creation.KeyTaken:
            return _replay(creation.by_key(self._engine, tenant_id, key), digest)
        except creation.KeyInFlight:
            raise IdempotencyKeyInFlight("a request with this Idempotency-Key is still being processed") from None
        except creation.Unaffordable as exc:
            raise InsufficientCredits(
                f"this request needs {cost} credits; the balance is {exc.balance}",
                balance=str(exc.balance),
                needed=str(cost),
            ) from None
        return Created(TaskView.of(task), replayed=False)

    def _by_key(self, conn: Connection, tenant_id: uuid.UUID, key: str) -> Any:
        return creation._by_key(conn, tenant_id, key)

    def _check_assets(self, conn: Connection, tenant_id: uuid.UUID, asset_ids: tuple[str, ...]) -> None:
        if not asset_ids:
            return
        wanted = [uuid.UUID(a) for a in asset_ids]
        rows = {
            r.id: r
            for r in conn.execute(
                sa.select(assets.c.id, assets.c.status, assets.c.kind).where(
                    assets.c.id.in_(wanted), assets.c.tenant_id == tenant_id
                )
            )
        }
        for asset_id in wanted:
            row = rows.get(asset_id)
            if row is None:
                raise NotFound(f"asset {asset_id} not found")
            if row.kind not in (AssetKind.INPUT_IMAGE.value, AssetKind.INPUT_VIDEO.value):
                raise InvalidInput(f"asset {asset_id} is not an input asset", field="asset_ids")
            if row.status != AssetStatus.READY.value:
                raise InvalidInput(f"asset {asset_id} is {row.status}, not READY", field="asset_ids")

    def _new_task(
        self, tenant_id: uuid.UUID, key: str, params: dict[str, Any], digest: bytes, cost: Decimal, trace_id: str | None
    ) -> creation.NewTask:
        # The machine decides each creation step; the row is written once, at the state they lead to.
        now = self._clock.now()
        deadline = now + timedelta(seconds=params["deadline_s"])
        history: list[tuple[str, str | None, str, int]] = [("created", None, TaskStatus.CREATED.value, 0)]
        snap = TaskSnapshot(TaskStatus.CREATED, 0, 0, deadline)
        for event in (TaskEvent.VALIDATION_STARTED, TaskEvent.VALIDATION_PASSED, TaskEvent.QUEUED):
            decision = decide(snap, event, now)
            assert isinstance(decision, Decision), decision
            history.append((event.value, decision.from_status.value, decision.to_status.value, decision.version))
            snap = TaskSnapshot(decision.to_status, decision.version, decision.progress, deadline)
        task_id = new_id()
        return creation.NewTask(
            id=task_id,
            tenant_id=tenant_id,
            key=key,
            request_hash=digest,
            status=snap.status.value,
            version=snap.version,
            progress=snap.progress,
            model=params["model"],
            provider=params["provider"],
            priority=params["priority"],
            cost=cost,
            prompt=params["prompt"],
            params=params,
            deadline_at=deadline,
            trace_id=trace_id,
            now=now,
            history=tuple(history),
            queued_payload={
                "task_id": str(task_id),
                "requested_model": params["model"],
                "priority": params["priority"],
                "deadline_at": deadline.isoformat(),
            },
        )

    # --------------------------------------------------------------------------------------------- read
    def get(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> TaskView:
        with read_conn(self._engine) as conn:
            row = tasks.read(conn, task_id, tenant_id)
        if row is None:
            raise NotFound(f"generation {task_id} not found")
        return TaskView.of(row)

    def find_by_key(self, tenant_id: uuid.UUID, idempotency_key: str) -> TaskView | None:
        """The task an Idempotency-Key created, if any: lets a client resume without re-sending anything."""
        with self._engine.connect() as conn:
            row = self._by_key(conn, tenant_id, _check_key(idempotency_key))
        return None if row is None else TaskView.of(row)

    def list(
        self, tenant_id: uuid.UUID, status: str | None = None, limit: int = 50, cursor: uuid.UUID | None = None
    ) -> tuple[list[TaskView], uuid.UUID | None]:
        """Newest first, keyset-paginated on the time-ordered id; returns (page, next cursor or None)."""
        stmt = sa.select(generation_tasks).where(_t.tenant_id == tenant_id)
        if status is not None:
            try:
                stmt = stmt.where(_t.status == TaskStatus(status).value)
            except ValueError:
                raise InvalidInput(
                    f"unknown status {status!r} (known: {', '.join(s.value for s in TaskStatus)})", field="status"
                ) from None
        if cursor is not None:
            stmt = stmt.where(_t.id < cursor)
        stmt = stmt.order_by(_t.id.desc()).limit(limit + 1)
        with read_conn(self._engine) as conn:
            rows = conn.execute(stmt).all()
        page = [TaskView.of(r) for r in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    # ------------------------------------------------------------------------------------------- cancel
    def cancel(self, tenant_id: uuid.UUID, task_id: uuid.UUID, requested_by: str = "api") -> TaskView:
        """Cancel per seed §4.5.3. Repeating a cancel is harmless; canceling a finished task is a 409."""
        with write_tx(self._engine) as conn:
            row = tasks.read(conn, task_id, tenant_id, lock=True)
            if row is None:
                raise NotFound(f"generation {task_id} not found")
            now = self._clock.now()
            result = decide(tasks.snapshot(row), TaskEvent.CANCEL_REQUESTED, now)
            if isinstance(result, Rejection):
                if row.status in (TaskStatus.CANCELED.value, TaskStatus.CANCEL_REQUESTED.value):
                    return TaskView.of(row)
                reason = "finished" if result.kind is RejectionKind.TERMINAL else "past the point of cancellation"
                raise IllegalState(f"generation is {row.status}: {reason}", current_status=row.status)
            apply_cancel(
                conn,
                row,
                result,
                now,
                source=EventSource.API,
                created_by=requested_by,
                payload={"requested_by": requested_by},
            )
            return TaskView.of(tasks.read(conn, task_id))


def apply_cancel(
    conn: Connection,
    row: Any,
    decision: Decision,
    now: datetime,
    *,
    source: EventSource,
    created_by: str,
    payload: dict[str, Any],
) -> Decimal | None:
    """Record a decided cancel on the locked task row: the transition, and the reservation released when no
    provider job can have cost anything (the provider cancel itself is driven later from the task row).
    Returns the cost booked, as `billing.close_reservation` does."""
    extra: dict[str, Any] = {"cancel_requested_at": now}
    if Effect.REQUEST_PROVIDER_CANCEL in decision.effects or Effect.SCHEDULE_RECONCILE in decision.effects:
        extra["next_action_at"] = now
    tasks.apply(
        conn,
        row.id,
        decision,
        source=source,
        source_event_id=f"{row.id}:{decision.version}",
        now=now,
        extra=extra,
        payload=payload,
    )
    return billing.close_reservation(conn, row, decision, now, reason="canceled", created_by=created_by)


def _check_key(key: str | None) -> str:
    if key is None or not key.strip():
        raise MissingIdempotencyKey("the Idempotency-Key header is required")
    if len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise BadRequest(f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable characters")
    return key


def _replay(row: Any, digest: bytes) -> Created:
    if bytes(row.request_hash) != digest:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
    return Created(TaskView.of(row), replayed=True)
