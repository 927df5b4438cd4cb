"""The upload quarantine (issue 16 item 2) on both databases and both stores: uploads land in
`tenants/{tid}/quarantine/`, no URL can name that, `complete` promotes a validated copy and deletes the original,
a rejected upload stays for its grace and is then deleted by the sweeper, an abandoned one is deleted when its
session expires, and the orphan scan counts a quarantined key only once no session owns it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import assets, upload_sessions
from aivedio_engine.services.errors import Forbidden
from aivedio_engine.services.tenants import Principal
from aivedio_engine.storage import keys
from tests.integration.test_storage_scan import PAST_GRACE, clip, context, principal, staging_key  # noqa: F401

GRACE = 3 * 3600  # sweeper.rejected_upload_grace_s in these tests


@pytest.fixture(params=["sqlite-fs", "postgres-fs", "sqlite-s3", "postgres-s3"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    c = context(request, tmp_path, *request.param.split("-"), sweeper={"rejected_upload_grace_s": GRACE})
    yield c
    c.close()


def session_of(ctx: AppContext, asset_id: uuid.UUID) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(upload_sessions).where(upload_sessions.c.asset_id == asset_id)).one()


def asset_of(ctx: AppContext, asset_id: uuid.UUID) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(assets).where(assets.c.id == asset_id)).one()


def start(ctx: AppContext, who: Principal, data: bytes, declared: int | None = None) -> uuid.UUID:
    """An upload session, and the client's bytes written to the target it was given."""
    view, _ = ctx.assets.create_upload(who, "clip.mp4", declared or len(data), "video/mp4")
    key = staging_key(ctx, view.id)
    ctx.storage.put_stream(key, [data], "video/mp4", max_bytes=declared or len(data))
    return view.id


def stored(ctx: AppContext, key: str) -> bool:
    return ctx.storage.head(key) is not None


def test_uploads_land_in_quarantine_which_no_url_can_name_and_complete_promotes_them(
    ctx: AppContext, clip: bytes
) -> None:
    who = principal(ctx)
    asset_id = start(ctx, who, clip)
    quarantined = staging_key(ctx, asset_id)
    assert quarantined.startswith(f"tenants/{who.tenant_id}/quarantine/")
    assert keys.is_quarantined(quarantined)
    with pytest.raises(keys.InvalidKey, match="quarantined"):
        ctx.storage.signed_get_url(quarantined, 60)
    if ctx.storage.kind == "fs":  # the API's own object route refuses it too, whatever the signature says
        with pytest.raises(Forbidden):
            ctx.assets.open_signed_object(quarantined, 2**40, "forged")

    assert ctx.assets.complete(who, asset_id).status == "READY"
    published = asset_of(ctx, asset_id).object_key
    assert not keys.is_quarantined(published) and f"/assets/{asset_id}/original-" in published
    assert stored(ctx, published) and ctx.storage.signed_get_url(published, 60)
    assert not stored(ctx, quarantined)  # promoted: the original is deleted at once
    session = session_of(ctx, asset_id)
    assert session.status == "COMPLETED" and session.quarantine_cleared_at is not None
    assert ctx.quarantine.sweep() == 0  # nothing left for the sweeper


def test_a_rejected_upload_stays_in_quarantine_for_its_grace_then_the_sweeper_deletes_it(
    ctx: AppContext, clip: bytes
) -> None:
    who = principal(ctx)
    asset_id = start(ctx, who, clip[:1000], declared=len(clip))  # fewer bytes than declared
    quarantined = staging_key(ctx, asset_id)
    view = ctx.assets.complete(who, asset_id)
    assert view.status == "REJECTED" and "size mismatch" in (view.error or "")
    assert asset_of(ctx, asset_id).object_key == quarantined  # the record of what was refused
    assert stored(ctx, quarantined)

    ctx.clock.advance(PAST_GRACE)  # type: ignore[attr-defined]
    scan = ctx.storage_scanner.scan()  # past the scan's grace, but its session still owns it: not an orphan
    assert (scan.objects, scan.orphans) == (1, 0)
    assert ctx.quarantine.sweep() == 0 and stored(ctx, quarantined)  # inside its grace

    ctx.clock.advance(GRACE)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().quarantine_cleared == 1
    assert not stored(ctx, quarantined)
    assert session_of(ctx, asset_id).quarantine_cleared_at is not None
    assert asset_of(ctx, asset_id).status == "REJECTED"  # the row stays: why it was refused is still answered
    assert ctx.quarantine.sweep() == 0


def test_an_abandoned_upload_is_deleted_from_quarantine_when_its_session_expires(ctx: AppContext, clip: bytes) -> None:
    asset_id = start(ctx, principal(ctx), clip)
    quarantined = staging_key(ctx, asset_id)
    ctx.clock.advance(ctx.settings.storage.upload_url_ttl_s + ctx.settings.sweeper.abandoned_upload_s + 60)  # type: ignore[attr-defined]
    assert ctx.sweeper.sweep().uploads_expired == 1
    assert not stored(ctx, quarantined)
    session = session_of(ctx, asset_id)
    assert session.status == "EXPIRED" and session.quarantine_cleared_at is not None
    assert asset_of(ctx, asset_id).status == "REJECTED"


def test_the_scan_counts_a_quarantined_key_only_once_no_session_owns_it(ctx: AppContext, clip: bytes) -> None:
    """A rejected asset's row names its quarantined key as a record; that does not keep the bytes. A session that
    recorded its quarantine cleared while the bytes are still there (a delete that failed silently, a client that
    wrote again after) leaves garbage the collector may take."""
    who = principal(ctx)
    asset_id = start(ctx, who, clip[:1000], declared=len(clip))
    ctx.assets.complete(who, asset_id)
    quarantined = staging_key(ctx, asset_id)
    with ctx.engine.begin() as conn:
        conn.execute(
            upload_sessions.update()
            .where(upload_sessions.c.asset_id == asset_id)
            .values(quarantine_cleared_at=ctx.clock.now())
        )
    ctx.clock.advance(PAST_GRACE)  # type: ignore[attr-defined]
    scan = ctx.storage_scanner.scan()
    assert [o.key for o in scan.orphan_objects] == [quarantined]
    ctx.clock.advance(86_400)  # type: ignore[attr-defined]
    result = ctx.storage_collector.collect_page_if_due()
    assert result is not None and result.deleted == 1 and not stored(ctx, quarantined)
