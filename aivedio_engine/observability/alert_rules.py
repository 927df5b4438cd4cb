"""Alert rules over live data: facts from SQL, thresholds from `[alerts]`, rows in `alerts`.

`gather` reads the facts (index-backed aggregates, see `snapshot`), `evaluate` is pure (facts + thresholds →
findings) and `AlertEvaluator` — called by the sweeper, at most every `alerts.interval_s` — writes each finding
with `alerts.raise_alert`, whose dedup key keeps one open alert per rule and subject: a condition that holds
on the next evaluation only moves its `last_seen_at`. Alerts are closed by people (acknowledged, resolved),
not by the rule going quiet, so a flapping condition cannot hide — except role_missing, which closes itself when a
process of the role is alive again (each new absence is a new alert, so a flapping role still shows).

The rules:
- failed tasks: tasks reaching FAILED_FINAL or EXPIRED within `window_s` reach `failed_tasks`;
- provider failing in a row: a provider's newest `provider_consecutive_failures` finished attempts all failed;
- queue backlog: QUEUED tasks reach `queue_depth`, or the oldest has waited `queue_age_s`;
- media failure rate: of the media steps finished within `window_s` (at least `media_min_samples`), the share
  that failed (FAILED_FINAL, or held for a human because processing failed) reaches `media_failure_rate`;
- cost anomaly, per project (per tenant for tasks without one): the credits committed in the last hour (ledger:
  reservations net of releases and refunds) exceed `cost_budget_per_hour`, or exceed `cost_factor` × the hourly
  mean of the 24 hours before while being at least `cost_min_per_hour`;
- System B workflows (is about them): steps that failed for good or went to a person within `window_s`
  reach `failed_tasks`; each workflow queue's due steps reach `queue_depth` or the longest-waiting has been due
  `queue_age_s`; of the composition runs ended within `window_s` (at least `media_min_samples`), the share that
  did not succeed reaches `media_failure_rate`; a project's actual cost (the sum of its steps') exceeds
  `cost_factor` × its estimate. A provider failing in a row is the rule above: vendor steps run as generation
  tasks, so their attempts are among the provider's;
- storage capacity: a local data path (data dir; the object store root for `fs`) has less than `min_free_bytes`
  or `min_free_ratio` free. An S3 bucket has no capacity to read through its API, so it is not checked;
- role missing: a required role (relay, worker, scheduler, sweeper) has no live process, and its newest heartbeat
  (a process that stopped cleanly included) is `role_missing_s` old, while work waits for it (heartbeats,
  `services.liveness`); it closes itself once a process of the role is alive. Every role process checks this
  rule from its heartbeat thread (not the sweeper's pass), so a missing sweeper is reported by whoever still runs;
- motion (issue 14): one alert per subject of the audit's I2.4, I2.5, I7.4 and I10.3 once the sweeper's own
  repair had its budget (`services.invariants_motion.findings`);
- callback verification: a provider's callbacks failed verification (`callback_rejections`, written by
  `services.callbacks`) at least `callback_verify_failures` times in one fixed window of
  `callback_verify_window_s`. The current and the previous window are read, so a window that fills up between two
  evaluations is still seen; the audit's I10.4 checks that each such window got its alert.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aivedio_engine.db import alert_facts
from aivedio_engine.db import callback_rejections as rejections
from aivedio_engine.db import workflows as wf_repo
from aivedio_engine.db.alert_facts import Spend
from aivedio_engine.db.alerts import Rule, raise_alert, resolve_open
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.snapshot import since_floor
from aivedio_engine.domain.status import AlertSeverity, AttemptStatus, TaskStatus
from aivedio_engine.domain.workflow import StepType
from aivedio_engine.observability.snapshot import storage_usage
from aivedio_engine.services.liveness import RoleView

if TYPE_CHECKING:
    from collections.abc import Callable

    from aivedio_engine.clock import Clock
    from aivedio_engine.config import AlertSettings, Settings
    from aivedio_engine.db.handles import Connection, Engine
    from aivedio_engine.services.liveness import LivenessService

FAILED_ATTEMPT = frozenset({AttemptStatus.FAILED.value, AttemptStatus.FAILED_BEFORE_ACCEPT.value})
#: a provider's failure streak is looked for among attempts created this recently
STREAK_WINDOW_S = 86_400


@dataclass(frozen=True)
class Facts:
    failed_tasks: int = 0
    provider_streaks: dict[str, int] = field(default_factory=dict)  # failed finished attempts in a row, newest first
    queue_depth: int = 0
    queue_oldest_age_s: float = 0.0
    media_finished: int = 0
    media_failed: int = 0
    spend: list[Spend] = field(default_factory=list)
    disks: dict[str, tuple[int, int]] = field(default_factory=dict)  # path → (free bytes, total bytes)
    failed_steps: int = 0
    step_queues: dict[str, tuple[int, float]] = field(default_factory=dict)  # queue → (due steps, oldest age s)
    composition_finished: int = 0
    composition_failed: int = 0
    project_costs: list[wf_repo.ProjectCost] = field(default_factory=list)
    roles: list[RoleView] = field(default_factory=list)  # liveness of each role and the work waiting for it
    #: provider → (failed verifications, their reasons) in its fuller window of the current and the previous one
    callback_failures: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    rule: Rule
    severity: AlertSeverity
    dedup_key: str
    message: str
    subject_type: str | None = None
    subject_id: str | None = None
    details: dict[str, Any] | None = None


def evaluate(f: Facts, cfg: AlertSettings) -> list[Finding]:
    """The findings the facts give under the thresholds; pure."""
    out: list[Finding] = []
    window = _span(cfg.window_s)
    if f.failed_tasks >= cfg.failed_tasks:
        out.append(
            Finding(
                Rule.FAILED_TASKS_HIGH,
                AlertSeverity.WARNING,
                "all",
                f"{f.failed_tasks} tasks failed in the last {window} (threshold {cfg.failed_tasks})",
                details={"failed": f.failed_tasks, "window_s": cfg.window_s},
            )
        )
    for provider, streak in sorted(f.provider_streaks.items()):
        if streak >= cfg.provider_consecutive_failures:
            out.append(
                Finding(
                    Rule.PROVIDER_CONSECUTIVE_FAILURES,
                    AlertSeverity.CRITICAL,
                    provider,
                    f"provider {provider}: the last {streak} finished attempts all failed",
                    subject_type="provider",
                    subject_id=provider,
                    details={"streak": streak},
                )
            )
    if f.queue_depth >= cfg.queue_depth or (f.queue_depth and f.queue_oldest_age_s >= cfg.queue_age_s):
        out.append(
            Finding(
                Rule.QUEUE_BACKLOG,
                AlertSeverity.WARNING,
                "queued",
                f"{f.queue_depth} tasks queued, the oldest for {_span(f.queue_oldest_age_s)} "
                f"(thresholds {cfg.queue_depth} tasks, {_span(cfg.queue_age_s)})",
                details={"depth": f.queue_depth, "oldest_age_s": round(f.queue_oldest_age_s, 1)},
            )
        )
    if f.media_finished >= cfg.media_min_samples and f.media_failed / f.media_finished >= cfg.media_failure_rate:
        out.append(
            Finding(
                Rule.MEDIA_FAILURE_RATE,
                AlertSeverity.WARNING,
                "media",
                f"{f.media_failed} of {f.media_finished} media steps failed in the last {window} "
                f"(threshold {cfg.media_failure_rate:.0%})",
                details={"failed": f.media_failed, "finished": f.media_finished},
            )
        )
    for s in f.spend:
        reason = _cost_reason(s, cfg)
        if reason:
            subject_type, subject_id = ("project", s.project_id) if s.project_id else ("tenant", s.tenant_id)
            out.append(
                Finding(
                    Rule.COST_ANOMALY,
                    AlertSeverity.CRITICAL,
                    f"{subject_type}:{subject_id}",
                    f"{subject_type} {subject_id}: {_num(s.last_hour)} credits committed in the last hour, {reason}",
                    subject_type=subject_type,
                    subject_id=subject_id,
                    details={
                        "tenant_id": s.tenant_id,
                        "last_hour": _num(s.last_hour),
                        "baseline_per_hour": _num(s.baseline_per_hour),
                    },
                )
            )
    out += _workflow_findings(f, cfg)
    for provider, (failures, reasons) in sorted(f.callback_failures.items()):
        if failures >= cfg.callback_verify_failures:
            out.append(
                Finding(
                    Rule.CALLBACK_VERIFY_FAILURES,
                    AlertSeverity.WARNING,
                    provider,
                    f"provider {provider}: {failures} callbacks failed verification within "
                    f"{_span(cfg.callback_verify_window_s)} ({reasons}): its webhook secret may differ from ours, "
                    f"or someone else calls /v1/callbacks/{provider}; its jobs are followed by polling meanwhile",
                    subject_type="provider",
                    subject_id=provider,
                    details={"failures": failures, "reasons": reasons.split(",")},
                )
            )
    for path, (free, total) in sorted(f.disks.items()):
        if free < cfg.min_free_bytes or (total and free / total < cfg.min_free_ratio):
            out.append(
                Finding(
                    Rule.STORAGE_CAPACITY_LOW,
                    AlertSeverity.CRITICAL,
                    path[-255:],
                    f"{path}: {free / 1024**3:.1f} GiB free of {total / 1024**3:.1f} GiB",
                    subject_type="path",
                    subject_id=path[-128:],
                    details={"free": free, "total": total},
                )
            )
    out += role_findings(f.roles, cfg)
    return out


def role_findings(roles: list[RoleView], cfg: AlertSettings) -> list[Finding]:
    """role_missing (`RoleView.missing`): only while work waits, a quiet system without a worker is not an
    incident; the age given is that of the role's newest heartbeat, whichever process wrote it."""
    out = []
    for r in roles:
        if not r.missing(cfg.role_missing_s):
            continue
        age = None if r.newest_age_s is None else round(r.newest_age_s, 1)
        out.append(
            Finding(
                Rule.ROLE_MISSING,
                AlertSeverity.CRITICAL,
                r.role,
                f"no {r.role} alive ({r.seen}) while {r.waiting} item(s) wait for it: start `aivedio serve --role "
                f"{r.role}`",
                subject_type="role",
                subject_id=r.role,
                details={"waiting": r.waiting, "last_seen_age_s": age},
            )
        )
    return out


