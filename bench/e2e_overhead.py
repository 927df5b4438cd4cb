"""`e2e_overhead`: what a user of the distributed deployment feels, per task, with the sim's standard clip.

Overhead per task = (SUCCEEDED seen by the client over SSE) − (202 returned) − (the sim's own job time,
`--job-seconds`). The system (`bench/e2e/system.py`): PostgreSQL (own database), RabbitMQ (own vhost; `--broker
redis` for the Redis broker), Redis (own key prefix), moto S3, the sim provider, and one `aivedio serve` process
per role group — api; scheduler + sweeper; relay; worker — so each group's CPU is its own. Admission caps are
raised to 1024 so the benchmark measures overhead, not a configured cap.

Procedure: warm-up tasks; the **saturation** search — closed loop with `--concurrency` tasks in flight (each
finished task is followed by the next) for `--saturation-seconds`, per concurrency; saturation = the highest
completion rate inside the CPU window (the steady middle of the point), and the **CPU seconds per task** by
process group are that window's CPU ÷ its completions (the worker's ffprobe/ffmpeg children from its cutime).
Then `--reps` times: baseline A; the **idle** point (`--idle-tasks` one at a time, closed loop with one in
flight); the **load** point (open loop at `--load-share` × saturation for `--duration` s); baseline B.

Per point (`bench/e2e/analysis.py`): overhead p50/p99; the **stage split** from the database's own timestamps
(202 → DISPATCHING → SUBMITTED → webhook stored − job time → POST_PROCESSING → last derivative READY →
SUCCEEDED → seen); the **hop latency** of every message the worker started (enqueue = the outbox row's
created_at → actor start, recorded by `bench/e2e/probe.py`, a Dramatiq middleware on the worker's broker; split
into outbox+relay (→ published_at) and broker (published_at → start)).

Baselines (`bench/e2e/baseline.py`, A-B-A): the single-client latency of each physical step the
pipeline needs (commit, Redis hop, loopback HTTP, S3 PUT) × its count per task (`bench/e2e/model.py`), and the
C.4 anchor formula; the idle and load overheads are also shown as ratios to them, a repetition kept when its A
and B agree within 10 %.

Correctness gate (`bench/e2e/gate.py`, every task of the run): 202 and SUCCEEDED seen with proxy_mp4, hls and
thumbnail outputs; in the database every task SUCCEEDED with reserved 0, one RESERVE and one SETTLE, one attempt,
contiguous applied state events; no dead letter, no DEAD outbox row; one sim job per task. A failing gate exits 1.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench import common
from bench.common import BenchError, Postgres
from bench.e2e import model
from bench.e2e.baseline import BASELINE_EXTRA_SQL, PGBENCH_SCRIPTS, BaselineEnv, baseline_block
from bench.e2e.gate import correctness_gate
from bench.e2e.model import EXPECTED_DERIVED_FILES, pipeline, step_counts
from bench.e2e.points import measure_saturation, run_point
from bench.e2e.render import render
from bench.e2e.stats import round_rate
from bench.e2e.summary import _rep_doc, felt, summarize_run
from bench.e2e.system import System

NAME = "e2e_overhead"
DESCRIPTION = (
    "overhead per task (SUCCEEDED seen − 202 − sim job time) idle and at 50 % of saturation, stage split, hop "
    "latency, saturation tasks/s, CPU per task by process group; gated on correctness"
)
QUICK = {
    "reps": 1,
    "duration": 12,
    "idle_tasks": 15,
    "warmup_tasks": 4,
    "saturation_seconds": 16.0,
    "concurrency": [12],
    "baseline_seconds": 1,
}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("give one or more concurrencies >= 1, e.g. 8,16,32")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(duration=20)
    p.add_argument("--concurrency", type=_ints, default=[8, 16, 32], help="closed-loop saturation levels (8,16,32)")
    p.add_argument("--saturation-seconds", type=float, default=30.0, help="seconds of each saturation point")
    p.add_argument("--load-share", type=float, default=0.5, help="the load point's rate ÷ saturation (0.5)")
    p.add_argument("--rep-load-rate", type=float, default=None, help="the load point's rate, tasks/s (skips nothing)")
    p.add_argument("--idle-tasks", type=int, default=40, help="tasks of each idle point, one at a time (40)")
    p.add_argument("--idle-gap-ms", type=float, default=100.0, help="pause between idle tasks (100 ms)")
    p.add_argument("--warmup-tasks", type=int, default=6, help="tasks (2 in flight) before anything is measured")
    p.add_argument("--job-seconds", type=float, default=0.2, help="the sim's job time: the known provider delay")
    p.add_argument("--baseline-seconds", type=int, default=3, help="seconds of each pgbench c=1 baseline run")
    p.add_argument("--observe", choices=("sse", "get"), default="sse", help="SSE stream (default) or polling GET")
    p.add_argument("--get-interval-ms", type=float, default=5.0, help="GET polling interval with --observe get")
    p.add_argument("--worker-threads", type=int, default=8, help="broker.worker_threads of the worker process")
    p.add_argument("--broker", choices=("rabbitmq", "redis"), default="rabbitmq", help="the distributed broker")
    p.add_argument("--pool-size", type=int, default=20, help="database.pool_size of each aivedio process")
    p.add_argument("--point-timeout", type=int, default=600, help="seconds a point may take to finish")
    p.add_argument("--max-backlog", type=int, default=100, help="open loop: stop sending at this many in flight")
    common.add_output_args(p, "1 rep, 16 s saturation at c=12, 15 idle tasks, 12 s load (< 4 min)")
    common.add_infra_args(p)
    p.set_defaults(_defaults={k: p.get_default(k) for k in QUICK})


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _brief(p: dict[str, Any]) -> str:
    s = p["summary"]["overhead_ms"]
    return (
        f"{p['label']}: {p['succeeded']}/{p['tasks']} (sent {p['sent']}), overhead p50 {s['p50']:.0f} ms p99 "
        f"{s['p99']:.0f} ms, hop p50 {p['hops']['hop_ms']['p50']:.1f} ms, completions {p['completion_rate']:.1f}/s"
        f" ({p['elapsed_s']:.0f} s)"
    )


def _point_doc(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if k != "client"}


def _scheduler_interval() -> float:
    from aivedio_engine.worker.runtime import SCHEDULER_INTERVAL_S

    return SCHEDULER_INTERVAL_S


def measure(system: System, env: BaselineEnv, args: argparse.Namespace, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Warm-up, saturation, then the repetitions; returns every point (for the gate); fills `doc`."""
    points: list[dict[str, Any]] = []
    if args.warmup_tasks:
        w = run_point(system, "warmup", args, n=args.warmup_tasks, concurrency=2)
        points.append(w)
        _log(_brief(w))
    saturation = measure_saturation(system, args, _log)
    points += saturation["points"]
    doc["saturation"] = {**saturation, "points": [_point_doc(p) for p in saturation["points"]]}
    sat = saturation["rate"]
    load_rate = args.rep_load_rate or round_rate(args.load_share * (sat if sat and math.isfinite(sat) else 2.0))
    reps: list[dict[str, Any]] = []
    for i in range(1, args.reps + 1):
        quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
        _log(f"rep {i}/{args.reps}: baseline A")
        a = baseline_block(env)
        idle = run_point(system, f"rep{i}-idle", args, n=args.idle_tasks, concurrency=1, gap_s=args.idle_gap_ms / 1000)
        points.append(idle)
        _log(_brief(idle))
        n_load = max(2, round(load_rate * args.duration))
        skip = min(3.0, args.duration / 4)
        load = run_point(
            system, f"rep{i}-load", args, rate=load_rate, n=n_load, cpu_window=(skip, args.duration - 2 * skip)
        )
        points.append(load)
        _log(_brief(load))
        _log(f"rep {i}: baseline B")
        b = baseline_block(env)
        reps.append(
            {"index": i, "baseline_a": a, "baseline_b": b, "idle": _point_doc(idle), "load": _point_doc(load)}
            | {"quiet_before": quiet}
        )
    _log("correctness gate")
    gate = correctness_gate(system, points)
    derived = gate["derived_objects_per_task"]
    derived_files = round(derived) if math.isfinite(derived) and derived > 0 else EXPECTED_DERIVED_FILES
    summary, rep_objs = summarize_run(reps, derived_files, args.job_seconds)
    summary["felt"] = felt(summary, reps, saturation)
    doc.update(
        summary=summary,
        repetitions=[_rep_doc(r, o) for r, o in zip(reps, rep_objs, strict=True)],
        gate=gate,
        derived_files_used=derived_files,
        warmup=[_point_doc(p) for p in points if p["label"] == "warmup"],
        pipeline=[s.__dict__ for s in pipeline(derived_files)],
    )
    return points


