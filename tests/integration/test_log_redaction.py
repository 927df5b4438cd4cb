"""The log grep: real `aivedio generate` and `aivedio serve` processes at DEBUG with JSON
logs. A prompt, an API key, a provider API key, a webhook secret and signed URLs (ours, and a forged S3 one) go in;
none of them may come out, and the lines of a task's work carry its task id (and the request's trace id).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest

from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.providers.webhooks import new_secret
from tests.e2e.support import sample_png
from tests.support.app import free_port, tenant_with_key
from tests.support.sim import wait_until

REPO = Path(__file__).resolve().parents[2]
PROMPT = "a secret prompt xyz about the harbour at dawn"
VENDOR_KEY = "sk-vendor-" + uuid.uuid4().hex
WEBHOOK_SECRET = new_secret(os.urandom(32))


def _cli(data: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aivedio_cli",
        "--config",
        str(REPO / "aivedio.toml"),
        "--set",
        f"data_dir={data}",
        "--set",
        "logging.format=json",
        "--set",
        "logging.level=DEBUG",
        *args,
    ]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    # configured secrets of the provider that runs: masked wherever they would appear
    env.update(
        AIVEDIO_PROVIDERS__LOCAL__API_KEY=VENDOR_KEY,
        AIVEDIO_PROVIDERS__LOCAL__WEBHOOK_SECRETS=json.dumps([WEBHOOK_SECRET]),
        PYTHONUNBUFFERED="1",
    )
    return env


def assert_nothing_secret(text: str, *literals: str) -> None:
    for literal in (PROMPT, quote(PROMPT), VENDOR_KEY, WEBHOOK_SECRET, *literals):
        assert literal not in text, literal
    leaks = [
        re.search(p, text)
        for p in (
            r"avk_[A-Za-z0-9_\-]{8,}",
            r"whsec_[A-Za-z0-9+/=_\-]{8,}",
            r"(?i)\bsig=[A-Za-z0-9_\-%]{4,}",
            r"(?i)X-Amz-(Signature|Credential)=\w",
        )
    ]
    assert not [m.group(0) for m in leaks if m]


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]


@pytest.mark.timeout(300)
def test_generate_logs_json_with_task_ids_and_no_secrets(tmp_path: Path) -> None:
    image = sample_png(tmp_path / "img.png")
    run = subprocess.run(
        _cli(
            tmp_path / "data",
            "generate",
            PROMPT,
            "--image",
            str(image),
            "--duration",
            "1",
            "--resolution",
            "360p",
            "--wait",
            "--json",
        ),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    task_id = json.loads(run.stdout)["id"]
    assert_nothing_secret(run.stdout + run.stderr)
    lines = json_lines(run.stderr)
    assert "?<redacted>" in run.stderr  # the provider's signed output URL was logged (Dramatiq, httpx) and masked
    actor_lines = [line for line in lines if line["event"] == "actor finished"]
    # the clip is small: the fetch_output run also does the media step (media.inline_after_fetch_max_bytes)
    assert {line["actor"] for line in actor_lines} >= {"submit_to_provider", "fetch_output"}
    assert all(line["task_id"] == task_id for line in actor_lines)
    assert any(line["logger"] == "httpx" and line.get("task_id") == task_id for line in lines)  # a library's line
    # one summary line per finished task, with the settled cost and no prompt
    (summary,) = [line for line in lines if line["event"] == "task.finished"]
    assert summary["task_id"] == task_id and summary["status"] == "SUCCEEDED" and summary["provider"] == "local"
    assert summary["actual_cost"] and summary["attempts"] == 1 and summary["seconds"] > 0
    assert summary["input"]["duration_s"] and "prompt" not in summary


@pytest.mark.timeout(300)
def test_serve_access_and_worker_logs_carry_trace_ids_and_no_secrets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ctx = build_context(load_settings(REPO / "aivedio.toml", {"data_dir": str(data)}))
    migrate.upgrade(ctx.engine)
    who = tenant_with_key(ctx, "obs", 100)
    ctx.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _cli(data, "--set", f"api.port={port}", "serve"),
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    signatures: list[str] = []
    try:
        with httpx.Client(base_url=base, timeout=10) as http:
            wait_until(lambda: proc.poll() is not None or _up(http), 60, "the API to answer")
            assert proc.poll() is None, log.read_text()[-3000:]
            created = http.post(
                "/v1/generations",
                headers={**who.headers, "Idempotency-Key": "obs-1", "X-Request-Id": "trace-obs-1"},
                json={"prompt": PROMPT, "model": "local-v1", "duration_s": 1, "resolution": "360p"},
            )
            assert created.status_code == 202, created.text
            url = f"/v1/generations/{created.json()['id']}"
            done = wait_until(lambda: _finished(http, url, who.headers), 120, "the generation to finish")
            assert done["status"] == "SUCCEEDED", done
            for link in done["outputs"].values():  # signed object URLs and the signed playlist
                signatures += parse_qs(urlsplit(link).query)["sig"]
                got = http.get(link)
                assert got.status_code == 200, (link, got.status_code)
            playlist = http.get(done["outputs"]["hls"]).text
            segment = next(line for line in playlist.splitlines() if line and not line.startswith("#"))
            signatures += parse_qs(urlsplit(segment).query)["sig"]
            assert http.get(segment).status_code == 200
            forged = http.get(
                "/v1/objects/x.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE"
                "&X-Amz-Signature=" + "ab" * 32
            )
            assert forged.status_code == 403
            assert http.get("/v1/generations", params={"prompt": PROMPT}, headers=who.headers).status_code == 200
            metrics = http.get("/metrics").text
            assert 'aivedio_actor_messages_total{actor="fetch_output",outcome="ok"}' in metrics
            assert 'aivedio_provider_limit{provider="local"} 4.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert signatures and all(len(s) > 8 for s in signatures)
    assert_nothing_secret(text, who.key, *signatures)
    lines = json_lines(text)
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any("/v1/objects/" in line["event"] and "?<redacted>" in line["event"] for line in access)
    assert any("POST /v1/generations" in line["event"] and line.get("trace_id") == "trace-obs-1" for line in access)
    worker = [line for line in lines if line["event"] == "actor finished"]
    assert worker and all(line["task_id"] == done["id"] for line in worker)
    # the request's id follows the task through the workers; provider observations are queued without it
    # (services.observations writes their outbox rows with no trace id)
    assert {line["actor"] for line in worker if line.get("trace_id") != "trace-obs-1"} <= {"reduce_provider_status"}


def _up(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _finished(http: httpx.Client, url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    doc = http.get(url, headers=headers).json()
    return doc if doc["status"] in ("SUCCEEDED", "FAILED_FINAL", "EXPIRED", "CANCELED") else None