def _workflow_findings(f: Facts, cfg: AlertSettings) -> list[Finding]:
    out: list[Finding] = []
    window = _span(cfg.window_s)
    if f.failed_steps >= cfg.failed_tasks:
        out.append(
            Finding(
                Rule.FAILED_STEPS_HIGH,
                AlertSeverity.WARNING,
                "all",
                f"{f.failed_steps} workflow steps failed or went to review in the last {window} "
                f"(threshold {cfg.failed_tasks})",
                details={"failed": f.failed_steps, "window_s": cfg.window_s},
            )
        )
    for queue, (due, age) in sorted(f.step_queues.items()):
        if due >= cfg.queue_depth or (due and age >= cfg.queue_age_s):
            out.append(
                Finding(
                    Rule.QUEUE_BACKLOG,
                    AlertSeverity.WARNING,
                    f"workflow:{queue}",
                    f"workflow queue {queue}: {due} steps due, the oldest for {_span(age)} "
                    f"(thresholds {cfg.queue_depth} steps, {_span(cfg.queue_age_s)})",
                    subject_type="workflow_queue",
                    subject_id=queue,
                    details={"due": due, "oldest_age_s": round(age, 1)},
                )
            )
    done, failed = f.composition_finished, f.composition_failed
    if done >= cfg.media_min_samples and failed / done >= cfg.media_failure_rate:
        out.append(
            Finding(
                Rule.COMPOSITION_FAILURE_RATE,
                AlertSeverity.WARNING,
                "composition",
                f"{failed} of {done} composition runs failed in the last {window} "
                f"(threshold {cfg.media_failure_rate:.0%})",
                details={"failed": failed, "finished": done},
            )
        )
    factor = Decimal(str(cfg.cost_factor))
    for c in f.project_costs:
        if c.estimate > 0 and c.actual > factor * c.estimate:
            out.append(
                Finding(
                    Rule.COST_ANOMALY,
                    AlertSeverity.CRITICAL,
                    f"project:{c.project_id}",
                    f"project {c.project_id}: its steps cost {_num(c.actual)} credits, over {cfg.cost_factor:g} × "
                    f"its estimate of {_num(c.estimate)}",
                    subject_type="project",
                    subject_id=str(c.project_id),
                    details={"tenant_id": str(c.tenant_id), "actual": _num(c.actual), "estimate": _num(c.estimate)},
                )
            )
    return out


