"""`aivedio storage scan` over a store filled by real generations (sim provider, output fetch, media: raw output,
proxy, HLS playlist + init + segments, thumbnail, waveform), on SQLite and PostgreSQL; the CLI's clock is the
seeded FakeClock (see tests/support/seeding.py), so "older than the grace" is a matter of advancing it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.db.tables import assets, storage_scans, task_attempts
from aivedio_engine.storage import keys
from tests.support.app import make_context
from tests.support.moto import MotoS3
from tests.support.seeding import Seeded


def scan(s: Seeded, *args: str) -> tuple[int, dict[str, Any]]:
    result = s.cli("storage", "scan", "--json", *args)
    return result.exit_code, json.loads(result.stdout)


def test_scan_reports_the_orphan_a_crashed_fetch_leaves(seeder: Callable[..., Seeded]) -> None:
    s = seeder({"ok": "scene one"})
    assert s.task("ok").status == "SUCCEEDED"
    with s.ctx.engine.connect() as conn:
        attempt_id = conn.execute(
            sa.select(task_attempts.c.id).where(task_attempts.c.task_id == s.tasks["ok"])
        ).scalar_one()
        rows = conn.execute(sa.select(sa.func.count()).select_from(assets)).scalar_one()
    # the fetcher stored a second output, then died before its asset commit
    crashed = keys.raw_output_key(s.tenant_id, s.tasks["ok"], attempt_id, 1)
    s.ctx.storage.put_stream(crashed, [b"v" * 2048], "video/mp4", max_bytes=2048)
    scans_before = len(s.all(sa.select(storage_scans.c.id)))  # the sweeper already scanned while driving

    code, young = scan(s)
    assert code == 0 and young["ok"] and young["error"] is None
    assert young["objects"] - 1 > rows  # HLS segments have no rows of their own, and are still not orphans
    assert (young["orphans"], young["orphan_objects"], young["grace_s"]) == (0, [], 3600)

    s.advance(3600 + 120)
    code, old = scan(s)
    assert code == 0 and old["objects"] == young["objects"] and old["bytes"] == young["bytes"]
    assert (old["orphans"], old["orphan_bytes"], old["truncated"]) == (1, 2048, False)
    assert [(o["key"], o["size_bytes"]) for o in old["orphan_objects"]] == [(crashed, 2048)]
    assert old["store"] == f"fs:{s.ctx.storage.bucket}" and old["finished_at"] == s.ctx.clock.now().isoformat()

    code, longer = scan(s, "--grace", "3h")  # an operator's own grace: the object is younger than that
    assert code == 0 and longer["orphans"] == 0 and longer["grace_s"] == 3 * 3600

    recorded = s.all(sa.select(storage_scans).order_by(storage_scans.c.id))[scans_before:]
    assert [(str(r.id), r.orphans, r.sample) for r in recorded] == [
        (young["scan_id"], 0, []),
        (old["scan_id"], 1, [crashed]),
        (longer["scan_id"], 0, []),
    ]

    text = s.cli("storage", "scan")
    assert text.exit_code == 0, text.output
    assert crashed in text.stdout and "1 orphans (2.0 KiB)" in text.stdout
    assert s.cli("storage", "scan", "--grace", "soon").exit_code == 2


def test_a_failed_listing_exits_1_and_is_recorded(tmp_path: Path, moto_s3: MotoS3) -> None:
    storage = {**moto_s3.storage_settings(), "bucket": f"missing-{uuid.uuid4().hex[:12]}"}
    make_context(tmp_path / "data", storage=storage).close()  # the schema
    sets = [f"data_dir={tmp_path / 'data'}"] + [f"storage.{k}={v}" for k, v in storage.items()]
    result = CliRunner().invoke(app, [a for s in sets for a in ("--set", s)] + ["storage", "scan", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert not report["ok"] and "NoSuchBucket" in report["error"] and report["objects"] == 0
    ctx = make_context(tmp_path / "data", storage=storage)
    with ctx.engine.connect() as conn:
        (row,) = conn.execute(sa.select(storage_scans)).all()
    ctx.close()
    assert (str(row.id), row.error) == (report["scan_id"], report["error"])


def test_gc_deletes_only_the_orphans_older_than_its_window_and_audits_both_runs(
    seeder: Callable[..., Seeded],
) -> None:
    from aivedio_engine.db.tables import audit_log

    s = seeder({"ok": "scene one"})
    assert s.task("ok").status == "SUCCEEDED"
    with s.ctx.engine.connect() as conn:
        attempt_id = conn.execute(
            sa.select(task_attempts.c.id).where(task_attempts.c.task_id == s.tasks["ok"])
        ).scalar_one()
    crashed = keys.raw_output_key(s.tenant_id, s.tasks["ok"], attempt_id, 1)
    s.ctx.storage.put_stream(crashed, [b"v" * 2048], "video/mp4", max_bytes=2048)
    before = {o.key for o in s.ctx.storage.iter_objects(keys.TENANTS_PREFIX)}

    s.advance(3600 + 120)  # an orphan for the scan, still inside the GC's one-day window
    young = json.loads(s.cli("storage", "gc", "--dry-run", "--json").stdout)
    assert (young["orphans"], young["deleted"], young["listed"]) == (0, 0, len(before))

    s.advance(86_400)
    preview = s.cli("storage", "gc", "--dry-run", "--json")
    doc = json.loads(preview.stdout)
    assert preview.exit_code == 0 and doc["dry_run"] is True
    assert [(o["key"], o["size_bytes"]) for o in doc["objects"]] == [(crashed, 2048)] and doc["deleted"] == 0
    assert s.ctx.storage.head(crashed) is not None

    assert s.cli("storage", "gc", "--yes").exit_code == 2  # no reason
    assert s.cli("storage", "gc", "--reason", "cleanup").exit_code == 4  # no terminal, no --yes
    assert s.cli("storage", "gc", "--grace", "10m", "--dry-run").exit_code == 2  # inside any commit's reach

    done = s.cli("storage", "gc", "--yes", "--reason", "INC-7 crashed fetch", "--json")
    result = json.loads(done.stdout)
    assert done.exit_code == 0 and (result["deleted"], result["deleted_bytes"], result["failed"]) == (1, 2048, [])
    assert s.ctx.storage.head(crashed) is None
    assert {o.key for o in s.ctx.storage.iter_objects(keys.TENANTS_PREFIX)} == before - {crashed}
    assert json.loads(s.cli("storage", "scan", "--json").stdout)["orphans"] == 0  # the task's bytes all stayed

    rows = s.all(sa.select(audit_log).where(audit_log.c.command == "storage gc").order_by(audit_log.c.created_at))
    assert [(r.dry_run, r.outcome, r.affected_ids) for r in rows][-2:] == [
        (True, "previewed", [crashed]),
        (False, "deleted", [crashed]),
    ]
    assert rows[-1].reason == "INC-7 crashed fetch" and rows[-1].args["deleted"] == 1
