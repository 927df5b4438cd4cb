"""Everything the screens read and change, as calls on the engine's services (the ones the CLI uses).

Screens never touch SQL: they call an `EngineData` method from a background worker and render what it returns.
Snapshot tests swap in an object with the same methods and fixed data (tests/tui/fixture_data.py), so the
screens and widgets that render are the real ones.

The overview's panels all come from `services.overview.OverviewService` (one read, one definition per count).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aivedio_engine.media.preview import Pixels, read_pixels
from aivedio_engine.services.alert_ops import AlertChange, AlertView
from aivedio_engine.services.errors import IllegalState, ServiceError
from aivedio_engine.services.invariants import DEFAULT_GRACE_S, AuditReport
from aivedio_engine.services.keep_moving import ObservationReplay
from aivedio_engine.services.ledger_ops import MANUAL_KEY_PREFIX, Balance
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.overview import Overview
from aivedio_engine.services.reconcile_ops import Candidate
from aivedio_engine.services.replay import Preview, ReplayFilter
from aivedio_engine.services.review import ReviewView
from aivedio_engine.services.task_ops import TaskRow, Timeline
from aivedio_engine.services.workflows import Project, ProjectView
from tui.preview import preview_box

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.domain.capacity_live import LiveReport

#: rows a list screen loads; the TUI is a live view, not an export (the CLI's --limit/--json is for that)
LIST_LIMIT = 200
#: tasks the `:` palette offers for one id prefix
PREFIX_HITS = 10
#: offending rows the audit screen keeps per violated check (all are counted)
AUDIT_ROWS = 100


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
    #: what the client asked for (None for a workflow step)
    prompt: str | None = None
    #: the thumbnail's pixels at preview size (None: no local thumbnail, or it could not be read)
    preview: Pixels | None = None
    #: the proxy MP4 on this machine (fs store), for the system player; None elsewhere
    proxy: str | None = None
    #: the thumbnail image file on this machine (fs store), for terminals that draw images; None elsewhere
    thumbnail_file: str | None = None


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


class EngineData:
    """The TUI's window on one `AppContext`. Every method blocks (database, provider calls): call it from a
    thread worker, never from the event loop."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    @property
    def describe(self) -> str:
        """Where the data comes from, for the header (never the DSN: it may carry a password)."""
        s = self.ctx.settings
        return f"{s.mode} · {'postgresql' if s.is_postgres else 'sqlite'}"

    # --- overview ---------------------------------------------------------------------------------------------

    def overview(self) -> Overview:
        return self.ctx.overview.read()

    # --- tasks ------------------------------------------------------------------------------------------------

    def tasks(self, query: TaskQuery) -> list[TaskRow]:
        rows = self.ctx.task_ops.list(
            status=query.status, tenant=query.tenant, provider=query.provider, limit=LIST_LIMIT
        )
        return [r for r in rows if query.keeps(r)]

    def timeline(self, task_id: uuid.UUID) -> Timeline:
        return self.ctx.task_ops.timeline(task_id)

    def cancel(self, task_id: uuid.UUID, op: Operation) -> str:
        r = self.ctx.task_ops.cancel(task_id, op)
        return f"task {r.task_id}: {r.outcome.replace('_', ' ')} ({r.from_status} → {r.to_status})"

    # --- projects (System B) ----------------------------------------------------------------------------------

    def projects(self) -> list[Project]:
        """Every tenant's projects, newest first."""
        return self.ctx.workflows.list_projects(None, LIST_LIMIT)

    def project(self, project_id: uuid.UUID) -> ProjectView:
        return self.ctx.workflows.get(project_id)

    def retry_step(self, project_id: uuid.UUID, step_key: str, op: Operation) -> str:
        s = self.ctx.project_ops.retry_step(project_id, step_key, op)
        return f"step {s.step_key}: {s.status} again (retry budget reset)"

    def approve_step(self, project_id: uuid.UUID, step_key: str, op: Operation) -> str:
        s = self.ctx.project_ops.approve_step(project_id, step_key, op)
        return f"step {s.step_key}: approved → {s.status}"

    # --- review -----------------------------------------------------------------------------------------------

    def review_items(self) -> list[ReviewView]:
        """Open items (pending, or claimed) oldest first: the queue a reviewer works through."""
        return [i for i in self.ctx.review.list(None, limit=LIST_LIMIT) if i.state in ("pending", "claimed")]

    def review_facts(self, item: ReviewView) -> AssetFacts:
        if item.task_id is None:  # a workflow step: its facts are on the projects screen
            return AssetFacts(item.asset_id, None, None, None, None, None, None, None)
        timeline = self.ctx.task_ops.timeline(item.task_id)
        output = next((i for i in timeline.items if i["kind"] == "asset" and i["id"] == item.asset_id), None)
        facts = {
            k: output[k] if output else None for k in ("mime", "duration_ms", "size_bytes", "width", "height", "status")
        }
        tenant_id = timeline.task["tenant_id"]
        found = self.ctx.outputs.files(tenant_id, item.task_id)
        try:
            local = self.ctx.outputs.local_paths(tenant_id, item.task_id)
        except ValueError:  # an s3 store: the object key is what an operator can fetch
            local = {}
        thumb, proxy = local.get("thumbnail"), local.get("proxy_mp4")
        thumbnail = str(thumb) if thumb else None
        if thumbnail is None and "thumbnail" in found:
            thumbnail = f"{self.ctx.settings.storage.bucket}/{found['thumbnail'].key}"
        preview = None
        if thumb is not None:
            t = found["thumbnail"]
            try:
                preview = read_pixels(thumb, *preview_box(t.width, t.height))
            except (ValueError, OSError, subprocess.TimeoutExpired):  # the card says "no preview"; facts still show
                preview = None
        return AssetFacts(
            asset_id=item.asset_id,
            **facts,
            thumbnail=thumbnail,
            prompt=self.ctx.task_ops.prompt(item.task_id),
            preview=preview,
            proxy=str(proxy) if proxy else None,
            thumbnail_file=thumbnail if thumb else None,
        )

    def player_link(self, task_id: uuid.UUID) -> str:
        """A signed link to the task's playback page on `aivedio serve` (for a reviewer on any machine)."""
        return self.ctx.player.link(task_id)

    def find_tasks(self, prefix: str) -> list[TaskRow]:
        """Tasks whose id starts with `prefix` (the `:` palette); InvalidInput when it is not hex."""
        return self.ctx.task_ops.list(id_prefix=prefix, limit=PREFIX_HITS)

    def claim(self, item_id: uuid.UUID, op: Operation) -> str:
        v = self.ctx.review.claim(item_id, op.actor, op)
        until = v.claimed_until.strftime("%H:%M:%S") if v.claimed_until else "?"
        return f"claimed review item {v.id} until {until}"

    def approve(self, item_id: uuid.UUID, op: Operation) -> str:
        d = self.ctx.review.approve(item_id, op.actor, op)
        return f"approved: task {d.item.task_id} → {d.task_status}"

    def reject(self, item_id: uuid.UUID, op: Operation) -> str:
        d = self.ctx.review.reject(item_id, op.actor, op)
        return f"rejected: task {d.item.task_id} → {d.task_status}"

    # --- SUBMIT_UNKNOWN ---------------------------------------------------------------------------------------

    def unknown(self) -> list[Candidate]:
        return self.ctx.reconcile_ops.candidates(limit=LIST_LIMIT)

    def reconcile(self, task_ids: Sequence[uuid.UUID], op: Operation) -> str:
        outcomes = self.ctx.reconcile_ops.run(op, list(task_ids))
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.result] = counts.get(o.result, 0) + 1
        return "reconciled: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing to do")

    def bind_job(self, task_id: uuid.UUID, job_id: str, op: Operation) -> str:
        o = self.ctx.reconcile_ops.bind(op, task_id, job_id)
        return f"{o.result}: task {o.task_id} bound to job {o.provider_job_id}, now {o.task_status}"

    def not_created(self, task_id: uuid.UUID, op: Operation) -> str:
        o = self.ctx.reconcile_ops.not_created(op, task_id)
        return f"{o.result}: task {o.task_id} {o.action.replace('_', ' ')}, now {o.task_status}"

    # --- dead letters, orphans, DEAD outbox rows --------------------------------------------------------------

    def replay_list(self, kind: str) -> Preview | ObservationReplay:
        if kind == "observations":  # stored but never applied (their message was lost): the keep-moving service's
            return self.ctx.keep_moving.preview(None, LIST_LIMIT)
        return self.ctx.replay.preview(kind, ReplayFilter(limit=LIST_LIMIT))  # type: ignore[arg-type]

    def replay(self, kind: str, ids: Sequence[str], op: Operation) -> str:
        if kind == "observations":
            o = self.ctx.keep_moving.replay_ids(op, ids)
            return f"replay observations: {o.outcome} (rereduced={len(o.done) - len(o.failed)}, failed={len(o.failed)})"
        r = self.ctx.replay.replay(kind, list(ids), op)  # type: ignore[arg-type]
        parts = [f"done={len(r.done)}", f"skipped={len(r.skipped)}", f"failed={len(r.failed)}"]
        if kind == "orphans":
            parts.append(f"still orphan={len(r.still_orphan)}")
        return f"replay {kind}: {r.outcome} ({', '.join(parts)})"

    # --- ledger and capacity ----------------------------------------------------------------------------------

    def balances(self) -> list[Balance]:
        return [self.ctx.ledger_ops.balance(str(t.id)) for t in self.ctx.tenants.list()[:LIST_LIMIT]]

    def entries(self, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
        return self.ctx.ledger_ops.entries(str(tenant_id), limit=LIST_LIMIT)

    def adjust(self, tenant_id: uuid.UUID, amount: Decimal, key: str, task_id: uuid.UUID | None, op: Operation) -> str:
        """Book one ADJUSTMENT (`aivedio ledger adjust`); a refusal is re-raised saying so."""
        try:
            r = self.ctx.ledger_ops.adjust(str(tenant_id), amount, key, op, task_id=task_id)
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
        return self.ctx.capacity_live.report(window_s)

    # --- invariant audit --------------------------------------------------------------------------------------

    def audit(self, grace_s: float = DEFAULT_GRACE_S) -> AuditRun:
        at = self.ctx.clock.now()
        report = self.ctx.invariants.run(grace_s=grace_s, limit=AUDIT_ROWS)
        return AuditRun(at, grace_s, report)

    # --- alerts -----------------------------------------------------------------------------------------------

    def alerts(self, query: AlertQuery) -> list[AlertView]:
        rows = self.ctx.alert_ops.list(query.status, query.rule, query.severity, limit=LIST_LIMIT)
        return [a for a in rows if query.keeps(a)]

    def acknowledge(self, ids: Sequence[uuid.UUID], op: Operation) -> str:
        return _change_text("acknowledged", self.ctx.alert_ops.acknowledge(list(ids), op))

    def resolve(self, ids: Sequence[uuid.UUID], op: Operation) -> str:
        return _change_text("resolved", self.ctx.alert_ops.resolve(list(ids), op))


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
