"""The `local` provider: renders a real clip with ffmpeg in this process and serves it over loopback
HTTP, so embedded mode exercises the same submit → poll → fetch path as a hosted vendor.

Jobs are durable when the provider is given a `LocalJobs` store (bootstrap does: the engine's database, table
`local_jobs`): a job outlives the process that rendered it. A render is stopped rather than failed when the
provider is closed before it ends (a Ctrl-C'd `aivedio generate`, a stopping `aivedio serve`) or when its
ffmpeg is interrupted (SIGINT/SIGTERM/SIGHUP, `media.sandbox.stopping`); the job is then released, and the
next instance asked about it (any engine on the data dir: `generations wait`, `serve`) renders it again under
the same job id. So does a job whose process died without releasing it (killed hard): its row names a process
that is gone. The same request key always finds the same job, a finished output is served, never rendered
again, and only the row's owner renders, so a job never renders twice at once. The engine therefore keeps one
attempt, one reservation and one settlement however often the render was cut short.

Without a store (tests, tools) jobs live in memory, and a restart knows only what they left on disk: an output
in the served directory means SUCCEEDED; a tombstone means stopped, not failed (ABORTED: not billed, so the
engine submits again). Any other unknown id is NotFound.
Renders run on a thread pool sized by `max_concurrency`; each is an argv from `media.render` run through
`media.sandbox` exactly as the derive step's children are (prlimit, its own session, a wall-clock timeout, no
network, a uid of its own per job with the job's process, file-size and disk limits), in a job directory of
`media.derive.job_dir` (the system temp dir, where a pool uid can reach it), always removed. The reference
image is copied into that directory first, so the child reads only the job's own files. Only a finished render
is copied into the served directory's `.work` and renamed into place, so a partial file is never downloadable.

A request for `n` outputs renders n clips, one after the other, each a variant (`render.ClipSpec.variant`):
output 0 is `<job>.mp4`, output i is `<job>-<i>.mp4`. Output 0 is renamed into place last, so its presence
still means the whole job finished.

Output URLs carry an expiry and an HMAC over (job id, expiry) keyed per instance: an expired or edited URL
gets 403, like a vendor CDN, which lets the engine's refresh-on-403 path run for real (`local_outputs.py`).

A job that ends (SUCCEEDED or FAILED) is reported at once through `report(provider name, observation)` when one is
given (bootstrap stores it as the provider's callback: `CallbackService.report`), so the engine need not wait for
its next poll. The report is best effort, from the render thread: a failure is logged, and polling, which never
stops, completes the task anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.config import ModelSettings, ProviderSettings
from aivedio_engine.domain.references import MB, ModelLimits
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.media import derive, render, sandbox
from aivedio_engine.providers import local_owners as owners
from aivedio_engine.providers.base import (
    Accepted,
    CallbackRejected,
    Canceled,
    Capabilities,
    GenerationRequest,
    JobStatus,
    NotFound,
    Observation,
    Output,
    QueryFailed,
    Rejected,
    SubmitResult,
    TooLate,
    Unsupported,
)
from aivedio_engine.providers.local_outputs import OutputServer

if TYPE_CHECKING:
    from aivedio_engine.db.local_jobs import LocalJob, LocalJobs

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"loc_[0-9a-f]{32}")
_FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.ABORTED})
#: where an ABORTED job leaves its id, so that an instance started later can still answer for it
_TOMBSTONES = ".aborted"
#: the renderer pans over ONE image (more would be ignored, so they are refused) and has no video-to-video; the
#: image is decoded inside the render sandbox, whose memory cap a larger file could exceed
LOCAL_LIMITS = ModelLimits(max_reference_images=1, max_reference_videos=0, max_image_bytes=32 * MB, max_outputs=4)


def model_limits(model: str) -> ModelLimits:
    return LOCAL_LIMITS


_DEFAULT_MODELS = {
    "local-v1": ModelSettings(
        max_duration_s=10,
        resolutions=["360p", "720p"],
        price_per_second={"360p": Decimal("0.5"), "720p": Decimal("1")},
        max_outputs=4,
    )
}
_REJECT = ErrorClass.PROVIDER_REJECTED
#: renders started for one job before it fails: each cut short (a process killed hard, again and again) would
#: otherwise re-render it forever
MAX_RENDERS = 5


@dataclass(eq=False)
class _Job:
    job_id: str
    request_key: str
    spec: render.ClipSpec
    prompt: str
    image: Path | None
    updated_at: datetime
    status: JobStatus = JobStatus.QUEUED
    progress: int = 0
    error_code: str | None = None
    error_message: str | None = None
    size_bytes: int | None = None
    #: outputs asked for, and each finished one's size (index order)
    n: int = 1
    sizes: list[int] = field(default_factory=list)
    process: sandbox.Child | None = field(default=None, repr=False)


def file_reference(url: str) -> Path | None:
    """The default reference resolver: `file://` URLs of existing local files only (ffmpeg never sees a URL)."""
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    path = Path(unquote(parts.path))
    return path if path.is_absolute() and path.is_file() else None


class LocalProvider:
    def __init__(
        self,
        name: str,
        settings: ProviderSettings,
        *,
        data_dir: Path,
        clock: Clock | None = None,
        ffmpeg_bin: str = "ffmpeg",
        fps: int = 15,
        preset: str = "ultrafast",
        render_timeout_s: float = 600.0,
        realtime: bool = False,
        retention_s: float = 86400.0,
        font_file: Path | None | str = "auto",
        resolve_reference: Callable[[str], Path | None] = file_reference,
        jobs: LocalJobs | None = None,
        report: Callable[[str, Observation], object] | None = None,
    ) -> None:
        self.name = name
        self._report = report
        self._clock = clock or SystemClock()
        self._models = dict(settings.models or _DEFAULT_MODELS)
        self._ttl_s = settings.output_url_ttl_s
        self._ffmpeg, self._timeout_s, self._retention_s = ffmpeg_bin, render_timeout_s, retention_s
        self._render_options = {"fps": fps, "preset": preset, "realtime": realtime}
        self._font = render.pick_font() if font_file == "auto" else (Path(font_file) if font_file else None)
        if self._font is None:
            log.warning("local provider: no font file found (install fonts-dejavu-core); captions are skipped")
        self._resolve_reference = resolve_reference
        self.capabilities = Capabilities(
            models=tuple(self._models),
            max_duration_s=max(m.max_duration_s for m in self._models.values()),
            resolutions=tuple(
                sorted({r for m in self._models.values() for r in m.resolutions if r in render.RESOLUTIONS})
            ),
            supports_callbacks=False,
            supports_lookup_by_request_key=True,
            supports_cancel=True,
            output_url_ttl_s=self._ttl_s,
            cancel_is_billed=False,
            reference_transport="file",
            model_limits={m: LOCAL_LIMITS for m in self._models},
        )
        # absolute: renders run with cwd set to their work dir, so a relative data dir would resolve twice
        self.root = Path(data_dir).resolve() / "local-provider"
        self._work = self.root / ".work"
        self._work.mkdir(parents=True, exist_ok=True)
        self._tombstones = self.root / _TOMBSTONES
        self._tombstones.mkdir(exist_ok=True)
        _remove_stale(self.root, self._work, render_timeout_s + 60, retention_s)
        self._lock = threading.Lock()
        self._store = jobs
        self._token = secrets.token_hex(8)
        self._owner = owners.owner_id(self._token)
        owners.LIVE_TOKENS.add(self._token)
        self._jobs: dict[str, _Job] = {}
        self._by_key: dict[str, str] = {}
        self._closed = False
        self._swept_at = self._clock.now()
        self._pool = ThreadPoolExecutor(max_workers=settings.max_concurrency, thread_name_prefix=f"{name}-render")
        self._outputs = OutputServer(self.root, self._clock, f"{name}-http")
        self.base_url = self._outputs.base_url

    # --- the Provider protocol ------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        if not request_key or len(request_key) > 255:
            return Rejected(ErrorClass.LOCAL_INVALID, "invalid_request_key", "request key must be 1–255 chars")
        with self._lock:
            if (known := self._known(request_key)) is not None:
                return known
        job = self._new_job(request, request_key)  # outside the lock: a resolver may touch the disk
        if isinstance(job, Rejected):
            return job
        if self._store is not None:
            row, created = self._store.create(job.job_id, request_key, _params(job), self._owner, self._clock.now())
            if not created:  # the key's job exists, made by this or another process, maybe before a restart
                return Accepted(row.job_id, self._take_over_or_observe(row))
        with self._lock:
            if (known := self._known(request_key)) is not None:  # a concurrent submit with the same key won
                return known
            self._sweep()
            self._start(job)
            return Accepted(job.job_id, self._observe(job))

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return self._observe(job)
        row = self._store.get(job_id) if self._store is not None and _JOB_ID.fullmatch(job_id) else None
        return self._from_disk(job_id) if row is None else self._take_over_or_observe(row)

    def find(self, request_key: str) -> Observation | NotFound | Unsupported | QueryFailed:
        with self._lock:
            job_id = self._by_key.get(request_key)
            if job_id is not None:
                return self._observe(self._jobs[job_id])
        row = self._store.by_key(request_key) if self._store is not None else None
        return NotFound() if row is None else self._take_over_or_observe(row)

    def list_jobs(self, created_after: datetime, created_before: datetime) -> Unsupported:
        return Unsupported()

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return self._cancel_stored(job_id)
            if job.status is JobStatus.CANCELED:
                return Canceled()
            if job.status in _FINISHED:
                return TooLate()
            self._finish(job, JobStatus.CANCELED)
            proc = job.process
        if proc is not None:
            _stop(proc)  # return only once ffmpeg is gone, so "canceled" means no CPU is being spent
        return Canceled()

    def _cancel_stored(self, job_id: str) -> Canceled | TooLate | QueryFailed:
        """A job this instance does not render: stopped in the store, where its renderer (if any) sees it."""
        row = self._store.cancel(job_id, self._clock.now()) if self._store is not None else None
        if row is None:
            return QueryFailed(_REJECT, f"no job {job_id!r}")
        return Canceled() if row.state is JobStatus.CANCELED else TooLate()

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        raise CallbackRejected("the local provider sends no callbacks")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = [j for j in self._jobs.values() if j.status not in _FINISHED]
            for job in running:  # stopped, not failed: nothing was delivered nor billed
                self._stopped(job, "provider_closed", "the local provider was shut down")
            procs = [j.process for j in running if j.process is not None]
        for proc in procs:
            _stop(proc)
        if self._store is not None:  # the next engine on this data dir renders them again, same job ids
            self._store.release([j.job_id for j in running], self._owner, self._clock.now())
        owners.LIVE_TOKENS.discard(self._token)
        self._outputs.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._outputs.join()

    def __enter__(self) -> LocalProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- extras for operators and tests ----------------------------------------------------------------------

    def process_id(self, job_id: str) -> int | None:
        """The pid of the job's ffmpeg while it runs."""
        with self._lock:
            job = self._jobs.get(job_id)
            return job.process.pid if job is not None and job.process is not None else None

    def output_url(self, job_id: str, expires: int | None = None, index: int = 0) -> str:
        """A signed URL for the job's output `index`, valid until `expires` (unix seconds; default now + TTL)."""
        if expires is None:
            expires = int(self._clock.now().timestamp()) + self._ttl_s
        name = _output_name(job_id, index)
        return self._outputs.url(name, expires)

    # --- jobs ------------------------------------------------------------------------------------------------

    def _start(self, job: _Job) -> None:
        """Hold `job` in memory and queue its render (caller holds the lock)."""
        self._jobs[job.job_id] = job
        self._by_key[job.request_key] = job.job_id
        self._pool.submit(self._run, job)

    def _take_over_or_observe(self, row: LocalJob) -> Observation:
        """A stored job this instance does not hold: rendered again here if nobody renders it (its process
        died, or released it), else reported as the store has it."""
        assert self._store is not None
        if not row.finished and not self._closed:
            claimed = self._store.claim(row.job_id, self._owner, owners.orphaned, self._clock.now(), MAX_RENDERS)
            if claimed is not None:
                log.info("local provider: rendering job %s again (its render was cut short)", row.job_id)
                job = _job_of(claimed, self._clock.now())
                with self._lock:
                    if row.job_id not in self._jobs and not self._closed:
                        self._start(job)
                release = self._closed
                if release:  # closed meanwhile: give it back to the next engine
                    self._store.release([row.job_id], self._owner, self._clock.now())
            with self._lock:
                if (held := self._jobs.get(row.job_id)) is not None:
                    return self._observe(held)
            row = self._store.get(row.job_id) or row
        return self._observe_stored(row)

    def _observe_stored(self, row: LocalJob) -> Observation:
        outputs: tuple[Output, ...] = ()
        if row.state is JobStatus.SUCCEEDED:  # rendered by another instance: every variant it renamed into place
            outputs = self._served(row.job_id, self._sizes_on_disk(row.job_id))
        progress = 100 if row.state is JobStatus.SUCCEEDED else row.progress
        return Observation(
            job_id=row.job_id,
            status=row.state,
            provider_updated_at=row.updated_at,
            progress=progress,
            outputs=outputs,
            billed_outputs=_billed(len(outputs), int(row.params.get("n", 1))) if outputs else None,
            error_code=row.error_code,
            error_message=row.error_message,
            request_key=row.request_key,
            raw={"status": row.state.value, "progress": progress, "stored": True},
        )

    def _known(self, request_key: str) -> SubmitResult | None:
        if self._closed:
            return Rejected(ErrorClass.CONNECT_FAILED, "provider_closed", "the local provider is shut down")
        job_id = self._by_key.get(request_key)
        return None if job_id is None else Accepted(job_id, self._observe(self._jobs[job_id]))

    def _sweep(self) -> None:
        # Jobs finished longer than the retention ago: the engine has long copied the output into its own
        # store, and without this a long-running embedded process keeps every clip it ever rendered twice.
        now = self._clock.now()
        if (now - self._swept_at).total_seconds() < 60:
            return
        self._swept_at = now
        for job in [j for j in self._jobs.values() if j.status in _FINISHED]:
            if (now - job.updated_at).total_seconds() > self._retention_s:
                for index in range(job.n):
                    (self.root / f"{_output_name(job.job_id, index)}.mp4").unlink(missing_ok=True)
                del self._jobs[job.job_id], self._by_key[job.request_key]
        if self._store is not None:
            self._store.purge(now - timedelta(seconds=self._retention_s))

    def _new_job(self, request: GenerationRequest, request_key: str) -> _Job | Rejected:
        model = self._models.get(request.model)
        if model is None:
            return Rejected(_REJECT, "unsupported_model", f"unknown model {request.model!r}")
        if request.resolution not in model.resolutions or request.resolution not in render.RESOLUTIONS:
            return Rejected(_REJECT, "unsupported_resolution", f"{request.model} renders {model.resolutions}")
        if not 1 <= request.duration_s <= model.max_duration_s:
            return Rejected(_REJECT, "unsupported_duration", f"duration must be 1–{model.max_duration_s} s")
        seed = request.seed if request.seed is not None else render.seed_from(request.prompt)
        try:
            spec = render.make_spec(
                request.resolution, request.aspect_ratio, request.duration_s, seed, **self._render_options
            )
        except render.RenderSpecError as exc:
            return Rejected(_REJECT, "unsupported_aspect_ratio", str(exc))
        image = None
        if request.reference_urls:  # one reference image; the clip pans over it
            image = self._resolve_reference(request.reference_urls[0])
            if image is None:
                return Rejected(_REJECT, "reference_unreadable", "the reference is not a readable local file")
        return _Job(
            job_id=f"loc_{secrets.token_hex(16)}",
            request_key=request_key,
            spec=spec,
            prompt=request.prompt,
            image=image,
            updated_at=self._clock.now(),
            n=max(1, min(request.n, LOCAL_LIMITS.max_outputs)),
        )

    def _observe(self, job: _Job) -> Observation:
        outputs: tuple[Output, ...] = ()
        if job.status is JobStatus.SUCCEEDED:
            outputs = self._served(job.job_id, job.sizes)
        return Observation(
            job_id=job.job_id,
            status=job.status,
            provider_updated_at=job.updated_at,
            progress=job.progress,
            outputs=outputs,
            error_code=job.error_code,
            error_message=job.error_message,
            request_key=job.request_key,
            # every output made is billed; reported only for n > 1, where the price list alone would not say it
            billed_outputs=_billed(len(job.sizes), job.n) if job.status is JobStatus.SUCCEEDED else None,
            raw={"status": job.status.value, "progress": job.progress},
        )

    def _served(self, job_id: str, sizes: list[int]) -> tuple[Output, ...]:
        """The finished outputs, by index, each with a fresh signed URL (vendors re-sign on each poll too)."""
        expires = int(self._clock.now().timestamp()) + self._ttl_s
        return tuple(
            Output(
                url=self.output_url(job_id, expires, index),
                content_type="video/mp4",
                expires_at=datetime.fromtimestamp(expires, UTC),
                size_bytes=size,
                index=index,
            )
            for index, size in enumerate(sizes)
        )

    def _sizes_on_disk(self, job_id: str) -> list[int]:
        """The sizes of the job's outputs in the served directory, output 0 first, up to the first one missing."""
        sizes: list[int] = []
        while (path := self.root / f"{_output_name(job_id, len(sizes))}.mp4").is_file():
            sizes.append(path.stat().st_size)
        return sizes

    def _from_disk(self, job_id: str) -> Observation | NotFound:
        """A job this instance does not know, as far as the data dir tells (see the module docstring)."""
        if not _JOB_ID.fullmatch(job_id):
            return NotFound()
        try:
            stat = (self.root / f"{job_id}.mp4").stat()
        except OSError:
            stat = None
        if stat is not None:  # renamed into place only once complete: the render finished before the restart
            sizes = self._sizes_on_disk(job_id)
            return Observation(
                job_id=job_id,
                status=JobStatus.SUCCEEDED,
                progress=100,
                outputs=self._served(job_id, sizes),
                billed_outputs=_billed(len(sizes), len(sizes)),
                provider_updated_at=datetime.fromtimestamp(stat.st_mtime, UTC),
                raw={"status": JobStatus.SUCCEEDED.value, "recovered": True},
            )
        try:
            code, _, message = (self._tombstones / job_id).read_text("utf-8").partition("\n")
            at = datetime.fromtimestamp((self._tombstones / job_id).stat().st_mtime, UTC)
        except OSError:
            return NotFound()
        return Observation(
            job_id=job_id,
            status=JobStatus.ABORTED,
            provider_updated_at=at,
            error_code=code or "aborted",
            error_message=message or None,
            raw={"status": JobStatus.ABORTED.value, "recovered": True},
        )

    def _stopped(self, job: _Job, code: str, message: str) -> None:
        """The render was cut short, not failed: nothing was delivered nor billed (caller holds the lock). With a
        store the job is forgotten here and the caller releases it, once its ffmpeg is gone, for a render under
        the same id; without one it is ABORTED (the engine submits again)."""
        if self._store is None:
            self._finish(job, JobStatus.ABORTED, code, message)
            return
        job.status, job.error_code, job.error_message = JobStatus.ABORTED, code, message
        self._forget(job)

    def _stored(self, write: Callable[..., Any], *args: Any, **values: Any) -> Any:
        """A store write from a render thread; None when the database refused it. The render goes on: this
        instance still answers from memory, and the row, left as it was, is this live instance's."""
        try:
            return write(*args, **values)
        except Exception:  # a locked or unreachable database must not wedge the render thread
            log.warning("local provider: could not record job %s", args[0] if args else "?", exc_info=True)
            return None

    def _forget(self, job: _Job) -> None:
        if self._jobs.get(job.job_id) is job:
            del self._jobs[job.job_id]
            self._by_key.pop(job.request_key, None)

    def _finish(self, job: _Job, status: JobStatus, code: str | None = None, message: str | None = None) -> None:
        job.status, job.error_code, job.error_message = status, code, message
        if status is JobStatus.SUCCEEDED:
            job.progress = 100
        job.updated_at = self._clock.now()
        if self._store is not None and status is JobStatus.CANCELED:
            self._stored(self._store.cancel, job.job_id, job.updated_at)  # its renderer sees so at its next write
        elif self._store is not None:
            output = str(self.root / f"{job.job_id}.mp4") if status is JobStatus.SUCCEEDED else None
            self._stored(
                self._store.record,
                job.job_id,
                self._owner,
                job.updated_at,
                state=status,
                progress=job.progress,
                output_path=output,
                size_bytes=job.size_bytes,
                error_code=code,
                error_message=message,
                owner=None,
            )
        if status is JobStatus.ABORTED:  # the engine may only ask after a restart: answer it then too
            try:
                (self._tombstones / job.job_id).write_text(f"{code or 'aborted'}\n{message or ''}", "utf-8")
            except OSError:
                log.warning("local provider: cannot record aborted job %s", job.job_id)

    def _run(self, job: _Job) -> None:
        with self._lock:
            if job.status is not JobStatus.QUEUED:  # canceled while it waited for a slot
                return
            job.status, job.updated_at = JobStatus.RUNNING, self._clock.now()
        try:
            with derive.job_dir() as work:  # per render: a takeover never shares it
                self._render(job, work)
        except Exception as exc:  # a bug or an OS error must still end the job in an explainable state
            log.exception("local render %s crashed", job.job_id)
            with self._lock:
                if job.status is JobStatus.RUNNING:
                    self._finish(job, JobStatus.FAILED, "render_crashed", f"{type(exc).__name__}: {exc}"[:200])
        self._report_end(job)

    def _report_end(self, job: _Job) -> None:
        """Tell the engine the job ended, instead of letting it find out at its next poll (best effort)."""
        with self._lock:
            if self._report is None or job.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
                return  # stopped (rendered again later) or canceled (the engine asked for it): nothing to tell
            # an id of its own, as a vendor's webhook has: a report the engine could not use yet (it raced the
            # submit's own commit) must not make the poll's observation of the same state look like a repeat
            observation = replace(self._observe(job), event_id=f"report:{job.job_id}:{job.status.value}")
        try:
            self._report(self.name, observation)
        except Exception:  # the engine's poll is the fallback; a render thread must never die of this
            log.warning("local provider: could not report job %s; its next poll will", job.job_id, exc_info=True)

    def _render(self, job: _Job, work: Path) -> None:
        caption, font = None, self._font_for(job.prompt)
        if font is not None:
            caption = work / "caption.txt"
            caption.write_text(render.caption_text(job.prompt, job.spec.width, job.spec.height), encoding="utf-8")
        image = None
        if job.image is not None:  # the job's uid reads the job's files only, never the user's own
            image = work / f"reference{job.image.suffix.lower()}"
            try:
                shutil.copyfile(job.image, image)
            except OSError as exc:
                with self._lock:
                    if job.status is JobStatus.RUNNING:
                        reason = f"the reference image cannot be read: {exc.strerror or type(exc).__name__}"
                        self._finish(job, JobStatus.FAILED, "render_failed", reason)
                return
        made: list[Path] = []
        for index in range(job.n):
            partial = work / ("out.mp4" if index == 0 else f"out-{index}.mp4")
            spec = job.spec if index == 0 else replace(job.spec, variant=index)
            if not self._render_one(job, work, spec, image, partial, caption, font, index):
                return
            made.append(partial)
        # onto the served directory's file system first (the job directory is in the system temp dir), so
        # that each output appears there by one rename
        staged = [self._work / f"{_output_name(job.job_id, i)}.{self._token}.mp4" for i in range(job.n)]
        try:
            for src, dst in zip(made, staged, strict=True):
                shutil.copyfile(src, dst)
            with self._lock:
                if job.status is not JobStatus.RUNNING:
                    return
                # the variants first, output 0 last: its file in place means the whole job is done (`_from_disk`)
                for index in reversed(range(job.n)):
                    os.replace(staged[index], self.root / f"{_output_name(job.job_id, index)}.mp4")
                job.sizes = [(self.root / f"{_output_name(job.job_id, i)}.mp4").stat().st_size for i in range(job.n)]
                job.size_bytes = job.sizes[0]
                self._finish(job, JobStatus.SUCCEEDED)
        finally:
            for path in staged:  # left over only when the job ended meanwhile or a copy failed
                path.unlink(missing_ok=True)

    def _render_one(
        self,
        job: _Job,
        work: Path,
        spec: render.ClipSpec,
        image: Path | None,
        partial: Path,
        caption: Path | None,
        font: Path | None,
        index: int,
    ) -> bool:
        """Render output `index` into `partial`; True when it was made, else the job has been ended (or, stopped,
        handed back to the store for a render under the same id)."""
        argv = sandbox.prefix(sandbox.encoder_cpu_s(self._timeout_s), 2 * 1024**3) + render.clip_argv(
            spec, partial, image=image, caption_file=caption, font_file=font, ffmpeg_bin=self._ffmpeg
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        with open(work / "stderr.log", "wb") as errors:  # a file, not a pipe: a chatty ffmpeg cannot block
            try:
                # `workdir`: the derive step's isolation (a uid of its own, the job's limits) besides no network
                child = sandbox.spawn(
                    argv,
                    workdir=work,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    env=env,
                    cwd=work,
                )
            except sandbox.Interrupted:  # this process is stopping its children: not a verdict on the request
                with self._lock:
                    stopped = job.status is JobStatus.RUNNING
                    if stopped:
                        self._stopped(job, "render_interrupted", "the render was not started: the engine is stopping")
                if stopped:
                    self._release(job)
                return False
            except OSError as exc:
                with self._lock:
                    if job.status is JobStatus.RUNNING:
                        self._finish(job, JobStatus.FAILED, "ffmpeg_unavailable", str(exc)[:200])
                return False
            with child:
                with self._lock:
                    job.process = child
                    if job.status is not JobStatus.RUNNING:  # canceled or closed between spawn and here
                        child.interrupt()
                if self._store is not None and index == 0:
                    if self._stored(self._store.started, job.job_id, self._owner, self._clock.now()) is False:
                        self._lost(job, child)
                watchdog = threading.Timer(self._timeout_s, child.expire)  # recorded as ours before the kill
                watchdog.daemon = True
                watchdog.start()
                try:
                    assert child.proc.stdout is not None
                    stored = index * 100 // job.n
                    for line in child.proc.stdout:
                        if (percent := render.progress_percent(line, spec.duration_s)) is not None:
                            overall = (index * 100 + percent) // job.n  # n outputs share the job's 0-99 %
                            with self._lock:
                                job.progress = max(job.progress, overall)
                            if self._store is not None and overall >= stored + 10:  # for other instances' eyes
                                stored = overall
                                if self._progress(job, overall) is False:
                                    self._lost(job, child)
                    code = child.wait()
                finally:
                    watchdog.cancel()
        ending = child.ending(code)
        with self._lock:
            job.process = None
            if job.status is not JobStatus.RUNNING:
                return False
            if ending is sandbox.Ending.INTERRUPTED:  # stopped, not failed: nothing to bill, render again
                self._stopped(job, "render_interrupted", f"the render was {child.describe(code)}")
            elif ending is sandbox.Ending.TIMEOUT:
                self._finish(job, JobStatus.FAILED, "render_timeout", f"render exceeded {self._timeout_s:g} s")
                return False
            elif code != 0:
                reason = render.error_summary((work / "stderr.log").read_bytes(), (work, job.image))
                self._finish(job, JobStatus.FAILED, "render_failed", reason or f"ffmpeg exited with {code}")
                return False
            else:
                return True
        self._release(job)  # interrupted: the job goes back to the store for the next render
        return False

    def _progress(self, job: _Job, percent: int) -> bool | None:
        assert self._store is not None
        done: bool | None = self._stored(
            self._store.record, job.job_id, self._owner, self._clock.now(), progress=percent
        )
        return done

    def _release(self, job: _Job) -> None:
        """A stopped render's job back to the store, for the next asker (this instance, unless it is closing)."""
        if self._store is not None:
            self._stored(self._store.release, [job.job_id], self._owner, self._clock.now())

    def _lost(self, job: _Job, child: sandbox.Child) -> None:
        """The store says the job is no longer ours (canceled elsewhere, or taken over): stop rendering it."""
        with self._lock:
            if job.status is JobStatus.RUNNING:
                job.status = JobStatus.CANCELED
                self._forget(job)
        child.interrupt()

    def _font_for(self, prompt: str) -> Path | None:
        if self._font is not None and render.needs_cjk(prompt):
            return render.pick_font(render.CJK_FONT_CANDIDATES) or self._font
        return self._font

    # --- output serving --------------------------------------------------------------------------------------


def _output_name(job_id: str, index: int) -> str:
    """The served file's stem: output 0 keeps the job id alone, as before multi-output jobs existed."""
    return job_id if index == 0 else f"{job_id}-{index}"


def _stop(child: sandbox.Child) -> None:
    # SIGKILL, not SIGTERM: on TERM ffmpeg finalises the file (faststart rewrites it), work we then discard
    child.interrupt()
    child.proc.wait()


def _remove_stale(root: Path, work: Path, work_age_s: float, output_age_s: float) -> None:
    # By age, not wholesale: another instance (a CLI command next to `aivedio serve`) may share the directory.
    now = time.time()
    for entry in work.iterdir():
        if now - entry.stat().st_mtime > work_age_s:
            shutil.rmtree(entry, ignore_errors=True)
    for entry in [*root.glob("loc_*.mp4"), *(root / _TOMBSTONES).glob("loc_*")]:
        if now - entry.stat().st_mtime > output_age_s:
            entry.unlink(missing_ok=True)


def _params(job: _Job) -> dict[str, Any]:
    """What a later process needs to render the job again."""
    return {
        "spec": dataclasses.asdict(job.spec),
        "prompt": job.prompt,
        "image": str(job.image) if job.image else None,
        "n": job.n,
    }


def _job_of(row: LocalJob, now: datetime) -> _Job:
    p = row.params
    return _Job(
        job_id=row.job_id,
        request_key=row.request_key,
        spec=render.ClipSpec(**p["spec"]),
        prompt=p["prompt"],
        image=Path(p["image"]) if p.get("image") else None,
        updated_at=now,
        n=int(p.get("n", 1)),  # rows written before multi-output jobs have no n: one output
    )


def _billed(made: int, asked: int) -> int | None:
    """Every output made is billed; reported only for a job of several, where the price list alone would not say
    it."""
    return made if asked > 1 or made > 1 else None
