"""`e2e_overhead`: platform overhead per task, provider time excluded, against the sum of the single-client
latencies of the physical steps the pipeline needs (A-B-A, BENCHMARKS.md; performance_anchors.md C.4).

Numerator, per task: (terminal state visible to the client) − (202 returned) − (known sim provider delay =
`--job-seconds`), at an idle 1 task/s and under load (50 tasks/s, or — if the box cannot sustain that — the
highest rate it sustains, with 50/s reported as not reached).

The system is the distributed deployment of tests/e2e/test_distributed.py, started fresh for the run:
PostgreSQL (own database), Redis (broker, slots, pub/sub under an own key prefix), S3 (`moto_server`, own
process), the `sim` provider (`aivedio sim-provider`, own process, no faults), and two `aivedio serve`
processes: `api,scheduler,sweeper` and `relay,worker`. Admission caps (platform/tenant/provider concurrency)
are raised to 1024 so the benchmark measures overhead, not a configured cap. One tenant, one key.

Per task the client POSTs /v1/generations (unique Idempotency-Key) on an open-loop schedule, then follows
GET /v1/generations/{id}/events (SSE; `--observe get` polls GET every `--get-interval-ms` instead) until the
terminal status, then confirms it with one GET (status and playable outputs, for the gate). The path between:

    202 → relay → intake (NOTIFY wakes the dispatcher; 0.5 s fallback tick) → dispatch → outbox → relay (LISTEN/NOTIFY)
    → Redis → submit actor → POST /v1/jobs to the sim → [sim job: job_seconds] → webhook POST to the API → outbox
    → relay → reducer → fetch.requested → relay → fetch actor: GET output from the sim, S3 PUT → media.process.requested
    → relay → media actor: S3 GET, ffprobe + ffmpeg (proxy MP4, HLS, thumbnail), S3 PUTs → SUCCEEDED
    (→ task.status.changed → relay → notify actor → Redis PUBLISH → the API's SSE stream re-reads and sends)

Figures reported per point (p50 / p99 over the point's tasks):
  * headline  = SSE-observed terminal − 202 − job_seconds. The SSE event arrives after the notify hop
                (outbox → relay → notify actor → PUBLISH → re-read), so it is an upper bound of "visible via
                GET"; the lower bound is the next figure.
  * committed = server timestamp of the SUCCEEDED state event − 202 − job_seconds (the transaction that makes it
                visible to GET commits right after that timestamp).
  * media-excluded (diagnostic) = headline − the task's POST_PROCESSING → SUCCEEDED interval (state event
                timestamps: relay hop + S3 + ffprobe/ffmpeg + commit), against a baseline without the media stage.
  The targets (p50 ≤ 8×, p99 ≤ 30× under load; idle p99 ≤ 150 ms; floor p50 ≤ 15×) are checked on the headline.

Baseline, measured right before (A) and after (B) the system points of each repetition, single client:
  commit    pgbench -c 1 of a one-row INSERT (one durable commit), average latency
  hop       redis-benchmark -c 1: LPUSH + BRPOP of a 300-byte message, average latencies summed
  http      GET /healthz on the API under test, one keep-alive connection (Python http.client), median of 400
  s3        PUT of a 1 KiB object to moto, one boto3 client, median of 200
and the count of each inside [202, terminal visible via GET], from the code (PIPELINE below):

    stage     commits hops http s3   what
    dispatch     1     0    0   0    Dispatcher._claim: task → DISPATCHING, attempt row, outbox row
    submit       3     1    1   0    relay claim (1 tx) + Redis hop; SubmitService tx A, POST /v1/jobs, tx B
    callback     1     0    1   0    the sim's succeeded webhook POST; CallbackService tx (provider_events + outbox)
    reduce       2     1    0   0    relay claim + hop; reducer tx (→ OUTPUT_FETCHING, fetch.requested)
    fetch        2     1    1   2    relay claim + hop; GET the output from the sim; S3 HEAD + PUT; tx
    media        2     1    0  1+F   relay claim + hop; S3 GET; ffprobe/ffmpeg; F derivative PUTs; tx (SUCCEEDED)
    read         0     0    1   0    the client's GET that sees SUCCEEDED
    total       11     4    4  3+F   F = derivative objects per task, counted in the bucket (5: proxy.mp4,
                                     index.m3u8, init.mp4, one .m4s segment, thumbnail)

    baseline (count) = 11 × commit + 4 × hop + 4 × http + (3 + F) × s3
    media-excluded baseline = the same without the media stage (9 commits, 3 hops, 4 http, 2 s3)

The C.4 anchor formula (≈ 2.3 ms in performance_anchors.md) is measured in the same blocks and printed too:
    anchor = pgbench c=1 create_task.sql + claim_outbox_1.sql + 2 × transition.sql + 2 × redis-benchmark c=1
             EVAL (Dramatiq-style enqueue)
The headline ratio uses the count-based baseline (the physical steps this pipeline actually has); the anchor
ratio is shown beside it. Each ratio keeps a repetition only when its own two baselines (A, B) differ by at
most 10 %; the ms figures follow the count-based rule. Medians and spreads are over the kept repetitions; the
median over all repetitions (discarded ones included) is printed beside them, labelled as such.

Procedure: warm-up tasks; then once, the load attempt at `--load-rate` (50/s) for `--duration` s. If it is not
sustained (a task unfinished, or the p50 of the last quarter of tasks > 1.5 × that of the first quarter + 50 ms:
a queue builds up), the saturated completion rate is measured from it and rates from 0.9 × that downwards are
probed (`--max-probes`) until one is sustained; that rate is the repetitions' load level. Then `--reps` times:
A, idle point (`--idle-tasks` at `--idle-rate`), load point, B.

Correctness gate (every task of the run, warm-up and probes included): the client got 202 for each POST and saw
SUCCEEDED on the stream and on GET, with proxy_mp4, hls and thumbnail outputs; in the database every task is
SUCCEEDED with reserved_amount 0, exactly one RESERVE and one SETTLE ledger row and nothing else, one attempt,
its applied state events contiguous (versions 0..v, no (from, to) pair twice); no dead letter, no DEAD outbox
row; the sim created exactly one job per task.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench import common
from bench.common import BenchError, CpuSampler, Postgres, Repetition, fmt, table

NAME = "e2e_overhead"
DESCRIPTION = (
    "(terminal visible) − (202) − (sim provider delay), p50/p99 at 1 task/s and under load, ÷ the sum "
    "of the physical steps' single-client latencies"
)
TARGET_P50_X, TARGET_P99_X, FLOOR_P50_X, IDLE_P99_MS = 8.0, 30.0, 15.0, 150.0
LOAD_RATE = 50.0
INITIAL_CREDITS = Decimal(10) ** 9
MODEL = "sim-v1"
BODY = {"prompt": "a red fox running through fresh snow at dusk, cinematic, 35mm film", "model": MODEL, "duration_s": 2}
TERMINAL = frozenset({"SUCCEEDED", "FAILED_FINAL", "CANCELED", "EXPIRED"})
REQUIRED_OUTPUTS = ("hls", "proxy_mp4", "thumbnail")
#: derivative objects per task expected in the bucket (proxy.mp4, index.m3u8, init.mp4, seg_000.m4s, thumbnail)
EXPECTED_DERIVED_FILES = 5
#: a point is "not sustained" when the p50 of its last quarter exceeds this × the first quarter's + the slack
TREND_FACTOR, TREND_SLACK_MS = 1.5, 50.0
#: ... or when tasks complete at less than this share of the offered rate
COMPLETION_SHARE = 0.85
PROBE_FACTORS = (0.9, 0.7, 0.5, 0.35)
REDIS_PAYLOAD = "x" * 300
#: the anchor's Dramatiq-like enqueue (performance_anchors B.4): ZADD heartbeat, HSET message, RPUSH id
DRAMATIQ_EVAL = (
    "redis.call('zadd',KEYS[1]..':__heartbeats__',ARGV[1],'w1') "
    "redis.call('hset',KEYS[1]..':default.msgs',ARGV[2],ARGV[3]) "
    "return redis.call('rpush',KEYS[1]..':default',ARGV[2])"
)

PGBENCH_SCRIPTS = {
    # one durable commit of a one-row transaction (autocommit INSERT)
    "commit_1row.sql": "\\set v random(1, 1000000)\nINSERT INTO commit_probe (v) VALUES (:v);\n",
    # performance_anchors B.3 claim_outbox.sql with LIMIT 1 (-M prepared turns :ids into a parameter)
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


# ------------------------------------------------------------------------------------- the physical steps
@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    commits: int
    hops: int
    http: int
    s3: int
    #: the media stage: left out of the media-excluded baseline
    media: bool = False


def pipeline(derived_files: int = EXPECTED_DERIVED_FILES) -> tuple[Stage, ...]:
    """The physical steps of one task between the 202 and the GET that sees SUCCEEDED (see the module doc)."""
    return (
        Stage("dispatch", "Dispatcher._claim: task → DISPATCHING, attempt, outbox row", 1, 0, 0, 0),
        Stage("submit", "relay claim + Redis hop; SubmitService tx A, POST /v1/jobs to the sim, tx B", 3, 1, 1, 0),
        Stage("callback", "sim's succeeded webhook POST; CallbackService tx", 1, 0, 1, 0),
        Stage("reduce", "relay claim + hop; reducer tx (→ OUTPUT_FETCHING)", 2, 1, 0, 0),
        Stage("fetch", "relay claim + hop; GET output from the sim; S3 HEAD + PUT; tx (→ POST_PROCESSING)", 2, 1, 1, 2),
        Stage(
            "media",
            f"relay claim + hop; S3 GET; ffprobe/ffmpeg; {derived_files} derivative PUTs; tx (→ SUCCEEDED)",
            2,
            1,
            0,
            1 + derived_files,
            media=True,
        ),
        Stage("read", "client GET sees SUCCEEDED", 0, 0, 1, 0),
    )


STEP_KEYS = ("commit", "hop", "http", "s3")


def step_counts(stages: Sequence[Stage], exclude_media: bool = False) -> dict[str, int]:
    """How many of each physical step the stages need."""
    use = [s for s in stages if not (exclude_media and s.media)]
    return {
        "commit": sum(s.commits for s in use),
        "hop": sum(s.hops for s in use),
        "http": sum(s.http for s in use),
        "s3": sum(s.s3 for s in use),
    }


def count_baseline(latency_ms: dict[str, float], counts: dict[str, int]) -> float:
    """Σ count × single-client latency (ms); NaN when a needed latency is missing."""
    total = 0.0
    for key, n in counts.items():
        if n == 0:
            continue
        v = latency_ms.get(key)
        if v is None or not math.isfinite(v):
            return math.nan
        total += n * v
    return total


def anchor_baseline(latency_ms: dict[str, float]) -> float:
    """performance_anchors C.4: create + single-row claim + 2 × transition + 2 × EVAL, all c=1 (ms)."""
    try:
        return (
            latency_ms["create_task"]
            + latency_ms["claim_outbox_1"]
            + 2 * latency_ms["transition"]
            + 2 * latency_ms["eval"]
        )
    except KeyError:
        return math.nan


# ------------------------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values. q in [0, 100]."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return math.nan
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {
            "n": 0,
            "p50": math.nan,
            "p90": math.nan,
            "p99": math.nan,
            "max": math.nan,
            "mean": math.nan,
            "min": math.nan,
        }
    return {
        "n": len(xs),
        "min": min(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def sustained(
    samples: Sequence[tuple[float, float]],
    total: int,
    *,
    offered: float | None = None,
    completed: float | None = None,
    factor: float = TREND_FACTOR,
    slack_ms: float = TREND_SLACK_MS,
) -> tuple[bool, dict[str, Any]]:
    """Did the point keep up? `samples` are (scheduled send offset s, overhead ms) of the finished tasks, `total`
    the tasks planned; `offered` and `completed` the planned rate and the measured completion rate (tasks/s).
    Not sustained when a task was not sent or did not finish, when tasks completed at less than
    COMPLETION_SHARE × the offered rate, or when the median overhead of the last quarter (by send time) exceeds
    factor × the first quarter's + slack: latency that grows with time is a queue building up."""
    done = sorted(samples)
    info: dict[str, Any] = {"finished": len(done), "planned": total}
    if len(done) < total:
        info["reason"] = f"{total - len(done)} of {total} task(s) not sent or not finished"
        return False, info
    if offered and completed is not None and math.isfinite(completed) and completed < COMPLETION_SHARE * offered:
        info["reason"] = (
            f"completed {completed:.2f}/s < {COMPLETION_SHARE:g} × the offered {offered:g}/s: a backlog built up"
        )
        return False, info
    if len(done) < 8:
        info["reason"] = "too few tasks to see a trend"
        return True, info
    q = len(done) // 4
    first = statistics.median(v for _, v in done[:q])
    last = statistics.median(v for _, v in done[-q:])
    info.update(first_quarter_p50_ms=first, last_quarter_p50_ms=last)
    ok = last <= factor * first + slack_ms
    if not ok:
        info["reason"] = (
            f"p50 grew from {first:.0f} ms (first quarter) to {last:.0f} ms (last quarter): a backlog built up"
        )
    return ok, info


