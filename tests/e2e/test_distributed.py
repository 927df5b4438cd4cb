"""Distributed mode end to end: two `aivedio serve` processes (api+scheduler+sweeper, relay+worker) on PostgreSQL,
RabbitMQ (the broker, a private vhost), Redis (slots, pub/sub) and S3 (moto), the `sim` provider with faults; 50
generations from `aivedio batch run --api-url` to SUCCEEDED, each with a playable proxy MP4 and HLS playlist in S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks
from tests.e2e.support import ffprobe_duration, sample_png
from tests.support.app import free_port
from tests.support.moto import MotoS3
from tests.support.rabbitmq import private_amqp_url
from tests.support.sim import SECRET, running_sim, wait_until

TASKS = 50


def _config(tmp: Path, pg_url: str, s3: MotoS3, sim_url: str, api_port: int, amqp_url: str) -> Path:
    prefix = f"e2e-{uuid.uuid4().hex[:8]}:"
    storage = s3.storage_settings()
    text = f"""
mode = "distributed"
data_dir = "{tmp / "data"}"
[database]
url = "{pg_url}"
[broker]
kind = "rabbitmq"
url = "{amqp_url}"
worker_threads = 8
[redis]
url = "redis://127.0.0.1:6379/0"
key_prefix = "{prefix}"
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
max_interval_s = 3
[sweeper]
interval_s = 1
[providers.local]
enabled = false
[providers.sim]
adapter = "sim"
base_url = "{sim_url}"
allow_http_origin = true
output_hosts = ["127.0.0.1"]
max_concurrency = 16
webhook_secrets = ["{SECRET}"]
[providers.sim.models.sim-v1]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = {{ "720p" = "1" }}
"""
    path = tmp / "aivedio.toml"
    path.write_text(text)
    return path


@contextmanager
def _serve(config: Path, roles: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio_cli", "--config", str(config), "serve", "--role", roles],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drop_redis_keys(url: str, prefix: str) -> None:
    """The run's slot and pub/sub keys all live under its own prefix: leave the shared Redis as found."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def amqp_url() -> Iterator[str]:
    yield from private_amqp_url("e2e")


@pytest.mark.timeout(600)
def test_fifty_generations_through_distributed_serve(
    tmp_path: Path, pg_url: str, moto_s3: MotoS3, amqp_url: str
) -> None:
    api_port = free_port()
    faults = "redirect=0.2,dup_cb=0.2,reorder_cb=0.2,drop_cb=0.1,early_cb=0.1,5xx=0.05,latency=5ms..40ms"
    with running_sim(real_clock=True, seed=11, faults=faults, job_seconds=1.0) as sim, ExitStack() as stack:
        config = _config(tmp_path, pg_url, moto_s3, sim.base_url, api_port, amqp_url)
        ctx = build_context(load_settings(str(config)))
        stack.callback(_drop_redis_keys, ctx.settings.redis.url, ctx.settings.redis.key_prefix)  # runs last
        stack.callback(ctx.close)
        migrate.upgrade(ctx.engine)
        tenant = ctx.tenants.create("e2e", Decimal(1000))
        _, key = ctx.tenants.create_key(tenant.id)

        stack.enter_context(_serve(config, "api,scheduler,sweeper", tmp_path / "api.log"))
        stack.enter_context(_serve(config, "relay,worker", tmp_path / "worker.log"))
        wait_until(lambda: _ready(api_port), timeout_s=30, what="API ready")
        rules = moto_s3.client().get_bucket_lifecycle_configuration(Bucket=moto_s3.bucket)["Rules"]
        assert any(r.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation") == 1 for r in rules)

        image = sample_png(tmp_path / "ref.png")
        batch = tmp_path / "batch.jsonl"
        batch.write_text(
            "".join(
                json.dumps(
                    {
                        "prompt": f"scene {i}",
                        "model": "sim-v1",
                        "duration_s": 2,
                        **({"images": [image.name]} if i % 10 == 0 else {}),
                    }
                )
                + "\n"
                for i in range(TASKS)
            )
        )
        results = tmp_path / "results.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "batch",
                "run",
                str(batch),
                "--concurrency",
                "25",
                "--out",
                str(results),
                "--api-url",
                f"http://127.0.0.1:{api_port}",
                "--api-key",
                key,
                "--timeout",
                "300",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert run.returncode == 0, run.stderr[-3000:] + _tail(tmp_path)
        lines = [json.loads(line) for line in results.read_text().splitlines()]
        assert len(lines) == TASKS and {r["status"] for r in lines} == {"SUCCEEDED"}

        # the main job as a client of the running server: reference upload by presigned POST, signed URLs back
        one = subprocess.run(
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "generate",
                "a red fox running through snow",
                "--image",
                str(image),
                "--model",
                "sim-v1",
                "--duration",
                "2",
                "--wait",
                "--json",
                "--api-url",
                f"http://127.0.0.1:{api_port}",
                "--api-key",
                key,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert one.returncode == 0, one.stderr[-2000:]
        single = json.loads(one.stdout)
        assert single["status"] == "SUCCEEDED" and single["outputs"]["proxy_mp4"].startswith("http")
        _download(single["outputs"]["proxy_mp4"], tmp_path / "single.mp4")
        assert ffprobe_duration(tmp_path / "single.mp4") > 0.5  # the sim serves the same 1 s sample clip

        # a re-run resumes every line: no upload, no new task
        again = subprocess.run(
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "batch",
                "run",
                str(batch),
                "--json",
                "--api-url",
                f"http://127.0.0.1:{api_port}",
                "--api-key",
                key,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["resumed"] == TASKS

        with ctx.engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(generation_tasks)).scalar_one()
            reserved = conn.execute(sa.select(sa.func.sum(generation_tasks.c.reserved_amount))).scalar_one()
            settles = conn.execute(
                sa.select(sa.func.count()).select_from(credit_ledger).where(credit_ledger.c.entry_type == "SETTLE")
            ).scalar_one()
            hls = (
                conn.execute(
                    sa.select(assets.c.object_key).where(assets.c.profile == "hls", assets.c.status == "READY")
                )
                .scalars()
                .all()
            )
        assert count == TASKS + 1 and reserved == 0 and settles == TASKS + 1 and len(hls) == TASKS + 1

        for i, line in enumerate(lines):
            proxy = tmp_path / f"proxy-{i}.mp4"
            # the signed URL from GET /v1/generations/{id} is what a player would open
            _download(line["outputs"]["proxy_mp4"], proxy)
            assert ffprobe_duration(proxy) > 0.5
        for line in lines[:10]:
            # the HLS link is our signed playlist: every segment in it carries its own signed S3 URL
            assert ffprobe_duration(line["outputs"]["hls"], network=True) > 0.5
        tampered = lines[0]["outputs"]["hls"].replace("sig=", "sig=x")
        assert _status(tampered) == 403
        truth = sim.truth()
        assert truth, "the simulator recorded its jobs"


def _ready(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:  # loopback
            return r.status == 200
    except OSError:
        return False


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _download(url: str, dest: Path) -> None:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r, open(dest, "wb") as f:  # noqa: S310 - loopback moto
        f.write(r.read())


def _tail(tmp: Path) -> str:
    return "".join(f"\n--- {log.name}\n" + log.read_text(errors="replace")[-3000:] for log in tmp.glob("*.log"))
