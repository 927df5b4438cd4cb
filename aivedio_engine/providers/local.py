"""The `local` provider (DESIGN §8): renders a real clip with ffmpeg in this process and serves it over loopback
HTTP, so embedded mode exercises the same submit → poll → fetch path as a hosted vendor.

Jobs live in memory. A restart forgets them, not what they left on disk: a job id this instance does not know
is answered from the data dir when it can be — its output in the served directory means the render finished
before the restart (SUCCEEDED, with a URL signed by this instance); a tombstone means it was stopped, not
failed (ABORTED: not billed, so the engine submits again). A render is stopped rather than failed when the
provider is closed before it ends (a Ctrl-C'd `aivedio generate`, a stopping `aivedio serve`) or when its
ffmpeg is interrupted (SIGINT/SIGTERM/SIGHUP, `media.sandbox.stopping`). Any other unknown id is NotFound.
Renders run on a thread pool sized by `max_concurrency`; each is an argv from `media.render` run through
`media.sandbox` (prlimit, its own session, a wall-clock timeout), in a per-job work directory that is always
removed. Only a finished render is renamed into the served directory, so a partial file is never downloadable.

Output URLs carry an expiry and an HMAC over (job id, expiry) keyed per instance: an expired or edited URL
gets 403, like a vendor CDN, which lets the engine's refresh-on-403 path run for real.
"""

from __future__ import annotations