def completion_rate(terminal_times: Sequence[float]) -> float:
    """Tasks finished per second between the 10th and 90th percentile of the finish times (the saturated
    throughput when the point was overloaded); NaN with fewer than 10 finishes."""
    ts = sorted(t for t in terminal_times if math.isfinite(t))
    if len(ts) < 10:
        return math.nan
    i, j = len(ts) // 10, (len(ts) * 9) // 10
    span = ts[j] - ts[i]
    return (j - i) / span if span > 0 else math.nan


def round_rate(r: float) -> float:
    """Rates as a person would pick them: 0.5 steps below 10/s, whole numbers above."""
    if r < 10:
        return max(0.5, round(r * 2) / 2)
    return float(round(r))


def probe_rates(capacity: float, offered: float, factors: Sequence[float] = PROBE_FACTORS) -> list[float]:
    """Candidate sustainable rates, highest first: fractions of the measured saturated throughput, below the
    offered rate that failed, without repeats."""
    out: list[float] = []
    for f in factors:
        r = round_rate(min(capacity * f, offered * 0.9))
        if r not in out and r < offered:
            out.append(r)
    return out


class SseParser:
    """Server-Sent Events, line by line: `feed(line)` returns the event's parsed JSON data once its blank line
    arrives (None otherwise). Comment lines (`: ping`) and fields other than data are ignored."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> Any:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data:
                return None
            text, self._data = "\n".join(self._data), []
            return json.loads(text)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


def parse_redis_csv(text: str) -> dict[str, float]:
    """redis-benchmark --csv: the first data row as {"rps", "avg_latency_ms", "p50_latency_ms", ...}."""
    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(rows) < 2:
        raise BenchError(f"cannot read redis-benchmark output:\n{text[-500:]}")
    head = [h.strip('"') for h in rows[0].split('","')]
    vals = [v.strip('"') for v in re.findall(r'"((?:[^"]|"")*)"', rows[1])]
    out: dict[str, float] = {}
    for h, v in zip(head, vals, strict=False):
        if h != "test":
            try:
                out[h] = float(v)
            except ValueError:
                pass
    return out


def _ts(text: str | None) -> float:
    return datetime.fromisoformat(text).timestamp() if text else math.nan


# ------------------------------------------------------------------------------------------------ options
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(duration=10)
    p.add_argument("--load-rate", type=float, default=LOAD_RATE, help="target load, tasks/s (default 50)")
    p.add_argument(
        "--rep-load-rate",
        type=float,
        default=None,
        help="load level of the repetitions (default: --load-rate if sustained, else the highest "
        "sustained rate found); setting it skips the load attempt and the search",
    )
    p.add_argument("--max-probes", type=int, default=3, help="rates tried when the load rate is not sustained")
    p.add_argument("--idle-rate", type=float, default=1.0, help="idle level, tasks/s (default 1)")
    p.add_argument("--idle-tasks", type=int, default=30, help="tasks of each idle point (default 30)")
    p.add_argument("--warmup-tasks", type=int, default=6, help="tasks sent at 2/s before anything is measured")
    p.add_argument("--job-seconds", type=float, default=0.2, help="the sim's job time: the known provider delay")
    p.add_argument("--baseline-seconds", type=int, default=3, help="seconds of each pgbench c=1 baseline run")
    p.add_argument(
        "--observe",
        choices=("sse", "get"),
        default="sse",
        help="how the client sees the terminal state: the SSE stream (default) or polling GET",
    )
    p.add_argument("--get-interval-ms", type=float, default=5.0, help="GET polling interval with --observe get")
    p.add_argument("--worker-threads", type=int, default=8, help="broker.worker_threads of the worker process")
    p.add_argument("--pool-size", type=int, default=20, help="database.pool_size of each aivedio process")
    p.add_argument("--point-timeout", type=int, default=600, help="seconds a point may take to finish")
    p.add_argument(
        "--max-backlog",
        type=int,
        default=100,
        help="stop sending a point's tasks once this many are in flight (0: never); the point then "
        "counts as not sustained (default 100)",
    )
    common.add_infra_args(p)


# ------------------------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}


class Proc:
    """A child process of the benchmark with its log file; stopped by its own pid only."""

    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=common.REPO, env=_clean_env(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 40) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def _wait_http(url: str, proc: Proc, timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc.check()
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                if r.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"{what or url} not ready after {timeout_s:.0f} s:\n{proc.tail()}")


@dataclass
class System:
    """Everything started for the run; `stop()` ends exactly what was started."""

    workdir: Path
    db: str
    db_url: str
    redis_url: str
    key_prefix: str
    job_seconds: float
    worker_threads: int
    pool_size: int
    procs: dict[str, Proc] = field(default_factory=dict)
    api_port: int = 0
    api_url: str = ""
    sim_url: str = ""
    s3_url: str = ""
    bucket: str = "aivedio-bench"
    tenant_id: Any = None
    api_key: str = ""
    config_path: Path | None = None

    def start(self) -> None:
        secret = self._start_sim_and_moto()
        self.api_port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.config_path = self.workdir / "aivedio.toml"
        self.config_path.write_text(self._config(secret))
        self._prepare_db()
        self.procs["api"] = Proc(
            "aivedio serve api,scheduler,sweeper",
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "--config",
                str(self.config_path),
                "serve",
                "--role",
                "api,scheduler,sweeper",
            ],
            self.workdir / "api.log",
        )
        self.procs["worker"] = Proc(
            "aivedio serve relay,worker",
            [sys.executable, "-m", "aivedio_cli", "--config", str(self.config_path), "serve", "--role", "relay,worker"],
            self.workdir / "worker.log",
        )
        _wait_http(self.api_url + "/readyz", self.procs["api"], what="the API")
        time.sleep(1.0)  # the worker declares its queues and the relay starts listening
        self.procs["worker"].check()

    def _start_sim_and_moto(self) -> str:
        from aivedio_engine.providers.webhooks import new_secret

        secret = new_secret(secrets.token_bytes(32))
        s3_port, sim_port = _free_port(), _free_port()
        moto = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        if not Path(moto).exists():
            raise BenchError("moto_server not found (pip install 'moto[server]')")
        self.procs["moto"] = Proc(
            "moto_server", [moto, "-H", "127.0.0.1", "-p", str(s3_port)], self.workdir / "moto.log"
        )
        self.procs["sim"] = Proc(
            "aivedio sim-provider",
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "sim-provider",
                "--port",
                str(sim_port),
                "--job-seconds",
                f"{self.job_seconds:g}",
                "--webhook-secret",
                secret,
                "--seed",
                "1",
            ],
            self.workdir / "sim.log",
        )
        self.s3_url, self.sim_url = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{sim_port}"
        _wait_http(self.s3_url + "/", self.procs["moto"], what="moto_server")
        _wait_http(self.sim_url + "/_sim/truth", self.procs["sim"], what="the sim provider")
        self.s3_client().create_bucket(Bucket=self.bucket)
        return secret

    def s3_client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.s3_url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )

    def _config(self, secret: str) -> str:
        return f"""
