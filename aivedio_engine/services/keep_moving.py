"""Every task keeps moving from the database's facts alone (issue 14): what a lost message or a half-done
transaction left behind is found in the rows and driven on. The sweeper runs `sweep` every pass; `aivedio replay
observations` runs `rereduce` on demand. Every action is idempotent and takes the engine's one lock order (the
task, then its attempt), so two sweepers, or a sweeper and a late message, cannot apply anything twice.

- A provider observation stored in `provider_events` but never classified by the reducer (its outbox message was
  lost: a broker or Redis flushed, a worker killed) is reduced again from its stored row, after
  `sweeper.observation_stuck_s`. Later polls of the same job carry the same fingerprint and are deduplicated,
  so without this nothing would ever reach the reducer again.
- An orphan observation whose job id an attempt owns now is rematched (a rematch that looked before the orphan
  committed missed it).
- An ACKED/RUNNING attempt of a task that ended, idle past the same budget, is closed: SUCCEEDED when its task
  succeeded (the task's output is its job's), else CANCELED (`task_ended`) with the job stopped; either way its
  slot is freed after the commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import stalled
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.stalled import UnappliedObservation
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import AttemptStatus, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent
from aivedio_engine.services import observations, reducer
from aivedio_engine.services.after_commit import AfterCommit
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.transition import lock_attempt, move_attempt
from aivedio_engine.slots.base import SlotStore
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger("aivedio.keep_moving")
#: rows handled per scan; the next pass takes the rest
BATCH = 500
#: how far back each pass looks for lost observations (index-backed); older ones are `aivedio replay
#: observations`' and the audit's (I10.1, I10.3) — as long as an orphan is kept
LOOKBACK = timedelta(days=7)


@dataclass
class KeptMoving:
    rereduced: int = 0
    rematched: int = 0
    attempts_closed: int = 0


@dataclass(frozen=True)
class Rereduced:
    provider_event_id: str
    task_id: str
    #: the reducer's digest (applied:<STATUS>, stale, duplicate, unmatched, ...) or "failed: <error>"
    outcome: str


@dataclass
class ObservationReplay:
    """What `aivedio replay observations` found (every match, exactly) and did."""

    dry_run: bool
    total: int
    items: list[dict[str, Any]] = field(default_factory=list)
    done: list[Rereduced] = field(default_factory=list)
    rows: list[UnappliedObservation] = field(default_factory=list, repr=False)

    @property
    def failed(self) -> list[Rereduced]:
        return [d for d in self.done if d.outcome.startswith("failed")]

    @property
    def outcome(self) -> str:
        if self.dry_run:
            return "dry_run"
        if self.failed:
            return "partial" if len(self.failed) < len(self.done) else "failed"
        return "rereduced" if self.done else "nothing"


class KeepMoving:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        slots: SlotStore | None = None,
        cancel_job: Callable[[Any], object] | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._slots = slots
        self._cancel_job = cancel_job

    @property
    def budget(self) -> timedelta:
        return timedelta(seconds=self._settings.sweeper.observation_stuck_s)

    def sweep(self) -> KeptMoving:
        now = self._clock.now()
        done = KeptMoving()
        done.rematched = self.rematch_bound_orphans()
        done.rereduced = len(self.rereduce(self.unapplied(now - self.budget, since=now - LOOKBACK)))
        done.attempts_closed = self.close_left_attempts(now - self.budget)
        return done

    # --- observations ---------------------------------------------------------------------------------------

    def preview(self, task_id: uuid.UUID | None = None, limit: int = 100) -> ObservationReplay:
        """The stored observations never applied (all of them: an operator asks, no budget is waited out): the
        exact count and the oldest `limit`. Changes nothing, records nothing."""
        if not 1 <= limit <= 10_000:
            raise InvalidInput("--limit must be within 1..10000", field="limit")
        now = self._clock.now()
        with self._engine.connect() as conn:
            total = stalled.count_unapplied(conn, now, task_id)
        rows = self.unapplied(now, task_id, limit)
        return ObservationReplay(True, total, [_item(r) for r in rows], rows=rows)

    def replay(self, op: Operation, task_id: uuid.UUID | None = None, limit: int = 100) -> ObservationReplay:
        """`aivedio replay observations`: the previewed observations reduced again now (a dry run only lists
        them), with one audit row."""
        op.require_reason()
        result = self.preview(task_id, limit)
        result.dry_run = op.dry_run
        if not op.dry_run:
            result.done = self.rereduce(result.rows)
        with write_tx(self._engine) as conn:
            ids = [i["id"] for i in result.items]
            record(conn, op, affected_ids=ids, outcome=result.outcome, now=self._clock.now())
        return result

    def replay_ids(self, op: Operation, ids: Sequence[str]) -> ObservationReplay:
        """The TUI's replay of chosen rows: only those of `ids` still unapplied are reduced again (one applied
        meanwhile is skipped), with one audit row."""
        op.require_reason()
        wanted = set(ids)
        result = self.preview(None, 10_000)
        chosen = [r for r in result.rows if str(r.provider_event_id) in wanted]
        result = ObservationReplay(op.dry_run, len(chosen), [_item(r) for r in chosen], rows=chosen)
        if not op.dry_run:
            result.done = self.rereduce(chosen)
        with write_tx(self._engine) as conn:
            record(
                conn, op, affected_ids=[i["id"] for i in result.items], outcome=result.outcome, now=self._clock.now()
            )
        return result

    def unapplied(
        self, cutoff: datetime, task_id: uuid.UUID | None = None, limit: int = BATCH, since: datetime | None = None
    ) -> list[UnappliedObservation]:
        """Stored observations never classified by the reducer, received before `cutoff`, oldest first."""
        with self._engine.connect() as conn:
            return stalled.unapplied_rows(conn, cutoff, task_id, since, limit)

    def rereduce(self, rows: Sequence[UnappliedObservation]) -> list[Rereduced]:
        """Reduce each stored observation again, each in its own transaction (the reducer dedupes by the
        observation's key, so one that a late message applies meanwhile is a duplicate here)."""
        done = []
        for row in rows:
            try:
                outcome = self.rereduce_one(row.observation)
            except Exception as exc:  # one bad row must not stop the others; it stays listed for the next pass
                log.warning("re-reduce of provider event %s failed", row.provider_event_id, exc_info=True)
                outcome = f"failed: {type(exc).__name__}"
            done.append(Rereduced(str(row.provider_event_id), str(row.task_id), outcome))
        return done

    def rereduce_one(self, observation: dict[str, Any]) -> str:
        after = AfterCommit(self._engine, self._slots)
        urgent = self._settings.fetch.urgent_within_s
        with write_tx(self._engine) as conn:
            digest = reducer.reduce(conn, dict(observation), self._clock.now(), urgent, after)
            failpoint("sweeper.rereduce.before_commit")
        failpoint("sweeper.rereduce.after_commit")
        after.run()
        return digest

    def rematch_bound_orphans(self) -> int:
        with self._engine.connect() as conn:
            rows = stalled.bound_orphan_rows(conn, BATCH)
        jobs = {(r.provider, r.provider_job_id): r.attempt_id for r in rows}
        rematched = 0
        for (provider, job_id), attempt_id in jobs.items():
            with write_tx(self._engine) as conn:
                rematched += observations.rematch(conn, provider, job_id, attempt_id, self._clock.now())
        return rematched

    # --- attempts an ended task left open -------------------------------------------------------------------

    def close_left_attempts(self, cutoff: datetime) -> int:
        states = (
            AttemptStatus.NEW.value,
            AttemptStatus.ACKED.value,
            AttemptStatus.RUNNING.value,
        )  # SENDING: `_stuck_sending` first
        with self._engine.connect() as conn:
            ids = stalled.open_attempt_ids_of_ended_tasks(conn, cutoff, states, BATCH)
        return sum(self._close(attempt_id) for attempt_id in ids)

    def _close(self, attempt_id: uuid.UUID) -> int:
        now = self._clock.now()
        after = AfterCommit(self._engine, self._slots)
        with write_tx(self._engine) as conn:
            task, attempt = lock_attempt(conn, attempt_id)
            if task is None or attempt is None or not TaskStatus(task.status).is_terminal:
                return 0
            if attempt.submit_state == AttemptStatus.NEW.value:
                # never sent, and its submit message is gone (the submit actor closes it this way when the
                # message arrives after the task ended)
                event, error = AttemptEvent.REJECTED_BEFORE_ACCEPT, ErrorOutcome.NOT_SENT_TASK_MOVED
                move_attempt(conn, attempt, event, now, tenant_id=task.tenant_id, after=after, error=error)
            elif attempt.submit_state in (AttemptStatus.ACKED.value, AttemptStatus.RUNNING.value):
                succeeded = task.status == TaskStatus.SUCCEEDED.value and int(attempt.attempt_no) == int(
                    task.current_attempt_no or 0
                )
                event = AttemptEvent.PROVIDER_SUCCEEDED if succeeded else AttemptEvent.TASK_ENDED
                move_attempt(conn, attempt, event, now, tenant_id=task.tenant_id, after=after, completed_at=now)
                if not succeeded and self._cancel_job is not None and attempt.provider_job_id:
                    cancel = self._cancel_job
                    after.call(lambda: cancel(attempt))  # best effort: stop paying for a job nobody follows
            else:
                return 0
        after.run()
        log.info("closed attempt %s of %s task %s (%s)", attempt_id, task.status, task.id, event.value)
        return 1


def _item(row: UnappliedObservation) -> dict[str, Any]:
    obs = row.observation or {}
    return {
        "id": str(row.provider_event_id),
        "task_id": str(row.task_id),
        "provider": row.provider,
        "job_id": row.provider_job_id,
        "status": obs.get("status"),
        "received_at": row.received_at.isoformat(),
    }
