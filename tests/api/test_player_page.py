"""The reviewer's playback page `GET /v1/generations/{id}/player` (embedded: fs store served by the API): the
link the operator tools mint opens without an API key, a real headless Chromium (Debian's package, installed by
scripts/test) loads it and plays the proxy MP4 far enough to report its duration, and a tampered or foreign
signature is a 403."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import make_context, running_api, tenant_with_key
from tests.support.sim import wait_until

_DURATION = re.compile(r'<span id="duration" data-state="(\w+)">([^<]*)</span>')


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless_duration(url: str, profile: Path) -> tuple[str, str]:
    """(state, text) of the page's duration field after Chromium loaded the page and the video's metadata."""
    browser = _chromium()
    assert browser is not None
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # root in CI: Chromium's sandbox refuses to run as root
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    found = _DURATION.search(done.stdout.decode(errors="replace"))
    assert found, f"no duration field in the DOM (exit {done.returncode}): {done.stderr.decode()[-2000:]}"
    return found.group(1), found.group(2)


def test_the_signed_player_page_plays_the_proxy_in_headless_chromium(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    who = tenant_with_key(ctx, "alice", credits=100)
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, threading.Event())
    runtime.start()
    try:
        with running_api(ctx) as base:
            created = httpx.post(
                f"{base}/v1/generations",
                headers={**who.headers, "Idempotency-Key": "p1"},
                json={"prompt": "waves", "model": "local-v1", "duration_s": 2},
            ).json()
            task_id = uuid.UUID(created["id"])

            def status() -> str:
                with ctx.engine.connect() as conn:
                    return conn.execute(sa.select(generation_tasks.c.status)).scalar_one()

            wait_until(lambda: status() == "SUCCEEDED", timeout_s=90, what="SUCCEEDED")
            link = ctx.player.link(task_id)
            assert link.startswith(ctx.player.base_url() + f"/v1/generations/{task_id}/player?expires=")
            url = base + link.removeprefix(ctx.player.base_url())

            page = httpx.get(url)  # no API key: the signature is the credential
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "script-src 'sha256-" in page.headers["content-security-policy"]
            assert page.headers["referrer-policy"] == "no-referrer"
            assert '<source src="' in page.text and 'type="video/mp4"' in page.text
            assert "application/vnd.apple.mpegurl" in page.text  # HLS first, for browsers that play it

            assert httpx.get(url.replace("sig=", "sig=A")).status_code == 403
            other = url.replace(str(task_id), str(uuid.UUID(int=task_id.int ^ 1)))
            assert httpx.get(other).status_code == 403  # the signature binds the task
            assert httpx.get(url.split("?")[0]).status_code == 403

            if _chromium() is None:
                pytest.skip("Debian's chromium is not installed (scripts/test installs it with apt-get)")
            state, text = headless_duration(url, tmp_path / "chromium")
            assert state == "ok", f"the browser could not play the page's video ({state})"
            assert 1.5 < float(text) < 3.0
    finally:
        runtime.shutdown()
        ctx.close()
