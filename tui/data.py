"""Everything the screens read and change, as calls on the engine's services (the ones the CLI uses).

Screens never touch SQL: they call an `EngineData` method from a background worker and render what it returns.
Snapshot tests swap in an object with the same methods and fixed data (tests/tui/fixture_data.py), so the
screens and widgets that render are the real ones.

The overview reuses `observability.snapshot.read_snapshot` — the fact queries behind the Prometheus gauges —
inside the same short read-only transaction with a statement timeout that `metrics.DbCollector._read` opens;
that wrapper is private to the collector, so its three lines are repeated here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from aivedio_engine.db.alerts import open_alerts
from aivedio_engine.domain.status import AttemptStatus
from aivedio_engine.observability.snapshot import read_snapshot
from aivedio_engine.services.alert_ops import AlertChange, AlertOps, AlertView
from aivedio_engine.services.capacity_live import CapacityLiveService
from aivedio_engine.services.errors import IllegalState, ServiceError
from aivedio_engine.services.invariants import DEFAULT_GRACE_S, AuditReport, InvariantService
from aivedio_engine.services.ledger_ops import MANUAL_KEY_PREFIX, Balance, LedgerOps
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.reconcile_ops import Candidate, ReconcileOps
from aivedio_engine.services.replay import Preview, ReplayFilter, ReplayService
from aivedio_engine.services.review import ReviewService, ReviewView
from aivedio_engine.services.task_ops import TaskOps, TaskRow, Timeline

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.domain.capacity_live import LiveReport

#: rows a list screen loads; the TUI is a live view, not an export (the CLI's --limit/--json is for that)
LIST_LIMIT = 200
#: offending rows the audit screen keeps per violated check (all are counted)
AUDIT_ROWS = 100


@dataclass(frozen=True)
class ProviderLoad:
    name: str
    active: int
    limit: int | None
    unknown: int
    orphans: int


@dataclass(frozen=True)
class AlertLine:
    raised_at: datetime
    severity: str
    rule: str
    message: str
    #: the alert's id, so the overview can open it on the Alerts screen
    id: uuid.UUID | None = None


@dataclass(frozen=True)
class AuditRun:
    """One run of the invariant checks (`aivedio audit`), and when it ran."""

    at: datetime
    grace_s: float
    report: AuditReport


@dataclass(frozen=True)
class AlertQuery:
    """The `/` filter of the alerts screen: `status:` (unresolved, open, acknowledged, resolved, all),
    `severity:` and `rule:` go to the service like the CLI's flags; other words must all appear in a row."""

    status: str = "unresolved"
    severity: str | None = None
    rule: str | None = None
    words: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AlertQuery:
        fields_: dict[str, str] = {}
        words: list[str] = []
        for token in text.split():
            key, sep, value = token.partition(":")
            if sep and key.lower() in ("status", "severity", "rule") and value:
                fields_[key.lower()] = value.lower() if key.lower() != "rule" else value
            else:
                words.append(token.lower())
        return cls(words=tuple(words), **fields_)

    def keeps(self, a: AlertView) -> bool:
        hay = " ".join(
            str(v).lower()
            for v in (a.id, a.rule, a.severity, a.status, a.subject_type, a.subject_id, a.message, a.acknowledged_by)
        )
        return all(w in hay for w in self.words)


@dataclass(frozen=True)
class Overview:
    """The operational figures of seed 000 §4.10.7 as the metrics endpoint reads them."""

    now: datetime
    #: unfinished tasks by status (finished ones are not counted: no index covers them, see snapshot.py)
    by_status: dict[str, int]
    queue_depth: int
    queue_p95_age_s: float | None
    queue_oldest_age_s: float | None
    submit_unknown: int
    outbox_due: int
    outbox_oldest_age_s: float | None
    dead_letters: int
    orphans: int
    reserved_credits: float
    reserved_oldest_age_s: float | None
    providers: list[ProviderLoad]
    alerts: list[AlertLine] = field(default_factory=list)


@dataclass(frozen=True)
class AssetFacts:
    """The probe facts of a review item's output, and where its thumbnail is."""

    asset_id: uuid.UUID | None
    mime: str | None
    duration_ms: int | None
    size_bytes: int | None
    width: int | None
    height: int | None
    status: str | None
    thumbnail: str | None  # a local path (fs store) or bucket/key; None when no READY thumbnail exists


@dataclass(frozen=True)
class TaskQuery:
    """The `/` filter of the tasks screen: `status:`, `tenant:`, `provider:` go to the service (exact, like the
    CLI flags); any other words must all appear in a row's status, tenant, provider, model or id."""

    status: str | None = None
    tenant: str | None = None
    provider: str | None = None
    words: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> TaskQuery:
        fields_: dict[str, str] = {}
        words: list[str] = []
        for token in text.split():
            key, sep, value = token.partition(":")
            if not sep:
                key, sep, value = token.partition("=")
            if sep and key.lower() in ("status", "tenant", "provider") and value:
                fields_[key.lower()] = value
            else:
                words.append(token.lower())
        return cls(words=tuple(words), **fields_)

    def keeps(self, row: TaskRow) -> bool:
        hay = " ".join(str(v).lower() for v in (row.status, row.tenant, row.provider, row.model, row.task_id))
        return all(w in hay for w in self.words)


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


