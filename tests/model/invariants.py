"""The money's invariants, read from the engine's tables, the store and the sim's ground truth after every step of
a sequence (tests/model/money.py), each one written from the promise — a tenant pays for what it received, never
twice and never for nothing — rather than from the engine's own queries; `aivedio audit`'s ledger checks are run
beside them and must agree.

`violations(world, model)` returns one line per broken promise (empty: all hold)."""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db import balances
from aivedio_engine.db.tables import (
    assets,
    credit_ledger,
    generation_tasks,
    task_attempts,
    task_state_events,
    tenant_balance_stripes,
)
from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.services.invariants import InvariantService
from tests.model.engine import World

D = Decimal
EPS = D("0.000001")
TERMINAL = {s.value for s in TASK_TERMINAL}
#: states a task reaches only once the vendor produced an output
HELD = {TaskStatus.OUTPUT_FETCHING.value, TaskStatus.POST_PROCESSING.value, TaskStatus.MANUAL_REVIEW.value}
#: the audit checks that speak about money (I4: the ledger) and whose verdict the model's must match
MONEY_CHECKS = ["I4.1", "I4.2", "I4.3", "I4.4", "I4.5", "I4.6", "I4.8", "I4.9"]


@dataclass
class Model:
    """What the sequence did, as the tenant and the operator know it (not as the engine recorded it)."""

    #: tenant id → the credits it was given
    tenants: dict[uuid.UUID, Decimal] = field(default_factory=dict)
    #: task id → its tenant
    tasks: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    #: tasks a tenant asked to cancel (accepted by the engine)
    canceled: set[uuid.UUID] = field(default_factory=set)
    #: tasks a reviewer rejected (a person's verdict, not the SLA's)
    rejected: set[uuid.UUID] = field(default_factory=set)


def _ledger_by_task(conn: Any) -> dict[uuid.UUID, list[Any]]:
    out: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for r in conn.execute(sa.select(credit_ledger).where(credit_ledger.c.task_id.is_not(None))):
        out[r.task_id].append(r)
    return out


def _delivered(conn: Any, world: World) -> dict[uuid.UUID, int]:
    """Variants whose required derivatives are READY, per task (what the tenant can play)."""
    needed = {p.value for p in world.ctx.settings.media.required_profiles}
    a = assets.c
    raws = {
        r.id: (r.task_id, r.output_index)
        for r in conn.execute(
            sa.select(a.id, a.task_id, a.output_index).where(a.kind == "RAW_OUTPUT", a.status == "READY")
        )
    }
    ready: dict[uuid.UUID, set[str]] = defaultdict(set)
    for r in conn.execute(
        sa.select(a.parent_asset_id, a.profile).where(a.parent_asset_id.is_not(None), a.status == "READY")
    ):
        ready[r.parent_asset_id].add(r.profile)
    out: dict[uuid.UUID, set[int]] = defaultdict(set)
    for raw_id, (task_id, index) in raws.items():
        if needed <= ready[raw_id]:
            out[task_id].add(index)
    return {t: len(v) for t, v in out.items()}


