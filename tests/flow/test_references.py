"""What a provider receives for a task's reference assets, and what happens when one is gone before submit."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks, outbox_events, task_state_events
from aivedio_engine.providers.base import GenerationRequest
from tests.support.app import tenant_with_key
from tests.support.flow import sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

PNG = b"\x89PNG\r\n\x1a\n" + b"reference-bytes" * 20


def _ready_input(ctx: AppContext, tenant_id: Any, kind: str = "INPUT_IMAGE") -> tuple[str, str]:
    asset_id = new_id()
    key = f"tenants/{tenant_id}/uploads/{asset_id}/ref.png"
    stored = ctx.storage.put_stream(key, [PNG], "image/png", 1 << 20)
    with ctx.engine.begin() as conn:
        conn.execute(
            assets.insert().values(
                id=asset_id,
                tenant_id=tenant_id,
                kind=kind,
                status="READY",
                bucket=ctx.storage.bucket,
                object_key=key,
                size_bytes=stored.size,
                checksum_algorithm="sha256",
                checksum_value=stored.sha256,
                mime_detected="image/png",
                created_at=ctx.clock.now(),
            )
        )
    return str(asset_id), key


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    with running_sim(seed=3, job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim)
        sent: list[GenerationRequest] = []
        provider = ctx.providers["sim"]
        real = provider.submit

        def record(request: GenerationRequest, request_key: str) -> Any:
            sent.append(request)
            return real(request, request_key)

        monkeypatch.setattr(provider, "submit", record)
        yield ctx, sent
        ctx.close()


def _submit(ctx: AppContext, tenant_id: Any, key: str, asset_ids: list[str]) -> Any:
    task = ctx.generations.create(
        tenant_id, key, {"prompt": "a fox", "model": "sim-v1", "duration_s": 2, "asset_ids": asset_ids}
    ).task
    assert ctx.dispatcher.run_once() == 1
    Pump(ctx, stop_at_fetch=True).run()
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task.id)).one()


def test_a_vendor_gets_a_short_lived_signed_url_for_each_reference(recorded: Any) -> None:
    ctx, sent = recorded
    who = tenant_with_key(ctx, "alice", credits=100)
    image, image_key = _ready_input(ctx, who.tenant_id)
    video, video_key = _ready_input(ctx, who.tenant_id, kind="INPUT_VIDEO")
    task = _submit(ctx, who.tenant_id, "k1", [image, video])
    assert task.status == "SUBMITTED"
    (request,) = sent
    assert len(request.reference_urls) == 1 and len(request.reference_video_urls) == 1
    for url, key in ((request.reference_urls[0], image_key), (request.reference_video_urls[0], video_key)):
        parts = urlsplit(url)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        expires = int(query["expires"])
        ttl = ctx.settings.storage.reference_url_ttl_s
        assert expires - ttl - 1 <= ctx.clock.now().timestamp() <= expires - ttl + 1
        assert unquote(parts.path) == f"/v1/objects/{key}"
        assert ctx.storage.verify(
            "GET", f"objects/{key}", expires, query["sig"], filename=query.get("filename"), now=ctx.clock.now()
        )
    # the signed URLs are credentials: no row of the task, its history or its messages holds one
    with ctx.engine.connect() as conn:
        stored = [
            str(r) for t in (generation_tasks, task_state_events, outbox_events) for r in conn.execute(sa.select(t))
        ]
    assert not any("sig=" in row for row in stored)


def test_the_local_provider_reads_the_reference_as_a_file(tmp_path: Path) -> None:
    from tests.support.app import make_context

    ctx = make_context(tmp_path / "data")
    who = tenant_with_key(ctx, "bob", credits=100)
    image, _ = _ready_input(ctx, who.tenant_id)
    with ctx.engine.connect() as conn:
        from aivedio_engine.db.assets import inputs_of

        found = inputs_of(conn, who.tenant_id, [image])
    refs = ctx.submitter._references.resolve(found, [image], transport="file", now=ctx.clock.now())
    path = Path(urlsplit(refs.images[0]).path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(PNG).hexdigest()
    ctx.close()


@pytest.mark.parametrize("how", ["object deleted", "asset no longer READY"])
def test_a_reference_gone_before_submit_fails_the_task_and_releases_the_credits(recorded: Any, how: str) -> None:
    ctx, sent = recorded
    who = tenant_with_key(ctx, "carol", credits=100)
    image, key = _ready_input(ctx, who.tenant_id)
    task = ctx.generations.create(
        who.tenant_id, "k1", {"prompt": "a fox", "model": "sim-v1", "duration_s": 2, "asset_ids": [image]}
    ).task
    if how == "object deleted":
        ctx.storage.delete(key)
    else:
        with ctx.engine.begin() as conn:
            conn.execute(assets.update().values(status="DELETED"))
    assert ctx.dispatcher.run_once() == 1
    Pump(ctx, stop_at_fetch=True).run()
    with ctx.engine.connect() as conn:
        row = conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task.id)).one()
        ledger = sorted(
            r.entry_type for r in conn.execute(sa.select(credit_ledger).where(credit_ledger.c.task_id == task.id))
        )
    assert sent == []  # the provider was never called
    assert row.status == "FAILED_FINAL" and row.last_error_code == "reference_unavailable"
    assert row.last_error_class == "local_invalid" and row.reserved_amount == 0
    assert ledger == ["RELEASE", "RESERVE"]
