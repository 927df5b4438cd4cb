"""The `photo_story` example (System B) end to end in distributed mode: two `aivedio serve` processes
(api+scheduler+sweeper, relay+worker) on PostgreSQL, RabbitMQ, Redis and S3 (moto), driven as a remote client
would: the photo uploaded by presigned POST, the project created by `POST /v1/projects`, followed by `GET` until it
ends. Every step runs in the worker process, the `clip` steps through real `local` generation tasks, with every
file in S3. The delivered MP4 is read back from S3 and probed: H.264 + AAC + a subtitle track, the planned length,
a loudness in range."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.bootstrap import build_context
from aivedio_engine.client import RemoteClient
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from tests.e2e.test_distributed import _drop_redis_keys, _ready, _serve, _tail, amqp_url  # noqa: F401 - fixture
from tests.support.app import free_port
from tests.support.moto import MotoS3
from tests.support.sim import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "photo_story"
SCRIPT = "Hello there. Good bye."
_ENDED = frozenset({"succeeded", "cancelled", "failed", "needs_attention"})


def _config(tmp: Path, pg_url: str, s3: MotoS3, api_port: int, amqp_url: str) -> Path:
    storage = s3.storage_settings()
    text = f"""
mode = "distributed"
data_dir = "{tmp / "data"}"
default_provider = "local"
[database]
url = "{pg_url}"
[broker]
kind = "rabbitmq"
url = "{amqp_url}"
worker_threads = 4
[redis]
url = "redis://127.0.0.1:6379/0"
key_prefix = "e2e-story-{uuid.uuid4().hex[:8]}:"
[storage]
kind = "s3"
bucket = "{storage["bucket"]}"
endpoint_url = "{storage["endpoint_url"]}"
region = "{storage["region"]}"
access_key_id = "{storage["access_key_id"]}"
secret_access_key = "{storage["secret_access_key"]}"
[api]
port = {api_port}
public_base_url = "http://127.0.0.1:{api_port}"
[polling]
min_interval_s = 1
max_interval_s = 2
[sweeper]
interval_s = 1
[providers.local]
enabled = true
adapter = "local"
allow_http_origin = true
output_hosts = ["127.0.0.1"]
max_concurrency = 2
supports_lookup_by_request_key = true
[providers.local.models.local-v1]
max_duration_s = 10
resolutions = ["360p", "720p"]
price_per_second = {{ "360p" = "0.5", "720p" = "1" }}
"""
    path = tmp / "aivedio.toml"
    path.write_text(text)
    return path


def _api(method: str, url: str, key: str, body: dict[str, Any] | None = None, **headers: str) -> Any:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=10) as r:  # noqa: S310 - loopback
        return json.loads(r.read())


def _probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", "format=duration:stream=codec_type,codec_name", "-of", "json"]
        + [str(path)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return dict(json.loads(out.stdout))


def _loudness(path: Path) -> float:
    err = subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostats", "-i", str(path), "-map", "0:a", "-af", "ebur128", "-f", "null", "-"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stderr.decode()
    m = re.search(r"I:\s+(-?[0-9.]+) LUFS", err[err.rfind("Summary:") :])
    assert m, err[-500:]
    return float(m.group(1))


@pytest.mark.timeout(600)
def test_photo_story_through_distributed_serve(tmp_path: Path, pg_url: str, moto_s3: MotoS3, amqp_url: str) -> None:
    api_port = free_port()
    base = f"http://127.0.0.1:{api_port}"
    with ExitStack() as stack:
        config = _config(tmp_path, pg_url, moto_s3, api_port, amqp_url)
        ctx = build_context(load_settings(str(config)))
        stack.callback(_drop_redis_keys, ctx.settings.redis.url, ctx.settings.redis.key_prefix)  # runs last
        stack.callback(ctx.close)
        migrate.upgrade(ctx.engine)
        tenant = ctx.tenants.create("story", Decimal(100))
        _, key = ctx.tenants.create_key(tenant.id)

        stack.enter_context(_serve(config, "api,scheduler,sweeper", tmp_path / "api.log"))
        stack.enter_context(_serve(config, "relay,worker", tmp_path / "worker.log"))
        wait_until(lambda: _ready(api_port), timeout_s=30, what="API ready")

        remote = RemoteClient(base, key)
        stack.callback(remote.close)
        photo_id = remote.upload(EXAMPLE / "photo.png")  # presigned POST straight to S3
        created = _api(
            "POST",
            f"{base}/v1/projects",
            key,
            {"workflow": "photo_story", "user_ref": "e2e", "input": {"photo_asset_id": photo_id, "script": SCRIPT}},
            **{"Idempotency-Key": "story-1"},
        )
        project_id = created["id"]

        # the project is followed the way a client does: GET until it ends (a deadline, never a guessed sleep)
        deadline = time.monotonic() + 420
        doc = created
        while doc["status"] not in _ENDED:
            assert time.monotonic() < deadline, json.dumps(doc, indent=1)[-3000:] + _tail(tmp_path)
            time.sleep(0.5)
            doc = _api("GET", f"{base}/v1/projects/{project_id}", key)
        steps = {s["key"]: s for s in doc["steps"]}
        failed = {k: (s["status"], s["error_code"], s["error_message"]) for k, s in steps.items()}
        assert doc["status"] == "succeeded", json.dumps(failed, indent=1) + _tail(tmp_path)
        assert all(s["status"] == "success" for s in steps.values()), failed
        assert {"clip[0]", "clip[1]", "composition", "final_qc", "delivery"} <= set(steps)
        assert doc["result_asset_id"]

        # each clip is its own generation task, reserved once and settled once; local steps cost nothing
        clip_tasks = {steps[f"clip[{i}]"]["generation_task_id"] for i in range(2)}
        assert None not in clip_tasks and len(clip_tasks) == 2
        clip_cost = sum(Decimal(steps[f"clip[{i}]"]["cost_actual"]) for i in range(2))
        assert clip_cost > 0 and Decimal(doc["cost_actual"]) == clip_cost
        for task_id in clip_tasks:
            task = _api("GET", f"{base}/v1/generations/{task_id}", key)
            assert task["status"] == "SUCCEEDED"

        # every file of the project is in S3 (nothing on a local disk), the result among them
        view = ctx.workflows.get(uuid.UUID(project_id))
        result_key = next(s for s in view.steps if s.step_key == "delivery").output_json["key"]  # type: ignore[index]
        listed = moto_s3.client().list_objects_v2(Bucket=moto_s3.bucket, Prefix=f"workflows/{project_id}/")
        stored = {o["Key"] for o in listed.get("Contents", [])}
        assert result_key in stored and any(k.endswith("/subs.srt") for k in stored), stored
        out = tmp_path / "story.mp4"
        moto_s3.client().download_file(moto_s3.bucket, result_key, str(out))

    probe = _probe(out)
    kinds = {s["codec_type"]: s["codec_name"] for s in probe["streams"]}
    assert kinds == {"video": "h264", "audio": "aac", "subtitle": "mov_text"}
    assert abs(float(probe["format"]["duration"]) - 2.0) <= 0.1  # two one-second shots
    assert -24 <= _loudness(out) <= -10
