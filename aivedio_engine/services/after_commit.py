"""Work that must wait for a commit: freeing the slot of an attempt that ended, stopping a provider job.

The transition executor (`services/transition.py`) registers it on an `AfterCommit` inside the transaction;
the service that owns the transaction runs it once the commit has returned, and drops it if it rolled back.
Nothing here is needed for correctness: a lost release is rebuilt by the slot reconciler, and a lost cancel
only costs what the sweeper already accounted for.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from aivedio_engine.db import attempts, wakeup
from aivedio_engine.db.attempts import LeaseFacts
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.records import Attempt
from aivedio_engine.domain import admission
from aivedio_engine.domain.status import ATTEMPT_TERMINAL, AttemptStatus
from aivedio_engine.slots.base import Lease, SlotStore

log = logging.getLogger(__name__)


class AfterCommit:
    """Work to run once the caller's transaction has committed; dropped if it rolls back (never `run`)."""

    def __init__(self, engine: Engine, slots: SlotStore | None = None) -> None:
        self._engine = engine
        self._slots = slots
        self._hooks: list[Callable[[], object]] = []
        self._leases: list[Lease] = []

    def release(self, lease: Lease | None) -> None:
        if lease is not None and self._slots is not None:
            self._leases.append(lease)

    def call(self, fn: Callable[[], object]) -> None:
        self._hooks.append(fn)

    def run(self) -> None:
        hooks, self._hooks = self._hooks, []
        leases, self._leases = self._leases, []
        if leases and self._slots is not None:
            slots = self._slots
            hooks.insert(0, lambda: release_leases(self._engine, slots, leases))
        for hook in hooks:
            try:
                hook()
            except Exception:  # the commit stands; a lost release or cancel is recovered later
                log.warning("after-commit hook failed", exc_info=True)


def lease_of(attempt: Attempt | LeaseFacts, tenant_id: uuid.UUID) -> Lease | None:
    """The lease an attempt row holds, from rows already read (no query)."""
    if attempt.fencing_token is None:
        return None
    return Lease.of(
        str(attempt.id), attempt.fencing_token, admission.scope_names(str(tenant_id), attempt.provider, attempt.model)
    )


def finished_lease(
    attempt: Attempt | LeaseFacts, tenant_id: uuid.UUID, state: AttemptStatus | str | None = None
) -> Lease | None:
    """The attempt's lease if it is (now) terminal: the slot to free after the commit."""
    now_in = AttemptStatus(state or attempt.submit_state)
    return lease_of(attempt, tenant_id) if now_in in ATTEMPT_TERMINAL else None


def release_leases(engine: Engine, slots: SlotStore, leases: Sequence[Lease]) -> int:
    """Free finished attempts' slots in one exchange with the store (a batch of reduced events ends many);
    idempotent. Returns how many were still held."""
    released = slots.release_many(leases)
    if released:  # a freed slot may admit a waiting task: wake the dispatcher (once for all of them)
        wakeup.committed(engine, (wakeup.DISPATCH,))
    return released


def release_if_finished(engine: Engine, slots: SlotStore, attempt_id: uuid.UUID) -> bool:
    """Free an attempt's slot once it is terminal, from the rows (any process can); safe to repeat."""
    with engine.connect() as conn:
        row = attempts.lease_facts(conn, attempt_id)
    lease = None if row is None else finished_lease(row, row.tenant_id)
    return lease is not None and release_leases(engine, slots, [lease]) > 0
