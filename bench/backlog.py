"""backlog: do the hot paths slow down as the engine's bookkeeping grows? The relay's rate (bench.relay) and the
reducer's in-process rate (bench.reducer's workload: RUNNING then SUCCEEDED observations for seeded SUBMITTED tasks)
with `--old` old PUBLISHED outbox rows and `--old` old state events present, ÷ the same on empty tables, in the same
run (issue 16 item 8; target ≥ 0.8 for both).

Each side gets its own private database; the old rows are bulk-inserted with SQL (outbox rows a month old and
published, state events of a thousand old tasks), then VACUUM ANALYZE, as a long-running deployment would have them.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import Postgres
from bench.relay import System, make_system, relay_rate

DESCRIPTION = "relay and reducer rates with 1M old outbox rows and 1M old state events ÷ on empty tables; --quick"

_OLD_EVENTS_SQL = """
INSERT INTO task_state_events (id, task_id, attempt_id, source, source_event_id, event_type, from_status, to_status,
                               task_version, observed_at, payload, outcome, created_at)
SELECT gen_random_uuid(), t.ids[1 + (g % array_length(t.ids, 1))], NULL, 'polling', 'old-' || g || '-{tag}',
       'provider.status.observed', 'SUBMITTED', 'RUNNING', 3, now() - interval '30 days', NULL, 'applied',
       now() - interval '30 days'
FROM generate_series({lo}, {hi}) g,
     (SELECT array_agg(id) AS ids FROM generation_tasks WHERE client_idempotency_key LIKE 'old-%') t
"""


def add_arguments(p: Any) -> None:
    p.add_argument("--old", type=int, default=1_000_000, help="old outbox rows and old state events (default 1M)")
    p.add_argument("--rows", type=int, default=30_000, help="outbox rows the relay publishes per side")
    p.add_argument("--tasks", type=int, default=3_000, help="tasks whose two observations the reducer applies")
    p.add_argument("--threads", type=int, default=4, help="reducer threads (default %(default)s)")
    common.add_output_args(p, "200k old rows, 10,000 relay rows, 1,000 reducer tasks (< 2 min)")
    common.add_infra_args(p)


def _reducer_rate(system: System, tasks: int, threads: int, seed: int) -> dict[str, Any]:
    from bench.reducer import Workload, inproc_point

    work = Workload(system.pg.url(system.db, driver="postgresql"), [system.tenant], random.Random(seed), 4, 0.0)
    measured = work.seed("measured", tasks)
    warm = work.seed("warm", max(50, tasks // 10))
    system.pg.psql(system.db, "VACUUM ANALYZE")
    res = inproc_point(system.settings(), measured, warm, threads, system.db)
    return {k: res[k] for k in ("distinct", "processed", "errors", "elapsed_s", "events_per_s")}


def _age(system: System, old: int) -> dict[str, Any]:
    from bench.reducer import Workload

    t0 = time.monotonic()
    Workload(system.pg.url(system.db, driver="postgresql"), [system.tenant], random.Random(0), 4, 0.0).seed("old", 1000)
    system.fill(old, status="PUBLISHED", age="30 days")
    chunk = 200_000
    for lo in range(1, old + 1, chunk):
        system.pg.psql(system.db, _OLD_EVENTS_SQL.format(lo=lo, hi=min(old, lo + chunk - 1), tag=lo))
    system.pg.psql(system.db, "VACUUM ANALYZE")
    sizes = system.pg.psql(
        system.db,
        "SELECT relname || '=' || pg_total_relation_size(oid) FROM pg_class "
        "WHERE relname IN ('outbox_events', 'task_state_events')",
    )
    return {"old_rows": old, "setup_s": round(time.monotonic() - t0, 1), "bytes": sizes.replace("\n", ", ")}


def run(args: Any) -> int:
    common.apply_quick(
        args, {"old": 200_000, "rows": 10_000, "tasks": 1_000}, {"old": 1_000_000, "rows": 30_000, "tasks": 3_000}
    )
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    doc: dict[str, Any] = {"benchmark": "backlog", "machine": common.machine_info(), "git": common.git_info(),
                           "started_at": common.utc_now(), "old": args.old}  # fmt: skip
    sides: dict[str, dict[str, Any]] = {}
    for side in ("empty", "aged"):
        system = make_system(pg, f"backlog_{side}", args.redis_url)
        try:
            if side == "aged":
                sides[side] = {"aging": _age(system, args.old)}
            else:
                sides[side] = {}
            sides[side]["relay"] = relay_rate(system, args.rows, 200)
            sides[side]["reducer"] = _reducer_rate(system, args.tasks, args.threads, seed=7)
        finally:
            system.close(args.keep_dbs)
    doc["sides"] = sides
    e, a = sides["empty"], sides["aged"]
    doc["relay_ratio"] = a["relay"]["rows_per_s"] / e["relay"]["rows_per_s"]
    doc["reducer_ratio"] = a["reducer"]["events_per_s"] / e["reducer"]["events_per_s"]
    gates = {
        f"{side}: relay published all": s["relay"]["published"] == s["relay"]["rows"] for side, s in sides.items()
    } | {f"{side}: reducer applied all, no errors": s["reducer"]["errors"] == 0 for side, s in sides.items()}
    doc["gates"] = gates
    human = common.table(
        ["figure", "empty tables", f"{args.old:,} old rows", "aged ÷ empty", "target"],
        [
            ["relay rows/s", common.fmt(e["relay"]["rows_per_s"], 0), common.fmt(a["relay"]["rows_per_s"], 0),
             common.fmt(doc["relay_ratio"]), "≥ 0.8"],
            ["reducer events/s", common.fmt(e["reducer"]["events_per_s"], 0),
             common.fmt(a["reducer"]["events_per_s"], 0), common.fmt(doc["reducer_ratio"]), "≥ 0.8"],
            *[[f"gate: {k}", "ok" if v else "FAILED", "", "", ""] for k, v in gates.items()],
        ],
    )  # fmt: skip
    path = Path(args.json_out) if args.json_out else common.default_json_path("backlog")
    common.write_json(path, doc)
    common.emit(args, doc, human, path, sys.stdout)
    return 0 if all(gates.values()) else 1
