"""Bringing a provider's output home: the `fetch.requested` consumer (steps 30–32).

Network first, database second: the download streams straight into the object store (hashing as it goes) with
no transaction open; then one short transaction records the RAW_OUTPUT asset, moves the task
OUTPUT_FETCHING → POST_PROCESSING and asks for media processing. Duplicate deliveries are harmless: the inbox
row and the task's version make the second commit a no-op, and the store key is deterministic.

An object already under the key (a crash after the upload, before the commit) is never overwritten: the new
download is spooled to disk and compared; equal bytes reuse the object, different bytes are stored beside it
and raise an alert. A 403/404/410 first asks the provider for a fresh URL; other failures retry
within the `output_fetch` budget through a delayed outbox row, then fail the task (the provider delivered, so
its cost is settled) with an alert.

Fewer hops: when the outputs are small (`media.inline_after_fetch_max_bytes`) and this worker also runs the media
step, the fetch's transaction writes no `media.process.requested` row and the same actor run goes straight on to
the media step after the commit, under an envelope of its own (its own inbox row, transaction and state change):
two recorded steps, one broker message. A process or a database lost between the two leaves the task
POST_PROCESSING with no pending request: the fetch message's redelivery, finding its own step done, runs the media
steps that never committed at once (`services.inline_media`); a message lost with its broker is the sweeper's to
re-drive. A media run that raises queues its request after all.
"""

from __future__ import annotations

import random
import tempfile
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, attempts, inbox, tasks
from aivedio_engine.db import outputs as output_rows
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.domain.events import Route, fetch_route
from aivedio_engine.domain.retry import ErrorClass, Step, Verdict
from aivedio_engine.domain.status import AlertSeverity, EventSource, TaskStatus
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.fetch.fetcher import Fetcher, FetchError
from aivedio_engine.fetch.policy import FetchPolicy
from aivedio_engine.providers.base import Observation
from aivedio_engine.providers.registry import ProviderRegistry
from aivedio_engine.services import follow_on, inline_media, store_outage
from aivedio_engine.services.consume import Envelope, consume_once
from aivedio_engine.services.follow_on import FetchRequested, MediaProcessRequested
from aivedio_engine.services.transition import Change, ReviewOrder, decide_and_execute
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import HashingCounter, ObjectStore, iter_file, sha256_of
from aivedio_engine.testing.failpoints import failpoint

CONSUMER_GROUP = "output-fetch"
RAW_CONTENT_TYPE = "video/mp4"
#: the fetch's state event records, under its payload's "media", that the media step was to follow in the same run
MEDIA_INLINE = "inline"
#: an output URL answering these has expired or was revoked: ask the provider for a fresh one first
_EXPIRED = {403, 404, 410}
#: refusals no retry can fix: the URL or the body breaks our policy
_POLICY = {"blocked_scheme", "blocked_host", "blocked_address", "too_large", "bad_encoding", "too_many_redirects"}


class FetchFailure(Exception):
    def __init__(self, error_class: ErrorClass | None, code: str, message: str, *, url_refreshed: bool) -> None:
        super().__init__(message)
        #: None: a policy refusal, never retried
        self.error_class = error_class
        self.code = code
        self.url_refreshed = url_refreshed


@dataclass(frozen=True, slots=True)
class Stored:
    index: int
    key: str
    size: int
    sha256: str


