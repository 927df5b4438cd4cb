"""The dispatcher: QUEUED tasks → a fenced slot → DISPATCHING with a NEW attempt → `provider.submit.requested`.

The database is scanned directly, so a lost `generation.queued` message delays nothing. Admission is planned
with `domain.admission.select` (tiers, tenant round-robin, four nested limits) and enforced by the slot store;
each pick is claimed with a version-checked transition, so two schedulers never dispatch one task twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import attempts, outbox, tasks, wakeup
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import generation_tasks, task_attempts, tenants
from aivedio_engine.domain import admission
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import ATTEMPT_TERMINAL, EventSource, TaskStatus
from aivedio_engine.domain.transitions import Decision, TaskEvent, Trigger, decide
from aivedio_engine.services.provider_health import Health, provider_health
from aivedio_engine.slots.base import Lease, SlotStore
from aivedio_engine.testing.failpoints import failpoint

_t = generation_tasks.c
#: the submit message must be consumed within this; after it the sweeper re-emits it
SUBMIT_GRACE = timedelta(seconds=60)


class Dispatcher:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        slots: SlotStore,
        rebuild_slots: Callable[[], object] | None = None,
    ) -> None:
        self._engine = engine
        self._rebuild_slots = rebuild_slots
        self._clock = clock
        self._settings = settings
        self._slots = slots
        self._cursor: dict[int, str] = {}

    def limits(self, now: datetime, tenant_limits: dict[str, int], health: Health) -> admission.Limits:
        providers = {}
        for name, cfg in self._settings.providers.items():
            if not cfg.enabled:
                continue
            throttle = health.throttles.get(name)
            # a throttled provider keeps its in-flight jobs; the AIMD estimate only bounds new admissions
            providers[name] = min(cfg.max_concurrency, throttle.effective) if throttle else cfg.max_concurrency
        return admission.Limits(
            platform=self._settings.limits.platform_max_concurrency,
            tenant_default=self._settings.limits.tenant_default_max_concurrency,
            tenants=tenant_limits,
            providers=providers,
        )

    def run_once(self, max_picks: int = 100) -> int:
        """One admission round; returns how many tasks were dispatched."""
        now = self._clock.now()
        candidates, tenant_limits = self._candidates(now, limit=max(500, max_picks * 5))
        if not candidates:
            return 0
        if self._rebuild_slots is not None and self._slots.current_fence() == 0:
            # the store lost its state (Redis flushed or restarted): counts read now would be zero and admit
            # far too much, so rebuild them from the in-flight attempts before planning
            self._rebuild_slots()
        health = provider_health(self._engine, self._settings, now)
        limits = self.limits(now, tenant_limits, health)
        budget = {p: b for p, br in health.breakers.items() if (b := br.submit_budget(now)) is not None}
        for name, allowed in list(budget.items()):
            if allowed == 1 and health.sending.get(name):
                budget[name] = 0  # half-open: the single probe is already on its way
        for name, throttle in health.throttles.items():
            if not throttle.can_submit(now):
                budget[name] = 0  # Retry-After has not passed
        selection = admission.select(
            candidates, self._slots.counts(), limits, max_picks=max_picks, cursor=self._cursor, submit_budget=budget
        )
        self._cursor = dict(selection.cursor)
        dispatched = 0
        for pick in selection.picks:
            dispatched += self._dispatch(pick, limits, now)
        return dispatched

    def _candidates(self, now: datetime, limit: int) -> tuple[list[admission.Candidate], dict[str, int]]:
        stmt = (
            sa.select(
                _t.id,
                _t.tenant_id,
                _t.selected_provider,
                _t.requested_model,
                _t.created_at,
                _t.priority,
                tenants.c.priority_tier,
                tenants.c.max_concurrency,
            )
            .join(tenants, tenants.c.id == _t.tenant_id)
            .where(_t.status == TaskStatus.QUEUED.value, sa.or_(_t.next_action_at.is_(None), _t.next_action_at <= now))
            .order_by(_t.created_at)
            .limit(limit)
        )
        with self._engine.connect() as conn:
            rows = conn.execute(stmt).all()
        tenant_limits = {str(r.tenant_id): r.max_concurrency for r in rows if r.max_concurrency}
        cands = [
            admission.Candidate(
                task_id=str(r.id),
                tenant_id=str(r.tenant_id),
                provider=r.selected_provider or self._settings.default_provider,
                model=r.requested_model,
                created_at=r.created_at,
                priority=r.priority,
                tier=r.priority_tier or admission.PriorityTier.PAID,
            )
            for r in rows
        ]
        return cands, tenant_limits

    def _dispatch(self, pick: admission.Candidate, limits: admission.Limits, now: datetime) -> int:
        attempt_id = new_id()
        lease = self._slots.acquire(
            limits.chain(pick.tenant_id, pick.provider, pick.model),
            str(attempt_id),
            self._settings.limits.slot_lease_ttl_s,
        )
        if lease is None:
            return 0
        try:
            failpoint("dispatch.after_acquire")
            claimed = self._claim(uuid.UUID(pick.task_id), attempt_id, pick, lease, now)
        except Exception:
            self._slots.release(lease)
            raise
        if not claimed:
            self._slots.release(lease)
        return int(claimed)

    def _claim(
        self, task_id: uuid.UUID, attempt_id: uuid.UUID, pick: admission.Candidate, lease: Lease, now: datetime
    ) -> bool:
        with write_tx(self._engine) as conn:
            task = tasks.read(conn, task_id, lock=True)
            if task is None:
                return False
            decision = decide(tasks.snapshot(task), Trigger(TaskEvent.DISPATCH_CLAIMED, int(task.version)), now)
            if not isinstance(decision, Decision):
                return False  # another scheduler got it, or it was canceled meanwhile
            previous = attempts.current(conn, task_id)
            if previous is not None and previous.submit_state not in {s.value for s in ATTEMPT_TERMINAL}:
                return False  # the one-in-flight rule: never a second live attempt
            attempt_no = int(task.current_attempt_no) + 1
            attempts.create(
                conn,
                task_id=task_id,
                attempt_no=attempt_no,
                provider=pick.provider,
                model=pick.model,
                params=task.params,
                now=now,
                fencing_token=lease.fence,
                attempt_id=attempt_id,
                resubmitted_after_unknown=previous is not None and previous.last_error_class == "confirmed_not_created",
            )
            tasks.apply(
                conn,
                task_id,
                decision,
                source=EventSource.SCHEDULER,
                source_event_id=f"{task_id}:{decision.version}",
                now=now,
                extra={
                    "current_attempt_no": attempt_no,
                    "selected_provider": pick.provider,
                    "next_action_at": now + SUBMIT_GRACE,
                },
                payload={"attempt_id": str(attempt_id), "fence": lease.fence},
            )
            outbox.add(
                conn,
                EventType.PROVIDER_SUBMIT_REQUESTED,
                aggregate_type="attempt",
                aggregate_id=attempt_id,
                aggregate_version=decision.version,
                tenant_id=task.tenant_id,
                trace_id=task.trace_id,
                now=now,
                payload={"attempt_id": str(attempt_id), "task_id": str(task_id)},
            )
        return True


def lease_of(attempt: Any, tenant_id: uuid.UUID) -> Lease | None:
    """The lease an attempt row holds, from rows already read (no query)."""
    if attempt.fencing_token is None:
        return None
    return Lease.of(
        str(attempt.id), attempt.fencing_token, admission.scope_names(str(tenant_id), attempt.provider, attempt.model)
    )


def release_lease(engine: Engine, slots: SlotStore, lease: Lease) -> bool:
    """Free a finished attempt's slot (after the commit that finished it); idempotent."""
    released = slots.release(lease)
    if released:  # a freed slot may admit a waiting task: wake the dispatcher
        wakeup.committed(engine, (wakeup.DISPATCH,))
    return released