import hashlib
import hmac
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.config import ModelSettings, ProviderSettings
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.media import render, sandbox
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
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"loc_[0-9a-f]{32}")
_OUTPUT_PATH = re.compile(r"/outputs/(loc_[0-9a-f]{32})\.mp4")
_FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.ABORTED})
#: where an ABORTED job leaves its id, so that an instance started later can still answer for it
_TOMBSTONES = ".aborted"
_DEFAULT_MODELS = {
    "local-v1": ModelSettings(
        max_duration_s=10, resolutions=["360p", "720p"], price_per_second={"360p": Decimal("0.5"), "720p": Decimal("1")}
    )
}
_REJECT = ErrorClass.PROVIDER_REJECTED


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
    ) -> None:
        self.name = name
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
        )
        # absolute: renders run with cwd set to their work dir, so a relative data dir would resolve twice
        self.root = Path(data_dir).resolve() / "local-provider"
        self._work = self.root / ".work"
        self._work.mkdir(parents=True, exist_ok=True)
        self._tombstones = self.root / _TOMBSTONES
        self._tombstones.mkdir(exist_ok=True)
        _remove_stale(self.root, self._work, render_timeout_s + 60, retention_s)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._by_key: dict[str, str] = {}
        self._closed = False
        self._swept_at = self._clock.now()
        self._key = secrets.token_bytes(32)
        self._pool = ThreadPoolExecutor(max_workers=settings.max_concurrency, thread_name_prefix=f"{name}-render")
        self._server = _OutputServer(self)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=f"{name}-http", daemon=True
        )
        self._server_thread.start()

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
        with self._lock:
            if (known := self._known(request_key)) is not None:  # a concurrent submit with the same key won
                return known
            self._sweep()
            self._jobs[job.job_id] = job
            self._by_key[request_key] = job.job_id
            self._pool.submit(self._run, job)
            return Accepted(job.job_id, self._observe(job))

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return self._observe(job)
        return self._from_disk(job_id)

    def find(self, request_key: str) -> Observation | NotFound | Unsupported | QueryFailed:
        with self._lock:
            job_id = self._by_key.get(request_key)
            return NotFound() if job_id is None else self._observe(self._jobs[job_id])

    def list_jobs(self, created_after: datetime, created_before: datetime) -> Unsupported:
        return Unsupported()

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return QueryFailed(_REJECT, f"no job {job_id!r}")
            if job.status is JobStatus.CANCELED:
                return Canceled()
            if job.status in _FINISHED:
                return TooLate()
            self._finish(job, JobStatus.CANCELED)
            proc = job.process
        if proc is not None:
            _stop(proc)  # return only once ffmpeg is gone, so "canceled" means no CPU is being spent
        return Canceled()

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        raise CallbackRejected("the local provider sends no callbacks")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = [j for j in self._jobs.values() if j.status not in _FINISHED]
            for job in running:  # stopped, not failed: nothing was delivered nor billed, the engine may resubmit
                self._finish(job, JobStatus.ABORTED, "provider_closed", "the local provider was shut down")
            procs = [j.process for j in running if j.process is not None]
        for proc in procs:
            _stop(proc)
        self._server.shutdown()
        self._server.server_close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._server_thread.join(timeout=5)

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

    def output_url(self, job_id: str, expires: int | None = None) -> str:
        """A signed URL for the job's output, valid until `expires` (unix seconds; default now + TTL)."""
        if expires is None:
            expires = int(self._clock.now().timestamp()) + self._ttl_s
        return f"{self.base_url}/outputs/{job_id}.mp4?expires={expires}&sig={self._sign(job_id, expires)}"

    # --- jobs ------------------------------------------------------------------------------------------------

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
                (self.root / f"{job.job_id}.mp4").unlink(missing_ok=True)
                del self._jobs[job.job_id], self._by_key[job.request_key]

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
        )

    def _observe(self, job: _Job) -> Observation:
        outputs: tuple[Output, ...] = ()
        if job.status is JobStatus.SUCCEEDED:  # a fresh URL on every look, as vendors re-sign on each poll
            expires = int(self._clock.now().timestamp()) + self._ttl_s
            outputs = (
                Output(
                    url=self.output_url(job.job_id, expires),
                    content_type="video/mp4",
                    expires_at=datetime.fromtimestamp(expires, UTC),
                    size_bytes=job.size_bytes,
                ),
            )
        return Observation(
            job_id=job.job_id,
            status=job.status,
            provider_updated_at=job.updated_at,
            progress=job.progress,
            outputs=outputs,
            error_code=job.error_code,
            error_message=job.error_message,
            request_key=job.request_key,
            raw={"status": job.status.value, "progress": job.progress},
        )

    def _from_disk(self, job_id: str) -> Observation | NotFound:
        """A job this instance does not know, as far as the data dir tells (see the module docstring)."""
        if not _JOB_ID.fullmatch(job_id):
            return NotFound()
        try:
            stat = (self.root / f"{job_id}.mp4").stat()
        except OSError:
            stat = None
        if stat is not None:  # renamed into place only once complete: the render finished before the restart
            expires = int(self._clock.now().timestamp()) + self._ttl_s
            out = Output(
                url=self.output_url(job_id, expires),
                content_type="video/mp4",
                expires_at=datetime.fromtimestamp(expires, UTC),
                size_bytes=stat.st_size,
            )
            return Observation(
                job_id=job_id,
                status=JobStatus.SUCCEEDED,
                progress=100,
                outputs=(out,),
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

    def _finish(self, job: _Job, status: JobStatus, code: str | None = None, message: str | None = None) -> None:
        job.status, job.error_code, job.error_message = status, code, message
        if status is JobStatus.SUCCEEDED:
            job.progress = 100
        job.updated_at = self._clock.now()
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
        work = self._work / job.job_id
        try:
            work.mkdir(parents=True, exist_ok=True)
            self._render(job, work)
        except Exception as exc:  # a bug or an OS error must still end the job in an explainable state
            log.exception("local render %s crashed", job.job_id)
            with self._lock:
                if job.status is JobStatus.RUNNING:
                    self._finish(job, JobStatus.FAILED, "render_crashed", f"{type(exc).__name__}: {exc}"[:200])
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _render(self, job: _Job, work: Path) -> None:
        caption, font = None, self._font_for(job.prompt)
        if font is not None:
            caption = work / "caption.txt"
            caption.write_text(render.caption_text(job.prompt, job.spec.width, job.spec.height), encoding="utf-8")
        partial = work / "out.mp4"
        argv = sandbox.prefix(sandbox.encoder_cpu_s(self._timeout_s), 2 * 1024**3) + render.clip_argv(
            job.spec, partial, image=job.image, caption_file=caption, font_file=font, ffmpeg_bin=self._ffmpeg
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        with open(work / "stderr.log", "wb") as errors:  # a file, not a pipe: a chatty ffmpeg cannot block
            try:
                child = sandbox.spawn(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, env=env, cwd=work
                )
            except sandbox.Interrupted:  # this process is stopping its children: not a verdict on the request
                with self._lock:
                    if job.status is JobStatus.RUNNING:
                        self._finish(
                            job,
                            JobStatus.ABORTED,
                            "render_interrupted",
                            "the render was not started: the engine is stopping",
                        )
                return
            except OSError as exc:
                with self._lock:
                    if job.status is JobStatus.RUNNING:
                        self._finish(job, JobStatus.FAILED, "ffmpeg_unavailable", str(exc)[:200])
                return
            with child:
                with self._lock:
                    job.process = child
                    if job.status is not JobStatus.RUNNING:  # canceled or closed between spawn and here
                        child.interrupt()
                watchdog = threading.Timer(self._timeout_s, child.expire)  # recorded as ours before the kill
                watchdog.daemon = True
                watchdog.start()
                try:
                    assert child.proc.stdout is not None
                    for line in child.proc.stdout:
                        if (percent := render.progress_percent(line, job.spec.duration_s)) is not None:
                            with self._lock:
                                job.progress = max(job.progress, percent)
                    code = child.wait()
                finally:
                    watchdog.cancel()
        ending = child.ending(code)
        with self._lock:
            job.process = None
            if job.status is not JobStatus.RUNNING:
                return
            if ending is sandbox.Ending.TIMEOUT:
                self._finish(job, JobStatus.FAILED, "render_timeout", f"render exceeded {self._timeout_s:g} s")
            elif ending is sandbox.Ending.INTERRUPTED:  # stopped, not failed: nothing to bill, submit again
                self._finish(job, JobStatus.ABORTED, "render_interrupted", f"the render was {child.describe(code)}")
            elif code != 0:
                reason = render.error_summary((work / "stderr.log").read_bytes(), (work, job.image))
                self._finish(job, JobStatus.FAILED, "render_failed", reason or f"ffmpeg exited with {code}")
            else:
                final = self.root / f"{job.job_id}.mp4"
                os.replace(partial, final)
                job.size_bytes = final.stat().st_size
                self._finish(job, JobStatus.SUCCEEDED)

    def _font_for(self, prompt: str) -> Path | None:
        if self._font is not None and render.needs_cjk(prompt):
            return render.pick_font(render.CJK_FONT_CANDIDATES) or self._font
        return self._font

    # --- output serving --------------------------------------------------------------------------------------

    def _sign(self, job_id: str, expires: int) -> str:
        return hmac.new(self._key, f"{job_id}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def _authorize(self, raw_path: str) -> tuple[int, Path | None]:
        """(HTTP status, file): 404 for anything but an output path, 403 for a bad or expired signature."""
        parts = urlsplit(raw_path)
        match = _OUTPUT_PATH.fullmatch(parts.path)
        if match is None:
            return 404, None
        query = parse_qs(parts.query, keep_blank_values=True)
        expires, sig = query.get("expires", []), query.get("sig", [])
        if len(expires) != 1 or len(sig) != 1 or not expires[0].isdigit() or len(expires[0]) > 12:
            return 403, None
        if not hmac.compare_digest(sig[0], self._sign(match.group(1), int(expires[0]))):
            return 403, None
        if int(expires[0]) < self._clock.now().timestamp():
            return 403, None
        path = self.root / f"{match.group(1)}.mp4"
        return (200, path) if path.is_file() else (404, None)


class _OutputServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, provider: LocalProvider) -> None:
        self.provider = provider
        super().__init__(("127.0.0.1", 0), _OutputHandler)


class _OutputHandler(BaseHTTPRequestHandler):
    """GET of one finished output; no listing, no other files. Other methods get the stdlib's 501."""

    server: _OutputServer
    server_version = "aivedio-local"
    sys_version = ""

    def do_GET(self) -> None:  # stdlib naming
        failpoint("local.serve_output")  # tests hold a download here (a slow CDN) to stop the engine mid-fetch
        status, path = self.server.provider._authorize(self.path)
        try:
            handle = open(path, "rb") if path is not None else None  # noqa: SIM115 (closed below)
        except OSError:  # swept between the check and the open
            handle, status = None, 404
        if handle is None:
            self.send_error(status)
            return
        with handle:
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(os.fstat(handle.fileno()).st_size))
            self.send_header("Cache-Control", "private, no-store")
            self.end_headers()
            try:
                shutil.copyfileobj(handle, self.wfile, 256 * 1024)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; nothing to clean up

    def log_message(self, format: str, *args: object) -> None:
        pass  # request lines carry signed query strings, which must never reach logs


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
