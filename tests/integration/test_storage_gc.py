"""Orphan garbage collection: the listing resumes in key order on both stores, the sweeper walks
a bucket one page at a time, and a key that gains a row between the listing and the delete is kept."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, audit_log
from aivedio_engine.services.operations import Operation
from aivedio_engine.storage import keys
from tests.integration.test_storage_scan import context, execute
from tests.support.app import tenant_with_key

DAY = 86_400


@pytest.fixture(params=["sqlite-fs", "postgres-s3"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    c = context(request, tmp_path, *request.param.split("-"), sweeper={"storage_gc_page": 2})
    yield c
    c.close()


def put(ctx: AppContext, key: str, size: int = 10) -> str:
    ctx.storage.put_stream(key, [b"x" * size], "application/octet-stream", max_bytes=size)
    return key


def referenced(ctx: AppContext, key: str) -> None:
    tenant = uuid.UUID(key.split("/")[1])
    execute(
        ctx,
        assets.insert().values(
            id=new_id(),
            tenant_id=tenant,
            kind="INPUT_VIDEO",
            status="READY",
            bucket=ctx.storage.bucket,
            object_key=key,
            created_at=ctx.clock.now(),
        ),
    )


def keys_of(ctx: AppContext, **kw: Any) -> list[str]:
    return [o.key for o in ctx.storage.iter_objects(keys.TENANTS_PREFIX, **kw)]


def test_the_listing_is_in_key_order_and_resumes_after_any_key(ctx: AppContext) -> None:
    tenant = tenant_with_key(ctx, "acme").tenant_id
    base = f"tenants/{tenant}/"
    # '-' sorts before '/': a file "a-b" comes before everything under the directory "a/"
    written = [put(ctx, base + k) for k in ("a/x", "a/y/z", "a-b", "b", "a0", "ab/c")]
    listed = keys_of(ctx)
    assert listed == sorted(written)
    for i, key in enumerate(listed):
        assert keys_of(ctx, start_after=key) == listed[i + 1 :]
    assert keys_of(ctx, start_after=base + "a/") == listed[listed.index(base + "a/x") :]  # not itself a key
    assert keys_of(ctx, start_after=base + "zzz") == []


def test_the_sweeper_collects_a_page_at_a_time_and_keeps_what_is_referenced(ctx: AppContext) -> None:
    tenant = tenant_with_key(ctx, "acme").tenant_id
    orphans = [put(ctx, keys.raw_output_key(tenant, new_id(), new_id(), 0)) for _ in range(5)]
    kept = put(ctx, keys.raw_output_key(tenant, new_id(), new_id(), 0))
    referenced(ctx, kept)
    ctx.clock.advance(DAY + 120)  # type: ignore[attr-defined]

    pages = []
    for _ in range(6):
        result = ctx.storage_collector.collect_page_if_due()
        assert ctx.storage_collector.collect_page_if_due() is None  # not due again before the interval
        pages.append((result.listed, result.deleted) if result else None)
        ctx.clock.advance(ctx.settings.sweeper.storage_gc_interval_s)  # type: ignore[attr-defined]
    # 7 objects in pages of 2: the walk ends on the 4th page and starts over on the 5th
    # 6 objects in pages of 2: the third page stops at its size, the fourth finds the end, then it starts over
    assert [p[0] for p in pages if p] == [2, 2, 2, 0, 1, 1]
    assert sum(p[1] for p in pages if p) == 5
    assert keys_of(ctx) == [kept]
    with ctx.engine.connect() as conn:
        rows = list(conn.execute(sa.select(audit_log).where(audit_log.c.command == "storage gc")))
    assert {r.actor for r in rows} == {"sweeper"} and sum(r.args["deleted"] for r in rows) == 5
    assert sorted(k for r in rows for k in r.affected_ids) == sorted(orphans)  # pages that found none: no row


def test_a_key_that_gains_a_row_before_its_delete_is_kept(ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = tenant_with_key(ctx, "acme").tenant_id
    late, gone = (put(ctx, keys.raw_output_key(tenant, new_id(), new_id(), 0)) for _ in range(2))
    ctx.clock.advance(DAY + 120)  # type: ignore[attr-defined]
    collector = ctx.storage_collector
    delete = collector._delete

    def commit_then_delete(result: Any) -> None:
        referenced(ctx, late)  # a fetch's asset commit landing between the listing and the delete
        delete(result)

    monkeypatch.setattr(collector, "_delete", commit_then_delete)
    result = collector.collect(Operation(command="storage gc", reason="test", actor="t"))
    assert (len(result.orphans), result.deleted, result.kept_on_recheck) == (2, 1, 1)
    assert keys_of(ctx) == [late] and ctx.storage.head(gone) is None

    with pytest.raises(Exception, match="reason"):
        collector.collect(Operation(command="storage gc", reason=None, actor="t"))


def test_gc_can_be_switched_off(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    c = context(request, tmp_path, "sqlite", "fs", sweeper={"storage_gc_enabled": False})
    try:
        tenant = tenant_with_key(c, "acme").tenant_id
        key = put(c, keys.raw_output_key(tenant, new_id(), new_id(), 0))
        c.clock.advance(DAY + 120)  # type: ignore[attr-defined]
        assert c.storage_collector.collect_page_if_due() is None
        assert c.sweeper.sweep().storage_gc == {} and keys_of(c) == [key]
    finally:
        c.close()
