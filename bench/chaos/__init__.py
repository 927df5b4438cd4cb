"""`bench/run chaos [--tasks N] [--seed S] [--json]`: chaos at full scale, through real processes.

Starts api, relay, two workers, scheduler and sweeper as separate `aivedio serve --role` processes on a private
PostgreSQL database, Redis key prefix and RabbitMQ vhost, and `aivedio sim-provider` with its faults (ambiguous
submits, resets, 5xx, 429, throttling, failures, webhook dup/reorder/drop/early, redirects, cancel too late).
Workers fail and slow object-store writes (failpoints `storage.put`, `storage.put_slow`); the relay fails
between enqueue and commit (duplicate deliveries). An independent client submits N tasks over HTTP and records
its history, while the injector SIGKILLs roles, flushes the run's Redis keys, closes every broker connection and
terminates the database's backends. Then it checks (bench/chaos/verdict.py, history.py) and exits 1 on any
violation. The pytest tests/chaos/test_chaos_run.py runs it at 60 tasks.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import common
from bench.chaos import history as hist
from bench.chaos import replay_export, verdict
from bench.chaos.cluster import SIM_FAULTS, Cluster
from bench.chaos.faults import Injector

#: after the fault window, how long a create keeps retrying its key before its outcome stays unknown
CLIENT_PATIENCE_AFTER_FAULTS_S = 150.0
DESCRIPTION = "chaos through real processes: N tasks under SIGKILLs, Redis/broker/DB faults, sim faults; 0 violations"
CREDITS = Decimal(1_000_000)


@dataclass
class Report:
    tasks: int
    seed: int
    faults: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tasks": self.tasks,
            "seed": self.seed,
            "faults": self.faults,
            **self.figures,
            "violations": self.violations,
        }


def run_chaos(
    tasks: int,
    seed: int,
    workdir: Path,
    *,
    fault_gap_s: float = 2.0,
    spread_s: float | None = None,
    quiesce_budget_s: float = 300.0,
    replay_dir: Path | None = None,
    log: Any = None,
) -> Report:
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = Report(tasks, seed)
    cluster = Cluster(workdir, seed)
    started = time.monotonic()
    try:
        cluster.open()
        cluster.start_sim()
        tenant_id, api_key = _tenant(cluster)
        cluster.start_roles()
        cluster.wait_ready()
        say(f"chaos: {tasks} tasks, seed {seed}, db {cluster.db}, up in {time.monotonic() - started:.1f}s")

        history = hist.History()
        client = hist.Client(cluster.api_url, api_key, seed, history)
        injector = Injector(cluster, seed, fault_gap_s)
        injector.start()
        spread = spread_s if spread_s is not None else max(20.0, tasks * 0.25)
        # faults for a fixed window: on a slow box a client still retrying must not keep the faults coming (each
        # restart of the API is more unknown outcomes, which is more time faulting); its creates then go on with
        # the same keys until the system is whole again
        tail = min(15.0, spread / 3)
        window_end = time.monotonic() + spread + tail
        client.patience_until = window_end + CLIENT_PATIENCE_AFTER_FAULTS_S
        failed: list[BaseException] = []

        def run_client() -> None:
            try:
                client.run(tasks, f"chaos-{seed}", concurrency=8, cancel_p=0.12, spread_s=spread)
            except BaseException as exc:  # noqa: BLE001 - re-raised below: a client that died makes no valid run
                failed.append(exc)

        runner = threading.Thread(target=run_client, name="chaos-client", daemon=True)
        runner.start()
        runner.join(max(0.0, window_end - time.monotonic()))
        if not runner.is_alive():  # all created early: keep faulting a little so the late stages are hit too
            time.sleep(max(0.0, min(tail, window_end - time.monotonic())))
        injector.stop()
        runner.join()
        if failed:
            raise RuntimeError(f"the chaos client died: {failed[0]!r}") from failed[0]
        last_fault = injector.last_fault_at or time.monotonic()
        cluster.revive()
        say(f"chaos: faults stopped after {time.monotonic() - started:.1f}s: {dict(injector.counts)}")

        waited, left = verdict.wait_quiet(cluster, quiesce_budget_s - (time.monotonic() - last_fault), cluster.revive)
        report.figures["quiesce_s"] = round(time.monotonic() - last_fault, 1)
        report.violations["not_settled"] = [f"task {t} still {s}" for t, s in left]
        say(f"chaos: quiet {report.figures['quiesce_s']}s after the last fault ({len(left)} unsettled)")

        final = {op.task_id: client.get(op.task_id) for op in history.ops if op.task_id}
        report.violations["history"] = hist.check(history, final, verdict.db_keys(cluster))
        audit = verdict.audit(cluster)
        report.violations["audit"] = audit["violated"]
        report.figures["audit_rows"] = audit["rows"]
        truth = verdict.sim_truth(cluster)
        dup_paid = int(truth["duplicate_paid_jobs"])
        report.violations["sim_duplicate_paid_jobs"] = [f"{dup_paid} duplicate paid jobs"] if dup_paid else []
        report.violations["ledger"] = verdict.ledger(cluster, tenant_id, CREDITS)
        held, stuck = verdict.slots(cluster)
        report.violations["slots"] = [
            f"slot scope {k} holds {v} (more than in flight)" for k, v in held.items()
        ] + stuck
        report.violations["injector"] = injector.errors

        report.faults = {**dict(sorted(injector.counts.items())), **_sim_faults(truth), **_failpoint_hits(cluster)}
        report.figures.update(
            statuses=verdict.statuses(cluster),
            held_for_human=verdict.held_for_human(cluster),
            client=history.counts(),
            sim_jobs=len(truth["jobs"]),
            sim_faults=SIM_FAULTS,
            restarts={name: p.starts - 1 for name, p in cluster.procs.items()},
            wall_s=round(time.monotonic() - started, 1),
        )
        if replay_dir is not None:
            replay_dir.mkdir(parents=True, exist_ok=True)
            report.figures["replay_fixtures"] = [str(p) for p in replay_export.export(cluster, replay_dir)]
        if not report.ok:
            say(cluster.tails())
        return report
    finally:
        cluster.close()


def _tenant(cluster: Cluster) -> tuple[str, str]:
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.config import load_settings

    ctx = build_context(load_settings(str(cluster.config)))
    try:
        tenant = ctx.tenants.create("chaos", CREDITS, max_concurrency=16)
        _, key = ctx.tenants.create_key(tenant.id)
    finally:
        ctx.close()
    return str(tenant.id), key


def _sim_faults(truth: dict[str, Any]) -> dict[str, int]:
    """What the sim did (calls served, callbacks emitted / duplicated / held / dropped / early), from its own
    counters; which faults fired follows from the seed and the spec (`sim_faults`)."""
    calls = truth.get("calls", {})
    callbacks = truth.get("callbacks", {})
    out = {f"sim_calls:{k}": int(v) for k, v in sorted(calls.items()) if isinstance(v, int)}
    out.update({f"sim_cb:{k}": int(v) for k, v in sorted(callbacks.items()) if isinstance(v, int)})
    return out


def _failpoint_hits(cluster: Cluster) -> dict[str, int]:
    """Armed failpoints that fired (storage errors, slow writes, relay dying before commit), from the hit log."""
    path = cluster.workdir / "failpoints.log"
    counts: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                counts[f"failpoint_hits:{parts[1]}"] = counts.get(f"failpoint_hits:{parts[1]}", 0) + 1
    return counts


# --- bench/run chaos ---------------------------------------------------------------------------------------
def add_arguments(p: Any) -> None:
    p.add_argument("--tasks", type=int, default=60, help="tasks to submit (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the sim's faults, the injector and the client")
    p.add_argument("--fault-gap", type=float, default=2.0, help="mean seconds between injected faults")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, config)")
    p.add_argument("--save-replay", default=None, metavar="DIR", help="write provider-event replay fixtures here")


def run(args: Any) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="aivedio-chaos-"))
    report = run_chaos(
        args.tasks,
        args.seed,
        workdir,
        fault_gap_s=args.fault_gap,
        replay_dir=Path(args.save_replay) if args.save_replay else None,
    )
    doc = report.to_json()
    if getattr(args, "json_out", None):
        common.write_json(Path(args.json_out), doc)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(json.dumps({k: v for k, v in doc.items() if k != "audit_rows"}, indent=1, default=str))
    if not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"run directory: {workdir}", file=sys.stderr)
    return 0 if report.ok else 1
