"""What a chaos run must show once the faults stop, each from a source of its own:

- quiescence (the database): every task terminal, or parked (with a reason; MANUAL_REVIEW waits for a human)
  within the budget after the last fault;
- `aivedio audit` (a separate process): exit 0;
- the sim's ground truth (HTTP): 0 duplicate paid jobs;
- the ledger (SQL written here, not the engine's): per task, one RESERVE and its rows summing to minus the
  actual cost once terminal; per tenant, the balance moved by exactly the costs;
- slots (Redis through the slot store, and the attempts table): none held;
- the client's history (bench/chaos/history.py).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from decimal import Decimal
from typing import Any

import psycopg

from aivedio_engine.domain.status import ATTEMPT_IN_FLIGHT, ATTEMPT_TERMINAL, TASK_TERMINAL, TaskStatus
from bench.chaos.cluster import Cluster

_TERMINAL = sorted(s.value for s in TASK_TERMINAL)
#: a task a human now holds: parked with a reason, or in review
_WAITING_FOR_HUMAN = "(parked_reason IS NOT NULL OR status = 'MANUAL_REVIEW')"


def unsettled(cluster: Cluster) -> list[tuple[str, str]]:
    """Tasks neither terminal nor held for a human: (id, status)."""
    with psycopg.connect(cluster.dsn) as conn:
        rows = conn.execute(
            f"SELECT id::text, status FROM generation_tasks WHERE status <> ALL(%s) AND NOT {_WAITING_FOR_HUMAN}",
            (_TERMINAL,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def wait_quiet(cluster: Cluster, budget_s: float, revive: Any) -> tuple[float, list[tuple[str, str]]]:
    """Wait until nothing is unsettled; returns (seconds taken, what was left at the deadline)."""
    start = time.monotonic()
    left = unsettled(cluster)
    while left and time.monotonic() - start < budget_s:
        revive()  # a role that died of an armed failpoint is restarted, as its supervisor would
        time.sleep(1.0)
        left = unsettled(cluster)
    return time.monotonic() - start, left


def audit(cluster: Cluster) -> dict[str, Any]:
    done = subprocess.run(
        [*cluster.cli(), "audit", "--json", "--grace", "30s"],
        env=cluster._env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return {"exit": done.returncode, "violated": [f"no JSON: {done.stderr[-500:]}"], "rows": {}}
    violated = [c for c in doc.get("checks", []) if c["status"] != "ok"]
    return {
        "exit": done.returncode,
        "violated": [f"{c['id']} ({c['violations']}): {c['description']}" for c in violated],
        "rows": {c["id"]: c["rows"] for c in violated},
    }


def sim_truth(cluster: Cluster) -> dict[str, Any]:
    with urllib.request.urlopen(f"{cluster.sim_url}/_sim/truth", timeout=30) as r:  # noqa: S310 - loopback sim
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def ledger(cluster: Cluster, tenant_id: str, balance_before: Decimal) -> list[str]:
    problems: list[str] = []
    with psycopg.connect(cluster.dsn) as conn:
        per_task = conn.execute(
            """
            SELECT t.id::text, t.status, t.actual_cost, t.reserved_amount,
                   count(*) FILTER (WHERE l.entry_type = 'RESERVE'),
                   count(*) FILTER (WHERE l.entry_type IN ('SETTLE', 'RELEASE')),
                   COALESCE(sum(l.amount) FILTER (WHERE l.entry_type <> 'ADJUSTMENT'), 0)
            FROM generation_tasks t LEFT JOIN credit_ledger l ON l.task_id = t.id
            GROUP BY t.id
            """
        ).fetchall()
        balance = conn.execute(
            "SELECT COALESCE(sum(balance), 0) FROM tenant_balance_stripes WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
        by_ledger = conn.execute(
            "SELECT COALESCE(sum(amount), 0) FROM credit_ledger WHERE tenant_id = %s", (tenant_id,)
        )
        ledger_sum = by_ledger.fetchone()
    spent = Decimal(0)
    for task_id, status, actual, reserved, reserves, closes, total in per_task:
        if reserves != 1:
            problems.append(f"task {task_id}: {reserves} RESERVE rows")
        if status in _TERMINAL:
            cost = actual or Decimal(0)
            if closes > 1 or total != -cost or reserved != 0:
                problems.append(
                    f"task {task_id} {status}: ledger sums to {total}, actual cost {cost}, "
                    f"{closes} SETTLE/RELEASE, {reserved} still reserved"
                )
            spent += cost
        else:
            spent += reserved  # held for a human: its reservation is still out
    assert balance is not None and ledger_sum is not None
    if balance[0] != balance_before - spent:
        problems.append(f"tenant balance {balance[0]} != {balance_before} - {spent} spent or reserved")
    if balance[0] != ledger_sum[0]:
        problems.append(f"tenant balance {balance[0]} != its ledger's sum {ledger_sum[0]}")
    return problems


def slots(cluster: Cluster) -> tuple[dict[str, int], list[str]]:
    """Slot scopes holding more slots than there are attempts in flight, and attempts still in flight for a
    finished task."""
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.config import load_settings

    ctx = build_context(load_settings(str(cluster.config)))
    try:
        held = ctx.slots.counts()
    finally:
        ctx.close()
    with psycopg.connect(cluster.dsn) as conn:
        rows = conn.execute(
            "SELECT a.id::text, a.submit_state, t.id::text, t.status FROM task_attempts a "
            "JOIN generation_tasks t ON t.id = a.task_id "
            "WHERE a.submit_state <> ALL(%s) AND t.status = ANY(%s)",
            (sorted(s.value for s in ATTEMPT_TERMINAL), _TERMINAL),
        ).fetchall()
        in_flight = conn.execute(
            "SELECT count(*) FROM task_attempts WHERE submit_state = ANY(%s)",
            (sorted(s.value for s in ATTEMPT_IN_FLIGHT),),
        ).fetchone()
    stuck = [f"attempt {a} {s} of task {t} {ts}" for a, s, t, ts in rows]
    # an attempt still in flight (a parked SUBMIT_UNKNOWN may hold a job) keeps its slot; nothing else may
    allowed = int(in_flight[0]) if in_flight else 0
    over = {scope: n for scope, n in held.items() if n > allowed}
    return over, stuck


def held_for_human(cluster: Cluster) -> dict[str, int]:
    with psycopg.connect(cluster.dsn) as conn:
        rows = conn.execute(
            f"SELECT status, count(*) FROM generation_tasks WHERE {_WAITING_FOR_HUMAN} GROUP BY status"
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def statuses(cluster: Cluster) -> dict[str, int]:
    with psycopg.connect(cluster.dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM generation_tasks GROUP BY status").fetchall()
    return {r[0]: r[1] for r in rows}


def db_keys(cluster: Cluster) -> dict[str, list[str]]:
    with psycopg.connect(cluster.dsn) as conn:
        rows = conn.execute("SELECT client_idempotency_key, id::text FROM generation_tasks").fetchall()
    out: dict[str, list[str]] = {}
    for key, task_id in rows:
        out.setdefault(key, []).append(task_id)
    return out


assert TaskStatus.MANUAL_REVIEW.value == "MANUAL_REVIEW"  # the literal in _WAITING_FOR_HUMAN