mode = "distributed"
data_dir = "{self.workdir / "data"}"
default_provider = "sim"
[database]
url = "{self.db_url}"
pool_size = {self.pool_size}
[broker]
kind = "redis"
url = "{self.redis_url}"
worker_threads = {self.worker_threads}
consumer_idle_timeout_ms = 100
[redis]
url = "{self.redis_url}"
key_prefix = "{self.key_prefix}"
[storage]
kind = "s3"
bucket = "{self.bucket}"
endpoint_url = "{self.s3_url}"
region = "us-east-1"
access_key_id = "bench"
secret_access_key = "bench"
[api]
host = "127.0.0.1"
port = {self.api_port}
public_base_url = "{self.api_url}"
[limits]
platform_max_concurrency = 1024
tenant_default_max_concurrency = 1024
[providers.local]
enabled = false
[providers.sim]
adapter = "sim"
base_url = "{self.sim_url}"
allow_http_origin = true
output_hosts = ["127.0.0.1"]
max_concurrency = 1024
webhook_secrets = ["{secret}"]
[providers.sim.models.sim-v1]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = {{ "720p" = "1" }}
"""

    def _prepare_db(self) -> None:
        from aivedio_engine.bootstrap import build_context
        from aivedio_engine.config import load_settings
        from aivedio_engine.db import migrate

        ctx = build_context(load_settings(str(self.config_path)))
        try:
            migrate.upgrade(ctx.engine)
            tenant = ctx.tenants.create("bench-e2e", INITIAL_CREDITS)
            self.tenant_id = tenant.id
            self.api_key = ctx.tenants.create_key(tenant.id)[1]
        finally:
            ctx.close()

    def check(self) -> None:
        for p in self.procs.values():
            p.check()

    def sim_truth(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.sim_url + "/_sim/truth", timeout=30) as r:  # noqa: S310 - loopback
            return json.loads(r.read())

    def stop(self) -> None:
        # the engine first (it still talks to the others while it shuts down), then the sim and moto
        for name in ("api", "worker", "sim", "moto"):
            if name in self.procs:
                self.procs[name].stop()

    def log_tails(self) -> dict[str, str]:
        return {name: p.tail(15) for name, p in self.procs.items()}


# ------------------------------------------------------------------------------------------ baselines
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


# ------------------------------------------------------------------------------------------- the client
@dataclass
class TaskRun:
    index: int
    scheduled: float
    key: str
    t_send: float = math.nan
    t_202: float = math.nan
    status_code: int | None = None
    task_id: str | None = None
    t_terminal: float = math.nan
    terminal: str | None = None
    #: status → (server timestamp of the state event, client receive time)
    events: dict[str, tuple[float, float]] = field(default_factory=dict)
    get_status: str | None = None
    outputs: list[str] = field(default_factory=list)
    get_polls: int = 0
    error: str | None = None
    #: not sent: the point stopped sending when its backlog reached --max-backlog
    unsent: bool = False


async def _one(
    client: Any, headers: dict[str, str], run: TaskRun, observe: str, interval_s: float, timeout_s: float
) -> None:
    try:
        run.t_send = time.time()
        r = await client.post("/v1/generations", json=BODY, headers={**headers, "Idempotency-Key": run.key})
        run.t_202 = time.time()
        run.status_code = r.status_code
        if r.status_code != 202:
            run.error = f"POST answered {r.status_code}: {r.text[:200]}"
            return
        run.task_id = r.json()["id"]
        if observe == "sse":
            await _follow_sse(client, headers, run, timeout_s)
        else:
            await _poll_get(client, headers, run, interval_s, timeout_s)
        g = await client.get(f"/v1/generations/{run.task_id}", headers=headers)
        doc = g.json()
        run.get_status = doc.get("status")
        run.outputs = sorted((doc.get("outputs") or {}).keys())
    except Exception as exc:  # noqa: BLE001 - recorded, the gate fails on it
        run.error = f"{type(exc).__name__}: {exc}"[:300]


async def _follow_sse(client: Any, headers: dict[str, str], run: TaskRun, timeout_s: float) -> None:
    parser = SseParser()
    async with client.stream(
        "GET", f"/v1/generations/{run.task_id}/events", headers=headers, timeout=timeout_s
    ) as resp:
        if resp.status_code != 200:
            run.error = f"SSE answered {resp.status_code}"
            return
        async for line in resp.aiter_lines():
            ev = parser.feed(line)
            if ev is None:
                continue
            now = time.time()
            run.events.setdefault(ev["status"], (_ts(ev.get("at")), now))
            if ev["status"] in TERMINAL:
                run.t_terminal, run.terminal = now, ev["status"]
                return
    run.error = run.error or "the event stream ended without a terminal status"


async def _poll_get(client: Any, headers: dict[str, str], run: TaskRun, interval_s: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        g = await client.get(f"/v1/generations/{run.task_id}", headers=headers)
        now = time.time()
        run.get_polls += 1
        status = g.json().get("status")
        if status in TERMINAL:
            run.t_terminal, run.terminal = now, status
            return
        await asyncio.sleep(interval_s)
    run.error = "no terminal status before the deadline"


async def _drive(
    api_url: str, api_key: str, runs: list[TaskRun], observe: str, interval_s: float, timeout_s: float, max_backlog: int
) -> dict[str, Any]:
    """Send on schedule (open loop) until done, or until `max_backlog` tasks are in flight (then the rest is not
    sent: the point has shown it cannot keep up, and only makes the drain longer); wait for all to finish."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    info: dict[str, Any] = {"stopped_at_backlog": None}
    in_flight = 0

    def finished(_: Any) -> None:
        nonlocal in_flight
        in_flight -= 1

    async with httpx.AsyncClient(base_url=api_url, limits=limits, timeout=httpx.Timeout(60.0)) as client:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        pending = []
        for run in runs:
            delay = start + run.scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if max_backlog and in_flight >= max_backlog:
                info["stopped_at_backlog"] = {"sent": run.index, "after_s": round(run.scheduled, 2)}
                for rest in runs[run.index :]:
                    rest.unsent = True
                break
            in_flight += 1
            task = asyncio.create_task(_one(client, headers, run, observe, interval_s, timeout_s))
            task.add_done_callback(finished)
            pending.append(task)
        info["send_finished"] = time.time()
        done, not_done = await asyncio.wait(pending, timeout=timeout_s)
        for t in not_done:
            t.cancel()
        for run in runs:
            if not run.unsent and math.isnan(run.t_terminal) and run.error is None:
                run.error = "timed out"
    return info