def violations(world: World, model: Model, *, check_store: bool = True) -> list[str]:
    ctx = world.ctx
    bad: list[str] = []
    with world.sim._lock:
        vendor_jobs = dict(world.sim.jobs)
    with ctx.engine.connect() as conn:
        tasks = {r.id: r for r in conn.execute(sa.select(generation_tasks))}
        attempts: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for r in conn.execute(sa.select(task_attempts)):
            attempts[r.task_id].append(r)
        ledger = _ledger_by_task(conn)
        history: dict[uuid.UUID, set[str]] = defaultdict(set)
        for r in conn.execute(sa.select(task_state_events.c.task_id, task_state_events.c.to_status)):
            if r.to_status is not None:
                history[r.task_id].add(r.to_status)
        delivered = _delivered(conn, world)

        # --- per tenant: balance = what it was given − Σ its tasks' ledger, every stripe non-negative
        for tenant_id, initial in model.tenants.items():
            balance = balances.total(conn, tenant_id)
            spent = sum(
                (D(row.amount) for tid, rows in ledger.items() if model.tasks.get(tid) == tenant_id for row in rows),
                D(0),
            )
            if abs(balance - (initial + spent)) > EPS:
                bad.append(f"tenant {tenant_id}: balance {balance} != given {initial} + ledger {spent}")
            negative = conn.execute(
                sa.select(tenant_balance_stripes.c.stripe, tenant_balance_stripes.c.balance).where(
                    tenant_balance_stripes.c.tenant_id == tenant_id, tenant_balance_stripes.c.balance < 0
                )
            ).all()
            if negative:
                bad.append(f"tenant {tenant_id}: negative stripes {negative}")

        if set(tasks) != set(model.tasks):
            bad.append(f"tasks the engine holds {len(tasks)} != tasks the tenants were told of {len(model.tasks)}")

        # --- per task
        for tid, task in tasks.items():
            rows = ledger.get(tid, [])
            kinds = Counter(r.entry_type for r in rows)
            estimate = D(task.estimated_cost)
            n = int((task.params or {}).get("n") or 1)
            terminal = task.status in TERMINAL
            closings = kinds["SETTLE"] + kinds["RELEASE"]
            name = f"task {tid} ({task.status}, n={n}, estimate {estimate})"
            if kinds["RESERVE"] != 1:
                bad.append(f"{name}: {kinds['RESERVE']} RESERVE rows")
            if closings > 1 or (terminal and estimate > 0 and closings != 1) or (not terminal and closings):
                bad.append(f"{name}: {closings} closing rows (SETTLE/RELEASE) while {task.status}")
            if kinds["REFUND"] and not terminal:
                bad.append(f"{name}: a REFUND before the task closed")
            if any(r.entry_type == "ADJUSTMENT" and D(r.amount) != 0 for r in rows):
                bad.append(f"{name}: an ADJUSTMENT that moves credits")
            if not terminal:
                continue
            charged = -sum((D(r.amount) for r in rows if r.entry_type != "ADJUSTMENT"), D(0))
            if charged < -EPS or charged > estimate + EPS:
                bad.append(f"{name}: charged {charged}, outside 0..estimate")
            # a REFUND gives back what the vendor gave back or never billed (a bill reported after the close)
            last = max(attempts[tid], key=lambda a: a.attempt_no, default=None)
            refunds = sum((D(r.amount) for r in rows if r.entry_type == "REFUND"), D(0))
            gave_back = any(
                (job := vendor_jobs.get(a.provider_job_id)) is not None and (job.refunded or not job.billed)
                for a in attempts[tid]
            )
            lower_bill = last is not None and (last.billed_seconds is not None or last.billed_outputs is not None)
            if refunds and not (gave_back or lower_bill or (last is not None and last.vendor_billed is False)):
                bad.append(f"{name}: a REFUND of {refunds} with no refund, void or lower bill from the vendor")
            if last is not None and last.vendor_billed is False and charged > EPS:
                bad.append(f"{name}: charged {charged} although the vendor billed nothing")
            # the tenant's own decisions are charged per the vendor's bill: its cancel, its deadline running out
            # before any output existed, a person rejecting an output it was shown
            own = (
                tid in model.canceled
                or task.cancel_requested_at is not None
                or tid in model.rejected
                or (task.status == TaskStatus.EXPIRED.value and not (history[tid] & HELD))
            )
            # only a success hands its outputs over: a held output that ends otherwise was never received
            received = delivered.get(tid, 0) if task.status == TaskStatus.SUCCEEDED.value else 0
            cap = estimate * received / n
            if not own and charged > cap + EPS:
                bad.append(
                    f"{name}: charged {charged} for {received} received output(s) (at most {cap}); "
                    f"went through {sorted(history[tid])}"
                )
            # nothing received, not by the tenant's doing, and the vendor kept a bill worth something: the platform
            # bears it (a bill of 0 seconds or 0 outputs is worth nothing: VENDOR_BILLED_NOTHING)
            kept = [
                a
                for a in attempts[tid]
                if (job := vendor_jobs.get(a.provider_job_id)) is not None
                and job.billed
                and not job.refunded
                and a.billed_outputs != 0
                and (a.billed_seconds is None or a.billed_seconds > 0)
            ]
            booked = any(r.entry_type == "ADJUSTMENT" and r.business_key.startswith("platform_cost:") for r in rows)
            # the vendor gave the whole charge back and said so: the tenant keeps none of it charged
            told = [a for a in attempts[tid] if a.provider_job_id in world.told_refunded]
            if told and charged > EPS:
                bad.append(f"{name}: the vendor refunded job {told[0].provider_job_id} and said so; charged {charged}")
            if not own and not received and kept and not booked:
                bad.append(f"{name}: nothing received, the vendor billed it, and no platform cost was booked")
            if task.status == TaskStatus.SUCCEEDED.value and check_store and not world.store_down:
                bad.extend(_unreadable(world, conn, tid, name))

    bad.extend(_vendor_jobs(world, tasks, attempts, ledger))
    return bad


