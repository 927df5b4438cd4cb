"""The media step run by the worker that has just fetched its output, without a queue hop (issue 12, "fewer hops").

`OutputFetchService` hands over the media requests its transaction would otherwise have written to the outbox
(`transition.Change.media_inline`), once that transaction has committed. Each request runs through
`MediaService.handle` under an envelope of its own (`follow_on.inline_envelope`), so the media step keeps its own
inbox row, transaction, state change and retries (a retry is a delayed outbox row, as before): only the hop is gone.

The step's event id is derived from the fetch message's (`step_id`), so it names the same step on every delivery
of that message. Recovery follows from it: a process or a database lost between the fetch's commit and the media
step's leaves the task POST_PROCESSING with nothing queued, and the broker redelivers the fetch message (the actor
raised, or its worker died holding it); that delivery finds the fetch done and runs the media steps whose inbox
rows are missing (`left_behind`) at once. A run of the same step still under way elsewhere then commits once: the
second to reach the inbox row finds it taken. A message lost with its broker (embedded mode) is the sweeper's, after
`sweeper.media_stuck_s` (and an embedded engine's at its next start). A media run that raises (a database error)
committed nothing, so its request and the ones after it are queued here instead.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from aivedio_engine.clock import Clock
from aivedio_engine.db import inbox, outbox, tasks
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.services import follow_on
from aivedio_engine.services import media as media_step
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

    def run(self, task: Task, version: int, requests: Sequence[MediaProcessRequested], cause: uuid.UUID) -> str:
        """Run each request's media step now, in order; `version` is the task's after the fetch committed,
        `cause` the fetch message's event id."""
        results = []
        for i, request in enumerate(requests):
            env = inline_envelope(
                task,
                request,
                event_id=step_id(cause, request),
                version=version,
                now=self._clock.now(),
                causation_id=cause,
            )
            try:
                results.append(self._media.handle(env))
            except Exception:
                # nothing of this media run committed: queue it and the rest, as if they had never been inline
                log.warning("inline media step failed for task %s; queueing it", task.id, exc_info=True)
                queue(self._engine, task.id, requests[i:], self._clock.now())
                results.append("queued after an inline failure")
                break
        return "media: " + "; ".join(results)


def step_id(cause: uuid.UUID, request: MediaProcessRequested) -> uuid.UUID:
    """The event id of the media step the fetch message `cause` goes on to for `request`'s output."""
    return uuid.uuid5(cause, f"{request.event_type.value}:{request.asset_id}")


def left_behind(
    conn: Connection, task_id: uuid.UUID, cause: uuid.UUID, asset_ids: Sequence[uuid.UUID]
) -> list[MediaProcessRequested]:
    """The inline media steps of the fetch message `cause` (one per output in `asset_ids`) that never committed.
    None while a media request of the task is queued: that request (a retry, a queueing after an inline failure,
    the sweeper's re-drive) already carries the step on."""
    if outbox.has_pending(conn, task_id, EventType.MEDIA_PROCESS_REQUESTED):
        return []
    requests = [MediaProcessRequested(task_id, asset_id) for asset_id in asset_ids]
    done = inbox.consumed(conn, media_step.CONSUMER_GROUP, [step_id(cause, r) for r in requests])
    return [r for r in requests if step_id(cause, r) not in done]


def queue(engine: Engine, task_id: uuid.UUID, requests: Sequence[MediaProcessRequested], now: datetime) -> None:
    """Write the media requests to the outbox, for the media workers, while the task still waits for them."""
    with write_tx(engine) as conn:
        task = tasks.get(conn, task_id, lock=True)
        if task.status == TaskStatus.POST_PROCESSING.value:
            for request in requests:
                follow_on.emit(conn, task, request, version=int(task.version), now=now)