# ----------------------------------------------------------------------------------------------- points
def _cpu_groups(system: System) -> dict[str, Callable[[int, str, str], bool]]:
    pids = {name: p.pid for name, p in system.procs.items()}
    me = os.getpid()
    groups: dict[str, Callable[[int, str, str], bool]] = {
        "client": lambda pid, comm, cmd: pid == me,
        "api": lambda pid, comm, cmd: pid == pids["api"],
        "worker": lambda pid, comm, cmd: pid == pids["worker"],
        "sim": lambda pid, comm, cmd: pid == pids["sim"],
        "moto": lambda pid, comm, cmd: pid == pids["moto"],
        "redis": lambda pid, comm, cmd: comm == "redis-server",
    }
    groups.update(common.postgres_groups([system.db]))
    return groups


def _children_cpu_s(pid: int) -> float:
    """CPU seconds of the waited-for children of `pid` (cutime + cstime): the worker's ffprobe/ffmpeg runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


class _Window:
    """CPU use over [start + 1 s, start + window]: the middle of a point's sending phase."""

    def __init__(self, system: System, window_s: float) -> None:
        self.system, self.window_s = system, window_s
        self.result: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()

    def start(self) -> None:
        if self.window_s >= 4:
            self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(1.0):
            return
        sampler = CpuSampler(_cpu_groups(self.system))
        sampler.start()
        worker = self.system.procs["worker"].pid
        kids0, t0 = _children_cpu_s(worker), time.monotonic()
        self._stop.wait(self.window_s - 1.5)
        res = sampler.stop()
        kids = (_children_cpu_s(worker) - kids0) / max(1e-9, time.monotonic() - t0)
        if res and math.isfinite(kids):
            res["media_children_cores"] = round(kids, 3)
            res["other_cores"] = round(res["other_cores"] - kids, 3)
        self.result = res

    def join(self) -> dict[str, float]:
        if self._thread.is_alive():
            self._thread.join()
        return self.result


def run_point(
    system: System, label: str, rate: float, n: int, cfg: argparse.Namespace, sample_cpu: bool = True
) -> dict[str, Any]:
    """Send `n` tasks at `rate`/s (open loop), follow each to its terminal state; then measure."""
    system.check()
    tag = f"{label}-{secrets.token_hex(4)}"
    runs = [TaskRun(i, i / rate, f"{tag}-{i}") for i in range(n)]
    send_window = (n - 1) / rate if n > 1 else 0.0
    window = _Window(system, send_window) if sample_cpu else None
    if window:
        window.start()
    t0 = time.time()
    info = asyncio.run(
        _drive(
            system.api_url,
            system.api_key,
            runs,
            cfg.observe,
            cfg.get_interval_ms / 1000,
            cfg.point_timeout,
            cfg.max_backlog,
        )
    )
    elapsed = time.time() - t0
    cpu = window.join() if window else {}
    if info.get("stopped_at_backlog"):
        cpu = {}  # the window outlived the sending: not a steady state
    system.check()
    return analyse_point(system, label, rate, runs, elapsed, cpu, cfg.job_seconds, info)