class EngineData:
    """The TUI's window on one `AppContext`. Every method blocks (database, provider calls): call it from a
    thread worker, never from the event loop."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self._tasks = TaskOps(ctx.engine, ctx.clock)
        self._review = ReviewService(ctx.engine, ctx.clock)
        self._replay = ReplayService(ctx.engine, ctx.clock)
        self._ledger = LedgerOps(ctx.engine, ctx.clock)
        self._alerts = AlertOps(ctx.engine, ctx.clock)

    @property
    def describe(self) -> str:
        """Where the data comes from, for the header (never the DSN: it may carry a password)."""
        s = self.ctx.settings
        return f"{s.mode} · {'postgresql' if s.is_postgres else 'sqlite'}"

    # --- overview ---------------------------------------------------------------------------------------------

    def overview(self) -> Overview:
        settings, now = self.ctx.settings, self.ctx.clock.now()
        with self.ctx.engine.connect() as conn, conn.begin():
            if conn.dialect.name == "postgresql":  # the overview refreshes every few seconds: never let it pile up
                conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(settings.metrics.query_timeout_ms)}"))
            snap = read_snapshot(conn, settings, now)
            alert_rows = open_alerts(conn)
        by_status: dict[str, int] = {}
        for (status, _provider), n in snap.tasks.items():
            by_status[status] = by_status.get(status, 0) + n
        active: dict[str, int] = {}
        unknown: dict[str, int] = {}
        for (provider, state), n in snap.attempts.items():
            active[provider] = active.get(provider, 0) + n
            if state == AttemptStatus.UNKNOWN.value:
                unknown[provider] = unknown.get(provider, 0) + n
        limits = {name: p.max_concurrency for name, p in settings.providers.items() if p.enabled}
        names = sorted({*limits, *active, *snap.orphans})
        providers = [
            ProviderLoad(n, active.get(n, 0), limits.get(n), unknown.get(n, 0), snap.orphans.get(n, 0)) for n in names
        ]
        alerts = [AlertLine(r.raised_at, r.severity, r.rule, r.message, r.id) for r in reversed(alert_rows[-50:])]
        return Overview(
            now=now,
            by_status=dict(sorted(by_status.items())),
            queue_depth=by_status.get("QUEUED", 0),
            queue_p95_age_s=_age(now, snap.queue_p95),
            queue_oldest_age_s=_age(now, snap.queue_oldest),
            submit_unknown=sum(unknown.values()),
            outbox_due=int(snap.outbox_due or 0),
            outbox_oldest_age_s=_age(now, snap.outbox_oldest),
            dead_letters=int(snap.dead_letters),
            orphans=sum(snap.orphans.values()),
            reserved_credits=float(snap.reserved_credits),
            reserved_oldest_age_s=_age(now, snap.reserved_oldest),
            providers=providers,
            alerts=alerts,
        )

    # --- tasks ------------------------------------------------------------------------------------------------

    def tasks(self, query: TaskQuery) -> list[TaskRow]:
        rows = self._tasks.list(status=query.status, tenant=query.tenant, provider=query.provider, limit=LIST_LIMIT)
        return [r for r in rows if query.keeps(r)]

    def timeline(self, task_id: uuid.UUID) -> Timeline:
        return self._tasks.timeline(task_id)

    def cancel(self, task_id: uuid.UUID, op: Operation) -> str:
        r = self._tasks.cancel(task_id, op)
        return f"task {r.task_id}: {r.outcome.replace('_', ' ')} ({r.from_status} → {r.to_status})"

    # --- review -----------------------------------------------------------------------------------------------

    def review_items(self) -> list[ReviewView]:
        """Open items (pending, or claimed) oldest first: the queue a reviewer works through."""
        return [i for i in self._review.list(None, limit=LIST_LIMIT) if i.state in ("pending", "claimed")]

    def review_facts(self, item: ReviewView) -> AssetFacts:
        timeline = self._tasks.timeline(item.task_id)
        output = next((i for i in timeline.items if i["kind"] == "asset" and i["id"] == item.asset_id), None)
        facts = {
            k: output[k] if output else None for k in ("mime", "duration_ms", "size_bytes", "width", "height", "status")
        }
        return AssetFacts(
            asset_id=item.asset_id, **facts, thumbnail=self._thumbnail(timeline.task["tenant_id"], item.task_id)
        )

    def _thumbnail(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> str | None:
        found = self.ctx.outputs.files(tenant_id, task_id).get("thumbnail")
        if found is None:
            return None
        try:
            return str(self.ctx.outputs.local_paths(tenant_id, task_id)["thumbnail"])
        except (ValueError, KeyError):  # an s3 store: the object key is what an operator can fetch
            return f"{self.ctx.settings.storage.bucket}/{found.key}"

    def claim(self, item_id: uuid.UUID, op: Operation) -> str:
        v = self._review.claim(item_id, op.actor, op)
        until = v.claimed_until.strftime("%H:%M:%S") if v.claimed_until else "?"
        return f"claimed review item {v.id} until {until}"

    def approve(self, item_id: uuid.UUID, op: Operation) -> str:
        d = self._review.approve(item_id, op.actor, op)
        return f"approved: task {d.item.task_id} → {d.task_status}"

    def reject(self, item_id: uuid.UUID, op: Operation) -> str:
        d = self._review.reject(item_id, op.actor, op)
        return f"rejected: task {d.item.task_id} → {d.task_status}"

    # --- SUBMIT_UNKNOWN ---------------------------------------------------------------------------------------

    def unknown(self) -> list[Candidate]:
        return self._reconcile().candidates(limit=LIST_LIMIT)

    def reconcile(self, task_ids: Sequence[uuid.UUID], op: Operation) -> str:
        outcomes = self._reconcile().run(op, list(task_ids))
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.result] = counts.get(o.result, 0) + 1
        return "reconciled: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing to do")

    def _reconcile(self) -> ReconcileOps:
        # built per call: `sync` builds the provider registry, which a read-only session may never need
        return ReconcileOps(self.ctx.engine, self.ctx.clock, self.ctx.sync)

    # --- dead letters, orphans, DEAD outbox rows --------------------------------------------------------------

    def replay_list(self, kind: str) -> Preview:
        return self._replay.preview(kind, ReplayFilter(limit=LIST_LIMIT))  # type: ignore[arg-type]

    def replay(self, kind: str, ids: Sequence[str], op: Operation) -> str:
        r = self._replay.replay(kind, list(ids), op)  # type: ignore[arg-type]
        parts = [f"done={len(r.done)}", f"skipped={len(r.skipped)}", f"failed={len(r.failed)}"]
        if kind == "orphans":
            parts.append(f"still orphan={len(r.still_orphan)}")
        return f"replay {kind}: {r.outcome} ({', '.join(parts)})"

    # --- ledger and capacity ----------------------------------------------------------------------------------

    def balances(self) -> list[Balance]:
        return [self._ledger.balance(str(t.id)) for t in self.ctx.tenants.list()[:LIST_LIMIT]]

    def entries(self, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
        return self._ledger.entries(str(tenant_id), limit=LIST_LIMIT)

    def adjust(self, tenant_id: uuid.UUID, amount: Decimal, key: str, task_id: uuid.UUID | None, op: Operation) -> str:
        """Book one ADJUSTMENT (`aivedio ledger adjust`); a refusal is re-raised saying so."""
        try:
            r = self._ledger.adjust(str(tenant_id), amount, key, op, task_id=task_id)
        except ServiceError as exc:
            text = str(exc)
            raise type(exc)(text if text.startswith("refused") else f"refused: {text}", **exc.extra) from exc
        shown_key = r.business_key.removeprefix(MANUAL_KEY_PREFIX)
        if r.outcome == "duplicate":
            return (
                f"duplicate: business key {shown_key!r} is already booked for {r.tenant}; nothing changed "
                f"(balance {fmt_money(r.balance_after)})"
            )
        return (
            f"booked {fmt_money(r.amount)} credits for {r.tenant} under {shown_key!r}: balance "
            f"{fmt_money(r.balance_before)} → {fmt_money(r.balance_after)}"
        )

    def capacity(self, window_s: float) -> LiveReport:
        return CapacityLiveService(self.ctx.engine, self.ctx.clock, self.ctx.settings).report(window_s)

    # --- invariant audit --------------------------------------------------------------------------------------

    def audit(self, grace_s: float = DEFAULT_GRACE_S) -> AuditRun:
        at = self.ctx.clock.now()
        report = InvariantService(self.ctx.engine, self.ctx.clock).run(grace_s=grace_s, limit=AUDIT_ROWS)
        return AuditRun(at, grace_s, report)

    # --- alerts -----------------------------------------------------------------------------------------------

    def alerts(self, query: AlertQuery) -> list[AlertView]:
        rows = self._alerts.list(query.status, query.rule, query.severity, limit=LIST_LIMIT)
        return [a for a in rows if query.keeps(a)]

    def acknowledge(self, ids: Sequence[uuid.UUID], op: Operation) -> str:
        return _change_text("acknowledged", self._alerts.acknowledge(list(ids), op))

    def resolve(self, ids: Sequence[uuid.UUID], op: Operation) -> str:
        return _change_text("resolved", self._alerts.resolve(list(ids), op))


def _change_text(verb: str, change: AlertChange) -> str:
    text = f"{verb} {len(change.changed)} alert(s)"
    if change.skipped:
        why = sorted({w for _, w in change.skipped})
        text += f"; left {len(change.skipped)} alone ({', '.join(why)})"
    if change.refused:
        text += f"; refused {len(change.refused)}: {change.refused[0][1]}"
        if not change.changed:  # nothing happened: shown as a failed change, not as news
            raise IllegalState(text)
    return text


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def fmt_money(value: Decimal | float) -> str:
    return f"{Decimal(str(value)).normalize():f}"


def short_path(path: str | None, keep: int = 60) -> str:
    if not path:
        return "-"
    return path if len(path) <= keep else "…" + str(Path(path))[-(keep - 1) :]
