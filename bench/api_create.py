"""`api_create`: POST /v1/generations 202/s against pgbench of the same 4-insert transaction (A-B-A).

Per repetition (BENCHMARKS.md, performance_anchors.md C.1):
  A  pgbench -n -M prepared -T D -c 16 -j 2 -f create_task.sql, then -c 1 (latency point)
  S  the API (uvicorn, 2 worker processes) under wrk: 16 keep-alive connections posting with unique
     Idempotency-Keys for D seconds, then 1 connection for the c=1 latency p50
  B  the same pgbench pair again
ratio = API 202/s ÷ mean(A, B) TPS at c=16; c=1 overhead = API p50 − mean(A, B) pgbench average latency.

Secondary (one repetition each): idempotent replay rate (16 connections resending one key) ÷ the same baseline,
the same creation load spread over several tenants, and a py-spy profile of the API workers under load.

Correctness gate after the run: tasks = RESERVE ledger rows = generation.queued outbox rows = 202 responses
(plus the requests wrk abandoned in flight when its clock ran out, which the server may have committed: those
are identified by key and counted only if present), every task has exactly one of each and 4 state events, and
no response other than 202 was seen.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import common
from bench.common import BenchError, CpuSampler, Postgres, Repetition, fmt, fmt_spread, table

NAME = "api_create"
DESCRIPTION = "POST /v1/generations 202/s ÷ pgbench create_task.sql TPS at c=16, and c=1 latency overhead"
TARGET_RATIO, FLOOR_RATIO, TARGET_OVERHEAD_MS = 0.50, 0.35, 1.0
CLIENTS = 16
INITIAL_CREDITS = Decimal(10) ** 9
# ~200 B of JSON, as in performance_anchors C.1
BODY = json.dumps({
    "prompt": "a red fox running through fresh snow at dusk, cinematic, 35mm film, shallow depth of field, "
              "golden hour light, slow tracking shot from the side",
    "model": "local-v1",
    "duration_s": 2,
})

# One Idempotency-Key per request (nonce-thread-counter), or one key for all requests in "replay" mode. The key
# is also sent as X-Request-Id, which the API echoes, so a response can be matched to its request: what is left
# in `pending` when wrk stops is what was in flight (plus the one request wrk builds to verify the script).
WRK_SCRIPT = r"""
local threads = {}
local next_tid = 0

function setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  table.insert(threads, thread)
end

function init(args)
  mode, nonce, body = args[1], args[2], args[4]
  keys = {}
  for k in string.gmatch(args[3], "[^,]+") do table.insert(keys, "Bearer " .. k) end
  hdrs = {["Content-Type"] = "application/json"}
  counter, created, replayed, other = 0, 0, 0, 0
  statuses, pending, first_error = {}, {}, ""
end

