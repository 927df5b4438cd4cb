"""Garbage collection of orphan objects (/: "cleaned by a garbage collector after a safety
window"). An orphan is what `storage_scan` counts — no row references it, no open upload stages it — and here it
must also be older than the GC's own safety window (`sweeper.storage_gc_grace_s`, a day by default: far longer
than any fetch or media run takes between its PUT and its commit).

Deleting a customer's bytes by mistake cannot be undone, so:
- every key is looked up again right before its delete (a row committed since the listing keeps it);
- a dry run lists what would go and deletes nothing; both are audited (`audit_log`, with the reason and the keys);
- the sweeper collects one page per run (`sweeper.storage_gc_page` listed objects), resuming after the last key it
  saw, so a bucket of millions of objects never holds up a sweep; it starts over when the listing ends.
No transaction is open while the store is listed or an object deleted: the lookups are short reads, the audit row
one short write afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from aivedio_engine.db.session import write_tx
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.storage.base import ListedObject
from aivedio_engine.storage.keys import TENANTS_PREFIX

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Engine
    from aivedio_engine.services.storage_scan import StorageScanner
    from aivedio_engine.storage.base import ObjectStore

log = logging.getLogger("aivedio.storage_gc")
#: keys named in one audit row; the counts stay exact beyond it
AUDIT_KEYS = 1000
#: listed objects looked up per short read
LOOKUP_BATCH = 500
SWEEPER_ACTOR = "sweeper"


@dataclass
class GcResult:
    dry_run: bool
    grace_s: float
    listed: int = 0
    #: orphans older than the grace (deleted, or that would be in a dry run)
    orphans: list[ListedObject] = field(default_factory=list)
    deleted: int = 0
    deleted_bytes: int = 0
    #: found referenced on the second look, right before the delete: kept
    kept_on_recheck: int = 0
    failed: list[str] = field(default_factory=list)
    #: the listing ended (False: stopped at the limit; `last_key` is where the next page starts)
    complete: bool = True
    last_key: str | None = None

    @property
    def orphan_bytes(self) -> int:
        return sum(o.size_bytes for o in self.orphans)


class StorageCollector:
    def __init__(
        self, engine: Engine, clock: Clock, store: ObjectStore, settings: Settings, scanner: StorageScanner
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._store = store
        self._settings = settings
        self._scanner = scanner
        self._cursor: str | None = None
        self._not_before: datetime | None = None

    def collect(
        self,
        op: Operation,
        *,
        grace_s: float | None = None,
        limit: int | None = None,
        start_after: str | None = None,
        max_listed: int | None = None,
    ) -> GcResult:
        """Find the orphans older than the grace (at most `limit` of them, listing at most `max_listed` objects)
        and, unless `op.dry_run`, delete them; one audit row either way."""
        if not op.dry_run:
            op.require_reason()
        grace = float(self._settings.sweeper.storage_gc_grace_s if grace_s is None else grace_s)
        result = GcResult(op.dry_run, grace)
        cutoff = self._clock.now() - timedelta(seconds=grace)
        batch: list[ListedObject] = []
        listing = self._store.iter_objects(TENANTS_PREFIX, start_after=start_after)
        for obj in listing:
            result.listed += 1
            result.last_key = obj.key
            if obj.modified_at < cutoff:
                batch.append(obj)
            if len(batch) >= LOOKUP_BATCH:
                self._settle(batch, result, limit)
                batch = []
            if (limit is not None and len(result.orphans) >= limit) or (
                max_listed is not None and result.listed >= max_listed
            ):
                result.complete = False
                break
        if batch:
            self._settle(batch, result, limit)
        if not op.dry_run:
            self._delete(result)
        self._audit(op, result)
        return result

    def collect_page_if_due(self) -> GcResult | None:
        """The sweeper's hook: one page of the listing every `sweeper.storage_gc_interval_s`, from where the
        previous page stopped; None when disabled or not due."""
        s = self._settings.sweeper
        if not s.storage_gc_enabled:
            return None
        now = self._clock.now()
        if self._not_before is not None and now < self._not_before:
            return None
        self._not_before = now + timedelta(seconds=s.storage_gc_interval_s)
        op = Operation(
            command="storage gc",
            reason=f"scheduled: orphan objects older than {s.storage_gc_grace_s:g} s",
            actor=SWEEPER_ACTOR,
            args={"page": s.storage_gc_page, "start_after": self._cursor},
        )
        result = self.collect(op, start_after=self._cursor, max_listed=s.storage_gc_page)
        self._cursor = None if result.complete else result.last_key
        return result

    def _settle(self, batch: list[ListedObject], result: GcResult, limit: int | None) -> None:
        with self._engine.connect() as conn:
            referenced = self._scanner.referenced(conn, [o.key for o in batch])
        for obj in batch:
            if obj.key not in referenced and (limit is None or len(result.orphans) < limit):
                result.orphans.append(obj)

    def _delete(self, result: GcResult) -> None:
        for start in range(0, len(result.orphans), LOOKUP_BATCH):
            chunk = result.orphans[start : start + LOOKUP_BATCH]
            # the second look: a fetch or upload that committed a row for one of them since the listing keeps it
            with self._engine.connect() as conn:
                now_referenced = self._scanner.referenced(conn, [o.key for o in chunk])
            for obj in chunk:
                if obj.key in now_referenced:
                    result.kept_on_recheck += 1
                    continue
                try:
                    self._store.delete(obj.key)
                except Exception as exc:  # noqa: BLE001 - one object the store refused must not stop the rest
                    log.warning("storage gc: could not delete %s: %s", obj.key, exc)
                    result.failed.append(obj.key)
                    continue
                result.deleted += 1
                result.deleted_bytes += obj.size_bytes

    def _audit(self, op: Operation, result: GcResult) -> None:
        if op.actor == SWEEPER_ACTOR and not result.orphans:
            return  # a scheduled page that found nothing is not an action worth a row
        args = {
            **op.args,
            "grace_s": result.grace_s,
            "listed": result.listed,
            "orphans": len(result.orphans),
            "orphan_bytes": result.orphan_bytes,
            "deleted": result.deleted,
            "deleted_bytes": result.deleted_bytes,
            "kept_on_recheck": result.kept_on_recheck,
            "failed": len(result.failed),
        }
        audited = Operation(command=op.command, reason=op.reason, actor=op.actor, dry_run=op.dry_run, args=args)
        if result.dry_run:
            outcome = "previewed"
        else:
            outcome = "partial" if result.failed else "deleted"
        with write_tx(self._engine) as conn:
            keys = [o.key for o in result.orphans[:AUDIT_KEYS]]
            record(conn, audited, affected_ids=keys, outcome=outcome, now=self._clock.now())
        if not result.dry_run and result.deleted:
            log.info("storage gc: deleted %d orphan objects (%d bytes)", result.deleted, result.deleted_bytes)
