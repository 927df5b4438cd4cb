"""A request for n outputs over HTTP (issue 10 item 8): GET /v1/generations/{id} lists every output under
`variants` with its own signed URLs and asset rows, and a remote `download` writes each into v<i>/, verified."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import httpx
import sqlalchemy as sa

from aivedio_engine.client import RemoteClient
from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.download import download
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import make_context, running_api, tenant_with_key
from tests.support.sim import wait_until


def test_every_variant_is_served_signed_and_downloadable(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    who = tenant_with_key(ctx, "alice", credits=100)
    other = tenant_with_key(ctx, "bob", credits=100)
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, threading.Event())
    runtime.start()
    try:
        with running_api(ctx) as base:
            created = httpx.post(
                f"{base}/v1/generations",
                headers={**who.headers, "Idempotency-Key": "two"},
                json={"prompt": "waves", "model": "local-v1", "duration_s": 2, "n": 2},
            ).json()
            assert created["estimated_cost"] == "2.00000000"  # 0.5 x 2 s x 2 outputs

            def status() -> str:
                with ctx.engine.connect() as conn:
                    return conn.execute(sa.select(generation_tasks.c.status)).scalar_one()

            wait_until(lambda: status() == "SUCCEEDED", timeout_s=120, what="SUCCEEDED")
            doc = httpx.get(f"{base}/v1/generations/{created['id']}", headers=who.headers).json()
            variants = doc["variants"]
            assert [v["index"] for v in variants] == [0, 1]
            assert variants[0]["outputs"].keys() == doc["outputs"].keys()
            assert variants[0]["output_assets"] == doc["output_assets"]  # `outputs` stays the first
            digests = set()
            for v in variants:
                assert {"proxy_mp4", "hls", "thumbnail"} <= v["outputs"].keys()
                proxy = httpx.get(v["outputs"]["proxy_mp4"])
                assert proxy.status_code == 200
                assert v["output_assets"]["proxy_mp4"]["sha256"] == hashlib.sha256(proxy.content).hexdigest()
                digests.add(hashlib.sha256(proxy.content).hexdigest())
            assert len(digests) == 2
            assert httpx.get(f"{base}/v1/generations/{created['id']}", headers=other.headers).status_code == 404

            client = RemoteClient(base, who.key)
            try:
                assert [v["index"] for v in client.get(created["id"]).variants] == [0, 1]
                result = download(client, created["id"], tmp_path / "out")
            finally:
                client.close()
            assert not result.bad
            for i in (0, 1):
                assert (tmp_path / "out" / f"v{i}" / "proxy.mp4").is_file()
                assert (tmp_path / "out" / f"v{i}" / "hls" / "index.m3u8").is_file()
            assert all(f.verified for f in result.files if f.profile != "hls")
    finally:
        runtime.shutdown()
        ctx.close()
