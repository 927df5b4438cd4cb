"""The claim-time side of the System B queues, inside the workflow service's claim and
report transactions.

- `Admission.admit`: may this due step start now? Its project's image / composition count (read under the
  project row's lock, so two claimers of one project count one after the other) and its queue's running count
  (read under the queue's advisory lock for capped queues) against `StepLimits`; then, for a vendor step, a
  token of its provider's step rate (the engine's token-bucket store: in process, or Redis shared by every
  worker). A step refused a token gets a wake-up of its queue for when the bucket will hold one. Priority is
  the claim order itself: the best priority (1 premium … 5 cleanup), then the longest due.
- `wake_after`: a step stopped running, so steps it held back may start: one wake-up per queue for its project's
  due steps (project limits, the project lock) and one for its own queue when that queue is capped.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from aivedio_engine.db import step_queues
from aivedio_engine.db import workflows as repo
from aivedio_engine.db.handles import Connection
from aivedio_engine.domain.step_limits import Running, StepLimits, project_cap, refusal, vendor_rate
from aivedio_engine.domain.workflow import STEP_SPECS, Scope, StepType

if TYPE_CHECKING:
    from aivedio_engine.ratelimit import BucketStore

log = logging.getLogger(__name__)


class Admission:
    """The limits of one claim transaction (its own reads see the steps it started already)."""

    def __init__(
        self, conn: Connection, limits: StepLimits, queues: list[str], now: datetime, buckets: BucketStore | None
    ) -> None:
        self._conn = conn
        self._limits = limits
        self._now = now
        self._buckets = buckets
        #: queues already given a delayed wake-up by this claim (one is enough: each wake-up claims the best)
        self._rewoken: set[str] = set()
        step_queues.lock_queues(conn, [q for q in queues if q in limits.queue_running])

    def at_limit(self, queues: list[str]) -> list[tuple[list[StepType], list[uuid.UUID]]]:
        """Per project-limited scope among these queues' step types: the projects already at their limit (a
        pre-filter for the claim's candidates, so a project with many waiting steps does not hide the others;
        `admit` still decides, under the lock)."""
        by_scope: dict[Scope, list[StepType]] = {}
        for t, spec in STEP_SPECS.items():
            if spec.queue.value in queues and project_cap(t, self._limits) is not None:
                by_scope.setdefault(spec.scope, []).append(t)
        if not by_scope:
            return []
        running: Counter[tuple[Scope, uuid.UUID]] = Counter()
        for project_id, t, n in step_queues.running_by_project(self._conn, [t for ts in by_scope.values() for t in ts]):
            running[(STEP_SPECS[t].scope, project_id)] += n
        skip = []
        for scope, types in by_scope.items():
            cap = project_cap(types[0], self._limits)
            full = [pid for (sc, pid), n in running.items() if sc is scope and cap is not None and n >= cap]
            skip.append((types, full))
        return skip

    def admit(self, s: repo.Step) -> bool:
        conn, scope = self._conn, STEP_SPECS[s.task_type].scope
        same_project = same_queue = 0
        if project_cap(s.task_type, self._limits) is not None:
            repo.project(conn, s.project_id, lock=True)  # claimers of one project count one after the other
            types = step_queues.running_types_of_project(conn, s.project_id)
            same_project = sum(1 for t in types if STEP_SPECS[t].scope is scope)
        if s.queue in self._limits.queue_running:
            same_queue = step_queues.running_in_queue(conn, s.queue)
        why = refusal(s.task_type, s.queue, Running(same_project, same_queue), self._limits)
        if why is not None:
            log.debug("step %s of project %s waits: %s", s.step_key, s.project_id, why)
            return False
        return self._rate_allows(s)

    def _rate_allows(self, s: repo.Step) -> bool:
        bucket = vendor_rate(s.task_type, self._limits)
        if bucket is None or self._buckets is None:
            return True
        verdict = self._buckets.take(bucket[0], bucket[1], self._now.timestamp())
        if verdict.allowed:
            return True
        if s.queue not in self._rewoken:  # nothing else would wake it: no step of its stops because of this
            self._rewoken.add(s.queue)
            step_queues.announce(self._conn, s, self._now, at=self._now + timedelta(seconds=verdict.retry_after_s))
        log.debug("step %s waits %.2f s for its provider's step rate", s.step_key, verdict.retry_after_s)
        return False


def wake_after(conn: Connection, s: repo.Step, limits: StepLimits, now: datetime) -> None:
    """`s` stopped running: wake the queues of what it may have held back (see the module docstring)."""
    woken: set[str] = set()
    for due in step_queues.due_of_project(conn, s.project_id, now):
        if due.queue not in woken:
            woken.add(due.queue)
            step_queues.announce(conn, due, now)
    if s.queue in limits.queue_running and s.queue not in woken:
        first = step_queues.first_due(conn, s.queue, now)
        if first is not None:
            step_queues.announce(conn, first, now)


def redrive(conn: Connection, now: datetime, before: datetime) -> list[str]:
    """The sweeper's safety net: one fresh wake-up for each queue whose oldest due step has waited since before
    `before` (its message was lost, or spent while the step had to wait). Returns those queues."""
    queues = step_queues.queues_due_before(conn, before)
    for q in queues:
        due = step_queues.first_due(conn, q, now)
        if due is not None:
            step_queues.announce(conn, due, now)
    return queues
