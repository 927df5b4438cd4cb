"""Retention ("a clear data retention and deletion policy"; enterprise tenants their own), run by
the sweeper every `retention.interval_s`.

Tenant data, per tenant (its own days where `aivedio tenants update --retention-*` set them, else `[retention]`;
0 keeps it forever):
- outputs of tasks that ended `outputs_days` ago, unless a System B project still running uses the task (its
  clip feeds a later step): the raw output and every derivative become DELETED, then their objects are deleted;
- inputs uploaded `inputs_days` ago, unless an unfinished task or project uses them: the same;
- prompts of tasks that ended `prompts_days` ago: replaced by "[redacted]" (the task row, its request parameters,
  the local provider's job). Ids, statuses, amounts and the ledger stay.
Rows are marked first and objects deleted afterwards, outside any transaction: a crash in between leaves bytes no
live row names, which the orphan collector deletes after its safety window (services/storage_gc.py).

The engine's bookkeeping, by age, never what recovery still needs: published outbox rows (PENDING and DEAD stay),
inbox rows older than `webhooks.dedup_retention_days` (a dead letter older than that is refused by `aivedio replay
dlq`, services/replay.py, so a replay never meets a message whose inbox row is gone), state events of ended tasks
(each keeps its last applied event), provider events (an unmatched one only after its alert), delivered and dead
webhook deliveries.

Every deletion runs in batches of `retention.batch` rows, one short transaction each, and a run stops after
`MAX_BATCHES` batches per kind, so a first run over years of rows never holds up a sweep: the next run goes on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aivedio_engine.db import bookkeeping, lifecycle
from aivedio_engine.db.lifecycle import StoredObject
from aivedio_engine.db.session import write_tx
from aivedio_engine.storage import keys

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Connection, Engine
    from aivedio_engine.storage.base import ObjectStore

log = logging.getLogger("aivedio.retention")
DAY = timedelta(days=1)
#: batches of one kind per run
MAX_BATCHES = 20


@dataclass
class RetentionReport:
    outputs: int = 0
    inputs: int = 0
    prompts: int = 0
    objects_deleted: int = 0
    objects_failed: int = 0
    #: bookkeeping rows deleted, by table
    rows: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": self.outputs,
            "inputs": self.inputs,
            "prompts": self.prompts,
            "objects_deleted": self.objects_deleted,
            "objects_failed": self.objects_failed,
            "rows": dict(self.rows),
        }


def delete_objects(store: ObjectStore, keys_or_prefixes: list[str]) -> tuple[int, int]:
    """Delete each key, and every object under each prefix (ending in "/"); (deleted, failed). Best effort:
    what is left has no live row and is collected as an orphan."""
    deleted = failed = 0
    for item in keys_or_prefixes:
        targets = [o.key for o in store.iter_objects(item)] if item.endswith("/") else [item]
        for key in targets:
            try:
                store.delete(key)
                deleted += 1
            except Exception:
                log.warning("could not delete %s", key, exc_info=True)
                failed += 1
    return deleted, failed


def asset_objects(tenant_id: uuid.UUID, rows: list[StoredObject]) -> list[str]:
    """The object of each asset row and the prefix of its derivatives (and an input's earlier revisions)."""
    out: list[str] = []
    for row in rows:
        out += [row.object_key, f"{keys.tenant_prefix(tenant_id)}assets/{row.id}/"]
    return out


class RetentionService:
    def __init__(self, engine: Engine, clock: Clock, store: ObjectStore, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._store = store
        self._settings = settings
        self._not_before: datetime | None = None

    def enforce_if_due(self) -> RetentionReport | None:
        """The sweeper's hook: one run per `retention.interval_s` from this process (runs elsewhere are harmless:
        each deletion is idempotent)."""
        now = self._clock.now()
        if self._not_before is not None and now < self._not_before:
            return None
        self._not_before = now + timedelta(seconds=self._settings.retention.interval_s)
        return self.enforce()

    def enforce(self) -> RetentionReport:
        report = RetentionReport()
        now = self._clock.now()
        r = self._settings.retention
        with self._engine.connect() as conn:
            tenants = lifecycle.retentions(conn)
        for t in tenants:
            outputs_days = r.outputs_days if t.outputs_days is None else t.outputs_days
            inputs_days = r.inputs_days if t.inputs_days is None else t.inputs_days
            prompts_days = r.prompts_days if t.prompts_days is None else t.prompts_days
            if outputs_days:
                report.outputs += self._assets(report, t.tenant_id, now - outputs_days * DAY, lifecycle.expired_outputs)
            if inputs_days:
                report.inputs += self._assets(report, t.tenant_id, now - inputs_days * DAY, lifecycle.expired_inputs)
            if prompts_days:
                report.prompts += self._prompts(t.tenant_id, now - prompts_days * DAY, now)
        self._bookkeeping(report, now)
        if report.outputs or report.inputs or report.prompts or any(report.rows.values()):
            log.info("retention: %s", report.to_json())
        return report

    def _assets(
        self,
        report: RetentionReport,
        tenant_id: uuid.UUID,
        cutoff: datetime,
        select: Callable[[Connection, uuid.UUID, datetime, int], list[StoredObject]],
    ) -> int:
        done = 0
        for _ in range(MAX_BATCHES):
            with write_tx(self._engine) as conn:
                rows = select(conn, tenant_id, cutoff, self._settings.retention.batch)
                lifecycle.mark_assets_deleted(conn, [row.id for row in rows])
            if not rows:
                break
            deleted, failed = delete_objects(self._store, asset_objects(tenant_id, rows))
            report.objects_deleted += deleted
            report.objects_failed += failed
            done += len(rows)
        return done

    def _prompts(self, tenant_id: uuid.UUID, cutoff: datetime, now: datetime) -> int:
        done = 0
        for _ in range(MAX_BATCHES):
            with write_tx(self._engine) as conn:
                rows = lifecycle.prompts_due(conn, tenant_id, cutoff, self._settings.retention.batch)
                done += lifecycle.redact_prompts(conn, rows, now)
            if not rows:
                break
        return done

    def _bookkeeping(self, report: RetentionReport, now: datetime) -> None:
        r = self._settings.retention
        batch = r.batch
        jobs: dict[str, Callable[[Connection], int]] = {
            "outbox_events": lambda c: bookkeeping.delete_published_outbox(c, now - r.outbox_days * DAY, batch),
            "inbox_dedup": lambda c: bookkeeping.delete_inbox(c, inbox_cutoff(self._settings, now), batch),
            "task_state_events": lambda c: bookkeeping.delete_state_events(c, now - r.state_events_days * DAY, batch),
            "provider_events": lambda c: bookkeeping.delete_provider_events(
                c, now - r.provider_events_days * DAY, now, batch
            ),
            "webhook_deliveries": lambda c: bookkeeping.delete_webhook_deliveries(
                c, now - r.webhook_deliveries_days * DAY, batch
            ),
            "callback_rejections": lambda c: bookkeeping.delete_callback_rejections(
                c, now - r.provider_events_days * DAY, batch
            ),
        }
        for table, job in jobs.items():
            total = 0
            for _ in range(MAX_BATCHES):
                with write_tx(self._engine) as conn:
                    n = job(conn)
                total += n
                if n < batch:
                    break
            report.rows[table] = total


def inbox_cutoff(settings: Settings, now: datetime) -> datetime:
    """Inbox rows processed before this are deleted, and messages that occurred before it are not replayed."""
    return now - settings.webhooks.dedup_retention_days * DAY


def replay_refusal(settings: Settings, times: list[datetime], now: datetime) -> str | None:
    """Why a dead message that occurred at the earliest of `times` must not be replayed, or None. Inbox rows are
    deleted `webhooks.dedup_retention_days` after their message was consumed; a message from before that cut-off
    may have been consumed and forgotten, and replaying it could apply it twice, so it is refused instead."""
    occurred = min(t if t.tzinfo else t.replace(tzinfo=UTC) for t in times)
    if occurred >= inbox_cutoff(settings, now):
        return None
    return (
        f"older than the inbox retention ({settings.webhooks.dedup_retention_days} days, "
        f"webhooks.dedup_retention_days): occurred {occurred.isoformat()}, and whether it was already applied can "
        "no longer be told; not replayed"
    )