def _db_extras(system: System, task_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per task: when the succeeded callback was stored, the attempt's provider request key, and when each applied
    transition happened."""
    import psycopg

    out: dict[str, dict[str, Any]] = {t: {} for t in task_ids}
    if not task_ids:
        return out
    with psycopg.connect(system.db_url.replace("+psycopg", ""), autocommit=True) as conn:
        for task_id, received in conn.execute(
            "SELECT a.task_id::text, min(pe.received_at) FROM provider_events pe "
            "JOIN task_attempts a ON a.id = pe.matched_attempt_id "
            "WHERE a.task_id = ANY(%s::uuid[]) AND pe.observation->>'status' = 'succeeded' GROUP BY 1",
            (task_ids,),
        ):
            out[task_id]["callback_stored"] = received.timestamp()
        for task_id, key in conn.execute(
            "SELECT task_id::text, provider_request_key FROM task_attempts WHERE task_id = ANY(%s::uuid[])", (task_ids,)
        ):
            out[task_id]["request_key"] = key
        # the applied transitions' timestamps (what the SSE events carry as `at`; needed with --observe get)
        for task_id, status, at in conn.execute(
            "SELECT task_id::text, to_status, min(created_at) FROM task_state_events "
            "WHERE task_id = ANY(%s::uuid[]) AND outcome = 'applied' GROUP BY 1, 2",
            (task_ids,),
        ):
            out[task_id].setdefault("state_at", {})[status] = at.timestamp()
    return out


#: the path in order; each stage is the time between two consecutive marks (see task_marks)
STAGE_LABELS = (
    ("dispatch_wait", "202 → DISPATCHING (intake, dispatcher woken by NOTIFY)"),
    ("submit", "DISPATCHING → SUBMITTED (relay, hop, POST to the sim)"),
    ("provider_excess", "SUBMITTED → succeeded webhook stored, − job_seconds"),
    ("reduce", "webhook stored → OUTPUT_FETCHING (relay, hop, reducer)"),
    ("fetch", "OUTPUT_FETCHING → POST_PROCESSING (relay, hop, download, S3)"),
    ("media", "POST_PROCESSING → SUCCEEDED (relay, hop, S3, ffprobe/ffmpeg)"),
    ("notify", "SUCCEEDED committed → seen by the client"),
)


def task_metrics(run: TaskRun, extras: dict[str, Any], job_s: float, sim_created: float | None) -> dict[str, float]:
    """Overheads (ms) of one finished task and its stages along the path; the stages sum to the headline."""
    ev = {k: v[0] for k, v in run.events.items()}
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    job_ms = job_s * 1000
    succeeded_at = ev.get("SUCCEEDED", math.nan)
    media = ms(ev.get("POST_PROCESSING", math.nan), succeeded_at)
    head = ms(run.t_202, run.t_terminal) - job_ms
    cb = extras.get("callback_stored", math.nan)
    out = {
        "overhead_ms": head,
        "committed_ms": ms(run.t_202, succeeded_at) - job_ms,
        "media_ms": media,
        "overhead_ex_media_ms": head - media,
        "post_ms": ms(run.t_send, run.t_202),
        "dispatch_wait": ms(run.t_202, ev.get("DISPATCHING", math.nan)),
        "submit": ms(ev.get("DISPATCHING", math.nan), ev.get("SUBMITTED", math.nan)),
        "provider_excess": ms(ev.get("SUBMITTED", math.nan), cb) - job_ms,
        "reduce": ms(cb, ev.get("OUTPUT_FETCHING", math.nan)),
        "fetch": ms(ev.get("OUTPUT_FETCHING", math.nan), ev.get("POST_PROCESSING", math.nan)),
        "media": media,
        "notify": ms(succeeded_at, run.t_terminal),
    }
    if sim_created is not None:
        # the sim's own lateness: its 20 ms ticker and its single callback-delivery thread
        out["sim_late_ms"] = ms(sim_created, cb) - job_ms
    return out


def analyse_point(
    system: System,
    label: str,
    rate: float,
    runs: list[TaskRun],
    elapsed: float,
    cpu: dict[str, float],
    job_s: float,
    info: dict[str, Any],
) -> dict[str, Any]:
    ok = [r for r in runs if r.terminal == "SUCCEEDED" and r.task_id]
    extras = _db_extras(system, [r.task_id for r in ok if r.task_id])
    truth = system.sim_truth()
    created = {
        j["request_key"]: _ts(j["created_at"].replace("Z", "+00:00"))
        for j in truth.get("jobs", [])
        if j.get("request_key")
    }
    per_task = []
    for r in ok:
        x = extras.get(r.task_id or "", {})
        for status, at in x.get("state_at", {}).items():
            r.events.setdefault(status, (at, math.nan))
        m = task_metrics(r, x, job_s, created.get(x.get("request_key", "")))
        per_task.append(m)
    keys = ["overhead_ms", "committed_ms", "media_ms", "overhead_ex_media_ms", "post_ms", "sim_late_ms"]
    keys += [k for k, _ in STAGE_LABELS if k not in keys]
    summary = {k: latency_summary([m[k] for m in per_task if k in m]) for k in keys}
    sent = [r for r in runs if math.isfinite(r.t_send)]
    send_span = (max(r.t_send for r in sent) - min(r.t_send for r in sent)) if len(sent) > 1 else 0.0
    completed = completion_rate([r.t_terminal for r in ok])
    ok_trend, trend = sustained(
        [(r.scheduled, m["overhead_ms"]) for r, m in zip(ok, per_task, strict=True)],
        len(runs),
        offered=rate,
        completed=completed,
    )
    stopped = info.get("stopped_at_backlog")
    if stopped:
        trend["reason"] = (
            f"sending stopped after {stopped['sent']} of {len(runs)} tasks ({stopped['after_s']} s): "
            "the backlog reached --max-backlog"
        )
    statuses: dict[str, int] = {}
    for r in runs:
        if not r.unsent:
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
    return {
        "label": label,
        "offered_rate": rate,
        "tasks": len(runs),
        "sent": len(sent),
        "succeeded": len(ok),
        "stopped_at_backlog": stopped,
        "achieved_send_rate": (len(sent) - 1) / send_span if send_span > 0 else math.nan,
        "completion_rate": completed,
        "elapsed_s": round(elapsed, 2),
        "sustained": ok_trend,
        "trend": trend,
        "summary": summary,
        "post_statuses": statuses,
        "errors": [r.error for r in runs if r.error][:5],
        "error_count": sum(1 for r in runs if r.error),
        "cpu": cpu,
        "get_polls": sum(r.get_polls for r in runs),
        "client": [
            {
                "key": r.key,
                "task_id": r.task_id,
                "unsent": r.unsent,
                "scheduled": r.scheduled,
                "t_send": r.t_send,
                "t_202": r.t_202,
                "t_terminal": r.t_terminal,
                "terminal": r.terminal,
                "get_status": r.get_status,
                "outputs": r.outputs,
                "error": r.error,
                "events": {k: v[0] for k, v in r.events.items()},
            }
            for r in runs
        ],
    }


# ------------------------------------------------------------------------------------------ the gate
def correctness_gate(system: System, points: list[dict[str, Any]]) -> dict[str, Any]:
    import psycopg

    client = [c for p in points for c in p["client"] if not c["unsent"]]
    created = [c for c in client if c["task_id"]]
    with psycopg.connect(system.db_url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute(
            """
            WITH t AS (SELECT id, status, version, reserved_amount FROM generation_tasks WHERE tenant_id = %(t)s),
                 l AS (SELECT task_id, count(*) FILTER (WHERE entry_type = 'SETTLE') AS s,
                              count(*) FILTER (WHERE entry_type = 'RESERVE') AS r,
                              count(*) FILTER (WHERE entry_type NOT IN ('SETTLE', 'RESERVE')) AS o
                         FROM credit_ledger WHERE tenant_id = %(t)s GROUP BY task_id),
                 e AS (SELECT task_id, count(*) AS n, count(DISTINCT task_version) AS nv, max(task_version) AS mv,
                              count(DISTINCT (coalesce(from_status, ''), coalesce(to_status, ''))) AS np
                         FROM task_state_events WHERE outcome = 'applied' GROUP BY task_id),
                 a AS (SELECT task_id, count(*) AS n FROM task_attempts GROUP BY task_id)
            SELECT count(*),
                   count(*) FILTER (WHERE t.status <> 'SUCCEEDED'),
                   count(*) FILTER (WHERE t.reserved_amount <> 0),
                   count(*) FILTER (WHERE coalesce(l.s, 0) <> 1),
                   count(*) FILTER (WHERE coalesce(l.r, 0) <> 1),
                   count(*) FILTER (WHERE coalesce(l.o, 0) <> 0),
                   count(*) FILTER (WHERE e.n IS NULL OR e.n <> e.nv OR e.nv <> e.mv + 1 OR e.mv <> t.version
                                          OR e.np <> e.n),
                   count(*) FILTER (WHERE coalesce(a.n, 0) <> 1)
              FROM t LEFT JOIN l ON l.task_id = t.id LEFT JOIN e ON e.task_id = t.id
                     LEFT JOIN a ON a.task_id = t.id""",
            {"t": system.tenant_id},
        ).fetchone()
        tasks, not_ok, reserved, bad_settle, bad_reserve, other_ledger, bad_events, bad_attempts = row
        settles = conn.execute("SELECT count(*) FROM credit_ledger WHERE entry_type = 'SETTLE'").fetchone()[0]
        dead_letters = conn.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
        dead_outbox = conn.execute("SELECT count(*) FROM outbox_events WHERE status = 'DEAD'").fetchone()[0]
        applied = conn.execute("SELECT count(*) FROM task_state_events WHERE outcome = 'applied'").fetchone()[0]
    truth = system.sim_truth()
    keys = list(truth.get("by_request_key", {}).values())
    objects = _bucket_objects(system)
    derived_per_task = (objects["derived"] / tasks) if tasks else math.nan
    client_errors = [c["error"] for c in client if c["error"]]
    checks = {
        "every POST answered 202": len(created) == len(client) and all(c["t_202"] for c in created),
        "client saw SUCCEEDED on the stream and on GET, with proxy_mp4, hls, thumbnail": all(
            c["terminal"] == "SUCCEEDED"
            and c["get_status"] == "SUCCEEDED"
            and set(REQUIRED_OUTPUTS) <= set(c["outputs"])
            for c in client
        ),
        "tasks in the database == tasks created": tasks == len(created),
        "every task SUCCEEDED": not_ok == 0,
        "reserved_amount 0 on every task": reserved == 0,
        "exactly one SETTLE and one RESERVE per task, no other ledger row": bad_settle
        == bad_reserve
        == other_ledger
        == 0
        and settles == tasks,
        "no duplicate state transition (applied versions 0..v, no (from, to) twice)": bad_events == 0,
        "one attempt per task, one sim job per task": bad_attempts == 0
        and len(keys) == tasks
        and all(n == 1 for n in keys),
        "no dead letter, no DEAD outbox row": dead_letters == 0 and dead_outbox == 0,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "tasks": tasks,
        "client_tasks": len(client),
        "settle_rows": settles,
        "applied_state_events": applied,
        "tasks_not_succeeded": not_ok,
        "tasks_reserved_nonzero": reserved,
        "tasks_bad_ledger": bad_settle + bad_reserve + other_ledger,
        "tasks_bad_events": bad_events,
        "tasks_bad_attempts": bad_attempts,
        "dead_letters": dead_letters,
        "dead_outbox": dead_outbox,
        "sim_jobs": sum(keys),
        "sim_duplicate_jobs": truth.get("duplicate_jobs"),
        "bucket_objects": objects,
        "derived_objects_per_task": derived_per_task,
        "client_errors": client_errors[:5],
        "client_error_count": len(client_errors),
    }


def _bucket_objects(system: System) -> dict[str, int]:
    s3 = system.s3_client()
    counts = {"total": 0, "derived": 0, "raw": 0, "baseline": 0}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=system.bucket):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            counts["total"] += 1
            if key.startswith("bench-baseline/"):
                counts["baseline"] += 1
            elif "/raw/" in key:
                counts["raw"] += 1
            else:
                counts["derived"] += 1
    return counts


# ------------------------------------------------------------------------------------------- the run
def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _brief(p: dict[str, Any]) -> str:
    s = p["summary"]["overhead_ms"]
    return (
        f"{p['label']}: {p['succeeded']}/{p['tasks']} (sent {p['sent']}) at {p['offered_rate']:g}/s, overhead p50 "
        f"{s['p50']:.0f} ms p99 {s['p99']:.0f} ms, completions {p['completion_rate']:.1f}/s, "
        f"{'sustained' if p['sustained'] else 'NOT sustained'} ({p['elapsed_s']:.0f} s)"
    )


def find_load_level(system: System, args: argparse.Namespace, points: list[dict[str, Any]]) -> dict[str, Any]:
    """The load attempt at --load-rate; if it is not sustained, the highest sustained rate below it."""
    n = max(2, round(args.load_rate * args.duration))
    _log(f"load attempt: {n} tasks at {args.load_rate:g}/s")
    attempt = run_point(system, f"attempt-{args.load_rate:g}", args.load_rate, n, args)
    points.append(attempt)
    _log(_brief(attempt))
    search: dict[str, Any] = {"attempt": _point_doc(attempt), "probes": [], "target_rate": args.load_rate}
    if attempt["sustained"]:
        search.update(reached=True, rate=args.load_rate)
        return search
    capacity = attempt["completion_rate"]
    search["saturated_completion_rate"] = capacity
    rates = probe_rates(capacity if math.isfinite(capacity) else args.load_rate / 10, args.load_rate)
    found = None
    for rate in rates[: max(0, args.max_probes)]:
        time.sleep(2)
        p = run_point(system, f"probe-{rate:g}", rate, max(2, round(rate * args.duration)), args)
        points.append(p)
        search["probes"].append(_point_doc(p))
        _log(_brief(p))
        if p["sustained"]:
            found = rate
            break
    search.update(
        reached=False,
        rate=found if found is not None else (rates[-1] if rates else 1.0),
        sustained_found=found is not None,
    )
    return search


def _point_doc(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if k != "client"}


def run(args: argparse.Namespace) -> int:
    import redis

    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("pgbench", "psql", "redis-benchmark", "ffmpeg", "ffprobe"):
        common.need_tool(tool)
    try:
        redis.Redis.from_url(args.redis_url).ping()
    except Exception as exc:  # noqa: BLE001
        raise BenchError(f"Redis at {args.redis_url} unreachable: {exc}") from None
    sync_commit = pg.setting("synchronous_commit")
    started = common.utc_now()
    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    sys_db, pgb_db = f"bench_e2e_{tag}", f"bench_pgb_e2e_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    for name, text in PGBENCH_SCRIPTS.items():
        (workdir / name).write_text(text)
    key_prefix = f"bench-e2e-{tag}:"
    ru = urlparse(args.redis_url)
    system = System(
        workdir=workdir,
        db=sys_db,
        db_url=pg.url(sys_db),
        redis_url=args.redis_url,
        key_prefix=key_prefix,
        job_seconds=args.job_seconds,
        worker_threads=args.worker_threads,
        pool_size=args.pool_size,
    )
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "date": started,
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {
            "reps": args.reps,
            "load_seconds": args.duration,
            "load_rate": args.load_rate,
            "rep_load_rate": args.rep_load_rate,
            "idle_rate": args.idle_rate,
            "idle_tasks": args.idle_tasks,
            "warmup_tasks": args.warmup_tasks,
            "job_seconds": args.job_seconds,
            "baseline_seconds": args.baseline_seconds,
            "observe": args.observe,
            "get_interval_ms": args.get_interval_ms,
            "max_backlog": args.max_backlog,
            "worker_threads": args.worker_threads,
            "pool_size": args.pool_size,
            "synchronous_commit": sync_commit,
            "redis_key_prefix": key_prefix,
            "scheduler_interval_s": _scheduler_interval(),
            "consumer_idle_timeout_ms": 100,
            "admission_caps": 1024,
            "sim_faults": "none",
            "discard_rule": f"count-based baselines: max(A,B)/min(A,B) - 1 > {common.MAX_BASELINE_DIVERGENCE}",
            "step_counts": step_counts(pipeline()),
            "step_counts_ex_media": step_counts(pipeline(), True),
        },
        "targets": {
            "load_p50_x": TARGET_P50_X,
            "load_p99_x": TARGET_P99_X,
            "floor_p50_x": FLOOR_P50_X,
            "idle_p99_ms": IDLE_P99_MS,
        },
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
    points: list[dict[str, Any]] = []
    reps: list[dict[str, Any]] = []
    code = 0
    created_dbs: list[str] = []
    _log(f"databases {sys_db} (aivedio) and {pgb_db} (pgbench baselines); Redis prefix {key_prefix}; workdir {workdir}")
    try:
        pg.create_db(pgb_db)
        created_dbs.append(pgb_db)
        pg.psql(pgb_db, file=common.SQL_DIR / "create_task_schema.sql")
        pg.psql(pgb_db, BASELINE_EXTRA_SQL)
        pg.psql(pgb_db, "VACUUM ANALYZE")
        pg.create_db(sys_db)
        created_dbs.append(sys_db)
        system.start()
        _log(f"system up: API {system.api_url}, sim {system.sim_url}, S3 {system.s3_url}")
        env = BaselineEnv(
            pg,
            pgb_db,
            workdir,
            args.baseline_seconds,
            ru.hostname or "127.0.0.1",
            ru.port or 6379,
            key_prefix,
            "127.0.0.1",
            system.api_port,
            system.s3_client(),
            system.bucket,
        )
        if args.warmup_tasks:
            w = run_point(system, "warmup", 2.0, args.warmup_tasks, args, sample_cpu=False)
            points.append(w)
            _log(_brief(w))
        if args.rep_load_rate:
            search = {
                "reached": args.rep_load_rate >= args.load_rate,
                "rate": args.rep_load_rate,
                "target_rate": args.load_rate,
                "skipped": True,
                "probes": [],
            }
        else:
            search = find_load_level(system, args, points)
        doc["load_search"] = search
        load_rate = float(search["rate"])
        for i in range(1, args.reps + 1):
            quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
            _log(f"rep {i}/{args.reps}: baseline A")
            a = baseline_block(env)
            _log(f"rep {i}: idle point ({args.idle_tasks} tasks at {args.idle_rate:g}/s)")
            idle = run_point(system, f"rep{i}-idle", args.idle_rate, args.idle_tasks, args)
            points.append(idle)
            _log(_brief(idle))
            time.sleep(1)
            n_load = max(2, round(load_rate * args.duration))
            _log(f"rep {i}: load point ({n_load} tasks at {load_rate:g}/s)")
            load = run_point(system, f"rep{i}-load", load_rate, n_load, args)
            points.append(load)
            _log(_brief(load))
            _log(f"rep {i}: baseline B")
            b = baseline_block(env)
            reps.append(
                {
                    "index": i,
                    "baseline_a": a,
                    "baseline_b": b,
                    "idle": _point_doc(idle),
                    "load": _point_doc(load),
                    "quiet_before": quiet,
                }
            )
        _log("correctness gate")
        gate = correctness_gate(system, points)
        derived = gate["derived_objects_per_task"]
        derived_files = round(derived) if math.isfinite(derived) and derived > 0 else EXPECTED_DERIVED_FILES
        summary, rep_objs = summarize_run(reps, derived_files, args.job_seconds)
        doc.update(
            summary=summary,
            repetitions=[_rep_doc(r, o) for r, o in zip(reps, rep_objs, strict=True)],
            gate=gate,
            derived_files_used=derived_files,
            other_points=[_point_doc(p) for p in points if not p["label"].startswith("rep")],
            pipeline=[s.__dict__ for s in pipeline(derived_files)],
        )
        if not gate["ok"]:
            code = 1
        elif not any(o.kept for o in rep_objs):
            code = 2
    except BaseException as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc["logs"] = system.log_tails()
        doc.setdefault("repetitions", reps)
        raise
    finally:
        system.stop()
        if not args.keep_dbs:
            for db in created_dbs:
                try:
                    pg.drop_db(db)
                except BenchError as exc:
                    print(f"warning: could not drop {db}: {exc}", file=sys.stderr)
        try:
            doc["redis_keys_deleted"] = common.redis_cleanup(args.redis_url, key_prefix)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: Redis cleanup of {key_prefix}* failed: {exc}", file=sys.stderr)
        doc["finished"] = common.utc_now()
        path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path(NAME), doc)
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc))
    print(f"\nJSON: {path}")
    return code


def _scheduler_interval() -> float:
    from aivedio_engine.worker.runtime import SCHEDULER_INTERVAL_S

    return SCHEDULER_INTERVAL_S


# ------------------------------------------------------------------------------------------- summary
#: (point, metric key in the point summary, baseline kind) → the figures of the main table
FIGURES = (
    ("load", "overhead_ms", "count", "headline"),
    ("idle", "overhead_ms", "count", "headline"),
    ("load", "committed_ms", "count", "committed"),
    ("idle", "committed_ms", "count", "committed"),
    ("load", "overhead_ex_media_ms", "count_ex_media", "media-excluded"),
    ("idle", "overhead_ex_media_ms", "count_ex_media", "media-excluded"),
)


def summarize_run(
    reps: list[dict[str, Any]], derived_files: int, job_s: float
) -> tuple[dict[str, Any], list[Repetition]]:
    rep_objs: list[Repetition] = []
    for r in reps:
        ba, bb = baselines_of(r["baseline_a"], derived_files), baselines_of(r["baseline_b"], derived_files)
        r["baselines"] = {"a": ba, "b": bb}
        obj = Repetition(
            r["index"],
            ba["count"],
            r["load"]["summary"]["overhead_ms"]["p50"],
            bb["count"],
            raw={"baselines": r["baselines"]},
        )
        rep_objs.append(obj)
    kept = [(r, o) for r, o in zip(reps, rep_objs, strict=True) if o.kept]
    kept_anchor = [
        r for r in reps if common.baselines_agree(r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"])
    ]
    kept_ex = [
        r
        for r in reps
        if common.baselines_agree(r["baselines"]["a"]["count_ex_media"], r["baselines"]["b"]["count_ex_media"])
    ]

    def spread(
        fn: Callable[[dict[str, Any]], float], among: Sequence[dict[str, Any]] | None = None
    ) -> dict[str, Any] | None:
        s = common.summarize(fn(r) for r in (among if among is not None else [r for r, _ in kept]))
        return s.as_dict() if s else None

    def base(r: dict[str, Any], kind: str) -> float:
        return (r["baselines"]["a"][kind] + r["baselines"]["b"][kind]) / 2

    figures = []
    for point, metric, kind, label in FIGURES:
        for q in ("p50", "p99"):
            figures.append(
                {
                    "point": point,
                    "metric": metric,
                    "label": label,
                    "q": q,
                    "baseline": kind,
                    "ms": spread(lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q]),
                    "ms_all": spread(lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q], reps),
                    "ratio": spread(
                        lambda r, p=point, m=metric, q=q, k=kind: r[p]["summary"][m][q] / base(r, k),
                        kept_ex if kind == "count_ex_media" else None,
                    ),
                    "ratio_all": spread(
                        lambda r, p=point, m=metric, q=q, k=kind: r[p]["summary"][m][q] / base(r, k), reps
                    ),
                    "ratio_anchor": spread(
                        lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q] / base(r, "anchor"), kept_anchor
                    ),
                    "kept": len(kept_ex) if kind == "count_ex_media" else len(kept),
                    "kept_anchor": len(kept_anchor),
                }
            )
    steps = {}
    for key in ("commit", "hop", "http", "s3", "lpush", "brpop", "create_task", "claim_outbox_1", "transition", "eval"):
        steps[key] = spread(
            lambda r, k=key: (r["baseline_a"]["latency_ms"][k] + r["baseline_b"]["latency_ms"][k]) / 2, reps
        )
    stages = {}
    for point in ("idle", "load"):
        stages[point] = {
            k: {q: spread(lambda r, p=point, k=k, q=q: r[p]["summary"][k][q], reps) for q in ("p50", "p99")}
            for k in [s for s, _ in STAGE_LABELS] + ["sim_late_ms", "post_ms", "media_ms"]
        }
    summary = {
        "kept": len(kept),
        "kept_anchor": len(kept_anchor),
        "total": len(reps),
        "derived_files": derived_files,
        "job_seconds": job_s,
        "baseline_count_ms": spread(lambda r: base(r, "count"), reps),
        "baseline_count_ex_media_ms": spread(lambda r: base(r, "count_ex_media"), reps),
        "baseline_anchor_ms": spread(lambda r: base(r, "anchor"), reps),
        "steps_ms": steps,
        "figures": figures,
        "stages": stages,
        "load_rate": reps[0]["load"]["offered_rate"] if reps else None,
        "load_sustained": [r["load"]["sustained"] for r in reps],
        "load_completion_rate": spread(lambda r: r["load"]["completion_rate"]),
        "idle_completion_rate": spread(lambda r: r["idle"]["completion_rate"]),
    }
    return summary, rep_objs


def _rep_doc(r: dict[str, Any], o: Repetition) -> dict[str, Any]:
    return {
        **r,
        "headline_baseline_divergence": o.divergence if math.isfinite(o.divergence) else None,
        "anchor_baseline_divergence": common.baseline_divergence(
            r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"]
        ),
        "kept": o.kept,
        "kept_anchor": common.baselines_agree(r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"]),
    }


# -------------------------------------------------------------------------------------------- output
def _sp(s: dict[str, Any] | None, digits: int = 1) -> tuple[str, str]:
    if not s:
        return "—", "—"
    return fmt(s["median"], digits), f"{fmt(s['min'], digits)} – {fmt(s['max'], digits)}"


def _target(point: str, label: str, q: str) -> str:
    if label != "headline":
        return "(diagnostic)"
    if point == "load":
        return f"≤ {TARGET_P50_X:g}× (floor {FLOOR_P50_X:g}×)" if q == "p50" else f"≤ {TARGET_P99_X:g}×"
    return f"≤ {IDLE_P99_MS:g} ms" if q == "p99" else ""


def _verdict(point: str, label: str, q: str, ms: dict[str, Any] | None, ratio: dict[str, Any] | None) -> str:
    if label != "headline" or not ms or not ratio:
        return ""
    x, v = ratio["median"], ms["median"]
    if point == "load" and q == "p50":
        return "met" if x <= TARGET_P50_X else ("missed (floor met)" if x <= FLOOR_P50_X else "MISSED, floor too")
    if point == "load" and q == "p99":
        return "met" if x <= TARGET_P99_X else "MISSED"
    if point == "idle" and q == "p99":
        return "met" if v <= IDLE_P99_MS else "MISSED"
    return ""


def render(doc: dict[str, Any]) -> str:
    m, g, c = doc["machine"], doc["git"], doc["config"]
    out = [
        f"e2e_overhead — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
        f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
        f"synchronous_commit={c['synchronous_commit']}, observe={c['observe']}, sim job {c['job_seconds']:g} s "
        f"(subtracted), scheduler tick {c['scheduler_interval_s']:g} s, {c['worker_threads']} worker threads, "
        f"{c['reps']} reps"
    ]
    sm = doc.get("summary")
    search = doc.get("load_search") or {}
    if not sm:
        return "\n".join(out + ["", f"no result: {doc.get('error', 'nothing measured')}"])
    n = sm["total"]
    rate = sm.get("load_rate")
    if search.get("skipped"):
        note = " (--rep-load-rate)"
    elif search.get("reached"):
        note = ""
    else:
        note = (
            f" ({'highest sustained found' if search.get('sustained_found') else 'lowest probed, NOT sustained'};"
            f" {search.get('target_rate', LOAD_RATE):g}/s NOT reached)"
        )
    load_label = f"load {rate:g}/s{note}" if rate else "load"
    rows = []
    for f in sm["figures"]:
        point = load_label if f["point"] == "load" else f"idle {doc['config']['idle_rate']:g}/s"
        ms, msr = _sp(f["ms"], 1)
        ratio, ratior = _sp(f["ratio"], 1)
        anchor, _ = _sp(f["ratio_anchor"], 0)
        ms_all, _ = _sp(f["ms_all"], 1)
        ratio_all, _ = _sp(f["ratio_all"], 1)
        verdict = _verdict(f["point"], f["label"], f["q"], f["ms"], f["ratio"])
        if not verdict and f["ms"] is None:
            v_all = _verdict(f["point"], f["label"], f["q"], f["ms_all"], f["ratio_all"])
            verdict = f"{v_all} (all reps)" if v_all else ""
        v_anchor = _verdict(f["point"], f["label"], f["q"], f["ms_all"], f["ratio_anchor"])
        if verdict and f["point"] == "load" and v_anchor:
            verdict = f"{verdict}; vs anchor: {v_anchor}"
        rows.append(
            [
                point,
                f["label"],
                f["q"],
                ms,
                msr,
                f"{ratio}×",
                ratior,
                f"{f['kept']}/{n}",
                f"{anchor}×",
                f"{f['kept_anchor']}/{n}",
                ms_all,
                f"{ratio_all}×",
                _target(f["point"], f["label"], f["q"]),
                verdict,
            ]
        )
    bc, _ = _sp(sm["baseline_count_ms"], 2)
    bce, _ = _sp(sm["baseline_count_ex_media_ms"], 2)
    ba, bar = _sp(sm["baseline_anchor_ms"], 2)
    out += [
        "",
        f"Overhead = terminal seen − 202 − {sm['job_seconds']:g} s, in ms: median over the kept reps of each "
        f"rep's p50/p99. Ratio = ÷ the count-based baseline of the same rep, mean(A, B) (median {bc} ms; "
        f"media-excluded figures ÷ {bce} ms); anchor ratio = ÷ the C.4 formula (median {ba} ms), kept on its "
        "own A/B pair. 'all reps' = median over every repetition, discarded ones included.",
        table(
            [
                "point",
                "figure",
                "q",
                "ms",
                "ms spread",
                "ratio",
                "ratio spread",
                "kept",
                "anchor ratio",
                "kept",
                "ms, all reps",
                "ratio, all reps",
                "target",
                "verdict",
            ],
            rows,
        ),
    ]

    # load levels
    lv = []
    for p in ([search["attempt"]] if search.get("attempt") else []) + search.get("probes", []):
        s = p["summary"]["overhead_ms"]
        lv.append(
            [
                p["label"],
                fmt(p["offered_rate"]),
                fmt(p["achieved_send_rate"]),
                fmt(p["completion_rate"]),
                f"{p['succeeded']}/{p['sent']} of {p['tasks']}",
                fmt(s["p50"], 0),
                fmt(s["p99"], 0),
                fmt(s["max"], 0),
                "yes" if p["sustained"] else "NO: " + str(p["trend"].get("reason", "")),
                fmt(p["elapsed_s"], 0),
            ]
        )
    for r in doc.get("repetitions", []):
        for key in ("idle", "load"):
            p = r[key]
            s = p["summary"]["overhead_ms"]
            lv.append(
                [
                    p["label"],
                    fmt(p["offered_rate"]),
                    fmt(p["achieved_send_rate"]),
                    fmt(p["completion_rate"]),
                    f"{p['succeeded']}/{p['sent']} of {p['tasks']}",
                    fmt(s["p50"], 0),
                    fmt(s["p99"], 0),
                    fmt(s["max"], 0),
                    "yes" if p["sustained"] else "NO: " + str(p["trend"].get("reason", "")),
                    fmt(p["elapsed_s"], 0),
                ]
            )
    if lv:
        head = "Load levels (rates in tasks/s; completion rate = finishes/s between the 10th and 90th percentile):"
        if search.get("attempt") and not search.get("reached"):
            head += (
                f" {search['target_rate']:g}/s was NOT sustained; saturated completion rate "
                f"{fmt(search.get('saturated_completion_rate'))}/s; highest sustained rate found: "
                f"{fmt(search['rate']) if search.get('sustained_found') else 'none'}."
            )
        out += [
            "",
            head,
            table(
                [
                    "point",
                    "offered /s",
                    "sent /s",
                    "completed /s",
                    "succeeded/sent of planned",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "sustained",
                    "seconds",
                ],
                lv,
            ),
        ]

    # baselines
    counts, counts_ex = doc["config"]["step_counts"], doc["config"]["step_counts_ex_media"]
    counts = {**counts, "s3": 3 + sm["derived_files"]}
    counts_ex = {**counts_ex}
    st = sm["steps_ms"]
    brows = []
    for key, label in (
        ("commit", "durable commit, 1-row INSERT (pgbench c=1)"),
        ("hop", "Redis hop: LPUSH + BRPOP, 300 B (redis-benchmark c=1)"),
        ("http", "loopback HTTP: GET /healthz on the API, keep-alive"),
        ("s3", "S3 PUT 1 KiB to moto (boto3)"),
    ):
        med, sp = _sp(st.get(key), 3)
        contrib = st[key]["median"] * counts[key] if st.get(key) else math.nan
        brows.append([label, med, sp, counts[key], counts_ex[key], fmt(contrib, 2)])
    brows.append(["count-based baseline (Σ count × latency)", bc, _sp(sm["baseline_count_ms"], 2)[1], "", "", bc])
    for key, label, mult in (
        ("create_task", "anchor: create_task.sql (pgbench c=1)", 1),
        ("claim_outbox_1", "anchor: claim_outbox_1.sql (pgbench c=1)", 1),
        ("transition", "anchor: transition.sql (pgbench c=1)", 2),
        ("eval", "anchor: Dramatiq-style EVAL (redis-benchmark c=1)", 2),
    ):
        med, sp = _sp(st.get(key), 3)
        brows.append([label, med, sp, mult, "", fmt(st[key]["median"] * mult, 2) if st.get(key) else "—"])
    brows.append(["C.4 anchor formula (≈ 2.3 ms in performance_anchors)", ba, bar, "", "", ba])
    out += [
        "",
        f"Baseline steps (ms, mean(A, B), median over all reps); counts per task from the code, S3 count = "
        f"HEAD + PUT raw + GET raw + {sm['derived_files']} derivative objects counted in the bucket:",
        table(["step", "latency ms", "spread", "count", "count ex media", "contribution ms"], brows),
    ]

    # stages
    srows = []
    for key, label in STAGE_LABELS + (
        ("sim_late_ms", "of which the sim: webhook stored − (sim job created + job_seconds)"),
        ("post_ms", "(before the interval) POST → 202"),
    ):
        cells = [label]
        for point in ("idle", "load"):
            for q in ("p50", "p99"):
                cells.append(_sp(sm["stages"][point][key][q], 1)[0])
        srows.append(cells)
    out += [
        "",
        "Where the time goes (ms; consecutive stages along the path from state-event timestamps, the "
        "webhook's received_at and the client's clocks; they sum to the headline; median over all reps):",
        table(["stage", "idle p50", "idle p99", "load p50", "load p99"], srows),
    ]

    # CPU
    crows = []
    for r in doc.get("repetitions", []):
        cpu = r["load"].get("cpu") or {}
        if not cpu:
            continue
        rate_ = r["load"]["offered_rate"]

        def cell(name: str) -> str:
            v = cpu.get(f"{name}_cores")  # noqa: B023 - called within this iteration
            return "—" if v is None else f"{v:.2f} ({v * 1000 / rate_:.0f})"  # noqa: B023 - called within this iteration

        crows.append(
            [
                r["load"]["label"],
                f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %",
                cell("api"),
                cell("worker"),
                cell("media_children"),
                cell("postgres"),
                cell("pg_shared"),
                cell("redis"),
                cell("sim"),
                cell("moto"),
                cell("client"),
                cell("other"),
            ]
        )
    if crows:
        out += [
            "",
            "CPU during the load points' sending window (cores; CPU ms per task in brackets; media = the "
            "worker's ffprobe/ffmpeg children; other = everything else on the shared box):",
            table(
                [
                    "point",
                    "box busy",
                    "API proc",
                    "worker proc",
                    "media",
                    "PG backends",
                    "PG shared",
                    "redis",
                    "sim",
                    "moto",
                    "client",
                    "other",
                ],
                crows,
            ),
        ]

    # per rep
    prow = []
    for r in doc.get("repetitions", []):
        ba_, bb_ = r["baselines"]["a"], r["baselines"]["b"]
        prow.append(
            [
                r["index"],
                fmt(ba_["count"], 2),
                fmt(bb_["count"], 2),
                f"{100 * r['headline_baseline_divergence']:.1f} %"
                if r["headline_baseline_divergence"] is not None
                else "—",
                fmt(ba_["anchor"], 3),
                fmt(bb_["anchor"], 3),
                f"{100 * r['anchor_baseline_divergence']:.1f} %",
                fmt(r["idle"]["summary"]["overhead_ms"]["p50"], 0),
                fmt(r["idle"]["summary"]["overhead_ms"]["p99"], 0),
                fmt(r["load"]["summary"]["overhead_ms"]["p50"], 0),
                fmt(r["load"]["summary"]["overhead_ms"]["p99"], 0),
                "yes" if r["kept"] else "DISCARDED",
                "yes" if r.get("kept_anchor") else "DISCARDED",
            ]
        )
    out += [
        "",
        "Per repetition (baselines in ms; overheads in ms):",
        table(
            [
                "rep",
                "count A",
                "count B",
                "A/B differ",
                "anchor A",
                "anchor B",
                "anchor differ",
                "idle p50",
                "idle p99",
                "load p50",
                "load p99",
                "kept (count)",
                "kept (anchor)",
            ],
            prow,
        ),
    ]

    gt = doc.get("gate")
    if gt:
        out += [
            "",
            f"Correctness gate: {'PASS' if gt['ok'] else 'FAIL'} — {gt['tasks']:,} tasks (client "
            f"{gt['client_tasks']:,}), SETTLE rows {gt['settle_rows']:,}, applied state events "
            f"{gt['applied_state_events']:,}, sim jobs {gt['sim_jobs']:,}, derivative objects per task "
            f"{fmt(gt['derived_objects_per_task'])}, client errors {gt['client_error_count']}",
        ]
        out += [f"  [{'x' if ok else ' '}] {name}" for name, ok in gt["checks"].items()]
        if gt["client_errors"]:
            out += [f"  first client errors: {gt['client_errors'][:3]}"]
    return "\n".join(out)