def _cost_reason(s: Spend, cfg: AlertSettings) -> str | None:
    if cfg.cost_budget_per_hour > 0 and s.last_hour > cfg.cost_budget_per_hour:
        return f"over the budget of {_num(cfg.cost_budget_per_hour)} per hour"
    # a subject without history has no baseline to deviate from; the budget covers it
    if (
        s.baseline_per_hour > 0
        and s.last_hour >= cfg.cost_min_per_hour
        and s.last_hour > Decimal(str(cfg.cost_factor)) * s.baseline_per_hour
    ):
        return f"over {cfg.cost_factor:g} × its hourly mean of {s.baseline_per_hour:.2f} the day before"
    return None


def _num(d: Decimal) -> str:
    return format(d.normalize(), "f")  # ledger amounts carry 8 decimals: "6", not "6.00000000"


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def gather(conn: Connection, settings: Settings, now: datetime) -> Facts:
    """The facts the rules need, read on one connection."""
    cfg = settings.alerts
    since, floor = since_floor(now, cfg.window_s)
    failed = alert_facts.failed_tasks_since(conn, since, floor)
    media_finished = media_failed = 0
    for ends in alert_facts.media_ends_since(conn, since, floor):
        if ends.to_status in (
            TaskStatus.SUCCEEDED.value,
            TaskStatus.FAILED_FINAL.value,
            TaskStatus.MANUAL_REVIEW.value,
        ):
            media_finished += ends.count
            media_failed += ends.count if ends.to_status == TaskStatus.FAILED_FINAL.value else ends.held_for_failure
    depth, oldest = alert_facts.queued_tasks(conn)
    return Facts(
        failed_tasks=failed,
        provider_streaks=_streaks(conn, settings, now),
        queue_depth=depth,
        queue_oldest_age_s=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
        media_finished=media_finished,
        media_failed=media_failed,
        spend=alert_facts.spend(conn, now),
        callback_failures=_callback_failures(conn, cfg, now),
        disks={p: (u.free, u.total) for p, u in storage_usage(settings).items()},
        **_workflow_facts(conn, now, since, floor),
    )


