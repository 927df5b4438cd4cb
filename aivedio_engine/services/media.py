"""Making a stored output playable: the `media.process.requested` consumer.

The raw output is copied from the store into a per-job temp dir, checked against the checksum recorded when it
was fetched (what is processed is exactly what was stored), probed through the sandboxed ffprobe gate, and
turned into derivatives (`media.derive`) that are uploaded under deterministic keys. Then one short transaction
records the probe facts and every derivative's own status, and decides: every required profile READY → the
moderation hook → SUCCEEDED with the credit settlement and notification in the same transaction (or
MANUAL_REVIEW with a review item); a gate rejection → FAILED_FINAL; a failure that may pass on another run →
retry within the `media` budget, past which a human decides (media failures never regenerate).
A store that cannot be reached is an outage of ours, not a failure of the output: it holds the task in
POST_PROCESSING without spending the budget, and the broker or the sweeper runs the step again;
only a late derivatives-only run (the task already SUCCEEDED on its proxy) spends a try of its delayed schedule.
A job of several outputs (`n`) gets one message per raw output, each processed and retried on its own; the
task moves on (moderation, SUCCEEDED) only in the run that finds every output's required derivatives READY
(runs are serialized by the task row's lock, so exactly one of them sees the last output done).
An interrupted run (the engine stopping, SIGINT/SIGTERM/SIGHUP on a child: `media.sandbox` tells who ended it)
is such a retry, due at once: nothing was wrong with the output or with us, so there is nothing to back off from.
"""

from __future__ import annotations

import random
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import alerts, tasks
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Task
from aivedio_engine.domain.requests import Catalog, InvalidRequest
from aivedio_engine.domain.retry import ErrorClass, ErrorOutcome, Step, Verdict
from aivedio_engine.domain.status import (
    AlertSeverity,
    AssetKind,
    AssetStatus,
    DerivativeProfile,
    EventSource,
    TaskStatus,
)
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.media import derive
from aivedio_engine.media.probe import (
    MediaLimits,
    ProbeError,
    ProbeInterrupted,
    ProbeResult,
    ProbeUnavailable,
    probe_file,
)
from aivedio_engine.services import follow_on, media_partial, store_outage
from aivedio_engine.services.consume import Envelope, consume_once
from aivedio_engine.services.delivery import delivered_outputs
from aivedio_engine.services.follow_on import MediaProcessRequested
from aivedio_engine.services.moderation import INPUT_REVIEW
from aivedio_engine.services.transition import Change, ReviewOrder, decide_and_execute
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import ObjectNotFound, ObjectStore, iter_file, sha256_of

CONSUMER_GROUP = "media"
KIND = {
    DerivativeProfile.PROXY_MP4: AssetKind.PROXY,
    DerivativeProfile.HLS: AssetKind.HLS,
    DerivativeProfile.THUMBNAIL: AssetKind.THUMBNAIL,
    DerivativeProfile.WAVEFORM: AssetKind.WAVEFORM,
}
#: the state a media run applies to: a normal run, or a derivatives-only run after a proxy-only success
_STATUS_FOR = {False: TaskStatus.POST_PROCESSING.value, True: TaskStatus.SUCCEEDED.value}
#: a little slack over the model's maximum: vendors round clip lengths up to whole frames or GOPs
DURATION_SLACK_S = 1.0


class ModerationHook(Protocol):
    def hold_reason(self, task: Task, probe: ProbeResult) -> str | None:
        """Why the output must wait for a human (MANUAL_REVIEW), or None to let it through."""


@dataclass(frozen=True)
class PromptTermsModeration:
    """The built-in rule: hold outputs whose prompt mentions a configured term, and those of requests the input
    moderator let through with a warning (`input_review`, services/moderation.py). No terms: the rest passes."""

    terms: tuple[str, ...] = ()

    def hold_reason(self, task: Task, probe: ProbeResult) -> str | None:
        warned = (task.params or {}).get(INPUT_REVIEW)
        if warned:
            return f"input moderation: {warned}"
        prompt = str(task.prompt).casefold()
        hit = next((t for t in self.terms if t.casefold() in prompt), None)
        return None if hit is None else f"prompt matches review term {hit!r}"


@dataclass(frozen=True, slots=True)
class Derived:
    profile: DerivativeProfile
    status: str
    key: str
    size: int | None = None
    sha256: str | None = None
    error: str | None = None
    retryable: bool = False
    interrupted: bool = False