def attempt_lease(conn: Any, attempt_id: uuid.UUID) -> Lease | None:
    """The lease an attempt row holds, rebuilt from the row (any process can release it)."""
    row = conn.execute(
        sa.select(
            task_attempts.c.id,
            task_attempts.c.provider,
            task_attempts.c.model,
            task_attempts.c.fencing_token,
            generation_tasks.c.tenant_id,
        )
        .join(generation_tasks, generation_tasks.c.id == task_attempts.c.task_id)
        .where(task_attempts.c.id == attempt_id)
    ).first()
    if row is None or row.fencing_token is None:
        return None
    return Lease.of(str(row.id), row.fencing_token, admission.scope_names(str(row.tenant_id), row.provider, row.model))


def release_if_finished(engine: Engine, slots: SlotStore, attempt_id: uuid.UUID) -> bool:
    """Free an attempt's slot once it is terminal; safe to call any number of times."""
    with engine.connect() as conn:
        state = conn.execute(
            sa.select(task_attempts.c.submit_state).where(task_attempts.c.id == attempt_id)
        ).scalar_one_or_none()
        if state is None or state not in {s.value for s in ATTEMPT_TERMINAL}:
            return False
        lease = attempt_lease(conn, attempt_id)
    return lease is not None and release_lease(engine, slots, lease)