def _callback_failures(conn: Connection, cfg: AlertSettings, now: datetime) -> dict[str, tuple[int, str]]:
    """Per provider, the fuller of its current and previous windows of failed callback verifications."""
    window = cfg.callback_verify_window_s
    since = rejections.window_start(now, window) - timedelta(seconds=window)
    fullest: dict[str, tuple[int, str]] = {}
    for row in rejections.recent_windows(conn, since):
        if row.failures > fullest.get(row.provider, (0, ""))[0]:
            fullest[row.provider] = (int(row.failures), ",".join(sorted(set(row.reasons.split(",")))))
    return fullest


def _workflow_facts(conn: Connection, now: datetime, since: datetime, floor: Any) -> dict[str, Any]:
    done, failed = wf_repo.run_outcomes_since(conn, StepType.COMPOSITION, since, floor)
    return {
        "failed_steps": wf_repo.failed_steps_since(conn, since, floor),
        "step_queues": {
            b.queue: (b.due, max(0.0, (now - b.oldest_due_at).total_seconds()) if b.oldest_due_at else 0.0)
            for b in wf_repo.backlog(conn, now)
        },
        "composition_finished": done,
        "composition_failed": failed,
        "project_costs": wf_repo.project_costs(conn, since),
    }


def _streaks(conn: Connection, settings: Settings, now: datetime) -> dict[str, int]:
    """Per provider: how many of its newest finished attempts failed before the first success (capped at the
    threshold, which is all the rule needs to know)."""
    limit = settings.alerts.provider_consecutive_failures
    _, floor = since_floor(now, STREAK_WINDOW_S)
    out = {}
    for provider in sorted(p for p, c in settings.providers.items() if c.enabled):
        streak = 0
        for state in alert_facts.newest_finished_attempts(conn, provider, floor, limit):
            if state not in FAILED_ATTEMPT:
                break
            streak += 1
        out[provider] = streak
    return out


