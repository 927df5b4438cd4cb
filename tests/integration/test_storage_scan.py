"""The orphan object scan (orphan_object_count): real stores (fs in a tmp dir, S3 on moto with a
bucket per test), both databases, the engine's FakeClock for "old".

Objects get their real write time (file mtime, S3 LastModified); the FakeClock starts at the wall clock, so moving
it past the grace ages every object written so far without touching a file.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, storage_scans, upload_sessions
from aivedio_engine.services.tenants import Principal
from aivedio_engine.storage import keys
from tests.integration.test_observability import parse
from tests.media import shared_media
from tests.support.app import FakeClock, make_context, tenant_with_key
from tests.support.moto import MotoS3

GRACE = 3600
#: past the grace, with room for the test's own run time (objects carry wall-clock times)
PAST_GRACE = GRACE + 120


def fresh_bucket(moto: MotoS3) -> dict[str, Any]:
    """The moto server is shared by the session: a bucket of our own, so the scan sees only this test's objects."""
    mine = dataclasses.replace(moto, bucket=f"scan-{uuid.uuid4().hex[:12]}")
    mine.client().create_bucket(Bucket=mine.bucket)
    return mine.storage_settings()


def context(request: pytest.FixtureRequest, tmp_path: Path, db: str, store: str, **overrides: Any) -> AppContext:
    overrides.setdefault("metrics", {"cache_s": 0})
    if store == "s3":
        overrides["storage"] = fresh_bucket(request.getfixturevalue("moto_s3"))
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    return make_context(tmp_path / "data", url, clock=FakeClock(), **overrides)


@pytest.fixture(params=["sqlite-fs", "postgres-fs", "sqlite-s3", "postgres-s3"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    c = context(request, tmp_path, *request.param.split("-"))
    yield c
    c.close()


@pytest.fixture
def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    c = context(request, tmp_path, "sqlite", "fs")
    yield c
    c.close()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return shared_media(tmp_path_factory)["clip.mp4"].read_bytes()


def principal(ctx: AppContext) -> Principal:
    found = ctx.tenants.authenticate(tenant_with_key(ctx, "acme").key)
    assert found is not None
    return found


def upload(ctx: AppContext, who: Principal, data: bytes, *, complete: bool) -> uuid.UUID:
    """create → the client's upload (the fs PUT handler streams into put_stream just like this) → complete."""
    view, _ = ctx.assets.create_upload(who, "clip.mp4", len(data), "video/mp4")
    ctx.storage.put_stream(staging_key(ctx, view.id), [data], "video/mp4", max_bytes=len(data))
    if complete:
        assert ctx.assets.complete(who, view.id).status == "READY"
    return view.id


def staging_key(ctx: AppContext, asset_id: uuid.UUID) -> str:
    with ctx.engine.connect() as conn:
        return conn.execute(
            sa.select(upload_sessions.c.object_key).where(upload_sessions.c.asset_id == asset_id)
        ).scalar_one()


def scan_rows(ctx: AppContext) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(storage_scans).order_by(storage_scans.c.finished_at, storage_scans.c.id)))


def execute(ctx: AppContext, stmt: Any) -> None:
    with ctx.engine.begin() as conn:
        conn.execute(stmt)


