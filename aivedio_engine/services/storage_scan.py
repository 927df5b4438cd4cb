"""Orphan objects (`orphan_object_count`): bytes in our own object store that no row references
— a fetch that crashed between its PUT and its asset commit, a media run that uploaded derivatives and then
failed, a staging upload whose cleanup failed. Nobody will ever serve them, but they are paid for.

An object is an orphan when all of these hold:
- no `assets.object_key` of a live (not DELETED) asset in this store's bucket names it, and it is not a file of
  a recorded live derivative (an HLS asset row names its playlist; the init and media segments beside it belong
  to it too — `keys.derivative_owner`);
- for a key in a tenant's upload quarantine (`keys.is_quarantined`): no upload session still owns it — open (a
  client may still be uploading), or closed without its quarantined object recorded as cleared (a rejected upload
  in its grace, services/quarantine.py). Asset rows do not count for these keys;
- it is older than the grace (`sweeper.storage_scan_grace_s`): a fetch or media run writes its object first
  and commits its row afterwards, so a young unreferenced object is most likely a commit still on its way.

Only `keys.TENANTS_PREFIX` is listed: every key the engine writes lives there, so a bucket shared with other
data (or an fs root pointed at a directory holding other files) does not turn foreign objects into our orphans.

The listing is streamed and the keys are looked up in batches (one short read per `batch` old objects), so
memory follows the batch size, not the bucket or the tables. No transaction is open while the store is
listed; the outcome is recorded afterwards in `storage_scans` in one short transaction, failures included
(error set, counts 0), because /metrics must read a recorded scan rather than list a bucket at scrape time.

Deleting orphans is deliberately not done here: a false positive would destroy a customer's bytes, and the
count is what capacity planning needs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from aivedio_engine.clock import new_id
from aivedio_engine.db import lifecycle, storage_queries
from aivedio_engine.db.session import write_tx
from aivedio_engine.storage.base import ListedObject
from aivedio_engine.storage.keys import TENANTS_PREFIX, derivative_owner, is_quarantined

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Connection, Engine
    from aivedio_engine.storage.base import ObjectStore

log = logging.getLogger("aivedio.storage_scan")
#: keys looked up per query (`IN (...)` of this many parameters, well inside SQLite's and PostgreSQL's limits)
BATCH = 1000
#: orphan keys kept in the storage_scans row
SAMPLE_SIZE = 100
#: orphans returned to the caller; the counts stay exact beyond it
KEEP_ORPHANS = 10_000
MAX_ERROR = 500


@dataclass
class ScanResult:
    id: uuid.UUID
    started_at: datetime
    finished_at: datetime
    grace_s: float
    objects: int = 0
    bytes: int = 0
    orphans: int = 0
    orphan_bytes: int = 0
    #: the first KEEP_ORPHANS orphans in listing order
    orphan_objects: list[ListedObject] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def truncated(self) -> bool:
        return self.orphans > len(self.orphan_objects)


class StorageScanner:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        store: ObjectStore,
        settings: Settings,
        *,
        batch: int = BATCH,
        keep: int = KEEP_ORPHANS,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._store = store
        self._settings = settings
        self._batch = batch
        self._keep = keep
        self._not_before: datetime | None = None

    def scan(self, grace_s: float | None = None) -> ScanResult:
        """List the whole store, count its orphans, record one storage_scans row and return the outcome.

        Listing or lookup failures are recorded (and returned) as an error with zero counts; only a failure to
        record the row itself raises."""
        grace = float(self._settings.sweeper.storage_scan_grace_s if grace_s is None else grace_s)
        started = self._clock.now()
        result = ScanResult(new_id(), started, started, grace)
        try:
            self._count(result, started - timedelta(seconds=grace))
        except Exception as exc:  # noqa: BLE001 - whatever broke the listing, the row must say so
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            result = ScanResult(result.id, started, started, grace, error=f"{type(exc).__name__}: {text}"[:MAX_ERROR])
            log.warning("storage scan failed: %s", result.error)
        result.finished_at = self._clock.now()
        with write_tx(self._engine) as conn:
            storage_queries.record_scan(
                conn,
                scan_id=result.id,
                started_at=result.started_at,
                finished_at=result.finished_at,
                objects=result.objects,
                bytes_=result.bytes,
                orphans=result.orphans,
                orphan_bytes=result.orphan_bytes,
                sample=[o.key for o in result.orphan_objects[:SAMPLE_SIZE]] if result.ok else None,
                error=result.error,
            )
        if result.ok:
            log.info(
                "storage scan: %d objects (%d bytes), %d orphans (%d bytes)",
                result.objects,
                result.bytes,
                result.orphans,
                result.orphan_bytes,
            )
        return result

    def scan_if_due(self) -> ScanResult | None:
        """The sweeper's hook: scan when the newest storage_scans row (any process's, failed ones included, so a
        broken store is not listed on every sweep) is `sweeper.storage_scan_interval_s` old."""
        interval = timedelta(seconds=self._settings.sweeper.storage_scan_interval_s)
        now = self._clock.now()
        if self._not_before is not None and now < self._not_before:
            return None  # known not due: no query on every sweep
        with self._engine.connect() as conn:
            last = storage_queries.latest_finished_at(conn)
        if last is not None and now - last < interval:
            self._not_before = last + interval
            return None
        # one attempt per interval from this process, even if recording fails (the scan age metric shows it)
        self._not_before = now + interval
        return self.scan()

    def _count(self, result: ScanResult, cutoff: datetime) -> None:
        batch: list[ListedObject] = []
        for obj in self._store.iter_objects(TENANTS_PREFIX):
            result.objects += 1
            result.bytes += obj.size_bytes
            if obj.modified_at >= cutoff:
                continue  # young: its row may not be committed yet (and no lookup is needed)
            batch.append(obj)
            if len(batch) >= self._batch:
                self._settle(batch, result)
                batch = []
        if batch:
            self._settle(batch, result)

    def _settle(self, batch: list[ListedObject], result: ScanResult) -> None:
        with self._engine.connect() as conn:  # a short read, opened after the page was listed
            referenced = self.referenced(conn, [o.key for o in batch])
        for obj in batch:
            if obj.key not in referenced:
                result.orphans += 1
                result.orphan_bytes += obj.size_bytes
                if len(result.orphan_objects) < self._keep:
                    result.orphan_objects.append(obj)

    def referenced(self, conn: Connection, keys: Iterable[str]) -> set[str]:
        """Which of `keys` some row references (see the module docstring)."""
        keys = list(keys)
        quarantined = [k for k in keys if is_quarantined(k)]
        # a quarantined key belongs to its upload session until the session records it cleared; the asset row of
        # a rejected upload names it too, but only as a record, so it does not keep the bytes alive
        found = lifecycle.quarantine_owned(conn, quarantined)
        keys = [k for k in keys if not is_quarantined(k)]
        found.update(storage_queries.live_keys(conn, self._store.bucket, keys))
        owners = {k: owner for k in keys if k not in found and (owner := derivative_owner(k)) is not None}
        if owners:
            recorded = storage_queries.live_derivatives(
                conn, self._store.bucket, {parent for parent, _, _ in owners.values()}
            )
            found.update(k for k, owner in owners.items() if owner in recorded)
        return found
