"""`aivedio tenants purge ID --reason R`: delete a tenant's data, keep its accounts.

What goes: every object under the tenant's prefix (inputs, quarantined uploads, raw outputs, derivatives) and
under its System B projects' `workflows/{project}/`, the local provider's rendered copies of its videos, the
prompt and prompt-like parameters of every task (and of the local provider's jobs for them), the bodies of the
provider events about its jobs, the probe documents of its assets (file names, media metadata tags), and its
projects' inputs, step documents and event payloads.
What stays: the tenant row (suspended, its keys revoked, `purged_at` set), task, attempt and asset rows with their
ids, statuses, sizes and times (assets DELETED), the credit ledger untouched (amounts and ids, no content: the
balance and its history still add up), and the audit log, which gains one row with the counts.

A tenant with an unfinished task or project is refused: a provider job may still deliver an output, and a purge
must leave nothing behind; cancel them (or wait for them) first. A purge is idempotent: running it again after a crash
or a refused delete finishes the job. Rows change in short batched transactions; objects are deleted afterwards
with no transaction open, then the tenant's prefix is listed once more to report what is left.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aivedio_engine.db import lifecycle
from aivedio_engine.db import tenants as tenant_repo
from aivedio_engine.db.session import write_tx
from aivedio_engine.services.errors import IllegalState, NotFound
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.retention import delete_objects
from aivedio_engine.storage import keys

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.db.handles import Engine
    from aivedio_engine.storage.base import ObjectStore

#: rows per short transaction
BATCH = 500


@dataclass
class PurgeResult:
    tenant_id: uuid.UUID
    dry_run: bool
    #: objects under the tenant's prefix before the purge (in a dry run: what would be deleted)
    objects: int = 0
    object_bytes: int = 0
    objects_deleted: int = 0
    objects_failed: int = 0
    #: objects still under the prefix afterwards (0 unless a delete failed or something was written meanwhile)
    objects_left: int = 0
    assets: int = 0
    prompts: int = 0
    provider_bodies: int = 0
    #: System B projects whose input and step documents were redacted
    projects: int = 0
    #: the local provider's rendered copies deleted, or not found on this host
    local_outputs_deleted: int = 0
    local_outputs_missing: int = 0
    keys_revoked: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tenant_id"] = str(self.tenant_id)
        return data


class TenantPurger:
    def __init__(self, engine: Engine, clock: Clock, store: ObjectStore) -> None:
        self._engine = engine
        self._clock = clock
        self._store = store

    def purge(self, tenant_id: uuid.UUID, op: Operation) -> PurgeResult:
        op.require_reason()
        result = PurgeResult(tenant_id, op.dry_run)
        with self._engine.connect() as conn:
            if not tenant_repo.exists(conn, tenant_id):
                raise NotFound(f"tenant {tenant_id} not found")
            unfinished, open_projects = lifecycle.unfinished_work(conn, tenant_id)
            projects = lifecycle.project_ids(conn, tenant_id)
        if unfinished or open_projects:
            raise IllegalState(
                f"tenant {tenant_id} has {unfinished} unfinished task(s) and {open_projects} unfinished project(s): "
                "cancel them or let them end, then purge"
            )
        # System B step files live under workflows/{project}/, outside the tenant's prefix
        prefixes = [keys.tenant_prefix(tenant_id), *(f"workflows/{p}/" for p in projects)]
        for prefix in prefixes:
            for obj in self._store.iter_objects(prefix):
                result.objects += 1
                result.object_bytes += obj.size_bytes
        if op.dry_run:
            with self._engine.connect() as conn:
                result.prompts, result.assets = lifecycle.purge_counts(conn, tenant_id)
            self._audit(op, result, "dry_run")
            return result

        now = self._clock.now()
        with write_tx(self._engine) as conn:  # first: nothing new arrives while the rest runs
            result.keys_revoked = lifecycle.close_tenant(conn, tenant_id, now)
        while True:
            with write_tx(self._engine) as conn:
                marked = lifecycle.mark_assets_deleted(conn, lifecycle.live_assets(conn, tenant_id, BATCH))
            result.assets += len(marked)
            if not marked:
                break
        while True:
            with write_tx(self._engine) as conn:
                rows = lifecycle.prompts_due(conn, tenant_id, None, BATCH)
                result.prompts += lifecycle.redact_prompts(conn, rows, now)
            if not rows:
                break
        while True:
            with write_tx(self._engine) as conn:
                n = lifecycle.drop_provider_bodies(conn, tenant_id, BATCH)
            result.provider_bodies += n
            if not n:
                break
        for start in range(0, len(projects), BATCH):
            with write_tx(self._engine) as conn:
                result.projects += lifecycle.redact_projects(conn, projects[start : start + BATCH])
        self._local_outputs(tenant_id, result)
        result.objects_deleted, result.objects_failed = delete_objects(self._store, prefixes)
        with write_tx(self._engine) as conn:  # the quarantine is empty now: no session owns a key any more
            lifecycle.clear_sessions(conn, tenant_id, now)
        result.objects_left = sum(1 for prefix in prefixes for _ in self._store.iter_objects(prefix))
        self._audit(op, result, "purged" if not result.objects_left else "partial")
        return result

    def _local_outputs(self, tenant_id: uuid.UUID, result: PurgeResult) -> None:
        """The local provider is its own vendor and keeps each rendered video in its data dir: delete those of the
        tenant's jobs too. Only a file named after its job is touched; one on another host (a distributed
        deployment whose local renders ran elsewhere) is not found here and is counted as such."""
        with self._engine.connect() as conn:
            outputs = lifecycle.local_outputs(conn, tenant_id)
        for job_id, name in outputs:
            path = Path(name)
            if path.name != f"{job_id}.mp4":
                continue
            if path.exists():
                path.unlink()
                result.local_outputs_deleted += 1
            else:
                result.local_outputs_missing += 1
            with write_tx(self._engine) as conn:
                lifecycle.forget_local_output(conn, job_id)

    def _audit(self, op: Operation, result: PurgeResult, outcome: str) -> None:
        counts = {k: v for k, v in result.to_json().items() if k not in ("tenant_id", "dry_run")}
        audited = dataclasses.replace(op, args={**op.args, "counts": counts})
        with write_tx(self._engine) as conn:
            record(conn, audited, affected_ids=[result.tenant_id], outcome=outcome, now=self._clock.now())
