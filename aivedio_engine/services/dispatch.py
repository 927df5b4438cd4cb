"""The dispatcher: QUEUED tasks → a fenced slot → DISPATCHING with a NEW attempt → `provider.submit.requested`.

The database is scanned directly (a task entering QUEUED only wakes it, after the commit). Admission is planned
with `domain.admission.select` (tiers, tenant round-robin, four nested limits) and enforced by the slot store;
each pick is claimed with a version-checked transition, so two schedulers never dispatch one task twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import attempts, dispatch_queue, tasks
from aivedio_engine.db import degraded as degraded_db
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain import admission, degraded
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import ATTEMPT_TERMINAL, EventSource
from aivedio_engine.domain.transitions import Decision, TaskEvent, Trigger, decide
from aivedio_engine.services import provider_switch
from aivedio_engine.services.provider_health import Health, provider_health
from aivedio_engine.services.transition import AfterCommit, Change, NewAttempt, execute
from aivedio_engine.slots.base import Lease, SlotStore, SlotStoreUnavailable
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger(__name__)


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
        #: the redis_down_dispatch mode while the slot store is unreachable, None while it answers
        self.degraded: str | None = None

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
        try:
            counts = self._live_counts()
        except SlotStoreUnavailable as exc:
            return self._degraded_round(now, candidates, tenant_limits, max_picks, exc)
        selection, limits = self._plan(now, candidates, tenant_limits, counts, max_picks, 1.0)
        dispatched = 0
        for pick in selection.picks:
            dispatched += self._dispatch(pick, limits, now)
        return dispatched

    def _live_counts(self) -> dict[str, int]:
        if self._rebuild_slots is not None and (self.degraded is not None or self._slots.current_fence() == 0):
            # the store lost its state (Redis flushed or restarted), or it was unreachable and tasks were
            # dispatched meanwhile without it: counts read now would admit far too much, so rebuild them from
            # the in-flight attempts first (that also raises its fence counter above every degraded fence)
            self._rebuild_slots()
        counts = self._slots.counts()
        if self.degraded is not None:
            log.warning("slot store reachable again after degraded dispatch (%s)", self.degraded)
            self.degraded = None
        return counts

    def _plan(
        self,
        now: datetime,
        candidates: list[admission.Candidate],
        tenant_limits: dict[str, int],
        counts: dict[str, int],
        max_picks: int,
        fraction: float,
    ) -> tuple[admission.Selection, admission.Limits]:
        health = provider_health(self._engine, self._settings, now)
        candidates = provider_switch.reroute(self._engine, self._settings, candidates, health, now)
        limits = degraded.scaled(self.limits(now, tenant_limits, health), fraction * self._pressure(now))
        budget = {p: b for p, br in health.breakers.items() if (b := br.submit_budget(now)) is not None}
        for name, allowed in list(budget.items()):
            if allowed == 1 and health.sending.get(name):
                budget[name] = 0  # half-open: the single probe is already on its way
        for name, throttle in health.throttles.items():
            if not throttle.can_submit(now):
                budget[name] = 0  # Retry-After has not passed
        selection = admission.select(
            candidates, counts, limits, max_picks=max_picks, cursor=self._cursor, submit_budget=budget
        )
        self._cursor = dict(selection.cursor)
        return selection, limits

    def _pressure(self, now: datetime) -> float:
        """: outputs about to expire still waiting to be fetched take bandwidth before new work."""
        cfg = self._settings.fetch
        if not cfg.pressure_urgent_outputs:
            return 1.0
        urgent = degraded_db.urgent_fetches(self._engine, now + timedelta(seconds=cfg.urgent_within_s))
        return cfg.pressure_dispatch_fraction if urgent >= cfg.pressure_urgent_outputs else 1.0

    def _degraded_round(
        self,
        now: datetime,
        candidates: list[admission.Candidate],
        tenant_limits: dict[str, int],
        max_picks: int,
        exc: SlotStoreUnavailable,
    ) -> int:
        """The slot store is unreachable: pause, or admit from PostgreSQL's in-flight counts under scaled
        limits. Never fails a task, never touches a reservation, never resubmits: it only dispatches less."""
        mode = self._settings.limits.redis_down_dispatch
        if self.degraded is None:
            log.warning("slot store unreachable, dispatch degrades to %s: %s", mode, exc)
            if mode == "pg_count":
                degraded_db.reseed_fences(self._engine)
        self.degraded = mode
        if mode == "pause":
            return 0
        with degraded_db.round_lock(self._engine) as mine:
            if not mine:  # another scheduler is dispatching from the database counts: one at a time
                return 0
            counts = degraded_db.in_flight_counts(self._engine)
            selection, limits = self._plan(
                now, candidates, tenant_limits, counts, max_picks, self._settings.limits.redis_down_fraction
            )
            dispatched = 0
            for pick in selection.picks:
                attempt_id = new_id()
                chain = limits.chain(pick.tenant_id, pick.provider, pick.model)
                lease = Lease(str(attempt_id), degraded_db.next_fence(self._engine), tuple(s for s, _ in chain))
                dispatched += int(self._claim(uuid.UUID(pick.task_id), attempt_id, pick, lease, now))
            return dispatched

    def _candidates(self, now: datetime, limit: int) -> tuple[list[admission.Candidate], dict[str, int]]:
        with self._engine.connect() as conn:
            rows = dispatch_queue.due(conn, now, limit)
        tenant_limits = {str(r.tenant_id): r.max_concurrency for r in rows if r.max_concurrency}
        cands = [
            admission.Candidate(
                task_id=str(r.id),
                tenant_id=str(r.tenant_id),
                provider=r.selected_provider or self._settings.default_provider,
                model=r.requested_model,
                created_at=r.created_at,
                priority=r.priority,
                # re-capped here too: a tenant moved to a worse tier takes its queued tasks with it
                tier=admission.capped_tier(r.priority, r.priority_tier),
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
        after = AfterCommit(self._engine, self._slots)
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
            new = NewAttempt(
                attempt_id,
                pick.provider,
                pick.model,
                lease.fence,
                resubmitted_after_unknown=previous is not None
                and previous.last_error_class == ErrorOutcome.CONFIRMED_NOT_CREATED.value,
            )
            change = Change(
                EventSource.SCHEDULER,
                columns={
                    "selected_provider": pick.provider,
                    # the submit message must be consumed within this; after it the sweeper re-emits it
                    "next_action_at": now + timedelta(seconds=self._settings.sweeper.idle_grace_s),
                },
                payload={"attempt_id": str(attempt_id), "fence": lease.fence},
                new_attempt=new,
            )
            execute(conn, task, decision, change, now, after)
            failpoint("dispatch.before_commit")
        failpoint("dispatch.after_commit")
        after.run()
        return True
