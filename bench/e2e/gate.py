"""The correctness gate over every task of the run (warm-up and probes included): a failing check makes the
benchmark exit 1."""

from __future__ import annotations

import math
from typing import Any

from bench.e2e.model import REQUIRED_OUTPUTS
from bench.e2e.system import System


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
