"""The simulated vendor: job state on an injectable clock, ground truth, and the FastAPI app in front of it.

Jobs move queued (or throttled) → running → succeeded/failed on the state's clock: a `SimClock` moves only when
a test calls `advance()`, a `RealClock` is driven by a ticker thread. Transitions are replayed in time order
even across a large `advance()`, so a slot freed at t hands over to the oldest waiting job at t, and
`max_concurrent_running` is exact.

Ground truth counts what a real vendor would invoice: every job created, per request key, billed or not.
Tests prove "no duplicate paid jobs" from it without trusting anything the engine says.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _secrets
import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aivedio_engine.providers.sim.callbacks import CallbackDispatcher
from aivedio_engine.providers.sim.faults import NO_FAULTS, Dice, Faults

ACTIVE = ("queued", "throttled", "running")
QUEUE_SHARE = 0.1  # of job_seconds spent queued; the rest running
THROTTLE_SHARE = 0.4  # a throttled job becomes runnable this far into its life


class SimClock:
    """Manual clock: time moves only on `advance()`; starts at whole seconds so timestamps stay readable."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC).replace(microsecond=0)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)


class RealClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    faults: Faults = NO_FAULTS
    job_seconds: float = 2.0
    #: lookup by request key, and dedupe of a repeated Idempotency-Key; off = a vendor without either
    lookup: bool = True
    #: `GET /v1/jobs?created_after=&created_before=` lists recent jobs, independent of `lookup` (Replicate can
    #: list but not look up by key); off by default so that `lookup=False` stays a vendor that can do neither
    listing: bool = False
    max_concurrency: int | None = None
    webhook_url: str | None = None
    webhook_secrets: tuple[str, ...] = ()
    output_url_ttl_s: float = 3600.0
    #: the bill a finished billed job reports: requested seconds × bill_factor (< 1 under-reports, > 1
    #: over-reports what was asked for), and `cost` = those seconds × cost_per_second, in the sim's currency
    bill_factor: float = 1.0
    cost_per_second: float = 0.05
    #: the billed outputs a finished billed job of n > 1 outputs reports (None: all n; fewer under-reports)
    billed_outputs: int | None = None


@dataclass(eq=False)
class Job:
    id: str
    seq: int
    request_key: str | None
    created_at: datetime
    ready_at: datetime
    request: dict[str, Any]
    callback_url: str | None
    status: str = "queued"
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    waiting: bool = False  # runnable but over the concurrency limit
    will_fail: bool = False
    billed: bool = True
    #: the sim gave the charge back: a job voided after it ended, or one its own moderation failed
    refunded: bool = False
    canceled: bool = False
    events: int = 0


@dataclass
class SubmitOutcome:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection instead of answering
    early: threading.Event | None = None  # wait for this callback delivery before answering


