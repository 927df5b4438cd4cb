"""The single-client latency of each physical step (pgbench, redis-benchmark, loopback HTTP, S3), measured right
before (A) and after (B) the system points: the count-based and the C.4 anchor baselines."""

from __future__ import annotations

import http.client
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.common import BenchError, Postgres
from bench.e2e.model import anchor_baseline, count_baseline, pipeline, step_counts
from bench.e2e.stats import latency_summary, parse_redis_csv

REDIS_PAYLOAD = "x" * 300
#: the anchor's Dramatiq-like enqueue (B.4): ZADD heartbeat, HSET message, RPUSH id
DRAMATIQ_EVAL = (
    "redis.call('zadd',KEYS[1]..':__heartbeats__',ARGV[1],'w1') "
    "redis.call('hset',KEYS[1]..':default.msgs',ARGV[2],ARGV[3]) "
    "return redis.call('rpush',KEYS[1]..':default',ARGV[2])"
)

PGBENCH_SCRIPTS = {
    # one durable commit of a one-row transaction (autocommit INSERT)
    "commit_1row.sql": "\\set v random(1, 1000000)\nINSERT INTO commit_probe (v) VALUES (:v);\n",
    # B.3 claim_outbox.sql with LIMIT 1 (-M prepared turns:ids into a parameter)
    "claim_outbox_1.sql": (
        "BEGIN;\n"
        "SELECT array_agg(id) AS ids, count(*) AS n FROM (SELECT id, payload FROM outbox WHERE status = 'PENDING'\n"
        "  ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) s \\gset\n"
        "UPDATE outbox SET status = 'PUBLISHED', published_at = now() WHERE id = ANY (:ids::bigint[]);\n"
        "COMMIT;\n"
    ),
}
BASELINE_EXTRA_SQL = """
CREATE TABLE commit_probe (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v integer NOT NULL,
                           at timestamptz NOT NULL DEFAULT now());
INSERT INTO outbox (aggregate_id, topic, payload)
SELECT g, 'generation.submit', jsonb_build_object('task_id', g, 'tenant_id', 1 + g % 1000, 'provider', 'provider_a')
  FROM generate_series(1, 200000) AS g;
"""


@dataclass
class BaselineEnv:
    pg: Postgres
    pgb_db: str
    workdir: Path
    seconds: int
    redis_host: str
    redis_port: int
    key_prefix: str
    api_host: str
    api_port: int
    s3: Any
    bucket: str


def baseline_block(env: BaselineEnv) -> dict[str, Any]:
    """Every physical step once, single client; latencies in ms: pgbench's and redis-benchmark's averages, the
    medians of the HTTP and S3 samples (Python servers on a shared box: a median is not moved by a stall)."""
    lat: dict[str, float] = {}
    raw: dict[str, Any] = {}
    sql = {
        "commit": env.workdir / "commit_1row.sql",
        "create_task": common.SQL_DIR / "create_task.sql",
        "transition": common.SQL_DIR / "transition.sql",
        "claim_outbox_1": env.workdir / "claim_outbox_1.sql",
    }
    for key, script in sql.items():
        if key == "claim_outbox_1":
            pending = int(env.pg.scalar(env.pgb_db, "SELECT count(*) FROM outbox WHERE status = 'PENDING'"))
            if pending < 50_000:
                env.pg.psql(
                    env.pgb_db,
                    "INSERT INTO outbox (aggregate_id, topic, payload) SELECT g, "
                    "'generation.submit', jsonb_build_object('task_id', g) "
                    "FROM generate_series(1, 100000) AS g",
                )
        r = common.run_pgbench(env.pg, env.pgb_db, script, 1, env.seconds)
        lat[key] = r.latency_avg_ms
        raw[f"pgbench_{key}"] = r.as_dict()
    # Redis: a message's trip through a list, LPUSH then BRPOP (the list is never empty: same -n)
    hop_key = f"{env.key_prefix}baseline:hop"
    push = _redis_benchmark(env, ["LPUSH", hop_key, REDIS_PAYLOAD], 10_000)
    pop = _redis_benchmark(env, ["BRPOP", hop_key, "1"], 10_000)
    ev = _redis_benchmark(
        env,
        ["EVAL", DRAMATIQ_EVAL, "1", f"{env.key_prefix}baseline:dramatiq", "1", "__rand_int__", REDIS_PAYLOAD],
        10_000,
        rand=True,
    )
    lat["lpush"], lat["brpop"], lat["eval"] = push["avg_latency_ms"], pop["avg_latency_ms"], ev["avg_latency_ms"]
    lat["hop"] = lat["lpush"] + lat["brpop"]
    raw.update(redis_lpush=push, redis_brpop=pop, redis_eval=ev)
    http_ms = _http_latencies(env.api_host, env.api_port, 400)
    lat["http"] = statistics.median(http_ms)
    raw["http_healthz"] = latency_summary(http_ms)
    s3_ms = _s3_latencies(env.s3, env.bucket, 200)
    lat["s3"] = statistics.median(s3_ms)
    raw["s3_put"] = latency_summary(s3_ms)
    lat["commit_one_row"] = lat["commit"]
    return {"latency_ms": lat, "raw": raw}


def _redis_benchmark(env: BaselineEnv, command: list[str], n: int, rand: bool = False) -> dict[str, float]:
    cmd = [
        common.need_tool("redis-benchmark"),
        "-h",
        env.redis_host,
        "-p",
        str(env.redis_port),
        "-c",
        "1",
        "-n",
        str(n),
        "--csv",
    ]
    if rand:
        cmd += ["-r", "1000000000"]
    res = subprocess.run(cmd + command, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise BenchError(f"redis-benchmark failed: {res.stderr.strip()[-500:]}")
    return parse_redis_csv(res.stdout)


def _http_latencies(host: str, port: int, n: int) -> list[float]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    out = []
    try:
        for i in range(n + 40):
            t0 = time.perf_counter()
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            dt = (time.perf_counter() - t0) * 1000
            if resp.status != 200:
                raise BenchError(f"GET /healthz answered {resp.status}")
            if i >= 40:  # warm-up: connection, first requests
                out.append(dt)
    finally:
        conn.close()
    return out


def _s3_latencies(s3: Any, bucket: str, n: int) -> list[float]:
    body = b"x" * 1024
    out = []
    for i in range(n + 10):
        t0 = time.perf_counter()
        s3.put_object(Bucket=bucket, Key=f"bench-baseline/{i % 20}", Body=body)
        dt = (time.perf_counter() - t0) * 1000
        if i >= 10:
            out.append(dt)
    return out


def baselines_of(block: dict[str, Any], derived_files: int) -> dict[str, float]:
    lat = block["latency_ms"]
    stages = pipeline(derived_files)
    return {
        "count": count_baseline(lat, step_counts(stages)),
        "count_ex_media": count_baseline(lat, step_counts(stages, exclude_media=True)),
        "anchor": anchor_baseline(lat),
    }