def test_an_orphan_is_an_unreferenced_object_older_than_the_grace(ctx: AppContext, clip: bytes) -> None:
    who = principal(ctx)
    validated = upload(ctx, who, clip, complete=True)  # the staging object is discarded, the original published
    pending = upload(ctx, who, clip[:5000], complete=False)  # OPEN session: the client may still be at it
    # a fetcher that died after its PUT and before the asset commit; a media run that uploaded, then failed
    crashed_fetch = keys.raw_output_key(who.tenant_id, new_id(), new_id(), 0)
    ctx.storage.put_stream(crashed_fetch, [b"r" * 3000], "video/mp4", max_bytes=3000)
    failed_media = keys.derivative_key(who.tenant_id, new_id(), "hls", 1, "seg_000.m4s")
    ctx.storage.put_stream(failed_media, [b"s" * 700], "video/iso.segment", max_bytes=700)
    # not the engine's: keys outside tenants/ (a shared bucket) are never counted
    ctx.storage.put_stream("other-app/report.csv", [b"not ours"], "text/csv", max_bytes=100)
    with ctx.engine.connect() as conn:
        published = conn.execute(sa.select(assets.c.object_key).where(assets.c.id == validated)).scalar_one()
    listed = {o.key: o.size_bytes for o in ctx.storage.iter_objects(keys.TENANTS_PREFIX)}
    assert set(listed) == {published, staging_key(ctx, pending), crashed_fetch, failed_media}

    young = ctx.storage_scanner.scan()  # everything was written moments ago: its rows may still be coming
    assert (young.ok, young.objects, young.bytes, young.orphans, young.grace_s) == (
        True,
        4,
        sum(listed.values()),
        0,
        GRACE,
    )

    ctx.clock.advance(PAST_GRACE)  # type: ignore[attr-defined]
    old = ctx.storage_scanner.scan()
    assert (old.objects, old.orphans, old.orphan_bytes) == (4, 2, 3700)
    assert sorted((o.key, o.size_bytes) for o in old.orphan_objects) == sorted(
        [(crashed_fetch, 3000), (failed_media, 700)]
    )
    assert all(o.modified_at < ctx.clock.now() for o in old.orphan_objects)
    assert not old.truncated and old.error is None

    rows = scan_rows(ctx)
    assert [(r.id, r.objects, r.bytes, r.orphans, r.orphan_bytes, r.error) for r in rows] == [
        (young.id, 4, sum(listed.values()), 0, 0, None),
        (old.id, 4, sum(listed.values()), 2, 3700, None),
    ]
    assert sorted(rows[1].sample) == sorted([crashed_fetch, failed_media]) and rows[0].sample == []
    assert rows[1].started_at == rows[1].finished_at == ctx.clock.now()  # the FakeClock did not move

    # the OPEN session alone keeps its staging object: point the asset elsewhere, then close the session
    execute(ctx, assets.update().where(assets.c.id == pending).values(object_key=f"{published}-elsewhere"))
    assert ctx.storage_scanner.scan().orphans == 2
    # closed, but its quarantined bytes not yet recorded as cleared (services/quarantine.py): still its own
    execute(ctx, upload_sessions.update().where(upload_sessions.c.asset_id == pending).values(status="EXPIRED"))
    assert ctx.storage_scanner.scan().orphans == 2
    execute(
        ctx,
        upload_sessions.update()
        .where(upload_sessions.c.asset_id == pending)
        .values(quarantine_cleared_at=ctx.clock.now()),
    )
    assert {o.key for o in ctx.storage_scanner.scan().orphan_objects} == {
        crashed_fetch,
        failed_media,
        staging_key(ctx, pending),
    }


def test_the_files_of_a_recorded_derivative_are_not_orphans(embedded: AppContext) -> None:
    """An HLS asset row names its playlist; the segments beside it are its files too. Another pipeline version's
    files, or those of a profile never recorded, are not covered by it."""
    ctx, tenant = embedded, tenant_with_key(embedded, "acme").tenant_id
    raw, now = new_id(), embedded.clock.now()
    playlist = keys.derivative_key(tenant, raw, "hls", 2, "index.m3u8")
    written = [playlist] + [keys.derivative_key(tenant, raw, "hls", 2, n) for n in ("init.mp4", "seg_000.m4s")]
    strays = [
        keys.derivative_key(tenant, raw, "hls", 1, "seg_000.m4s"),
        keys.derivative_key(tenant, raw, "proxy_mp4", 2, "proxy.mp4"),
    ]
    for key in written + strays:
        ctx.storage.put_stream(key, [b"x"], "application/octet-stream", max_bytes=1)
    execute(
        ctx,
        assets.insert().values(
            id=raw,
            tenant_id=tenant,
            kind="INPUT_VIDEO",
            status="READY",
            bucket=ctx.storage.bucket,
            object_key=f"tenants/{tenant}/gone.mp4",
            created_at=now,
        ),
    )
    ctx.clock.advance(PAST_GRACE)  # type: ignore[attr-defined]
    assert {o.key for o in ctx.storage_scanner.scan().orphan_objects} == set(written + strays)
    execute(
        ctx,
        assets.insert().values(
            id=new_id(),
            tenant_id=tenant,
            kind="HLS",
            status="READY",
            parent_asset_id=raw,
            profile="hls",
            pipeline_version=2,
            bucket=ctx.storage.bucket,
            object_key=playlist,
            created_at=now,
        ),
    )
    result = ctx.storage_scanner.scan()
    assert {o.key for o in result.orphan_objects} == set(strays) and result.objects == 5


def test_a_listing_that_fails_is_recorded_with_zero_counts(
    request: pytest.FixtureRequest, tmp_path: Path, moto_s3: MotoS3
) -> None:
    gone = {**moto_s3.storage_settings(), "bucket": f"missing-{uuid.uuid4().hex[:12]}"}
    ctx = make_context(tmp_path / "data", clock=FakeClock(), storage=gone)
    try:
        result = ctx.storage_scanner.scan()
        assert not result.ok and "NoSuchBucket" in (result.error or "")
        (row,) = scan_rows(ctx)
        assert (row.id, row.objects, row.bytes, row.orphans, row.orphan_bytes, row.sample) == (
            result.id,
            0,
            0,
            0,
            0,
            None,
        )
        assert row.error == result.error
        report = ctx.sweeper.sweep()  # the sweeper carries on; its scan is not due yet (a failed row counts)
        assert report.storage_scan == {} and len(scan_rows(ctx)) == 1
    finally:
        ctx.close()