class AlertEvaluator:
    """The sweeper's hook: evaluate the rules at most every `alerts.interval_s` and record what fires."""

    def __init__(
        self, engine: Engine, clock: Clock, settings: Settings, liveness: Callable[[], LivenessService]
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        #: late-bound (the context's shared one): built on first evaluation, not with the sweeper
        self._liveness = liveness
        self._last: datetime | None = None
        self._last_roles: datetime | None = None

    def __call__(self) -> int:
        cfg = self._settings.alerts
        now = self._clock.now()
        if not cfg.enabled or (self._last is not None and (now - self._last).total_seconds() < cfg.interval_s):
            return 0
        self._last = now
        return len(self.evaluate_now())

    def evaluate_now(self) -> list[Finding]:
        """Evaluate and record now, whatever the interval (an operator's command, a test)."""
        now = self._clock.now()
        from aivedio_engine.services.invariants_motion import findings as motion_findings

        with self._engine.connect() as conn:
            facts = gather(conn, self._settings, now)
            motion = motion_findings(conn, self._settings, now)
        # role_missing is not evaluated here but by `roles_if_due` on the heartbeat thread of every role process:
        # only a process that writes heartbeats itself runs inside a deployment whose heartbeats mean something
        # (a sweeper driven by hand, as in tests and tools, would report every other role missing)
        return self._record(evaluate(facts, self._settings.alerts) + motion, now)

    def roles_if_due(self) -> int:
        """role_missing alone, at most every `alerts.interval_s`: the heartbeat thread of every role process
        calls it, so the rule holds even when the sweeper (which evaluates the others) is the missing role."""
        cfg = self._settings.alerts
        now = self._clock.now()
        if not cfg.enabled or (
            self._last_roles is not None and (now - self._last_roles).total_seconds() < cfg.interval_s
        ):
            return 0
        self._last_roles = now
        roles = self._liveness().report().roles
        # a role with a live process again closes its alert: the condition is presence, and an alert left open
        # after the role came back would be read as the next outage (a new absence raises a new one)
        back = [r.role for r in roles if r.alive]
        with write_tx(self._engine) as conn:
            resolve_open(conn, Rule.ROLE_MISSING, back, now=now)
        return len(self._record(role_findings(roles, cfg), now))

    def _record(self, findings: list[Finding], now: datetime) -> list[Finding]:
        if findings:
            with write_tx(self._engine) as conn:
                for f in findings:
                    raise_alert(
                        conn,
                        f.rule,
                        f.severity,
                        dedup_key=f.dedup_key,
                        message=f.message,
                        now=now,
                        subject_type=f.subject_type,
                        subject_id=f.subject_id,
                        details=f.details,
                    )
        return findings