class OutputFetchService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        providers: ProviderRegistry,
        store: ObjectStore,
        fetcher: Fetcher,
        rng: random.Random | None = None,
        media: inline_media.InlineMedia | None = None,
    ) -> None:
        """`media`: the media step, when this worker may run it itself after a small fetch (None: always queue)."""
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._providers = providers
        self._store = store
        self._fetcher = fetcher
        self._rng = rng or random.Random()
        self._media = media

    # --- the consumer ------------------------------------------------------------------------------------

    def handle(self, envelope: Envelope) -> str:
        request = FetchRequested.parse(envelope.payload)
        task_id, attempt_id = request.task_id, request.attempt_id
        with self._engine.connect() as conn:
            task = tasks.read(conn, task_id)
            attempt = attempts.read(conn, attempt_id)
            done = _raw_assets(conn, task_id, attempt_id)
        if task is None or attempt is None:
            return "unknown task"
        if task.status == TaskStatus.POST_PROCESSING.value:
            return self._media_left_behind(envelope, task, attempt_id, done)
        if task.status != TaskStatus.OUTPUT_FETCHING.value:
            return f"skipped: task is {task.status}"
        outputs = sorted(request.outputs, key=lambda o: o.get("index", 0))
        # each try may ask for fresh URLs once (the last fresh ones may have expired too); that one answer then
        # serves every output of the try, by index: the other outputs' observed URLs expired just the same
        fresh: dict[int, dict[str, Any]] = {}
        try:
            if not outputs:  # a success without URLs: ask again before giving up
                outputs = self._fresh_outputs(attempt)
                fresh.update((int(o.get("index", 0)), o) for o in outputs)
            stored = []
            for out in outputs:
                index = int(out.get("index", 0))
                if index in done:
                    stored.append(done[index])
                    continue
                stored.append(self._store_output(task, attempt, out, fresh))
        except FetchFailure as failure:
            self._failed(envelope, failure)
            return f"failed: {failure.code}"
        inline = self._media is not None and self._media.takes(sum(s.size for s in stored))
        follow: list[tuple[int, tuple[MediaProcessRequested, ...]]] = []
        consume_once(
            self._engine,
            CONSUMER_GROUP,
            envelope.event_id,
            task_id,
            lambda conn: self._persisted(conn, task_id, attempt_id, stored, inline, follow),
            self._clock.now(),
        )
        if self._media is None or not follow or not follow[0][1]:
            return f"stored {len(stored)}"
        version, requests = follow[0]
        # committed: from here to the media step's own commit, a crash is this message's redelivery's to resume
        failpoint("output_fetch.before_inline_media")
        return f"stored {len(stored)}; " + self._media.run(task, version, requests, envelope.event_id)

    def _media_left_behind(self, envelope: Envelope, task: Task, attempt_id: uuid.UUID, done: dict[int, Stored]) -> str:
        """A redelivery of a fetch that committed and was to go straight on to the media step: whatever of that step
        never committed runs now (here, or queued when this worker does not run media), rather than after the
        sweeper's `media_stuck_s`. The step keeps its inbox rows, so a run still under way elsewhere commits once."""
        skipped = f"skipped: task is {task.status}"
        with self._engine.connect() as conn:
            if not inbox.consumed(conn, CONSUMER_GROUP, [envelope.event_id]):
                return skipped  # another fetch message moved the task on: its own redelivery resumes it
            if output_rows.persisted_payload(conn, task.id).get("media") != MEDIA_INLINE:
                return skipped  # the media step was queued in the fetch's transaction: the queue carries it
            ids = [output_rows.raw_asset_id(conn, task.id, attempt_id, index) for index in sorted(done)]
            requests = inline_media.left_behind(conn, task.id, envelope.event_id, ids)
        if not requests:
            return skipped
        if self._media is not None and self._media.takes(sum(s.size for s in done.values())):
            return self._media.run(task, int(task.version), requests, envelope.event_id)
        inline_media.queue(self._engine, task.id, requests, self._clock.now())
        return f"media: queued {len(requests)}"

    # --- network -----------------------------------------------------------------------------------------

    def _policy(self, provider: str) -> FetchPolicy:
        cfg = self._settings.providers[provider]
        runtime_origin = getattr(self._providers[provider], "base_url", "")
        if not cfg.base_url and runtime_origin:  # local: its loopback server picks a port at start
            cfg = cfg.model_copy(update={"base_url": runtime_origin})
        return FetchPolicy.for_provider(cfg)

    def _store_output(
        self, task: Task, attempt: Attempt, out: dict[str, Any], fresh: dict[int, dict[str, Any]]
    ) -> Stored:
        """`fresh`: this try's fresh URLs by index, empty until asked for; filled here on the first expiry."""
        index = int(out.get("index", 0))
        key = keys.raw_output_key(task.tenant_id, task.id, attempt.id, index)
        url = (fresh.get(index) or out)["url"]
        try:
            return self._download(task, attempt, key, index, url)
        except FetchError as exc:
            moved = exc.reason == "blocked_host" and self._origin_moved(attempt.provider, url)
            if (exc.status not in _EXPIRED and not moved) or fresh:
                raise _failure(exc, bool(fresh)) from None
        fresh.update((int(o.get("index", 0)), o) for o in self._fresh_outputs(attempt))
        if index not in fresh:
            raise FetchFailure(
                ErrorClass.OUTPUT_URL_EXPIRED,
                "no_fresh_url",
                f"provider has no URL for output {index}",
                url_refreshed=True,
            )
        try:
            return self._download(task, attempt, key, index, fresh[index]["url"])
        except FetchError as exc:
            raise _failure(exc, True) from None

    def _origin_moved(self, provider: str, url: str) -> bool:
        """A URL on the host of a provider whose origin is picked at run time (`local`: a loopback port per
        process) but not on its origin now: made by an earlier process, so ask for a fresh one, which the same
        policy then checks. Configured origins never move: their refusals stand without a query."""
        origin = getattr(self._providers[provider], "base_url", "")
        if self._settings.providers[provider].base_url or not origin:
            return False
        return urlsplit(url).hostname == urlsplit(origin).hostname and not url.startswith(origin + "/")

    def _fresh_outputs(self, attempt: Attempt) -> list[dict[str, Any]]:
        job_id = attempt.provider_job_id
        answer = self._providers[attempt.provider].query(job_id) if job_id else None
        if not isinstance(answer, Observation) or not answer.outputs:
            raise FetchFailure(
                ErrorClass.OUTPUT_URL_EXPIRED,
                "refresh_failed",
                f"provider gave no fresh output URL ({type(answer).__name__})",
                url_refreshed=True,
            )
        return [
            {"url": o.url, "index": o.index, "expires_at": o.expires_at and o.expires_at.isoformat()}
            for o in answer.outputs
        ]

    def _download(self, task: Task, attempt: Attempt, key: str, index: int, url: str) -> Stored:
        policy = self._policy(attempt.provider)
        cap = self._settings.fetch.max_bytes
        with self._store_watched(task):
            stored = self._store.head(key)
        if stored is None:
            # the fetcher's own errors reach here through the streaming upload: they are the output's, not the store's
            with self._fetcher.open(url, policy) as download, self._store_watched(task, answers=(FetchError,)):
                obj = self._store.put_stream(key, download.chunks(), RAW_CONTENT_TYPE, cap)
            return Stored(index, key, obj.size, obj.sha256 or "")
        # never overwrite what may already be referenced: spool, compare, keep both when they differ
        with tempfile.TemporaryDirectory(prefix="aivedio-fetch-") as tmp:
            spool = Path(tmp) / "output"
            counter = HashingCounter(cap)
            with self._fetcher.open(url, policy) as download, open(spool, "wb") as f:
                for chunk in counter.feed(download.chunks()):
                    f.write(chunk)
            with self._store_watched(task):
                existing = self._existing_sha(key)
            if existing == counter.hexdigest:
                return Stored(index, key, counter.size, counter.hexdigest)
            other = key.removesuffix(".mp4") + f"-{counter.hexdigest[:16]}.mp4"
            with open(spool, "rb") as f, self._store_watched(task):
                obj = self._store.put_stream(other, iter_file(f), RAW_CONTENT_TYPE, cap)
        with self._engine.begin() as conn:
            alerts.raise_alert(
                conn,
                alerts.Rule.OUTPUT_CHECKSUM_MISMATCH,
                AlertSeverity.WARNING,
                dedup_key=key,
                now=self._clock.now(),
                subject_type="task",
                subject_id=str(task.id),
                message=f"output {index} of job {attempt.provider_job_id} differs from the stored "
                f"object; kept both ({key}, {other})",
            )
        return Stored(index, other, obj.size, obj.sha256 or "")

    def _store_watched(self, task: Task, answers: tuple[type[Exception], ...] = ()) -> AbstractContextManager[None]:
        """Store calls: a failure of the store itself raises the storage_unavailable alert and propagates (the task
        is held in OUTPUT_FETCHING, no try spent)."""
        return store_outage.watched(
            self._engine, self._clock, self._store, step="fetch", task_id=task.id, answers=answers
        )

    def _existing_sha(self, key: str) -> str | None:
        head = self._store.head(key)
        if head is None:
            return None
        if head.sha256:
            return head.sha256
        with self._store.open_read(key) as f:
            return sha256_of(f)[0]

    # --- database ----------------------------------------------------------------------------------------

    def _persisted(
        self,
        conn: Connection,
        task_id: uuid.UUID,
        attempt_id: uuid.UUID,
        stored: list[Stored],
        inline: bool,
        follow: list[tuple[int, tuple[MediaProcessRequested, ...]]],
    ) -> str:
        """`inline`: the media requests go to `follow` (with the new task version) for this run to carry out
        after the commit, instead of to the outbox."""
        now = self._clock.now()
        task = tasks.get(conn, task_id, lock=True)
        if task.status != TaskStatus.OUTPUT_FETCHING.value:
            return f"skipped: task is {task.status}"
        existing = _raw_assets(conn, task_id, attempt_id)
        ids = []
        for item in stored:
            if item.index in existing:
                ids.append(output_rows.raw_asset_id(conn, task_id, attempt_id, item.index))
                continue
            asset_id = new_id()
            output_rows.insert_raw_output(
                conn,
                asset_id=asset_id,
                tenant_id=task.tenant_id,
                task_id=task_id,
                attempt_id=attempt_id,
                index=item.index,
                bucket=self._store.bucket,
                key=item.key,
                size=item.size,
                sha256=item.sha256,
                mime=RAW_CONTENT_TYPE,
                now=now,
            )
            ids.append(asset_id)
        change = Change(
            EventSource.WORKER,
            columns={"output_asset_id": ids[0]},
            payload={
                "outputs": len(ids),
                "bytes": sum(s.size for s in stored),
                **({"media": MEDIA_INLINE} if inline else {}),
            },
            media_assets=tuple(ids),
            media_inline=inline,
        )
        done = decide_and_execute(conn, task, TaskEvent.OUTPUT_PERSISTED, change, now)
        follow[:] = [(done.decision.version, done.media)]
        return f"persisted {len(ids)}"

    def _failed(self, envelope: Envelope, failure: FetchFailure) -> None:
        now = self._clock.now()
        request = FetchRequested.parse(envelope.payload)

        def route_for(again: FetchRequested, at: datetime) -> Route:
            return fetch_route(again.expiries(), at, self._settings.fetch.urgent_within_s)

        def record(conn: Connection) -> str:
            task = tasks.get(conn, request.task_id, lock=True)
            if task.status != TaskStatus.OUTPUT_FETCHING.value:
                return f"skipped: task is {task.status}"
            verdict = follow_on.retry_step(
                conn,
                task,
                request,
                failure.error_class,
                failure.code,
                budget=self._settings.retry.budget(Step.OUTPUT_FETCH),
                now=now,
                rng=self._rng,
                url_refreshed=failure.url_refreshed,
                route_for=route_for,
            )
            if verdict.verdict in (Verdict.RETRY, Verdict.REFRESH_URL):
                return f"retry: {verdict.reason}"
            if verdict.verdict is Verdict.MANUAL:  # `[retry.output_fetch] manual_confirmation_required`
                why = f"output fetch failed ({verdict.reason}): {str(failure)[:300]}"
                held = Change(EventSource.WORKER, payload={"reason": why[:500]}, review=ReviewOrder(None, why))
                decide_and_execute(conn, task, TaskEvent.REVIEW_REQUIRED, held, now)
                return f"held for review: {verdict.reason}"
            change = Change(
                EventSource.WORKER,
                error=failure.error_class or ErrorClass.PROVIDER_REJECTED,
                error_code=failure.code,
                payload={"reason": verdict.reason, "error": str(failure)[:500]},
                ledger_reason="output_fetch_failed",
            )
            decide_and_execute(conn, task, TaskEvent.FINAL_FAILURE, change, now)
            alerts.raise_alert(
                conn,
                alerts.Rule.OUTPUT_FETCH_FAILED,
                AlertSeverity.WARNING,
                dedup_key=str(task.id),
                now=now,
                subject_type="task",
                subject_id=str(task.id),
                message=f"output fetch gave up ({verdict.reason}): {str(failure)[:300]}",
            )
            return f"gave up: {verdict.reason}"

        consume_once(self._engine, CONSUMER_GROUP, envelope.event_id, request.task_id, record, now)


def _failure(exc: FetchError, refreshed: bool) -> FetchFailure:
    if exc.reason in _POLICY:
        return FetchFailure(None, exc.reason, str(exc), url_refreshed=refreshed)
    if exc.status in _EXPIRED:
        return FetchFailure(ErrorClass.OUTPUT_URL_EXPIRED, f"http_{exc.status}", str(exc), url_refreshed=refreshed)
    code = f"http_{exc.status}" if exc.status else exc.reason
    return FetchFailure(ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT, code, str(exc), url_refreshed=refreshed)


def _raw_assets(conn: Connection, task_id: uuid.UUID, attempt_id: uuid.UUID) -> dict[int, Stored]:
    return {
        r.output_index: Stored(r.output_index, r.object_key, r.size_bytes or 0, r.checksum_value or "")
        for r in output_rows.raw_assets(conn, task_id, attempt_id)
    }