function request()
  counter = counter + 1
  local rid = nonce .. "-" .. tid .. "-" .. counter
  hdrs["Authorization"] = keys[(counter % #keys) + 1]
  hdrs["X-Request-Id"] = rid
  if mode == "replay" then hdrs["Idempotency-Key"] = nonce else hdrs["Idempotency-Key"] = rid end
  pending[rid] = true
  return wrk.format("POST", "/v1/generations", hdrs, body)
end

function response(status, headers, body)
  local rid = headers["x-request-id"] or headers["X-Request-Id"]
  if rid then pending[rid] = nil end
  if status == 202 then
    if headers["idempotent-replayed"] or headers["Idempotent-Replayed"] then
      replayed = replayed + 1
    else
      created = created + 1
    end
  else
    other = other + 1
    statuses[status] = (statuses[status] or 0) + 1
    if first_error == "" then first_error = string.sub(body or "", 1, 300) end
  end
end

function done(summary, latency, requests)
  local c, r, o, fe = 0, 0, 0, ""
  local st, pend = {}, {}
  for _, t in ipairs(threads) do
    c = c + t:get("created"); r = r + t:get("replayed"); o = o + t:get("other")
    for s, n in pairs(t:get("statuses")) do st[s] = (st[s] or 0) + n end
    for k, _ in pairs(t:get("pending")) do table.insert(pend, '"' .. k .. '"') end
    if fe == "" then fe = t:get("first_error") end
  end
  local parts = {}
  for s, n in pairs(st) do table.insert(parts, '"' .. s .. '":' .. n) end
  fe = string.gsub(fe, '[%c"\\]', ' ')
  local e = summary.errors
  io.write('BENCHJSON {"duration_us":' .. summary.duration .. ',"requests":' .. summary.requests ..
    ',"created":' .. c .. ',"replayed":' .. r .. ',"other":' .. o ..
    ',"statuses":{' .. table.concat(parts, ",") .. '},"pending":[' .. table.concat(pend, ",") .. ']' ..
    ',"errors":{"connect":' .. e.connect .. ',"read":' .. e.read .. ',"write":' .. e.write ..
    ',"status":' .. e.status .. ',"timeout":' .. e.timeout .. '}' ..
    string.format(',"latency_us":{"mean":%.1f,"p50":%.1f,"p90":%.1f,"p99":%.1f,"max":%.1f}',
      latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max) ..
    ',"first_error":"' .. fe .. '"}\n')
end
"""


# ------------------------------------------------------------------------------------------------ options
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--c1-duration", type=int, default=None,
                   help="seconds of each c=1 latency point (default: duration/2, at least 5)")
    p.add_argument("--warmup", type=int, default=3, help="seconds of API load before each measured API point")
    p.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2, one per core)")
    p.add_argument("--pool-size", type=int, default=20, help="database.pool_size of each API worker")
    p.add_argument("--server", choices=("bench", "uvicorn-cli"), default="bench",
                   help="bench: uvicorn's supervisor with a TCP_NODELAY-capable listener (default); uvicorn-cli: "
                        "stock `uvicorn --workers N`, which adds ~40 ms per keep-alive request (uvicorn#3149)")
    p.add_argument("--secondary-duration", type=int, default=10,
                   help="seconds of each point of the secondary measurements (replay, multi-tenant)")
    p.add_argument("--tenants", type=int, default=16,
                   help="tenants for the secondary multi-tenant creation point (0 skips it)")
    p.add_argument("--no-replay", action="store_true", help="skip the idempotent replay measurement")
    p.add_argument("--profile", type=int, default=5, help="seconds of py-spy profile under load (0 skips it)")
    p.add_argument("--wait-quiet", type=int, default=0, metavar="S",
                   help="before each repetition, wait up to S seconds for the box to be < 25 %% busy (shared box)")
    p.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    p.add_argument("--pg-admin-db", default="postgres", help="database to connect to for CREATE/DROP DATABASE")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the benchmark databases at the end")


# ------------------------------------------------------------------------------------------------- wrk
@dataclass
class WrkResult:
    mode: str
    clients: int
    duration_s: float
    requests: int
    created: int
    replayed: int
    other: int
    statuses: dict[str, int]
    pending: list[str]
    errors: dict[str, int]
    latency_us: dict[str, float]
    first_error: str
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def created_per_s(self) -> float:
        return self.created / self.duration_s if self.duration_s else math.nan

    @property
    def replayed_per_s(self) -> float:
        return self.replayed / self.duration_s if self.duration_s else math.nan

    @property
    def socket_errors(self) -> int:
        return sum(self.errors.values())

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["pending"] = len(self.pending)
        d["created_per_s"] = round(self.created_per_s, 1)
        d["replayed_per_s"] = round(self.replayed_per_s, 1)
        d["p50_ms"] = round(self.latency_us["p50"] / 1000, 3)
        d["p99_ms"] = round(self.latency_us["p99"] / 1000, 3)
        return d


@dataclass
class Tally:
    """Everything the API answered during the run, for the correctness gate."""

    created: int = 0
    replayed: int = 0
    non_202: Counter[str] = field(default_factory=Counter)
    socket_errors: Counter[str] = field(default_factory=Counter)
    pending_unique: list[str] = field(default_factory=list)
    replay_keys: list[str] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)
    runs: int = 0

    def add(self, w: WrkResult, replay_key: str | None) -> None:
        self.runs += 1
        self.created += w.created
        self.replayed += w.replayed
        self.non_202.update(w.statuses)
        self.socket_errors.update({k: v for k, v in w.errors.items() if v})
        if replay_key is None:
            self.pending_unique.extend(w.pending)
        elif replay_key not in self.replay_keys:
            self.replay_keys.append(replay_key)
        if w.first_error:
            self.first_errors.append(w.first_error)


class Api:
    """The API under test: uvicorn with the app factory, N worker processes, plus the wrk client."""

    def __init__(self, db_url: str, db_name: str, keys: list[str], workers: int, pool_size: int,
                 workdir: Path, server: str = "bench") -> None:
        self.keys, self.workdir, self.db_name = keys, workdir, db_name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.script = workdir / "create.lua"
        self.script.write_text(WRK_SCRIPT)
        self.log_path = workdir / "api_server.log"
        self.tally = Tally()
        env = {**os.environ, "BENCH_API_DATABASE_URL": db_url, "BENCH_API_POOL_SIZE": str(pool_size),
               "BENCH_API_DATA_DIR": str(workdir / "data")}
        if server == "uvicorn-cli":  # stock CLI: its --workers listener loses TCP_NODELAY (see bench/api_server.py)
            cmd = [sys.executable, "-m", "uvicorn", "--factory", "bench.api_server:app", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"]
        else:
            cmd = [sys.executable, "-m", "bench.api_server", "--port", str(self.port), "--workers", str(workers)]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, cwd=common.REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.workers_expected = workers
        self.worker_pids: list[int] = []

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        ok = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the API server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as resp:  # noqa: S310 - loopback
                    ok = ok + 1 if resp.status == 200 else 0
            except OSError:
                ok = 0
            if ok >= 4 * self.workers_expected:
                # one worker: uvicorn serves from the process it was started as
                self.worker_pids = _worker_pids(self.proc.pid) if self.workers_expected > 1 else [self.proc.pid]
                if len(self.worker_pids) >= self.workers_expected:
                    return
            time.sleep(0.25)
        raise BenchError(f"the API server did not become ready in {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wrk(self, clients: int, duration_s: int, mode: str = "unique", keys: list[str] | None = None,
            nonce: str | None = None, sample_cpu: bool = False) -> WrkResult:
        """One wrk run; every answer goes into the tally. With sample_cpu, the cores used by the API workers,
        their PostgreSQL backends, wrk and everything else are sampled over the middle of the run."""
        if self.proc.poll() is not None:
            raise BenchError(f"the API server died ({self.proc.returncode}):\n{self.log_tail()}")
        nonce = nonce or f"b{secrets.token_hex(6)}"
        threads = min(clients, 2)
        cmd = [common.need_tool("wrk"), "-t", str(threads), "-c", str(clients), "-d", f"{duration_s}s",
               "--timeout", "10s", "-s", str(self.script), self.url, "--", mode, nonce,
               ",".join(keys or self.keys), BODY]
        sampler = None
        if sample_cpu:
            workers = set(self.worker_pids)
            sampler = CpuSampler({"api": lambda pid, comm, cmd_: pid in workers,
                                  "wrk": lambda pid, comm, cmd_: comm == "wrk",
                                  **common.postgres_groups([self.db_name])})
        proc, cpu = common.sampled_run(cmd, duration_s, sampler)
        out, err = proc.stdout, proc.stderr
        if proc.returncode != 0:
            raise BenchError(f"wrk failed ({proc.returncode}): {err.strip()[-800:]}")
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCHJSON ")), None)
        if line is None:
            raise BenchError(f"no result line from wrk:\n{out[-1500:]}\n{err[-500:]}")
        d = json.loads(line[len("BENCHJSON "):])
        res = WrkResult(mode=mode, clients=clients, duration_s=d["duration_us"] / 1e6, requests=d["requests"],
                        created=d["created"], replayed=d["replayed"], other=d["other"], statuses=d["statuses"],
                        pending=d["pending"], errors=d["errors"], latency_us=d["latency_us"],
                        first_error=d["first_error"], cpu=cpu)
        self.tally.add(res, nonce if mode == "replay" else None)
        return res

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pid in self.worker_pids:  # only the workers this server started, should any survive it
            if _alive(pid) and _cmdline(pid).find("multiprocessing") >= 0:
                os.kill(pid, signal.SIGKILL)
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _worker_pids(master: int) -> list[int]:
    """uvicorn's worker processes (multiprocessing spawn children), not its resource tracker."""
    return [p for p in _children(master) if "spawn_main" in _cmdline(p) and "resource_tracker" not in _cmdline(p)]


# --------------------------------------------------------------------------------------------- measuring
def pgbench_block(pg: Postgres, db: str, duration: int, c1_duration: int) -> dict[str, Any]:
    script = common.SQL_DIR / "create_task.sql"
    c16 = common.run_pgbench(pg, db, script, CLIENTS, duration, sample_cpu=True)
    c1 = common.run_pgbench(pg, db, script, 1, c1_duration)
    return {"c16": c16.as_dict(), "c1": c1.as_dict()}


def system_block(api: Api, pg: Postgres, duration: int, c1_duration: int, warmup: int) -> dict[str, Any]:
    if warmup:
        api.wrk(CLIENTS, warmup)
    pg.checkpoint()
    c16 = api.wrk(CLIENTS, duration, sample_cpu=True)
    pg.checkpoint()
    c1 = api.wrk(1, c1_duration)
    return {"c16": c16.as_dict(), "c1": c1.as_dict()}


def profile_workers(api: Api, seconds: int, workdir: Path) -> dict[str, Any]:
    """py-spy record --gil (only the thread holding the GIL is sampled, i.e. Python CPU time; C code that
    releases the GIL — libpq, socket calls — is not seen) of every API worker under the c=16 creation load."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return {"skipped": "py-spy not installed (.venv/bin/pip install py-spy)"}
    result: dict[str, Any] = {}
    load = threading.Thread(target=lambda: result.setdefault("load", api.wrk(CLIENTS, seconds + 3).as_dict()))
    load.start()
    time.sleep(1.5)
    spies = []
    for pid in api.worker_pids:
        raw = workdir / f"pyspy-{pid}.txt"
        spies.append((raw, subprocess.Popen(
            [pyspy, "record", "--gil", "-r", "200", "-d", str(seconds), "-f", "raw", "-o", str(raw),
             "-p", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    errors = []
    for raw, sp in spies:
        _, err = sp.communicate(timeout=seconds + 60)
        if sp.returncode != 0 and not raw.exists():
            errors.append(err.strip()[-300:])
    load.join()
    stacks = Counter()
    for raw, _ in spies:
        if raw.exists():
            for line in raw.read_text(errors="replace").splitlines():
                stack, _, n = line.rpartition(" ")
                if stack and n.isdigit():
                    stacks[stack] += int(n)
    if not stacks:
        return {"skipped": "py-spy produced no samples: " + "; ".join(errors)}
    return {**summarize_profile(stacks), "seconds": seconds, "workers": len(spies), "load": result.get("load")}


def _frame_parts(frame: str) -> tuple[str, str]:
    """'func (path/to/file.py:123)' -> ('func', 'short/file.py')"""
    name, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "lib/python3":
                path = "stdlib/" + path.split("/", 1)[-1]
            break
    return name, path


def _package(path: str) -> str:
    head = path.split("/")[0]
    if head == "stdlib":
        return "stdlib:" + path.split("/")[1].removesuffix(".py")
    return head.removesuffix(".py")


#: leaf frames that are a thread blocked in a system call (socket poll, condition variable, event loop select);
#: py-spy's idle filter misses many of them on a loaded box, so the "CPU" views drop them
BLOCKING_LEAVES = {
    ("Connection.wait", "psycopg/connection.py"),  # psycopg's C wait: poll() on the socket
    ("EpollSelector.select", "selectors.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Queue.get", "queue.py"),
}


def _blocking(name: str, path: str) -> bool:
    return any(name == n and path.endswith(p) for n, p in BLOCKING_LEAVES)
_WRAPPERS = ("Thread._bootstrap", "Thread.run", "WorkerThread.run", "Context.run", "_run_sync_endpoint",
             "run_sync_in_worker_thread", "BaseEventLoop._run_once", "BaseEventLoop.run_forever", "Handle._run",
             "run (", "spawn_main", "_main", "Process._bootstrap", "Process.run", "<module>", "_bootstrap",
             "subprocess_started", "Server.run", "Server.serve", "Server._serve", "Server.main_loop",
             "Runner.run", "asyncio_run", "run_until_complete", "BaseEventLoop.run_until_complete",
             "BaseProcess._bootstrap", "BaseProcess.run", "Process.target", "run (asyncio/runners.py)")


def summarize_profile(stacks: Counter[str], top: int = 10) -> dict[str, Any]:
    """Top frames by own time (all samples, as py-spy shows them, and on-CPU only: blocking leaves dropped),
    top frames by inclusive time on CPU (thread/loop wrappers left out), and own CPU time by package."""
    total = sum(stacks.values())
    self_all: Counter[str] = Counter()
    self_cpu: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    cpu_total = 0
    for stack, n in stacks.items():
        frames = [_frame_parts(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        name, path = frames[-1]
        self_all[f"{name} ({path})"] += n
        if _blocking(name, path):
            continue
        cpu_total += n
        self_cpu[f"{name} ({path})"] += n
        by_package[_package(path)] += n
        for key in {f"{fn} ({fp})" for fn, fp in frames}:
            if not key.startswith(_WRAPPERS):
                inclusive[key] += n
    pct = lambda n, of: round(100.0 * n / of, 1) if of else 0.0  # noqa: E731
    return {
        "samples": total, "cpu_samples": cpu_total,
        "blocking_leaves_dropped": sorted(f"{n} ({p})" for n, p in BLOCKING_LEAVES),
        "top_self_all": [{"frame": k, "pct": pct(n, total)} for k, n in self_all.most_common(top)],
        "top_self": [{"frame": k, "pct": pct(n, cpu_total)} for k, n in self_cpu.most_common(top)],
        "top_inclusive": [{"frame": k, "pct": pct(n, cpu_total)} for k, n in inclusive.most_common(top)],
        "self_by_package": [{"package": k, "pct": pct(n, cpu_total)} for k, n in by_package.most_common(12)],
    }


def correctness_gate(pg: Postgres, db: str, tenant_ids: list[Any], tally: Tally) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(pg.url(db, driver="postgresql"), autocommit=True) as conn:
        row = conn.execute("""
            WITH t AS (SELECT id, status, version FROM generation_tasks WHERE tenant_id = ANY(%(t)s)),
                 r AS (SELECT task_id, count(*) AS n FROM credit_ledger
                        WHERE tenant_id = ANY(%(t)s) AND entry_type = 'RESERVE' GROUP BY task_id),
                 q AS (SELECT aggregate_id, count(*) AS n FROM outbox_events
                        WHERE tenant_id = ANY(%(t)s) AND event_type = 'generation.queued' GROUP BY aggregate_id),
                 e AS (SELECT task_id, count(*) AS n FROM task_state_events GROUP BY task_id)
            SELECT (SELECT count(*) FROM t),
                   (SELECT coalesce(sum(n), 0) FROM r),
                   (SELECT coalesce(sum(n), 0) FROM q),
                   (SELECT count(*) FROM t LEFT JOIN r ON r.task_id = t.id WHERE coalesce(r.n, 0) <> 1),
                   (SELECT count(*) FROM t LEFT JOIN q ON q.aggregate_id = t.id WHERE coalesce(q.n, 0) <> 1),
                   (SELECT count(*) FROM t LEFT JOIN e ON e.task_id = t.id WHERE coalesce(e.n, 0) <> 4),
                   (SELECT count(*) FROM r WHERE task_id NOT IN (SELECT id FROM t))
                     + (SELECT count(*) FROM q WHERE aggregate_id NOT IN (SELECT id FROM t)),
                   (SELECT count(*) FROM t WHERE status <> 'QUEUED' OR version <> 3)
        """, {"t": tenant_ids}).fetchone()
        tasks, reserves, queued, bad_reserve, bad_queued, bad_events, orphans, bad_status = row
        pending_committed = conn.execute(
            "SELECT count(*) FROM generation_tasks WHERE tenant_id = ANY(%s) AND client_idempotency_key = ANY(%s)",
            (tenant_ids, tally.pending_unique)).fetchone()[0] if tally.pending_unique else 0
        replay_tasks = conn.execute(
            "SELECT count(*) FROM generation_tasks WHERE tenant_id = ANY(%s) AND client_idempotency_key = ANY(%s)",
            (tenant_ids, tally.replay_keys)).fetchone()[0] if tally.replay_keys else 0
        balances = conn.execute("""
            SELECT t.id, t.credit_balance, (SELECT coalesce(sum(amount), 0) FROM credit_ledger l
                                             WHERE l.tenant_id = t.id),
                   (SELECT coalesce(sum(estimated_cost), 0) FROM generation_tasks g WHERE g.tenant_id = t.id)
              FROM tenants t WHERE t.id = ANY(%s)""", (tenant_ids,)).fetchall()
    balance_ok = all(bal == led == INITIAL_CREDITS - cost for _, bal, led, cost in balances)
    expected = tally.created + pending_committed
    checks = {
        "tasks == 202 created + committed in-flight": tasks == expected,
        "RESERVE ledger rows == tasks": reserves == tasks,
        "generation.queued outbox rows == tasks": queued == tasks,
        "each task: 1 RESERVE, 1 queued outbox row, 4 state events, QUEUED v3":
            bad_reserve == bad_queued == bad_events == bad_status == 0,
        "no orphan ledger/outbox rows": orphans == 0,
        "balance == ledger sum == initial - estimates": balance_ok,
        "one task per replayed key": replay_tasks == len(tally.replay_keys),
        "no non-202 response": not tally.non_202,
        "no socket error or timeout": not tally.socket_errors,
    }
    return {
        "ok": all(checks.values()), "checks": checks, "tasks": tasks, "reserve_rows": reserves,
        "queued_outbox_rows": queued, "responses_202_created": tally.created,
        "responses_202_replayed": tally.replayed, "in_flight_at_stop": len(tally.pending_unique),
        "in_flight_committed": pending_committed, "replay_keys": len(tally.replay_keys),
        "non_202": dict(tally.non_202), "socket_errors": dict(tally.socket_errors),
        "first_errors": tally.first_errors[:3], "wrk_runs": tally.runs,
        "tasks_bad_reserve": bad_reserve, "tasks_bad_outbox": bad_queued, "tasks_bad_events": bad_events,
        "tasks_bad_status": bad_status, "orphans": orphans,
    }


# ------------------------------------------------------------------------------------------------- setup
def prepare_system_db(url: str, tenants: int, workdir: Path) -> tuple[list[Any], list[str]]:
    """Migrate the aivedio schema and create the tenants (10^9 credits each) and one key per tenant."""
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db import migrate
    from bench.api_server import bench_settings

    ctx = build_context(bench_settings(url, pool_size=2, data_dir=str(workdir / "data")))
    try:
        migrate.upgrade(ctx.engine)
        ids, keys = [], []
        for i in range(tenants):
            t = ctx.tenants.create(f"bench-{i}", INITIAL_CREDITS)
            ids.append(t.id)
            keys.append(ctx.tenants.create_key(t.id)[1])
        return ids, keys
    finally:
        ctx.close()


def run(args: argparse.Namespace) -> int:
    duration = args.duration
    c1_duration = args.c1_duration or max(5, duration // 2)
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("pgbench", "psql", "wrk"):
        common.need_tool(tool)
    sync_commit = pg.setting("synchronous_commit")
    started = common.utc_now()
    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    sys_db, pgb_db = f"bench_api_{tag}", f"bench_pgb_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-create-"))
    doc: dict[str, Any] = {
        "benchmark": NAME, "date": started, "machine": common.machine_info(), "git": common.git_info(),
        "config": {"reps": args.reps, "duration_s": duration, "c1_duration_s": c1_duration,
                   "warmup_s": args.warmup, "wait_quiet_s": args.wait_quiet, "workers": args.workers,
                   "server": args.server, "pool_size": args.pool_size,
                   "clients": CLIENTS, "load_generator": "wrk (Lua: unique Idempotency-Key per request)",
                   "synchronous_commit": sync_commit, "body_bytes": len(BODY),
                   "baseline": "pgbench -n -M prepared -T D -c 16 -j 2 -f bench/sql/create_task.sql (+ -c 1 -j 1)",
                   "discard_rule": f"max(A,B)/min(A,B) - 1 > {common.MAX_BASELINE_DIVERGENCE}"},
        "targets": {"ratio": TARGET_RATIO, "floor": FLOOR_RATIO, "c1_overhead_ms": TARGET_OVERHEAD_MS},
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
    api: Api | None = None
    reps: list[Repetition] = []
    code = 0
    _log(f"databases {sys_db} (aivedio) and {pgb_db} (pgbench baseline); workdir {workdir}")
    try:
        pg.create_db(pgb_db)
        pg.create_db(sys_db)
        pg.psql(pgb_db, file=common.SQL_DIR / "create_task_schema.sql")
        n_tenants = max(1, args.tenants)
        tenant_ids, keys = prepare_system_db(pg.url(sys_db), n_tenants, workdir)
        api = Api(pg.url(sys_db), sys_db, keys[:1], args.workers, args.pool_size, workdir, args.server)
        api.wait_ready()
        _log(f"API up on {api.url}: {len(api.worker_pids)} workers {api.worker_pids}")
        api.wrk(CLIENTS, max(2, args.warmup))  # first contact: pools, caches, code paths

        for i in range(1, args.reps + 1):
            quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
            _log(f"rep {i}/{args.reps}: baseline A" + (f" (box {100 * quiet['busy_fraction']:.0f} % busy after "
                                                       f"waiting {quiet['waited_s']} s)" if quiet else ""))
            a = pgbench_block(pg, pgb_db, duration, c1_duration)
            _log(f"rep {i}: API (A c16 {a['c16']['tps']:.0f} TPS)")
            s = system_block(api, pg, duration, c1_duration, args.warmup)
            _log(f"rep {i}: baseline B (API {s['c16']['created_per_s']:.0f} 202/s)")
            b = pgbench_block(pg, pgb_db, duration, c1_duration)
            rep = Repetition(i, a["c16"]["tps"], s["c16"]["created_per_s"], b["c16"]["tps"],
                             raw={"baseline_a": a, "system": s, "baseline_b": b, "quiet_before": quiet})
            rep.raw["c1_overhead_ms"] = c1_overhead(rep)
            reps.append(rep)
            _log(f"rep {i}: B c16 {b['c16']['tps']:.0f} TPS -> ratio {rep.ratio:.3f} "
                 f"(baselines differ {100 * rep.divergence:.1f} %{'' if rep.kept else ', DISCARDED'})")

        secondary: dict[str, Any] = {}
        sd = args.secondary_duration
        if not args.no_replay:
            if args.wait_quiet:
                common.wait_for_quiet(args.wait_quiet)
            _log("secondary: idempotent replay (16 clients, one key)")
            secondary["replay"] = replay_point(api, pg, pgb_db, sd, args.warmup)
        if args.tenants > 1:
            if args.wait_quiet:
                common.wait_for_quiet(args.wait_quiet)
            _log(f"secondary: creation spread over {n_tenants} tenants")
            secondary["multi_tenant"] = multi_tenant_point(api, pg, pgb_db, sd, args.warmup, keys)
        if args.profile:
            _log(f"profile: py-spy {args.profile} s on {len(api.worker_pids)} workers")
            secondary["profile"] = profile_workers(api, args.profile, workdir)
        api.stop()
        gate = correctness_gate(pg, sys_db, tenant_ids, api.tally)
        doc.update(summary_doc(reps), repetitions=[r.as_dict() for r in reps], secondary=secondary, gate=gate)
        if not gate["ok"]:
            code = 1
        elif not common.kept(reps):
            code = 2
    except BaseException as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
        if api is not None:
            doc["server_log_tail"] = api.log_tail()
        raise
    finally:
        if api is not None:
            api.stop()
        if not args.keep_dbs:
            for db in (sys_db, pgb_db):
                try:
                    pg.drop_db(db)
                except BenchError as exc:
                    print(f"warning: could not drop {db}: {exc}", file=sys.stderr)
        doc["finished"] = common.utc_now()
        path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path(NAME), doc)
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc, reps))
    print(f"\nJSON: {path}")
    return code


def c1_overhead(rep: Repetition) -> float:
    a, b, s = rep.raw["baseline_a"]["c1"], rep.raw["baseline_b"]["c1"], rep.raw["system"]["c1"]
    return s["latency_us"]["p50"] / 1000 - (a["latency_avg_ms"] + b["latency_avg_ms"]) / 2


def replay_point(api: Api, pg: Postgres, db: str, duration: int, warmup: int) -> dict[str, Any]:
    script = common.SQL_DIR / "create_task.sql"
    key = f"replay{secrets.token_hex(6)}"
    a = common.run_pgbench(pg, db, script, CLIENTS, duration, sample_cpu=True)
    api.wrk(CLIENTS, max(1, warmup), mode="replay", nonce=key)  # the first of these creates the task
    pg.checkpoint()
    w = api.wrk(CLIENTS, duration, mode="replay", nonce=key, sample_cpu=True)
    b = common.run_pgbench(pg, db, script, CLIENTS, duration, sample_cpu=True)
    rep = Repetition(0, a.tps, w.replayed_per_s, b.tps)
    return {"baseline_a": a.as_dict(), "system": w.as_dict(), "baseline_b": b.as_dict(),
            "replayed_per_s": w.replayed_per_s, "ratio": rep.ratio, "baseline_divergence": rep.divergence,
            "kept": rep.kept}


def multi_tenant_point(api: Api, pg: Postgres, db: str, duration: int, warmup: int, keys: list[str]) -> dict[str, Any]:
    script = common.SQL_DIR / "create_task.sql"
    a = common.run_pgbench(pg, db, script, CLIENTS, duration, sample_cpu=True)
    api.wrk(CLIENTS, max(1, warmup), keys=keys)
    pg.checkpoint()
    w = api.wrk(CLIENTS, duration, keys=keys, sample_cpu=True)
    b = common.run_pgbench(pg, db, script, CLIENTS, duration, sample_cpu=True)
    rep = Repetition(0, a.tps, w.created_per_s, b.tps)
    return {"tenants": len(keys), "baseline_a": a.as_dict(), "system": w.as_dict(), "baseline_b": b.as_dict(),
            "created_per_s": w.created_per_s, "ratio": rep.ratio, "baseline_divergence": rep.divergence,
            "kept": rep.kept}


def summary_doc(reps: list[Repetition]) -> dict[str, Any]:
    def s(fn: Any) -> dict[str, Any] | None:
        x = common.summarize_kept(reps, fn)
        return x.as_dict() if x else None

    return {"summary": {
        "kept": len(common.kept(reps)), "total": len(reps),
        "ratio": s(lambda r: r.ratio),
        "api_created_per_s_c16": s(lambda r: r.system),
        "pgbench_tps_c16_mean": s(lambda r: (r.a + r.b) / 2),
        "api_p50_ms_c1": s(lambda r: r.raw["system"]["c1"]["latency_us"]["p50"] / 1000),
        "pgbench_latency_ms_c1_mean": s(lambda r: (r.raw["baseline_a"]["c1"]["latency_avg_ms"]
                                                  + r.raw["baseline_b"]["c1"]["latency_avg_ms"]) / 2),
        "c1_overhead_ms": s(lambda r: r.raw["c1_overhead_ms"]),
        "api_p50_ms_c16": s(lambda r: r.raw["system"]["c16"]["latency_us"]["p50"] / 1000),
        "api_p99_ms_c16": s(lambda r: r.raw["system"]["c16"]["latency_us"]["p99"] / 1000),
    }}


# ------------------------------------------------------------------------------------------------ output
def render(doc: dict[str, Any], reps: list[Repetition]) -> str:
    m, g = doc["machine"], doc["git"]
    head = (f"api_create — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
            f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
            f"synchronous_commit={doc['config']['synchronous_commit']}, load generator wrk, "
            f"{doc['config']['workers']} uvicorn workers, {doc['config']['reps']} × {doc['config']['duration_s']} s "
            f"(c=1: {doc['config']['c1_duration_s']} s)")
    sm = doc["summary"]
    k = f"{sm['kept']}/{sm['total']}"

    def row(label: str, key: str, target: str = "", digits: int = 2) -> list[str]:
        sp = common.Spread(**{"median": sm[key]["median"], "lo": sm[key]["min"], "hi": sm[key]["max"],
                              "n": sm[key]["n"]}) if sm.get(key) else None
        med, spread = fmt_spread(sp, digits)
        return [label, med, spread, target, k]

    main = table(["metric", "median", "spread (min – max)", "target", "kept reps"], [
        row("ratio: API 202/s ÷ pgbench TPS, c=16", "ratio", f"≥ {TARGET_RATIO} (floor {FLOOR_RATIO})", 3),
        row("API 202/s, c=16 (unique keys)", "api_created_per_s_c16"),
        row("pgbench TPS, c=16, mean(A, B)", "pgbench_tps_c16_mean"),
        row("API p50 ms, c=1", "api_p50_ms_c1"),
        row("pgbench avg latency ms, c=1, mean(A, B)", "pgbench_latency_ms_c1_mean", "", 3),
        row("c=1 overhead ms (API p50 − pgbench)", "c1_overhead_ms", f"≤ {TARGET_OVERHEAD_MS}"),
        row("API p50 ms, c=16", "api_p50_ms_c16"),
        row("API p99 ms, c=16", "api_p99_ms_c16"),
    ])
    per_rep = table(["rep", "pgbench A c16 TPS", "API 202/s", "pgbench B c16 TPS", "A/B differ", "ratio",
                     "pgb A c1 ms", "API c1 p50 ms", "pgb B c1 ms", "c1 overhead ms", "kept"], [
        [r.index, fmt(r.a), fmt(r.system), fmt(r.b), f"{100 * r.divergence:.1f} %", fmt(r.ratio, 3),
         fmt(r.raw["baseline_a"]["c1"]["latency_avg_ms"], 3), fmt(r.raw["system"]["c1"]["latency_us"]["p50"] / 1000),
         fmt(r.raw["baseline_b"]["c1"]["latency_avg_ms"], 3), fmt(r.raw["c1_overhead_ms"]),
         "yes" if r.kept else "DISCARDED"] for r in reps])
    out = [head, "", main, "", "Per repetition:", per_rep]

    sec = doc.get("secondary", {})
    rows = []
    for name, label in (("replay", "idempotent replay 202/s (one key, 16 clients)"),
                        ("multi_tenant", "creation 202/s over {t} tenants")):
        p = sec.get(name)
        if p:
            rate = p.get("replayed_per_s", p.get("created_per_s"))
            rows.append([label.format(t=p.get("tenants")), fmt(rate), fmt(p["baseline_a"]["tps"]),
                         fmt(p["baseline_b"]["tps"]), fmt(p["ratio"], 3),
                         f"{100 * p['baseline_divergence']:.1f} %{'' if p['kept'] else ' (DISCARDED)'}"])
    if rows:
        out += ["", "Secondary (one repetition each):",
                table(["measurement", "rate", "pgbench A c16", "pgbench B c16", "ratio", "A/B differ"], rows)]

    cpu_rows = []
    for r in reps:
        for label, point, rate_key in (("A pgbench", r.raw["baseline_a"]["c16"], "tps"),
                                       ("API", r.raw["system"]["c16"], "created_per_s"),
                                       ("B pgbench", r.raw["baseline_b"]["c16"], "tps")):
            cpu_rows.append(_cpu_row(f"rep {r.index} {label}", point.get("cpu"), point[rate_key]))
    for name, label, key in (("replay", "replay API", "replayed_per_s"), ("multi_tenant", "multi-tenant API",
                                                                           "created_per_s")):
        if sec.get(name):
            cpu_rows.append(_cpu_row(label, sec[name]["system"].get("cpu"), sec[name]["system"][key]))
    cpu_rows = [r for r in cpu_rows if r]
    if cpu_rows:
        out += ["", "Where the CPU goes at c=16 (cores used, sampled mid-run; CPU µs per transaction/request in "
                    "brackets; 'other' is everything else on the box — other people's work on a shared machine):",
                table(["point", "rate/s", "box busy", "other", "client", "API workers", "PG backends",
                       "PG shared"], cpu_rows)]

    prof = sec.get("profile")
    if prof and "top_self" in prof:
        out += ["", f"py-spy --gil (Python CPU only), {prof['workers']} API workers, {prof['seconds']} s under the "
                    f"c=16 creation load: {prof['samples']} samples ({prof['samples'] - prof['cpu_samples']} whose "
                    f"leaf is a blocking wait dropped). Top 10 by own time:",
                table(["#", "frame", "% of CPU samples"], [[i + 1, f["frame"], f["pct"]]
                                                          for i, f in enumerate(prof["top_self"])]),
                "", "top 10 by inclusive CPU time (thread and event-loop wrappers left out):",
                table(["#", "frame", "% of CPU samples"], [[i + 1, f["frame"], f["pct"]]
                                                          for i, f in enumerate(prof["top_inclusive"])]),
                "", "own CPU time by package: " + ", ".join(f"{p['package']} {p['pct']} %"
                                                            for p in prof["self_by_package"])]
    elif prof:
        out += ["", f"profile: {prof.get('skipped')}"]

    g = doc.get("gate")
    if g:
        out += ["", f"Correctness gate: {'PASS' if g['ok'] else 'FAIL'} — tasks {g['tasks']:,}, RESERVE rows "
                    f"{g['reserve_rows']:,}, generation.queued outbox rows {g['queued_outbox_rows']:,}; 202 created "
                    f"{g['responses_202_created']:,} + in flight when wrk stopped and committed "
                    f"{g['in_flight_committed']} (of {g['in_flight_at_stop']}); 202 replayed "
                    f"{g['responses_202_replayed']:,}; non-202 {g['non_202'] or 0}; socket errors "
                    f"{g['socket_errors'] or 0}"]
        out += [f"  [{'x' if ok else ' '}] {name}" for name, ok in g["checks"].items()]
        if g["first_errors"]:
            out += [f"  first error body: {g['first_errors'][0]}"]
    return "\n".join(out)


def _cpu_row(label: str, cpu: dict[str, float] | None, rate: float) -> list[str] | None:
    if not cpu:
        return None

    def cell(*groups: str) -> str:
        vals = [cpu[f"{g}_cores"] for g in groups if f"{g}_cores" in cpu]
        if not vals:
            return "—"
        cores = sum(vals)
        return f"{cores:.2f} ({cores * 1e6 / rate:.0f})" if rate else f"{cores:.2f}"

    return [label, fmt(rate), f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %", f"{cpu['other_cores']:.2f}",
            cell("wrk", "pgbench"), cell("api"), cell("postgres"), cell("pg_shared")]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
