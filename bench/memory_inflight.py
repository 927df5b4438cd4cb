"""memory_inflight: what `--tasks` in-flight tasks cost in memory and on disk, ÷ the raw bytes they consist of
(issue 16 item 8; target ≤ 1.25×).

Each task is created through the product's service (`GenerationService.create`: the task, its creation state
events, the RESERVE ledger row, the outbox rows) and then dispatched by the product's dispatcher (QUEUED →
DISPATCHING: a slot lease in Redis, the attempt row, a submit message in the outbox) — a create plus two
transitions, and the task is in flight, holding its slot. Measured around that: Δ RSS of this process (which hosts
the engine), Δ Redis `used_memory`, Δ PostgreSQL relation sizes (tables, indexes, TOAST) of the private database.
The raw bytes are the tuples themselves: Σ `pg_column_size(row)` of every row those tasks wrote, plus the Redis
keys' own `MEMORY USAGE`. Limits are raised so every task can be in flight at once; the provider is `local`, which
the dispatcher never calls (nothing is submitted: the relay is not running).
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import Postgres
from bench.relay import make_system

DESCRIPTION = "Δ RSS + Δ Redis + Δ relation size of N in-flight tasks ÷ their raw bytes; --quick, --json"

#: the tables one create + dispatch writes to
TABLES = ("generation_tasks", "task_attempts", "task_state_events", "credit_ledger", "outbox_events")


def add_arguments(p: Any) -> None:
    p.add_argument("--tasks", type=int, default=10_000, help="in-flight tasks (default %(default)s)")
    common.add_output_args(p, "2,000 tasks (< 1 min)")
    common.add_infra_args(p)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _relation_bytes(pg: Postgres, db: str) -> int:
    # every relation of the schema: tables with their indexes and TOAST (the whole footprint on disk)
    return int(pg.scalar(db, "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relkind = 'r' "
                             "AND c.relnamespace = 'public'::regnamespace"))  # fmt: skip


def _raw_bytes(pg: Postgres, db: str) -> dict[str, int]:
    out = {}
    for table in TABLES:
        out[table] = int(pg.scalar(db, f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t"))
    return out


def _redis(url: str, prefix: str) -> tuple[int, int, int]:
    import redis

    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    usage = sum(int(r.memory_usage(k) or 0) for k in keys)
    return int(r.info("memory")["used_memory"]), len(keys), usage


def run(args: Any) -> int:
    common.apply_quick(args, {"tasks": 2_000}, {"tasks": 10_000})
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.config import load_settings

    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    system = make_system(pg, "inflight", args.redis_url)
    base = system.settings()
    overrides = {
        **{k: v for k, v in base.model_dump(mode="json").items() if k in ("mode", "data_dir", "database", "broker",
                                                                           "redis")},
        "limits": {"platform_max_concurrency": args.tasks * 2, "tenant_default_max_concurrency": args.tasks * 2},
        "providers": {"local": {"max_concurrency": args.tasks * 2}},
    }  # fmt: skip
    settings = load_settings(common.REPO / "aivedio.toml", overrides)
    doc: dict[str, Any] = {"benchmark": "memory_inflight", "machine": common.machine_info(), "git": common.git_info(),
                           "started_at": common.utc_now(), "tasks": args.tasks}  # fmt: skip
    ctx = build_context(settings)
    try:
        ctx.generations.create(system.tenant, "warm", {"prompt": "warm up", "model": "local-v1", "duration_s": 2})
        ctx.dispatcher.run_once(10)  # imports, pools and caches in place before the baseline is read
        pg.psql(system.db, "CHECKPOINT")
        before = {"rss": _rss_bytes(), "redis": _redis(args.redis_url, system.prefix),
                  "relations": _relation_bytes(pg, system.db), "raw": _raw_bytes(pg, system.db)}  # fmt: skip
        t0 = time.monotonic()
        for i in range(args.tasks):
            ctx.generations.create(system.tenant, f"k{i}", {"prompt": f"scene {i}", "model": "local-v1",
                                                            "duration_s": 2})  # fmt: skip
        created_s = time.monotonic() - t0
        dispatched = 0
        while dispatched < args.tasks:
            n = ctx.dispatcher.run_once(500)
            if n == 0:
                break
            dispatched += n
        after = {"rss": _rss_bytes(), "redis": _redis(args.redis_url, system.prefix),
                 "relations": _relation_bytes(pg, system.db), "raw": _raw_bytes(pg, system.db)}  # fmt: skip
        in_flight = int(pg.scalar(system.db, "SELECT count(*) FROM generation_tasks WHERE status = 'DISPATCHING'"))
    finally:
        ctx.close()
        system.close(args.keep_dbs)
    raw_rows = {t: after["raw"][t] - before["raw"][t] for t in TABLES}
    raw_redis = after["redis"][2] - before["redis"][2]
    raw = sum(raw_rows.values()) + raw_redis
    deltas = {
        "rss": after["rss"] - before["rss"],
        "redis": after["redis"][0] - before["redis"][0],
        "relations": after["relations"] - before["relations"],
    }
    total = sum(deltas.values())
    doc.update(
        created_s=round(created_s, 1), dispatched=dispatched, in_flight=in_flight, deltas=deltas,
        raw={"rows": raw_rows, "redis_keys": raw_redis, "total": raw},
        per_task={"delta_bytes": total / args.tasks, "raw_bytes": raw / args.tasks}, ratio=total / raw,
    )  # fmt: skip
    gates = {"every task in flight": in_flight == args.tasks + 1 and dispatched >= args.tasks}
    doc["gates"] = gates
    human = common.table(
        ["figure", "bytes", "per task"],
        [
            ["Δ RSS (this process, hosting the engine)", f"{deltas['rss']:,}", f"{deltas['rss'] / args.tasks:,.0f}"],
            ["Δ Redis used_memory", f"{deltas['redis']:,}", f"{deltas['redis'] / args.tasks:,.0f}"],
            ["Δ relations (tables + indexes + TOAST)", f"{deltas['relations']:,}",
             f"{deltas['relations'] / args.tasks:,.0f}"],
            ["raw: row bytes written", f"{sum(raw_rows.values()):,}", f"{sum(raw_rows.values()) / args.tasks:,.0f}"],
            ["raw: Redis keys", f"{raw_redis:,}", f"{raw_redis / args.tasks:,.0f}"],
            ["Δ total ÷ raw (target ≤ 1.25)", common.fmt(doc["ratio"]), ""],
            *[[f"gate: {k}", "ok" if v else "FAILED", ""] for k, v in gates.items()],
        ],
    )  # fmt: skip
    path = Path(args.json_out) if args.json_out else common.default_json_path("memory_inflight")
    common.write_json(path, doc)
    common.emit(args, doc, human, path, sys.stdout)
    return 0 if all(gates.values()) else 1
