"""The upload quarantine: "after upload, first into a quarantine area; only after validation
into the consumable area".

A client writes only to `tenants/{tid}/quarantine/{session}` (`keys.upload_staging_key`), for which no signed URL
is ever made (`storage.base.readable_key`), so no client, provider or media run reads unvalidated bytes.
`AssetService.complete()` validates a local copy of it and publishes that copy under the asset's consumable key.
What happens to the quarantined object then:
- promoted (READY): deleted at once;
- rejected: kept for `sweeper.rejected_upload_grace_s` (an operator may want to see what was refused), then
  deleted by the sweeper;
- abandoned (the upload URL expired unused) or aborted (a tenant purge): deleted when the session is closed.
Each deletion is recorded on the session (`quarantine_cleared_at`), after the delete: a crash in between leaves
the session due, and the sweeper (`QuarantineSweeper.sweep`) deletes it again (a delete of a missing key is not an
error). Until then the session owns the key, which is how the orphan scan tells it from garbage.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from aivedio_engine.db import lifecycle
from aivedio_engine.db.session import write_tx

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Engine
    from aivedio_engine.storage.base import ObjectStore

log = logging.getLogger("aivedio.quarantine")


def clear_quarantine(engine: Engine, store: ObjectStore, session_id: uuid.UUID, key: str, now: datetime) -> bool:
    """Delete a session's quarantined object, then record that it is gone. False (nothing recorded) when the
    store refused: the sweeper tries again."""
    try:
        store.delete(key)
    except Exception:
        log.warning("could not delete quarantined upload %s; the sweeper will retry", key, exc_info=True)
        return False
    with write_tx(engine) as conn:
        lifecycle.mark_quarantine_cleared(conn, session_id, now)
    return True


class QuarantineSweeper:
    def __init__(self, engine: Engine, clock: Clock, store: ObjectStore, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._store = store
        self._settings = settings

    def sweep(self, batch: int = 500) -> int:
        """Delete the quarantined objects of closed sessions that are due (see the module docstring); returns
        how many were cleared."""
        now = self._clock.now()
        grace = timedelta(seconds=self._settings.sweeper.rejected_upload_grace_s)
        with self._engine.connect() as conn:
            due = lifecycle.quarantine_due(conn, now, now - grace, batch)
        return sum(clear_quarantine(self._engine, self._store, row.id, row.object_key, now) for row in due)
