"""`degrade`: the degradation matrix (issue 14 item 7).

For each row a fresh distributed system (`bench/degrade/system.py`: every role its own process, every dependency
behind its own proxy) runs under a steady stream of creates; after `--warmup` s the row's dependency is taken away
for `--seconds` (the proxy cut, or the fetcher's resolver failing every lookup), then given back; the creates go on
`--tail` s more. The row's own expectation is judged from what was seen during the outage (`rows.py`); then, for
every row: every 202 is a task in the database (never a lost 202), every task terminal within `--recover-timeout`
s, one RESERVE and one SETTLE or RELEASE per task, no duplicate paid job at the sim, and **recovery** = seconds from
the restore until the last task was seen terminal (polled every 0.5 s).

Exit codes: 0 every row passed, 1 a row failed, 3 the harness could not run."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import BenchError, Postgres
from bench.degrade.load import Db, Load
from bench.degrade.matrix import ROWS
from bench.degrade.rows import READY_TIMEOUT_S, Outage, Row
from bench.degrade.system import DATA_PLANE_STUCK_S, DegradeSystem

NAME = "degrade"
DESCRIPTION = (
    "degradation matrix: each dependency taken away under load; expected behaviour, nothing charged twice, "
    "recovery time"
)
QUICK = {"seconds": 8, "warmup": 6, "tail": 2, "recover_timeout": 150}


def add_arguments(p: Any) -> None:
    p.add_argument("--row", action="append", choices=sorted(ROWS), help="run only this row (repeatable; default all)")
    p.add_argument("--seconds", type=float, default=30, help="how long the dependency is away (default %(default)s)")
    p.add_argument("--warmup", type=float, default=10, help="seconds of load before the cut (default %(default)s)")
    p.add_argument("--tail", type=float, default=5, help="seconds of load after the restore (default %(default)s)")
    p.add_argument("--rate", type=float, default=2.0, help="creates per second (default %(default)s)")
    p.add_argument("--job-seconds", type=float, default=2.0, help="the sim's job time (default %(default)s)")
    p.add_argument(
        "--recover-timeout", type=float, default=300, help="seconds allowed to recover (default %(default)s)"
    )
    p.add_argument("--worker-threads", type=int, default=4)
    p.add_argument("--pool-size", type=int, default=5)
    common.add_output_args(p, "8 s outages, 6 s warm-up, 150 s to recover (figures for checking, not the record)")
    common.add_infra_args(p)
    p.set_defaults(_defaults={k: p.get_default(k) for k in QUICK})


def _log(msg: str) -> None:
    print(f"[degrade {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    quick_changed = common.apply_quick(args, QUICK, args._defaults)
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("ffmpeg", "ffprobe", "rabbitmqctl"):
        common.need_tool(tool)
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "date": common.utc_now(),
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {
            "rows": args.row or list(ROWS),
            "outage_s": args.seconds,
            "warmup_s": args.warmup,
            "tail_s": args.tail,
            "creates_per_s": args.rate,
            "job_seconds": args.job_seconds,
            "recover_timeout_s": args.recover_timeout,
            "sweeper_fetch_media_stuck_s": DATA_PLANE_STUCK_S,
            "quick_changed": quick_changed,
        },
        "rows": [],
    }
    try:
        for name in args.row or list(ROWS):
            doc["rows"].append(run_row(ROWS[name], args, pg))
    except BaseException as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        doc["finished"] = common.utc_now()
        path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path(NAME), doc)
    common.emit(args, doc, render(doc), path, sys.stdout)
    return 0 if all(r["pass"] for r in doc["rows"]) else 1


def run_row(row: Row, args: argparse.Namespace, pg: Postgres) -> dict[str, Any]:
    from aivedio_engine.testing.rabbitmq import private_vhost

    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}_{row.name}"
    db_name, prefix = f"bench_degrade_{tag}", f"bench-degrade-{tag}:"
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-degrade-{row.name}-"))
    result: dict[str, Any] = {"row": row.name, "expected": row.expected, "pass": False, "failures": []}
    _log(f"{row.name}: database {db_name}, Redis prefix {prefix}, workdir {workdir}")
    pg.create_db(db_name)
    system = DegradeSystem(
        workdir=workdir,
        db=db_name,
        db_url=pg.url(db_name),
        redis_url=args.redis_url,
        key_prefix=prefix,
        job_seconds=args.job_seconds,
        worker_threads=args.worker_threads,
        pool_size=args.pool_size,
        setup=row.setup,
    )
    db = Db(pg.url(db_name))
    try:
        with private_vhost("bench-degrade") as amqp_url:
            system.broker_url = amqp_url
            system.start()
            outage = Outage(system, Load(system.api_url, system.api_key, args.rate), db)
            try:
                _exercise(row, outage, args, result)
            finally:
                outage.load.stop()
                result["logs"] = {} if result["pass"] else system.log_tails()
                system.stop()
    except BaseException as exc:
        result["failures"].append(f"harness: {type(exc).__name__}: {exc}"[:500])
        if not isinstance(exc, Exception):
            raise
    finally:
        db.close()
        if not args.keep_dbs:
            try:
                pg.drop_db(db_name)
            except BenchError as exc:
                _log(f"warning: could not drop {db_name}: {exc}")
        try:
            common.redis_cleanup(args.redis_url, prefix)
        except Exception as exc:  # noqa: BLE001
            _log(f"warning: Redis cleanup of {prefix}* failed: {exc}")
        result["pass"] = not result["failures"]
        if result["pass"]:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            result["workdir"] = str(workdir)  # the full logs of every process, for the failure

    _log(f"{row.name}: {'PASS' if result['pass'] else 'FAIL'} {result['failures']}")
    return result


def _take_away(row: Row, system: DegradeSystem) -> None:
    if row.dependency == "dns":
        system.dns_flag.touch()
    elif row.dependency == "media":
        system.kill_media()
    else:
        system.proxies[row.dependency].cut()


def _give_back(row: Row, system: DegradeSystem) -> None:
    if row.dependency == "dns":
        system.dns_flag.unlink(missing_ok=True)
    elif row.dependency == "media":
        system.start_media()
    else:
        system.proxies[row.dependency].restore()


def _exercise(row: Row, o: Outage, args: argparse.Namespace, result: dict[str, Any]) -> None:
    o.load.start()
    time.sleep(args.warmup)
    if row.ready is not None:
        result["ready_wait_s"] = _wait_ready(row, o)
    o.system.check()
    result["before_cut"] = dict(o.db.statuses())
    _log(f"{row.name}: cut ({result['before_cut']})")
    o.t_cut = time.time()
    _take_away(row, o.system)
    while time.time() < o.t_cut + args.seconds:
        t = time.time()
        row.watch(o)
        time.sleep(max(0.0, 1.0 - (time.time() - t)))
    _give_back(row, o.system)
    o.t_restore = time.time()
    _log(f"{row.name}: restored after {o.t_restore - o.t_cut:.1f} s")
    time.sleep(args.tail)
    o.load.stop()
    result["recovery_s"] = _wait_terminal(o, args.recover_timeout, row.recover_watch)
    result["failures"] += row.judge(o)
    result["failures"] += _common_checks(o, result)
    result["notes"] = o.notes
    result["samples"] = o.samples
    if o.recovery_samples:
        result["recovery_samples"] = o.recovery_samples
    result["answers"] = _answer_counts(o)


def _wait_ready(row: Row, o: Outage) -> float:
    t0 = time.time()
    assert row.ready is not None
    while not row.ready(o):
        o.system.check()
        if time.time() - t0 > READY_TIMEOUT_S:
            raise BenchError(f"{row.name}: not ready to cut after {READY_TIMEOUT_S:g} s more ({dict(o.db.statuses())})")
        time.sleep(0.5)
    return round(time.time() - t0, 1)


def _wait_terminal(o: Outage, timeout_s: float, watch: Any = None) -> float | None:
    deadline, watched = time.time() + timeout_s, 0.0
    while time.time() < deadline:
        if o.db.all_terminal():
            return round(time.time() - o.t_restore, 1)
        o.system.check()
        if watch is not None and time.time() - watched >= 1.0:
            watched = time.time()
            watch(o)
        time.sleep(0.5)
    return None


def _common_checks(o: Outage, result: dict[str, Any]) -> list[str]:
    out = []
    if result["recovery_s"] is None:
        out.append(f"not every task terminal after recovery: {dict(o.db.statuses())}")
    in_db = o.db.task_status()
    lost = o.load.accepted_ids() - set(in_db)
    if lost:
        out.append(f"{len(lost)} accepted create(s) (202) with no task in the database")
    charged = o.db.ledger_violations()
    if charged:
        out.append(f"{len(charged)} task(s) not charged exactly once: {charged[:3]}")
    failed = sum(n for s, n in o.db.statuses().items() if s == "FAILED_FINAL")
    if failed:
        out.append(f"{failed} task(s) FAILED_FINAL (the sim injects no fault: the outage failed them)")
    truth = o.system.sim_truth()
    dup = int(truth.get("duplicate_paid_jobs", 0))  # type: ignore[call-overload]
    if dup:
        out.append(f"{dup} duplicate paid job(s) at the sim")
    final = dict(o.db.statuses())
    result["final"] = final
    result["tasks"] = sum(final.values())
    return out


def _answer_counts(o: Outage) -> dict[str, dict[str, int]]:
    def count(answers: list[Any]) -> dict[str, int]:
        c: dict[str, int] = {}
        for a in answers:
            c[str(a.status or "no answer")] = c.get(str(a.status or "no answer"), 0) + 1
        return c

    return {"during": count(o.during()), "all": count(list(o.load.answers))}


def render(doc: dict[str, Any]) -> str:
    c = doc["config"]
    head = (
        f"degrade: outage {c['outage_s']:g} s per row under {c['creates_per_s']:g} creates/s, sim job "
        f"{c['job_seconds']:g} s, sweeper.fetch_stuck_s = media_stuck_s = {c['sweeper_fetch_media_stuck_s']}\n\n"
    )
    rows = []
    for r in doc["rows"]:
        rec = r.get("recovery_s")
        during = ", ".join(f"{k}: {v}" for k, v in sorted(r.get("answers", {}).get("during", {}).items()))
        rows.append(
            [
                r["row"],
                "pass" if r["pass"] else "FAIL",
                "—" if rec is None else f"{rec:.1f}",
                r.get("tasks", "—"),
                during or "—",
                r["expected"],
                "; ".join(r["failures"]) or "—",
            ]
        )
    headers = ["row", "result", "recovery s", "tasks", "creates during outage", "expected", "failures"]
    return head + common.table(headers, rows)


__all__ = ["DESCRIPTION", "NAME", "add_arguments", "run"]