def run(args: argparse.Namespace) -> int:
    import redis

    quick_changed = common.apply_quick(args, QUICK, args._defaults)

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
        broker_kind=args.broker,
    )
    vhost = None
    if args.broker == "rabbitmq":
        from aivedio_engine.testing.rabbitmq import private_vhost

        vhost = private_vhost("bench-e2e")
        system.broker_url = vhost.__enter__()
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "date": started,
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {
            "reps": args.reps,
            "load_seconds": args.duration,
            "quick_changed": quick_changed,
            "concurrency": args.concurrency,
            "saturation_seconds": args.saturation_seconds,
            "load_share": args.load_share,
            "rep_load_rate": args.rep_load_rate,
            "idle_gap_ms": args.idle_gap_ms,
            "idle_tasks": args.idle_tasks,
            "warmup_tasks": args.warmup_tasks,
            "job_seconds": args.job_seconds,
            "baseline_seconds": args.baseline_seconds,
            "observe": args.observe,
            "get_interval_ms": args.get_interval_ms,
            "max_backlog": args.max_backlog,
            "worker_threads": args.worker_threads,
            "pool_size": args.pool_size,
            "broker": args.broker,
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
            "load_p50_x": model.TARGET_P50_X,
            "load_p99_x": model.TARGET_P99_X,
            "floor_p50_x": model.FLOOR_P50_X,
            "idle_p50_ms": model.IDLE_P50_TARGET_MS,
            "idle_p99_ms": model.IDLE_P99_TARGET_MS,
            "saturation_tasks_per_s": model.SATURATION_TARGET,
            "half_load_p99_over_idle_p99": model.HALF_LOAD_P99_X,
        },
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
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
        measure(system, env, args, doc)
        if not doc["gate"]["ok"]:
            code = 1
    except BaseException as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc["logs"] = system.log_tails()
        doc.setdefault("repetitions", [])
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
        if vhost is not None:
            try:
                vhost.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                print(f"warning: RabbitMQ vhost cleanup failed: {exc}", file=sys.stderr)
        doc["finished"] = common.utc_now()
        path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path(NAME), doc)
        shutil.rmtree(workdir, ignore_errors=True)
    common.emit(args, doc, render(doc), path, sys.stdout)
    return code
