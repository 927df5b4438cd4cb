"""Playback links of a finished generation (embedded: fs store served by the API): GET lists signed URLs of the
derivatives, the HLS link is a signed playlist whose segments carry their own signatures, and tampering with
or outliving a signature is a 403."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import httpx
import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.worker.runtime import Runtime
from tests.e2e.support import ffprobe_duration
from tests.support.app import make_context, running_api, tenant_with_key
from tests.support.sim import wait_until


def test_signed_outputs_of_a_succeeded_generation_play(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    who = tenant_with_key(ctx, "alice", credits=100)
    other = tenant_with_key(ctx, "bob", credits=100)
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, threading.Event())
    runtime.start()
    try:
        with running_api(ctx) as base:
            created = httpx.post(
                f"{base}/v1/generations",
                headers={**who.headers, "Idempotency-Key": "p1"},
                json={"prompt": "waves", "model": "local-v1", "duration_s": 2},
            ).json()

            def status() -> str:
                with ctx.engine.connect() as conn:
                    return conn.execute(sa.select(generation_tasks.c.status)).scalar_one()

            wait_until(lambda: status() == "SUCCEEDED", timeout_s=90, what="SUCCEEDED")
            doc = httpx.get(f"{base}/v1/generations/{created['id']}", headers=who.headers).json()
            outputs = doc["outputs"]
            assert {"proxy_mp4", "hls", "thumbnail"} <= outputs.keys()
            assert all(u.startswith(base) for u in outputs.values())

            proxy = httpx.get(outputs["proxy_mp4"])
            assert proxy.status_code == 200 and proxy.content[4:8] == b"ftyp"
            # each output comes with its asset row's size and checksum, so a client can check what it downloaded
            described = doc["output_assets"]
            assert described.keys() == outputs.keys()
            assert described["proxy_mp4"]["sha256"] == hashlib.sha256(proxy.content).hexdigest()
            assert described["proxy_mp4"]["size_bytes"] == len(proxy.content)
            assert proxy.headers["x-content-type-options"] == "nosniff"
            assert 1.5 < ffprobe_duration(outputs["hls"], network=True) < 3

            playlist = httpx.get(outputs["hls"]).text
            segments = [ln for ln in playlist.splitlines() if ln and not ln.startswith("#")]
            assert segments and all("sig=" in s for s in segments)
            assert 'URI="' in playlist and "init.mp4" in playlist

            assert httpx.get(outputs["hls"].replace("sig=", "sig=A")).status_code == 403
            assert httpx.get(outputs["proxy_mp4"].replace("sig=", "sig=A")).status_code == 403
            # another tenant sees neither the task nor its outputs
            assert httpx.get(f"{base}/v1/generations/{created['id']}", headers=other.headers).status_code == 404
    finally:
        runtime.shutdown()
        ctx.close()