class SimState:
    def __init__(self, config: SimConfig | None = None, clock: SimClock | RealClock | None = None) -> None:
        self.config = self._initial = config or SimConfig()
        self.clock = clock or SimClock()
        self.base_url = "http://127.0.0.1"  # set by whoever binds the socket; output URLs point here
        self._lock = threading.RLock()
        self._url_key = _secrets.token_bytes(32)
        self.dispatcher = CallbackDispatcher(self)
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._reset_locked()

    # lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.dispatcher.start()
        if isinstance(self.clock, RealClock) and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick_loop, name="sim-ticker", daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        self.dispatcher.stop()
        if self._ticker is not None:
            self._ticker.join(timeout=5)

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.02):
            self.tick()

    def reset(self) -> None:
        """Forget every job, call count and pending callback, and go back to the configuration at start."""
        self.reinit(self._initial)

    def reinit(self, config: SimConfig, clock: SimClock | None = None) -> None:
        """Start over with a new configuration (and clock): one server can serve many tests in a row."""
        with self._lock:
            if clock is not None:
                if not isinstance(self.clock, SimClock):
                    raise RuntimeError("a real-clock sim keeps its clock")
                self.clock = clock
            self._initial = self.config = config
            self._reset_locked()
            self.dispatcher.forget_pending()

    def _reset_locked(self) -> None:
        self.dice = Dice(self.config.seed)
        self.jobs: dict[str, Job] = {}
        self.by_key: dict[str, list[Job]] = {}
        self.calls = {"submit": 0, "query": 0, "find": 0, "list": 0, "cancel": 0, "output": 0}
        self.max_running = 0
        self._seq = 0

    def set_faults(self, faults: Faults, seed: int | None = None) -> None:
        with self._lock:
            self.config = replace(self.config, faults=faults, seed=self.config.seed if seed is None else seed)
            if seed is not None:
                self.dice = Dice(seed)

    def configure(self, **changes: Any) -> None:
        """Change lookup, max_concurrency, job_seconds, webhook settings at runtime."""
        with self._lock:
            self.config = replace(self.config, **changes)
            now = self.clock.now()
            self._start_waiting(now)  # a raised limit frees slots right away
            self._advance_jobs(now)

    def advance(self, seconds: float) -> None:
        if not isinstance(self.clock, SimClock):
            raise RuntimeError("advance() needs a SimClock")
        self.clock.advance(seconds)
        self.tick()

    def tick(self) -> None:
        with self._lock:
            self._advance_jobs(self.clock.now())

    @property
    def faults(self) -> Faults:
        return self.config.faults

    # vendor operations ------------------------------------------------------------------------------------
    def submit(self, body: dict[str, Any], request_key: str | None) -> SubmitOutcome:
        f = self.faults
        # every submit rolls every submit fault, so one kind's stream never depends on another's outcomes
        rolls = {k: self.dice.roll(k, f.p(k)) for k in ("429", "5xx", "reset", "ambiguous", "early_cb")}
        with self._lock:
            self.calls["submit"] += 1
            now = self.clock.now()
            self._advance_jobs(now)
            if rolls["429"]:
                return SubmitOutcome(429, {"error": "rate_limited"}, {"Retry-After": f"{f.retry_after_s:g}"})
            if rolls["5xx"]:
                return SubmitOutcome(500, {"error": "internal"})
            if rolls["reset"]:
                return SubmitOutcome(502, {}, drop=True)
            error = _validate(body)
            if error:
                return SubmitOutcome(400, {"error": error})
            if request_key and self.config.lookup and self.by_key.get(request_key):
                existing = self.by_key[request_key][0]
                return SubmitOutcome(201, self._job_json(existing, now), {"Idempotent-Replayed": "true"})
            job = self._create(body, request_key, now)
            early = self.dispatcher.emit(job, self._job_json(job, now), urgent=True) if rolls["early_cb"] else None
            if early is None:
                self._emit(job, now)
            return SubmitOutcome(201, self._job_json(job, now), drop=rolls["ambiguous"], early=early)

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            self.calls["query"] += 1
            now = self.clock.now()
            self._advance_jobs(now)
            job = self.jobs.get(job_id)
            return self._job_json(job, now) if job and self._visible(job, now) else None

    def find(self, request_key: str) -> dict[str, Any] | None:
        with self._lock:
            self.calls["find"] += 1
            now = self.clock.now()
            self._advance_jobs(now)
            found = [j for j in self.by_key.get(request_key, []) if self._visible(j, now)]
            return self._job_json(found[0], now) if found else None

    def list_jobs(
        self, after: datetime | None, before: datetime | None, limit: int = 100, cursor: int | None = None
    ) -> dict[str, Any]:
        """Visible jobs created in [after, before), newest first, a page at a time; `next` is the cursor of the
        following page. Items echo the request the job was made from, but not the request key: a vendor that
        echoed it would offer lookup by key."""
        with self._lock:
            self.calls["list"] += 1
            now = self.clock.now()
            self._advance_jobs(now)
            jobs = sorted(
                (
                    j
                    for j in self.jobs.values()
                    if self._visible(j, now)
                    and (after is None or j.created_at >= after)
                    and (before is None or j.created_at < before)
                    and (cursor is None or j.seq < cursor)
                ),
                key=lambda j: j.seq,
                reverse=True,
            )
            page = jobs[:limit]
            return {
                "jobs": [
                    {
                        "id": j.id,
                        "created_at": _iso(j.created_at),
                        "status": j.status,
                        "request": {k: v for k, v in j.request.items() if k != "callback_url"},
                    }
                    for j in page
                ],
                "next": str(page[-1].seq) if len(jobs) > limit else None,
            }

    def cancel(self, job_id: str) -> tuple[int, dict[str, Any]]:
        too_late = self.dice.roll("cancel_too_late", self.faults.p("cancel_too_late"))
        with self._lock:
            self.calls["cancel"] += 1
            now = self.clock.now()
            self._advance_jobs(now)
            job = self.jobs.get(job_id)
            if job is None or not self._visible(job, now):
                return 404, {"error": "not_found"}
            if job.status in ACTIVE and too_late:
                self._finish(job, now, force_success=True)
            if job.status == "canceled":
                return 200, self._job_json(job, now)
            if job.status not in ACTIVE:
                return 409, {"error": "too_late", "status": job.status}
            was_running = job.status == "running"
            job.status, job.canceled, job.updated_at, job.finished_at = "canceled", True, now, now
            # billing rule of the sim: a cancel before the job ran costs nothing, after it started it is charged
            job.billed = job.started_at is not None
            self._emit(job, now)
            if was_running:
                self._start_waiting(now)
            return 200, self._job_json(job, now)

    def void(self, job_id: str) -> tuple[int, dict[str, Any]]:
        """Void a finished job and refund it, as a vendor does after the fact (a late moderation finding, a
        billing correction): the job's status stays, `refunded` becomes true and a status callback goes out."""
        with self._lock:
            now = self.clock.now()
            self._advance_jobs(now)
            job = self.jobs.get(job_id)
            if job is None:
                return 404, {"error": "not_found"}
            if job.status in ACTIVE:
                return 409, {"error": "not_finished", "status": job.status}
            if not job.refunded:
                job.refunded, job.updated_at = True, now
                self._emit(job, now)
            return 200, self._job_json(job, now)

    def output_allowed(self, job_id: str, expires: str, sig: str) -> int:
        """200 when the signed output URL is valid now, else the status a vendor CDN would answer."""
        with self._lock:
            self.calls["output"] += 1
            job = self.jobs.get(job_id)
            if job is None or job.status != "succeeded":
                return 404
            if not hmac.compare_digest(self._url_sig(job_id, expires), sig):
                return 403
            try:
                expired = self.clock.now().timestamp() > float(expires)
            except ValueError:
                return 403
            return 403 if expired else 200

    # ground truth --------------------------------------------------------------------------------------
    def truth(self) -> dict[str, Any]:
        with self._lock:
            self._advance_jobs(self.clock.now())
            by_key = {k: len(v) for k, v in self.by_key.items()}
            paid = {k: sum(1 for j in v if j.billed) for k, v in self.by_key.items()}
            return {
                "jobs": [
                    {
                        "id": j.id,
                        "request_key": j.request_key,
                        "created_at": _iso(j.created_at),
                        "billed": j.billed,
                        "status": j.status,
                        "canceled": j.canceled,
                    }
                    for j in self.jobs.values()
                ],
                "by_request_key": by_key,
                "duplicate_jobs": sum(n - 1 for n in by_key.values() if n > 1),
                "duplicate_paid_jobs": sum(n - 1 for n in paid.values() if n > 1),
                "max_concurrent_running": self.max_running,
                "running": sum(1 for j in self.jobs.values() if j.status == "running"),
                "calls": dict(self.calls),
                "callbacks": self.dispatcher.stats(),
                "seed": self.config.seed,
                "faults": self.config.faults.to_spec(),
                "lookup": self.config.lookup,
                "listing": self.config.listing,
                "now": _iso(self.clock.now()),
            }

    # internals -------------------------------------------------------------------------------------------
    def _create(self, body: dict[str, Any], request_key: str | None, now: datetime) -> Job:
        self._seq += 1
        throttled = self.dice.roll("throttled", self.faults.p("throttled"))
        prompt = str(body.get("prompt", ""))
        # "[moderation]": the sim's own moderation fails the job after charging it, and refunds it
        will_fail = self.dice.roll("fail", self.faults.p("fail")) or "[fail]" in prompt or "[moderation]" in prompt
        j = self.config.job_seconds
        job = Job(
            id=f"job_{self._seq:05d}_{self.dice.token('job_id'):012x}",
            seq=self._seq,
            request_key=request_key,
            created_at=now,
            updated_at=now,
            request=dict(body),
            callback_url=body.get("callback_url"),
            status="throttled" if throttled else "queued",
            will_fail=will_fail,
            ready_at=now + timedelta(seconds=j * (THROTTLE_SHARE if throttled else QUEUE_SHARE)),
        )
        self.jobs[job.id] = job
        if request_key:
            self.by_key.setdefault(request_key, []).append(job)
        return job

    def _visible(self, job: Job, now: datetime) -> bool:
        return (now - job.created_at).total_seconds() >= self.faults.invisible_s

    def _advance_jobs(self, now: datetime) -> None:
        run_s = timedelta(seconds=self.config.job_seconds * (1 - QUEUE_SHARE))
        while True:
            due: tuple[datetime, int, Job] | None = None
            for job in self.jobs.values():
                if job.status == "running":
                    assert job.started_at is not None  # _run sets it with the status
                    t = job.started_at + run_s
                elif job.status in ("queued", "throttled") and not job.waiting:
                    t = job.ready_at
                else:
                    continue
                if t <= now and (due is None or (t, job.seq) < due[:2]):
                    due = (t, job.seq, job)
            if due is None:
                return
            t, _, job = due
            if job.status == "running":
                self._finish(job, t)
            elif self._running() < (self.config.max_concurrency or 1 << 30):
                self._run(job, t)
            else:
                job.waiting = True
                if job.status != "throttled":  # over the vendor's concurrency: THROTTLED, like Runway
                    job.status, job.updated_at = "throttled", t
                    self._emit(job, t)

    def _running(self) -> int:
        return sum(1 for j in self.jobs.values() if j.status == "running")

    def _run(self, job: Job, t: datetime) -> None:
        job.status, job.started_at, job.updated_at, job.waiting = "running", t, t, False
        self.max_running = max(self.max_running, self._running())
        self._emit(job, t)

    def _finish(self, job: Job, t: datetime, force_success: bool = False) -> None:
        fail = job.will_fail and not force_success
        if job.started_at is None:
            job.started_at = t
        job.status = "failed" if fail else "succeeded"
        job.updated_at = job.finished_at = t
        if fail and "[moderation]" in str(job.request.get("prompt", "")):
            job.refunded = True  # charged, then given back: the vendor's moderation rejected the output
        elif fail:
            job.billed = False  # like fal and Replicate: a failed generation is not charged
        self._emit(job, t)
        self._start_waiting(t)

    def _start_waiting(self, t: datetime) -> None:
        limit = self.config.max_concurrency or 1 << 30
        for waiting in sorted((j for j in self.jobs.values() if j.waiting), key=lambda j: j.seq):
            if self._running() >= limit:
                return
            self._run(waiting, t)

    def _emit(self, job: Job, t: datetime) -> None:
        self.dispatcher.emit(job, self._job_json(job, t))

    def _job_json(self, job: Job, now: datetime) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": job.id,
            "status": job.status,
            "progress": self._progress(job, now),
            "created_at": _iso(job.created_at),
            "updated_at": _iso(job.updated_at or job.created_at),
            "request_key": job.request_key,
            "model": job.request.get("model"),
            "billed": job.billed,
        }
        if job.billed and job.status not in ACTIVE:
            seconds = round(float(job.request.get("duration_s") or 0) * self.config.bill_factor, 3)
            out["billed_seconds"] = seconds
            out["cost"] = round(seconds * self.config.cost_per_second, 8)
            if _outputs(job) > 1:
                billed = self.config.billed_outputs
                out["billed_outputs"] = _outputs(job) if billed is None else billed
        if job.refunded:
            out["refunded"] = True
        if job.status == "succeeded":
            ttl = self.faults.url_expire_s if self.faults.url_expire_s is not None else self.config.output_url_ttl_s
            expires = now + timedelta(seconds=ttl)
            exp = f"{expires.timestamp():.3f}"
            sig = self._url_sig(job.id, exp)
            out["output"] = {
                "url": f"{self.base_url}/outputs/{job.id}.mp4?expires={exp}&sig={sig}",
                "expires_at": _iso(expires),
                "content_type": "video/mp4",
            }
            if _outputs(job) > 1:  # every output, by index; `output` stays the first, as for one
                out["outputs"] = [
                    {
                        **out["output"],
                        "url": f"{self.base_url}/outputs/{job.id}-{i}.mp4?expires={exp}&sig={sig}",
                        "index": i,
                    }
                    if i
                    else {**out["output"], "index": 0}
                    for i in range(_outputs(job))
                ]
        elif job.status == "failed":
            out["error"] = (
                {"code": "moderation", "message": "the simulated vendor's moderation rejected the output"}
                if job.refunded
                else {"code": "generation_failed", "message": "the simulated model failed"}
            )
        return out

    def _progress(self, job: Job, now: datetime) -> int:
        if job.status == "succeeded":
            return 100
        if job.status != "running" or job.started_at is None:
            return 0
        run_s = self.config.job_seconds * (1 - QUEUE_SHARE)
        return max(0, min(99, int(100 * (now - job.started_at).total_seconds() / run_s)))

    def _url_sig(self, job_id: str, expires: str) -> str:
        return hmac.new(self._url_key, f"{job_id}:{expires}".encode(), hashlib.sha256).hexdigest()[:32]


def _outputs(job: Job) -> int:
    n = job.request.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4 else 1


def _validate(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
        return "prompt_required"
    if "[moderate]" in body["prompt"]:
        return "content_moderated"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model_required"
    duration = body.get("duration_s")
    if not isinstance(duration, int) or isinstance(duration, bool) or not 1 <= duration <= 60:
        return "invalid_duration"
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 4:
        return "invalid_n"
    return None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def create_app(state: SimState) -> Any:
    """The ASGI app serving `state` (routes live in `app.py`; imported lazily to keep FastAPI out of adapters)."""
    from aivedio_engine.providers.sim.app import create_app as _create_app

    return _create_app(state)
