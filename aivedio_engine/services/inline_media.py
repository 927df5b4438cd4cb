"""The media step run by the worker that has just fetched its output, without a queue hop (issue 12, "fewer hops").

`OutputFetchService` hands over the media requests its transaction would otherwise have written to the outbox
(`transition.Change.media_inline`), once that transaction has committed. Each request runs through
`MediaService.handle` under an envelope of its own (`follow_on.inline_envelope`), so the media step keeps its own
inbox row, transaction, state change and retries (a retry is a delayed outbox row, as before): only the hop is gone.

Recovery is the queued path's: a process that dies before the media step commits leaves the task
POST_PROCESSING with no pending request, which the sweeper re-drives after `sweeper.media_stuck_s` (and an
embedded engine at its next start). A media run that raises (a database error) committed nothing, so its request
and the ones after it are queued here instead.
"""

from __future__ import annotations

import logging
import uuid

from aivedio_engine.clock import Clock
from aivedio_engine.db import tasks
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.services import follow_on
from aivedio_engine.services.follow_on import MediaProcessRequested, inline_envelope
from aivedio_engine.services.media import MediaService

log = logging.getLogger("aivedio.inline_media")


class InlineMedia:
    def __init__(self, engine: Engine, clock: Clock, media: MediaService, max_bytes: int) -> None:
        self._engine = engine
        self._clock = clock
        self._media = media
        #: outputs totalling more than this are queued (a long encode would hold the fetch worker)
        self.max_bytes = max_bytes

    def takes(self, total_bytes: int) -> bool:
        return 0 < self.max_bytes and total_bytes <= self.max_bytes

    def run(self, task: Task, version: int, requests: tuple[MediaProcessRequested, ...], cause: uuid.UUID) -> str:
        """Run each request's media step now, in order; `version` is the task's after the fetch committed."""
        results = []
        for i, request in enumerate(requests):
            env = inline_envelope(task, request, version=version, now=self._clock.now(), causation_id=cause)
            try:
                results.append(self._media.handle(env))
            except Exception:
                # nothing of this media run committed: queue it and the rest, as if they had never been inline
                log.warning("inline media step failed for task %s; queueing it", task.id, exc_info=True)
                self._queue(task.id, requests[i:])
                results.append("queued after an inline failure")
                break
        return "media: " + "; ".join(results)

    def _queue(self, task_id: uuid.UUID, requests: tuple[MediaProcessRequested, ...]) -> None:
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            task = tasks.get(conn, task_id, lock=True)
            if task.status == TaskStatus.POST_PROCESSING.value:
                for request in requests:
                    follow_on.emit(conn, task, request, version=int(task.version), now=now)