def _unreadable(world: World, conn: Any, task_id: uuid.UUID, name: str) -> list[str]:
    bad = []
    for a in conn.execute(sa.select(assets).where(assets.c.task_id == task_id, assets.c.status == "READY")):
        try:
            with world.ctx.storage.open_read(a.object_key) as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except Exception as exc:  # noqa: BLE001 - any failure to read is the finding
            bad.append(f"{name}: {a.kind} {a.object_key} unreadable: {exc!r}")
            continue
        if a.checksum_value and digest != a.checksum_value:
            bad.append(f"{name}: {a.kind} {a.object_key} does not match its checksum")
    return bad


def _vendor_jobs(
    world: World, tasks: dict[uuid.UUID, Any], attempts: dict[uuid.UUID, list[Any]], ledger: Any
) -> list[str]:
    """Every job the vendor made for a closed task is the job of one of its attempts, or a recorded duplicate (a
    platform-cost ADJUSTMENT of the task): counted per task, not per request key."""
    bad = []
    jobs_by_key: dict[str, list[Any]] = defaultdict(list)
    with world.sim._lock:
        for job in world.sim.jobs.values():
            if job.request_key:
                jobs_by_key[job.request_key].append(job)
    for tid, task in tasks.items():
        if task.status not in TERMINAL:
            continue
        bound = {a.provider_job_id for a in attempts[tid] if a.provider_job_id}
        made = [j for a in attempts[tid] if a.provider_request_key for j in jobs_by_key.get(a.provider_request_key, [])]
        unbound = [j for j in made if j.id not in bound and j.billed]
        recorded = sum(1 for r in ledger.get(tid, []) if r.entry_type == "ADJUSTMENT" and "duplicate" in r.business_key)
        if len(unbound) > recorded:
            bad.append(
                f"task {tid} ({task.status}): {len(made)} vendor job(s), {len(unbound)} billed and bound to no "
                f"attempt, {recorded} recorded as duplicates"
            )
    return bad


def audit_money(world: World) -> list[str]:
    """`aivedio audit`'s ledger checks, as failing check ids with a sample row."""
    report = InvariantService(world.ctx.engine, world.clock, world.ctx.settings).run(only=MONEY_CHECKS, limit=3)
    return [f"{r.id}: {r.violations} offender(s) {r.rows[:1]}" for r in report.results if not r.ok]


def audit_all(world: World) -> list[str]:
    report = InvariantService(world.ctx.engine, world.clock, world.ctx.settings).run(limit=3)
    return [f"{r.id}: {r.violations} offender(s) {r.rows[:1]}" for r in report.results if not r.ok]