def test_the_sweeper_scans_only_when_the_last_scan_is_old(
    embedded: AppContext, caplog: pytest.LogCaptureFixture
) -> None:
    ctx, clock = embedded, embedded.clock
    interval = ctx.settings.sweeper.storage_scan_interval_s
    assert interval == 3600
    key = keys.raw_output_key(new_id(), new_id(), new_id(), 0)
    ctx.storage.put_stream(key, [b"z" * 10], "video/mp4", max_bytes=10)

    assert ctx.sweeper.sweep().storage_scan == {"objects": 1, "orphans": 0, "error": None}  # no scan yet: due
    assert ctx.sweeper.sweep().storage_scan == {} and len(scan_rows(ctx)) == 1
    clock.advance(interval - 1)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().storage_scan == {} and len(scan_rows(ctx)) == 1
    clock.advance(1)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().storage_scan == {"objects": 1, "orphans": 0, "error": None}  # grace: 1 h exactly
    assert len(scan_rows(ctx)) == 2

    clock.advance(interval / 2)  # type: ignore[attr-defined]
    ctx.storage_scanner.scan()  # an operator's `aivedio storage scan` counts as the latest scan
    clock.advance(interval / 2)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().storage_scan == {} and len(scan_rows(ctx)) == 3
    clock.advance(interval / 2)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().storage_scan["orphans"] == 1 and len(scan_rows(ctx)) == 4

    def broken() -> Any:
        raise sa.exc.OperationalError("INSERT INTO storage_scans", {}, Exception("database is locked"))

    ctx.storage_scanner.scan = broken  # type: ignore[method-assign]  # recording the row failed
    clock.advance(interval)  # type: ignore[attr-defined]
    with caplog.at_level(logging.ERROR, logger="aivedio.sweeper"):
        report = ctx.sweeper.sweep()  # the sweep itself completes
    assert report.storage_scan == {"error": "not recorded"} and "storage scan" in caplog.text


def metrics(ctx: AppContext) -> dict[str, float]:
    r = TestClient(create_app(ctx)).get("/metrics")
    assert r.status_code == 200
    samples, docs = parse(r.text)
    return {name: v for (name, labels), v in samples.items() if not labels}


STORAGE_GAUGES = {
    "aivedio_orphan_objects",
    "aivedio_orphan_object_bytes",
    "aivedio_storage_objects",
    "aivedio_storage_object_bytes",
    "aivedio_storage_scan_age_seconds",
}


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_metrics_expose_the_newest_completed_scan(request: pytest.FixtureRequest, tmp_path: Path, db: str) -> None:
    ctx = context(request, tmp_path, db, "fs")
    try:
        clock = ctx.clock
        assert not STORAGE_GAUGES & set(metrics(ctx))  # never counted is not "no orphans"
        ctx.storage.put_stream(
            keys.raw_output_key(new_id(), new_id(), new_id(), 0), [b"o" * 4096], "video/mp4", max_bytes=4096
        )
        clock.advance(PAST_GRACE)  # type: ignore[attr-defined]
        ctx.storage.put_stream(
            keys.raw_output_key(new_id(), new_id(), new_id(), 0), [b"n" * 10], "video/mp4", max_bytes=10
        )  # written "now" by the wall clock: long before the FakeClock's now
        ctx.storage_scanner.scan()
        clock.advance(90)  # type: ignore[attr-defined]
        m = metrics(ctx)
        assert {k: m[k] for k in STORAGE_GAUGES} == {
            "aivedio_orphan_objects": 2,
            "aivedio_orphan_object_bytes": 4106,
            "aivedio_storage_objects": 2,
            "aivedio_storage_object_bytes": 4106,
            "aivedio_storage_scan_age_seconds": 90,
        }

        def down(prefix: str = "") -> Any:
            raise OSError("store unreachable")

        ctx.storage.iter_objects = down  # type: ignore[method-assign]
        assert ctx.storage_scanner.scan().error == "OSError: store unreachable"
        clock.advance(30)  # type: ignore[attr-defined]
        m = metrics(ctx)  # the failed scan's zeros are not figures: the last good ones stay, and age
        assert (m["aivedio_orphan_objects"], m["aivedio_storage_scan_age_seconds"]) == (2, 120)
        assert m["aivedio_metrics_db_up"] == 1
    finally:
        ctx.close()