@dataclass
class Outcome:
    probe: ProbeResult | None = None
    #: the output itself is unacceptable (gate, checksum): final
    rejected: str | None = None
    #: our side failed (ffprobe missing, the stored object missing): another run may pass
    unavailable: str | None = None
    #: the run was stopped, not failed (shutdown, SIGINT/SIGTERM/SIGHUP): retried at once, within the budget
    interrupted: bool = False
    derived: dict[DerivativeProfile, Derived] = field(default_factory=dict)


class MediaService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        store: ObjectStore,
        catalog: Catalog,
        moderation: ModerationHook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._store = store
        self._catalog = catalog
        self._moderation = moderation or PromptTermsModeration(tuple(settings.media.review_prompt_terms))
        self._rng = rng or random.Random()
        media = settings.media
        self.required = tuple(media.required_profiles)
        self.profiles = tuple(dict.fromkeys(self.required + tuple(media.optional_profiles)))

    def handle(self, envelope: Envelope) -> str:
        request = MediaProcessRequested.parse(envelope.payload)
        task_id, asset_id = request.task_id, request.asset_id
        with self._engine.connect() as conn:
            task = tasks.read(conn, task_id)
            raw = asset_rows.read(conn, asset_id)
        if task is None or raw is None:
            return "unknown task or asset"
        if task.status != _STATUS_FOR[request.derivatives_only]:
            return f"skipped: task is {task.status}"
        try:
            outcome = self._process(task, raw, self.limits_for(task))
        except Exception as exc:
            if not request.derivatives_only:
                raise  # a store outage holds the task in its step without spending the budget (see _process)
            # the task already SUCCEEDED on its proxy, and the sweeper re-drives no finished task: a late rebuild
            # that cannot reach the store spends a try of its own delayed schedule (media_partial) instead of
            # ending in dead letters after the broker's few quick retries
            outcome = Outcome(unavailable=f"store unavailable for the late rebuild: {type(exc).__name__}")
        result: list[str] = []
        consume_once(
            self._engine,
            CONSUMER_GROUP,
            envelope.event_id,
            task_id,
            lambda conn: _keep(result, self._record(conn, envelope, raw, outcome)),
            self._clock.now(),
        )
        return result[0] if result else "duplicate"

    def limits_for(self, task: Task) -> MediaLimits:
        limits = MediaLimits.from_settings(self._settings.media)
        try:
            model = self._catalog.find(task.requested_model, task.selected_provider)
        except InvalidRequest:
            return limits  # the model left the catalog since: the platform limit still applies
        return replace(limits, max_duration_s=min(limits.max_duration_s, model.max_duration_s + DURATION_SLACK_S))

    # --- files (no transaction open) ---------------------------------------------------------------------

    def _process(self, task: Task, raw: asset_rows.Asset, limits: MediaLimits) -> Outcome:
        with derive.job_dir() as workdir:
            limits = replace(limits, workdir=workdir)  # every file of the job is in it: the sandbox may isolate
            src = workdir / "raw.mp4"
            try:
                with self._store_watched(task):
                    self._store.download_to(raw.object_key, src)
            except ObjectNotFound:  # gone from the store: another run may find it restored, past that a human
                return Outcome(unavailable="the stored output is missing from the store")
            # any other store failure is an outage of our own store, not a fault of this output: it propagates (with
            # a storage_unavailable alert), so the task is held in POST_PROCESSING without spending
            # the media budget, and the broker's retries, then the sweeper's re-drive (`media_stuck_s`), run it
            # again once the store answers
            with open(src, "rb") as f:
                if raw.checksum_value and sha256_of(f)[0] != raw.checksum_value:
                    return Outcome(rejected="stored output does not match the checksum recorded at fetch")
            try:
                probe = probe_file(src, "video", limits)
            except ProbeInterrupted as exc:
                return Outcome(unavailable=str(exc), interrupted=True)
            except ProbeUnavailable as exc:
                return Outcome(unavailable=str(exc))
            except ProbeError as exc:
                return Outcome(rejected=f"output refused by the media gate: {exc}")
            outcome = Outcome(probe=probe)
            results = derive.build_derivatives(src, probe, workdir / "out", self.profiles, limits)
            for profile, res in results.items():
                outcome.derived[profile] = self._upload(task, raw, res)
        return outcome

    def _upload(self, task: Task, raw: asset_rows.Asset, res: derive.DerivativeResult) -> Derived:
        pv = self._settings.media.pipeline_version
        if res.status != "READY" or res.main is None:
            return Derived(
                res.profile,
                res.status,
                keys.derivative_key(task.tenant_id, raw.id, res.profile, pv, "failed"),
                error=res.error,
                retryable=res.retryable,
                interrupted=res.interrupted,
            )
        main = None
        for path in res.files:
            key = keys.derivative_key(task.tenant_id, raw.id, res.profile, pv, path.name)
            with open(path, "rb") as f, self._store_watched(task):
                obj = self._store.put_stream(
                    key, iter_file(f), derive.content_type_for(path), self._settings.fetch.max_bytes
                )
            if path == res.main:
                main = obj
        assert main is not None, "the main file is one of the derivative's files"
        return Derived(res.profile, "READY", main.key, main.size, main.sha256)

    def _store_watched(self, task: Task) -> AbstractContextManager[None]:
        return store_outage.watched(self._engine, self._clock, self._store, step="media", task_id=task.id)

    # --- the decision (one transaction) ------------------------------------------------------------------

    def _record(self, conn: Connection, envelope: Envelope, raw: asset_rows.Asset, outcome: Outcome) -> str:
        now = self._clock.now()
        assert raw.task_id is not None, "a raw output names its task (check raw_output_key)"
        task = tasks.get(conn, raw.task_id, lock=True)
        request = MediaProcessRequested.parse(envelope.payload)
        if task.status != _STATUS_FOR[request.derivatives_only]:
            return f"skipped: task is {task.status}"
        if request.derivatives_only:  # the task succeeded on its proxy: only the derivatives' own rows change
            return self._record_late(conn, task, raw, request, outcome, now)
        if outcome.rejected:
            _set_asset(conn, raw.id, status=AssetStatus.REJECTED.value, error=outcome.rejected[:2000])
            return self._fail(conn, task, outcome.rejected, now)
        if outcome.probe is not None:
            _set_asset(conn, raw.id, **_probe_columns(outcome.probe), status=AssetStatus.READY.value, ready_at=now)
        for derived in outcome.derived.values():
            if derived.status != "SKIPPED":  # e.g. no waveform for a silent clip: nothing to record
                self._save_derivative(conn, task, raw, derived, now)
        missing = [
            p
            for p in self.required
            if outcome.derived.get(p) is None or outcome.derived[p].status != AssetStatus.READY.value
        ]
        partial = media_partial.proxy_suffices(self._settings, missing, outcome.derived, outcome.unavailable)
        if (outcome.unavailable or missing) and not partial:
            reasons = outcome.unavailable or "; ".join(
                f"{p.value}: {outcome.derived[p].error if p in outcome.derived else 'not built'}" for p in missing
            )
            final = not outcome.unavailable and not any(
                outcome.derived[p].retryable for p in missing if p in outcome.derived
            )
            interrupted = outcome.interrupted or any(
                outcome.derived[p].interrupted for p in missing if p in outcome.derived
            )
            return self._retry_or_escalate(conn, envelope, task, raw, reasons, final, now, interrupted=interrupted)
        assert outcome.probe is not None
        waiting = self._outputs_waiting(conn, raw.id, partial)
        if waiting:  # this output is done; another run finishes the task
            return f"output {raw.output_index or 0} ready; waiting for output(s) {', '.join(map(str, waiting))}"
        hold = self._moderation.hold_reason(task, outcome.probe)
        if hold:
            return self._review(conn, task, raw.id, hold, now)
        change = Change(
            EventSource.WORKER,
            payload={"profiles": sorted(p.value for p in outcome.derived)},
            ledger_reason="succeeded",
            delivered=delivered_outputs(conn, task, self._settings.media),
        )
        decide_and_execute(conn, task, TaskEvent.PLAYABLE_ASSET_READY, change, now)
        if partial:  # written after the transition, so the late run is announced at the SUCCEEDED version
            media_partial.schedule_rebuild(conn, tasks.get(conn, task.id), request, self._settings, now, self._rng)
            return "succeeded on the proxy; " + ", ".join(p.value for p in missing) + " to be rebuilt"
        return "succeeded"

    def _record_late(
        self,
        conn: Connection,
        task: Task,
        raw: asset_rows.Asset,
        request: MediaProcessRequested,
        outcome: Outcome,
        now: datetime,
    ) -> str:
        built = [d for d in outcome.derived.values() if d.status == "READY"]
        for derived in built:
            self._save_derivative(conn, task, raw, derived, now)
        # against the stored rows, not this run's: a run that reached nothing (a store outage) names only the
        # derivatives still missing, not the proxy an earlier run made READY
        outputs = asset_rows.raw_outputs(conn, raw.id, self._settings.media.pipeline_version)
        ready = next(o.ready_profiles for o in outputs if o.id == raw.id)
        missing = [p for p in self.required if p.value not in ready]
        if not missing:
            return "derivatives rebuilt"
        if media_partial.schedule_rebuild(conn, task, request, self._settings, now, self._rng):
            return "derivatives still missing: " + ", ".join(p.value for p in missing) + "; retried later"
        return "derivatives still missing: " + ", ".join(p.value for p in missing) + "; left FAILED"

    def _outputs_waiting(self, conn: Connection, raw_id: uuid.UUID, proxy_only: bool = False) -> list[int]:
        """The indexes of the job's other outputs whose required derivatives are not all READY yet."""
        required = {DerivativeProfile.PROXY_MP4.value} if proxy_only else {p.value for p in self.required}
        outputs = asset_rows.raw_outputs(conn, raw_id, self._settings.media.pipeline_version)
        return [o.index for o in outputs if o.id != raw_id and not required <= o.ready_profiles]

    def _save_derivative(self, conn: Connection, task: Task, raw: asset_rows.Asset, d: Derived, now: datetime) -> None:
        values = dict(
            status=AssetStatus.READY.value if d.status == "READY" else AssetStatus.FAILED.value,
            object_key=d.key,
            size_bytes=d.size,
            checksum_algorithm="sha256" if d.sha256 else None,
            checksum_value=d.sha256,
            error=d.error and d.error[:2000],
            ready_at=now if d.status == "READY" else None,
        )
        asset_rows.save_derivative(
            conn,
            parent_id=raw.id,
            task_id=task.id,
            tenant_id=task.tenant_id,
            kind=KIND[d.profile].value,
            profile=d.profile.value,
            pipeline_version=self._settings.media.pipeline_version,
            bucket=self._store.bucket,
            now=now,
            values=values,
        )

    def _retry_or_escalate(
        self,
        conn: Connection,
        envelope: Envelope,
        task: Task,
        raw: asset_rows.Asset,
        reason: str,
        final: bool,
        now: datetime,
        *,
        interrupted: bool = False,
    ) -> str:
        verdict, why = Verdict.GIVE_UP, "not retryable"
        if not final:
            retried = follow_on.retry_step(
                conn,
                task,
                MediaProcessRequested.parse(envelope.payload),
                ErrorClass.MEDIA_WORKER_CRASHED,
                "media_interrupted" if interrupted else "media_retry",
                budget=self._settings.retry.budget(Step.MEDIA),
                now=now,
                rng=self._rng,
                # a stop, not a fault: no backoff, the next engine to run picks it up at once
                at_once=interrupted,
            )
            verdict, why = retried.verdict, retried.reason
        if verdict is Verdict.RETRY:
            return f"retry: {f'interrupted: {reason}'[:200] if interrupted else why}"
        if verdict is Verdict.MANUAL:
            return self._review(conn, task, raw.id, f"media processing failed ({why}): {reason}", now)
        return self._fail(conn, task, reason, now)

    def _fail(self, conn: Connection, task: Task, reason: str, now: datetime) -> str:
        change = Change(
            EventSource.WORKER,
            error=ErrorOutcome.MEDIA_REJECTED,
            error_code=reason,
            payload={"reason": reason[:500]},
            ledger_reason="media_failed",
        )
        decide_and_execute(conn, task, TaskEvent.FINAL_FAILURE, change, now)
        alerts.raise_alert(
            conn,
            alerts.Rule.MEDIA_FAILED,
            AlertSeverity.WARNING,
            dedup_key=str(task.id),
            now=now,
            subject_type="task",
            subject_id=str(task.id),
            message=reason[:500],
        )
        return f"failed: {reason[:80]}"

    def _review(self, conn: Connection, task: Task, asset_id: uuid.UUID, reason: str, now: datetime) -> str:
        change = Change(EventSource.WORKER, payload={"reason": reason[:500]}, review=ReviewOrder(asset_id, reason))
        decide_and_execute(conn, task, TaskEvent.REVIEW_REQUIRED, change, now)
        return "held for review"


def _probe_columns(probe: ProbeResult) -> dict[str, Any]:
    video = probe.video
    rate = video.frame_rate if video else None
    return dict(
        duration_ms=probe.duration_ms,
        width=video.width if video else None,
        height=video.height if video else None,
        frame_rate_num=rate.numerator if rate else None,
        frame_rate_den=rate.denominator if rate else None,
        probe=probe.raw,
    )


def _set_asset(conn: Connection, asset_id: uuid.UUID, **values: Any) -> None:
    asset_rows.set_columns(conn, asset_id, values)


def _keep(sink: list[str], value: str) -> str:
    sink.append(value)
    return value
