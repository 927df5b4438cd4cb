"""Generation tasks: idempotent creation with credit reservation, reads, and cancellation.

Creation is ONE transaction: RESERVE ledger row + task + its state events commit
together or not at all (`db.creation`); the commit wakes the dispatcher, which scans QUEUED tasks itself.
Idempotency is per tenant and key: the same key with the same normalized request returns the original task;
with another request it is a 409. Concurrent duplicates wait on the unique (tenant, key) index for the first
and then replay it; a duplicate whose twin has not committed in time is told the first is still in flight.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db import creation, tasks
from aivedio_engine.db.creation_batch import CreateBatcher
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.domain.admission import PriorityTier, capped_tier
from aivedio_engine.domain.moderation import ModerationInput, ModerationResult, ReferenceFacts, RuleModerator
from aivedio_engine.domain.references import LimitExceeded, Reference, check_references
from aivedio_engine.domain.requests import (
    Catalog,
    GenerationParams,
    InvalidRequest,
    estimate_cost,
    normalize,
    request_hash,
)
from aivedio_engine.domain.status import AssetKind, AssetStatus, EventSource, ModerationVerdict, TaskStatus
from aivedio_engine.domain.transitions import (
    Decision,
    Rejection,
    RejectionKind,
    TaskEvent,
    TaskSnapshot,
    decide,
)
from aivedio_engine.services.errors import (
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    IllegalState,
    InsufficientCredits,
    InvalidInput,
    ModerationRejected,
    NotFound,
    Overloaded,
)
from aivedio_engine.services.idempotency import checked_key
from aivedio_engine.services.moderation import INPUT_REVIEW, InputModerator, build_moderator
from aivedio_engine.services.shedding import BacklogGate
from aivedio_engine.services.task_view import Created, TaskView
from aivedio_engine.services.transition import Change, execute
from aivedio_engine.testing.failpoints import failpoint


class GenerationService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        catalog: Catalog,
        settings: Settings,
        tier_of: Callable[[uuid.UUID], int] | None = None,
        moderator: InputModerator | None = None,
        tier_cached: Callable[[uuid.UUID], int | None] | None = None,
        batcher: CreateBatcher | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._catalog = catalog
        self._settings = settings
        self._gate = BacklogGate(settings.limits)
        #: the tenant's priority tier (cached per process), which caps a request's `priority`
        self._tier_of = tier_of
        self._moderator = moderator or build_moderator(settings)
        #: the tier only if this process has it cached (None: a read is due), for `plan_on_loop`
        self._tier_cached = tier_cached
        self._moderator_local = isinstance(self._moderator, RuleModerator)
        #: the loop's creates, several to a statement under load (None: one statement each)
        self._batcher = batcher

    # ------------------------------------------------------------------------------------------- create
    def create(
        self, tenant_id: uuid.UUID, idempotency_key: str | None, body: dict[str, Any], trace_id: str | None = None
    ) -> Created:
        key = checked_key(idempotency_key)
        params, cost, digest = self._priced(body)
        try:
            self._gate.check(self._engine, tenant_id, self._clock.now())
        except Overloaded:
            existing = creation.by_key(self._engine, tenant_id, key)
            if existing is None:
                raise
            return _replay(existing, digest)  # a client retrying a request that did get in still sees its task
        try:
            refs: list[ReferenceFacts] = []
            if params.asset_ids:
                with self._engine.connect() as conn:
                    refs = self._check_assets(conn, tenant_id, params)
            # after validation, before the reservation: a refusal leaves nothing reserved
            verdict = self._moderator.check(ModerationInput(params.prompt, tuple(refs)))
            if verdict.verdict is ModerationVerdict.REJECT:
                raise ModerationRejected(f"the request was refused by input moderation: {verdict.summary}")
        except (NotFound, InvalidInput, ModerationRejected):
            existing = creation.by_key(self._engine, tenant_id, key)
            if existing is None:
                raise
            return _replay(existing, digest)  # made while its assets were still READY, or under older rules
        tenant_tier = self._tier_of(tenant_id) if self._tier_of is not None else PriorityTier.PAID
        return self.insert(self._planned(tenant_id, key, params, body, verdict, digest, cost, trace_id, tenant_tier))

    async def plan_on_loop(
        self,
        pool: Any,
        tenant_id: uuid.UUID,
        idempotency_key: str | None,
        body: dict[str, Any],
        trace_id: str | None = None,
    ) -> creation.NewTask | None:
        """`create`'s checks and its new task on the API's event loop (reads on the loop `pool`). None when they
        would need a blocking call — reference assets to read, a tier not cached, a moderator that may call out,
        a backlog or a refusal that may be a replay: the caller then runs `create` in a thread instead. Raises
        what `create` raises before its first read (a bad key, an invalid request)."""
        if self._tier_cached is None or not self._moderator_local or body.get("asset_ids"):
            return None
        key = checked_key(idempotency_key)
        params, cost, digest = self._priced(body)
        tenant_tier = self._tier_cached(tenant_id)
        if tenant_tier is None or not await self._gate.open_on_loop(pool, self._clock.now()):
            return None
        verdict = self._moderator.check(ModerationInput(params.prompt, ()))
        if verdict.verdict is ModerationVerdict.REJECT:
            return None
        return self._planned(tenant_id, key, params, body, verdict, digest, cost, trace_id, tenant_tier)

    def expecting(self) -> AbstractContextManager[None]:
        """Around a create's way to `insert_on_loop` on the loop: the batcher may wait for it (`CreateBatcher`)."""
        return nullcontext() if self._batcher is None else self._batcher.expecting()

    async def insert_on_loop(self, pool: Any, new: creation.NewTask) -> Created | None:
        """Insert a planned task on the event loop; a taken key replays the task that holds it, or is a 409. None
        when the blocking path must finish it (`insert` with `whole_balance`: the task's balance stripe is short)."""
        with _creation_errors(new.cost):
            try:
                if self._batcher is None:
                    row = await creation.create_on_loop(pool, self._engine, new)
                else:
                    row = await self._batcher.create(pool, new)
            except creation.KeyTaken:
                existing = await creation.by_key_on_loop(pool, new.tenant_id, new.key)
                return None if existing is None else _replay(existing, new.request_hash)
        return None if row is None else Created(TaskView.of(row), replayed=False)

    def insert(self, new: creation.NewTask, *, whole_balance: bool = False) -> Created:
        """Insert a planned task (blocking); a taken key replays the task that holds it, or is a 409."""
        with _creation_errors(new.cost):
            try:
                task = creation.create(self._engine, new, whole_balance=whole_balance)
            except creation.KeyTaken:
                existing = creation.by_key(self._engine, new.tenant_id, new.key)
                if existing is None:  # KeyTaken means a committed task holds the key, and tasks are never deleted
                    raise LookupError(f"the task holding idempotency key {new.key!r} is gone") from None
                return _replay(existing, new.request_hash)
        return Created(TaskView.of(task), replayed=False)

    def _priced(self, body: dict[str, Any]) -> tuple[GenerationParams, Decimal, bytes]:
        try:
            params = normalize(body, self._catalog)
        except InvalidRequest as exc:
            raise InvalidInput(str(exc), field=exc.field) from None
        spec = self._catalog.find(params.model, params.provider)
        return params, estimate_cost(params, spec), request_hash(params)

    def _planned(
        self,
        tenant_id: uuid.UUID,
        key: str,
        params: GenerationParams,
        body: dict[str, Any],
        verdict: ModerationResult,
        digest: bytes,
        cost: Decimal,
        trace_id: str | None,
        tenant_tier: int,
    ) -> creation.NewTask:
        stored = _stored(params, body)
        if verdict.verdict is ModerationVerdict.WARN:
            stored[INPUT_REVIEW] = verdict.summary  # the media step holds the output for a human
        tier = capped_tier(params.priority, tenant_tier)
        return self._new_task(tenant_id, key, stored, digest, cost, trace_id, tier)

    def _by_key(self, conn: Connection, tenant_id: uuid.UUID, key: str) -> Task | None:
        return creation._by_key(conn, tenant_id, key)

    def _check_assets(self, conn: Connection, tenant_id: uuid.UUID, params: GenerationParams) -> list[ReferenceFacts]:
        """Each named asset is the tenant's, a READY input; together they fit the model's reference limits.
        Returns what upload validation measured of each, for the moderator."""
        refs: list[Reference] = []
        facts: list[ReferenceFacts] = []
        for asset_id, row in zip(
            params.asset_ids, asset_rows.inputs_of(conn, tenant_id, params.asset_ids), strict=True
        ):
            if row is None:
                raise NotFound(f"asset {asset_id} not found")
            if row.kind not in (AssetKind.INPUT_IMAGE.value, AssetKind.INPUT_VIDEO.value):
                raise InvalidInput(f"asset {asset_id} is not an input asset", field="asset_ids")
            if row.status != AssetStatus.READY.value:
                raise InvalidInput(f"asset {asset_id} is {row.status}, not READY", field="asset_ids")
            is_video = row.kind == AssetKind.INPUT_VIDEO.value
            refs.append(Reference(asset_id, is_video, row.size_bytes, row.width, row.height))
            facts.append(ReferenceFacts(asset_id, is_video, row.mime, row.size_bytes, row.width, row.height))
        spec = self._catalog.find(params.model, params.provider)
        try:
            check_references(spec.model, spec.limits, refs)
        except LimitExceeded as exc:
            raise InvalidInput(str(exc), field=exc.field) from None
        return facts

    def _new_task(
        self,
        tenant_id: uuid.UUID,
        key: str,
        params: dict[str, Any],
        digest: bytes,
        cost: Decimal,
        trace_id: str | None,
        tier: int,
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
            priority=tier,  # the tier it is served in: params["priority"] keeps what was asked
            cost=cost,
            prompt=params["prompt"],
            params=params,
            deadline_at=deadline,
            trace_id=trace_id,
            now=now,
            history=tuple(history),
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
            row = self._by_key(conn, tenant_id, checked_key(idempotency_key))
        return None if row is None else TaskView.of(row)

    def list(
        self, tenant_id: uuid.UUID, status: str | None = None, limit: int = 50, cursor: uuid.UUID | None = None
    ) -> tuple[list[TaskView], uuid.UUID | None]:
        """Newest first, keyset-paginated on the time-ordered id; returns (page, next cursor or None)."""
        wanted = None
        if status is not None:
            try:
                wanted = TaskStatus(status).value
            except ValueError:
                raise InvalidInput(
                    f"unknown status {status!r} (known: {', '.join(s.value for s in TaskStatus)})", field="status"
                ) from None
        with read_conn(self._engine) as conn:
            rows = tasks.page(conn, tenant_id, wanted, cursor, limit + 1)
        page = [TaskView.of(r) for r in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    # ------------------------------------------------------------------------------------------- cancel
    def cancel(self, tenant_id: uuid.UUID, task_id: uuid.UUID, requested_by: str = "api") -> TaskView:
        """Cancel Repeating a cancel is harmless; canceling a finished task is a 409."""
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
            view = TaskView.of(tasks.get(conn, task_id))
            failpoint("cancel.before_commit")
        failpoint("cancel.after_commit")
        return view


def apply_cancel(
    conn: Connection,
    row: Task,
    decision: Decision,
    now: datetime,
    *,
    source: EventSource,
    created_by: str,
    payload: dict[str, Any],
) -> Decimal | None:
    """Record a decided cancel on the locked task row through the executor: the transition, the provider cancel
    (or reconciliation) scheduled on the row, and the reservation released when no provider job can have cost
    anything. Returns the cost booked, as `billing.close_reservation` does."""
    change = Change(
        source,
        columns={"cancel_requested_at": now},
        payload=payload,
        ledger_reason="canceled",
        created_by=created_by,
    )
    return execute(conn, row, decision, change, now).booked


@contextmanager
def _creation_errors(cost: Decimal) -> Iterator[None]:
    try:
        yield
    except creation.KeyInFlight:
        raise IdempotencyKeyInFlight("a request with this Idempotency-Key is still being processed") from None
    except creation.Unaffordable as exc:
        raise InsufficientCredits(
            f"this request needs {cost} credits; the balance is {exc.balance}",
            balance=str(exc.balance),
            needed=str(cost),
        ) from None


def _replay(row: Task, digest: bytes) -> Created:
    if bytes(row.request_hash) != digest:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
    return Created(TaskView.of(row), replayed=True)


def _stored(params: GenerationParams, body: dict[str, Any]) -> dict[str, Any]:
    """The params a task keeps. `provider_pinned`: the client named the provider, so the task never moves to
    another one (domain.provider_switch); kept beside the params, outside the request hash, as is
    `input_review` (a WARN verdict's reasons, added by `create`)."""
    return {**params.canonical(), "provider_pinned": body.get("provider") is not None}
