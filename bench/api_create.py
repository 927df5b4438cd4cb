"""`api_create`: POST /v1/generations 202/s against two pgbench baselines (A-B-A), with 1 and with N tenants.

Baselines ("Two baselines"):
  minimal bench/sql/create_task.sql, the 4-insert transaction B.3, on the B.2 schema
  own      the product's own create transaction, captured at run time (bench.own_sql): a real POST through the
           app on a scratch aivedio database, every statement and parameter recorded, the committed transaction
           rendered as one prepared pgbench script with per-transaction keys/ids; keys over 1 or over N tenants

Per repetition, one chain (each block is a set of pgbench runs, -c 16 -j 2, and -c 1 for the latency points):
  block 0   minimal c16, own(1 tenant) c16, minimal c1, own(1) c1
  API 1t    the API (uvicorn, 2 worker processes) under wrk: 16 keep-alive connections, one tenant's key, unique
            Idempotency-Keys for D s; then 1 connection for the c=1 p50
  block 1   minimal c16, own(1) c16, own(N) c16, minimal c1, own(1) c1
  API Nt    the same with the keys of N tenants, round robin
  block 2   minimal c16, own(N) c16
ratio = API 202/s ÷ mean(minimal before, after); schema cost = own ÷ minimal; client-path cost = API ÷ own.
Each baseline pair is kept or discarded on its own (10 % rule). c=1 overhead = API p50 − mean pgbench latency.

Round trips per POST (new key, and replayed) are counted from libpq's protocol trace at the API (in-process app,
warm connections), with pool checkouts and Parse messages; the scripts' round trips are their command counts.

Secondary (not with --quick): idempotent replay rate (16 connections resending one key) ÷ the minimal baseline,
and a py-spy profile of the API workers under load.

Correctness gate after the run: tasks = RESERVE ledger rows = task.status.changed (QUEUED) outbox rows = 202
(plus the requests wrk abandoned in flight when its clock ran out, which the server may have committed: those
are identified by key and counted only if present), every task has exactly one of each and 4 state events, no
response other than 202 was seen, and each own script writes per transaction the rows the product wrote.
"""

from __future__ import annotations

import argparse
import contextlib
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
DESCRIPTION = (
    "POST /v1/generations 202/s ÷ pgbench TPS at c=16 of the minimal create_task.sql and of our own "
    "create transaction (captured at run time), 1 and 16 tenants; round trips per POST"
)
TARGET_RATIO, FLOOR_RATIO, TARGET_OVERHEAD_MS = 0.50, 0.35, 1.0
CLIENTS = 16
INITIAL_CREDITS = Decimal(10) ** 9
# ~200 B of JSON, C.1
BODY = json.dumps(
    {
        "prompt": "a red fox running through fresh snow at dusk, cinematic, 35mm film, shallow depth of field, "
        "golden hour light, slow tracking shot from the side",
        "model": "local-v1",
        "duration_s": 2,
    }
)

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
#: what --quick changes (options given on the command line win): one repetition of short points, no secondaries
QUICK = {
    "reps": 1,
    "duration": 5,
    "c1_duration": 3,
    "warmup": 2,
    "no_replay": True,
    "profile": 0,
    "roundtrip_posts": 10,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--c1-duration",
        type=int,
        default=None,
        help="seconds of each c=1 latency point (default: duration/2, at least 5)",
    )
    p.add_argument("--warmup", type=int, default=3, help="seconds of API load before each measured API point")
    p.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2, one per core)")
    p.add_argument("--pool-size", type=int, default=20, help="database.pool_size of each API worker")
    p.add_argument(
        "--server",
        choices=("bench", "uvicorn-cli"),
        default="bench",
        help="bench: uvicorn's supervisor with a TCP_NODELAY-capable listener (default); uvicorn-cli: "
        "stock `uvicorn --workers N`, which adds ~40 ms per keep-alive request (uvicorn#3149)",
    )
    p.add_argument(
        "--secondary-duration",
        type=int,
        default=10,
        help="seconds of each point of the secondary measurement (idempotent replay)",
    )
    p.add_argument(
        "--tenants",
        type=int,
        default=16,
        help="tenants of the multi-tenant chain (keys spread over them; 0 or 1 skips it)",
    )
    p.add_argument("--no-replay", action="store_true", help="skip the idempotent replay measurement")
    p.add_argument("--profile", type=int, default=5, help="seconds of py-spy profile under load (0 skips it)")
    p.add_argument(
        "--roundtrip-posts",
        type=int,
        default=20,
        help="POSTs (new keys, then the same keys replayed) in the round-trip count (0 skips it)",
    )
    common.add_output_args(p, "one repetition, 5 s points (c=1: 3 s), no replay point or profile: ~2 min")
    p.add_argument(
        "--wait-quiet",
        type=int,
        default=0,
        metavar="S",
        help="before each repetition, wait up to S seconds for the box to be < 25 %% busy (shared box)",
    )
    p.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    p.add_argument("--pg-admin-db", default="postgres", help="database to connect to for CREATE/DROP DATABASE")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the benchmark databases at the end")
    p.set_defaults(_defaults={k: p.get_default(k) for k in QUICK})


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

    def __init__(
        self,
        db_url: str,
        db_name: str,
        keys: list[str],
        workers: int,
        pool_size: int,
        workdir: Path,
        server: str = "bench",
    ) -> None:
        self.keys, self.workdir, self.db_name = keys, workdir, db_name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.script = workdir / "create.lua"
        self.script.write_text(WRK_SCRIPT)
        self.log_path = workdir / "api_server.log"
        self.tally = Tally()
        env = {
            **os.environ,
            "BENCH_API_DATABASE_URL": db_url,
            "BENCH_API_POOL_SIZE": str(pool_size),
            "BENCH_API_DATA_DIR": str(workdir / "data"),
        }
        if server == "uvicorn-cli":  # stock CLI: its --workers listener loses TCP_NODELAY (see bench/api_server.py)
            cmd = [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "bench.api_server:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
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

    def wrk(
        self,
        clients: int,
        duration_s: int,
        mode: str = "unique",
        keys: list[str] | None = None,
        nonce: str | None = None,
        sample_cpu: bool = False,
    ) -> WrkResult:
        """One wrk run; every answer goes into the tally. With sample_cpu, the cores used by the API workers,
        their PostgreSQL backends, wrk and everything else are sampled over the middle of the run."""
        if self.proc.poll() is not None:
            raise BenchError(f"the API server died ({self.proc.returncode}):\n{self.log_tail()}")
        nonce = nonce or f"b{secrets.token_hex(6)}"
        threads = min(clients, 2)
        cmd = [
            common.need_tool("wrk"),
            "-t",
            str(threads),
            "-c",
            str(clients),
            "-d",
            f"{duration_s}s",
            "--timeout",
            "10s",
            "-s",
            str(self.script),
            self.url,
            "--",
            mode,
            nonce,
            ",".join(keys or self.keys),
            BODY,
        ]
        sampler = None
        if sample_cpu:
            workers = set(self.worker_pids)
            sampler = CpuSampler(
                {
                    "api": lambda pid, comm, cmd_: pid in workers,
                    "wrk": lambda pid, comm, cmd_: comm == "wrk",
                    **common.postgres_groups([self.db_name]),
                }
            )
        proc, cpu = common.sampled_run(cmd, duration_s, sampler)
        out, err = proc.stdout, proc.stderr
        if proc.returncode != 0:
            raise BenchError(f"wrk failed ({proc.returncode}): {err.strip()[-800:]}")
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCHJSON ")), None)
        if line is None:
            raise BenchError(f"no result line from wrk:\n{out[-1500:]}\n{err[-500:]}")
        d = json.loads(line[len("BENCHJSON ") :])
        res = WrkResult(
            mode=mode,
            clients=clients,
            duration_s=d["duration_us"] / 1e6,
            requests=d["requests"],
            created=d["created"],
            replayed=d["replayed"],
            other=d["other"],
            statuses=d["statuses"],
            pending=d["pending"],
            errors=d["errors"],
            latency_us=d["latency_us"],
            first_error=d["first_error"],
            cpu=cpu,
        )
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
MINIMAL_SCRIPT = common.SQL_DIR / "create_task.sql"


def baseline_block(pg: Postgres, pgb_db: str, own: OwnCreate, points: list[tuple[str, int, int]]) -> dict[str, Any]:
    """pgbench points, in order: ("minimal", c, D) runs create_task.sql on the B.2 schema; ("own_t<T>", c, D) the
    product's own create transaction captured at run time, with keys spread over T tenants."""
    out: dict[str, Any] = {}
    for name, clients, duration in points:
        if name == "minimal":
            res = common.run_pgbench(pg, pgb_db, MINIMAL_SCRIPT, clients, duration, sample_cpu=clients > 1).as_dict()
        else:
            res = own.run(pg, int(name.removeprefix("own_t")), clients, duration, sample_cpu=clients > 1)
        out[f"{name}_c{clients}"] = res
    return out


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
        spies.append(
            (
                raw,
                subprocess.Popen(
                    [
                        pyspy,
                        "record",
                        "--gil",
                        "-r",
                        "200",
                        "-d",
                        str(seconds),
                        "-f",
                        "raw",
                        "-o",
                        str(raw),
                        "-p",
                        str(pid),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
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


_WRAPPERS = (
    "Thread._bootstrap",
    "Thread.run",
    "WorkerThread.run",
    "Context.run",
    "_run_sync_endpoint",
    "run_sync_in_worker_thread",
    "BaseEventLoop._run_once",
    "BaseEventLoop.run_forever",
    "Handle._run",
    "run (",
    "spawn_main",
    "_main",
    "Process._bootstrap",
    "Process.run",
    "<module>",
    "_bootstrap",
    "subprocess_started",
    "Server.run",
    "Server.serve",
    "Server._serve",
    "Server.main_loop",
    "Runner.run",
    "asyncio_run",
    "run_until_complete",
    "BaseEventLoop.run_until_complete",
    "BaseProcess._bootstrap",
    "BaseProcess.run",
    "Process.target",
    "run (asyncio/runners.py)",
)


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
        "samples": total,
        "cpu_samples": cpu_total,
        "blocking_leaves_dropped": sorted(f"{n} ({p})" for n, p in BLOCKING_LEAVES),
        "top_self_all": [{"frame": k, "pct": pct(n, total)} for k, n in self_all.most_common(top)],
        "top_self": [{"frame": k, "pct": pct(n, cpu_total)} for k, n in self_cpu.most_common(top)],
        "top_inclusive": [{"frame": k, "pct": pct(n, cpu_total)} for k, n in inclusive.most_common(top)],
        "self_by_package": [{"package": k, "pct": pct(n, cpu_total)} for k, n in by_package.most_common(12)],
    }


def correctness_gate(pg: Postgres, db: str, tenant_ids: list[Any], tally: Tally) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(pg.url(db, driver="postgresql"), autocommit=True) as conn:
        row = conn.execute(
            """
            WITH t AS (SELECT id, status, version FROM generation_tasks WHERE tenant_id = ANY(%(t)s)),
                 r AS (SELECT task_id, count(*) AS n FROM credit_ledger
                        WHERE tenant_id = ANY(%(t)s) AND entry_type = 'RESERVE' GROUP BY task_id),
                 q AS (SELECT aggregate_id, count(*) AS n FROM outbox_events
                        WHERE tenant_id = ANY(%(t)s) AND event_type = 'task.status.changed'
                          AND aggregate_version = 3 GROUP BY aggregate_id),
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
        """,
            {"t": tenant_ids},
        ).fetchone()
        tasks, reserves, queued, bad_reserve, bad_queued, bad_events, orphans, bad_status = row
        pending_committed = (
            conn.execute(
                "SELECT count(*) FROM generation_tasks WHERE tenant_id = ANY(%s) AND client_idempotency_key = ANY(%s)",
                (tenant_ids, tally.pending_unique),
            ).fetchone()[0]
            if tally.pending_unique
            else 0
        )
        replay_tasks = (
            conn.execute(
                "SELECT count(*) FROM generation_tasks WHERE tenant_id = ANY(%s) AND client_idempotency_key = ANY(%s)",
                (tenant_ids, tally.replay_keys),
            ).fetchone()[0]
            if tally.replay_keys
            else 0
        )
        balances = conn.execute(
            """
            SELECT t.id, (SELECT coalesce(sum(balance), 0) FROM tenant_balance_stripes b WHERE b.tenant_id = t.id),
                   (SELECT coalesce(sum(amount), 0) FROM credit_ledger l
                                             WHERE l.tenant_id = t.id),
                   (SELECT coalesce(sum(estimated_cost), 0) FROM generation_tasks g WHERE g.tenant_id = t.id)
              FROM tenants t WHERE t.id = ANY(%s)""",
            (tenant_ids,),
        ).fetchall()
    balance_ok = all(bal == led == INITIAL_CREDITS - cost for _, bal, led, cost in balances)
    expected = tally.created + pending_committed
    checks = {
        "tasks == 202 created + committed in-flight": tasks == expected,
        "RESERVE ledger rows == tasks": reserves == tasks,
        # creation's one outbox row is the QUEUED notification (the queued-intake hop is gone)
        "task.status.changed (QUEUED) outbox rows == tasks": queued == tasks,
        "each task: 1 RESERVE, 1 QUEUED notification, 4 state events, QUEUED v3": bad_reserve
        == bad_queued
        == bad_events
        == bad_status
        == 0,
        "no orphan ledger/outbox rows": orphans == 0,
        "balance == ledger sum == initial - estimates": balance_ok,
        "one task per replayed key": replay_tasks == len(tally.replay_keys),
        "no non-202 response": not tally.non_202,
        "no socket error or timeout": not tally.socket_errors,
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "tasks": tasks,
        "reserve_rows": reserves,
        "queued_outbox_rows": queued,
        "responses_202_created": tally.created,
        "responses_202_replayed": tally.replayed,
        "in_flight_at_stop": len(tally.pending_unique),
        "in_flight_committed": pending_committed,
        "replay_keys": len(tally.replay_keys),
        "non_202": dict(tally.non_202),
        "socket_errors": dict(tally.socket_errors),
        "first_errors": tally.first_errors[:3],
        "wrk_runs": tally.runs,
        "tasks_bad_reserve": bad_reserve,
        "tasks_bad_outbox": bad_queued,
        "tasks_bad_events": bad_events,
        "tasks_bad_status": bad_status,
        "orphans": orphans,
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


OWN_KEY_PREFIX, OWN_KEY_SUFFIX = "own-key-", "-end"
#: each pgbench client walks its own range of :idx this long; each run starts at a new multiple of RUN_SPAN
OWN_STRIDE, RUN_SPAN = 10**7, 10**9


@dataclass
class OwnCreate:
    """The own-transaction baseline: a scratch aivedio database (migrated, same tenants and credits as the
    system's) and the pgbench scripts rendered from what a real POST sent to it."""

    db: str
    scripts: dict[int, Path]
    info: dict[str, Any]
    next_base: int = RUN_SPAN

    def run(self, pg: Postgres, tenants: int, clients: int, duration: int, sample_cpu: bool) -> dict[str, Any]:
        defines = {"base": self.next_base, "stride": OWN_STRIDE, "n": 0, "ts": int(time.time() * 1000)}
        self.next_base += RUN_SPAN
        res = common.run_pgbench(
            pg, self.db, self.scripts[tenants], clients, duration, sample_cpu=sample_cpu, defines=defines
        )
        return {**res.as_dict(), "tenants": tenants}


def prepare_own(pg: Postgres, db: str, n_tenants: int, pool_size: int, workdir: Path, rt_posts: int) -> OwnCreate:
    """Capture the product's create transaction and render it for pgbench.

    In this process: the real app (`create_app` on `build_context` with the benchmark's settings) on a fresh
    migrated database with `n_tenants` tenants, driven through FastAPI's TestClient (with its lifespan, so the
    create runs on the loop as served). A warm-up POST per tenant (at least two), then four
    recorded ones (keys own-key-<i>-end, tenant i % n): every statement and parameter SQLAlchemy hands the driver
    (`bench.own_sql.Recorder`), and the table writes they caused. The committed transaction is rendered twice
    (keys spread over 1 tenant and over n), and each script is run with pgbench -t to check it writes the same
    rows per transaction as the product did. Then, on warm connections, round trips per POST (new key, and the
    same keys replayed) from libpq's protocol trace, with pool checkouts and Parse messages."""
    from fastapi.testclient import TestClient

    from aivedio_engine.api.app import create_app
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db import migrate
    from bench import own_sql
    from bench.api_server import bench_settings

    ctx = build_context(bench_settings(pg.url(db), pool_size=pool_size, data_dir=str(workdir / "own-data")))
    info: dict[str, Any] = {"database": db, "tenants": n_tenants}
    try:
        migrate.upgrade(ctx.engine)
        tenant_ids, keys = [], []
        for i in range(n_tenants):
            t = ctx.tenants.create(f"own-{i}", INITIAL_CREDITS)
            tenant_ids.append(t.id)
            keys.append(ctx.tenants.create_key(t.id)[1])
        rec = own_sql.Recorder(ctx.engine)
        wire = own_sql.WireCounter(ctx.engine, workdir)
        wire.watch_loop_pool(ctx.loop_pool)  # the create route's async connections (opened by the lifespan)
        ctx.engine.dispose()  # from here on every connection is traced

        with TestClient(create_app(ctx)) as client:

            def post(i: int, replay: bool = False) -> None:
                key = f"{OWN_KEY_PREFIX}{i}{OWN_KEY_SUFFIX}"
                r = client.post(
                    "/v1/generations",
                    content=BODY,
                    headers={
                        "Authorization": f"Bearer {keys[i % n_tenants]}",
                        "Idempotency-Key": key,
                        "X-Request-Id": key,
                        "Content-Type": "application/json",
                    },
                )
                if r.status_code != 202 or bool(r.headers.get("idempotent-replayed")) != replay:
                    raise BenchError(
                        f"own-transaction capture: POST answered {r.status_code} "
                        f"(replayed={r.headers.get('idempotent-replayed')}): {r.text[:300]}"
                    )

            def disconnect() -> None:
                """Close every connection, the loop pool's too: a backend reports its table counters as it exits."""
                ctx.engine.dispose()
                if ctx.loop_pool is not None:
                    client.portal.call(ctx.loop_pool.open)  # type: ignore[union-attr]  # closes, then opens anew

            warm = max(2, n_tenants)  # every tenant once: its limits cached, as in the steady state wrk measures
            for i in range(warm):
                post(i)
            disconnect()
            before = own_sql.settled_writes(pg, db)
            n_cap = 4
            for i in range(warm, warm + n_cap):
                with rec.operation(i, "create"):
                    post(i)
            disconnect()
            product = own_sql.writes_per_op(before, own_sql.settled_writes(pg, db, before), n_cap)
            if rt_posts:
                for i in range(100, 112):  # psycopg prepares a statement on its 6th execution
                    post(i)
                rt = {
                    "POST /v1/generations, new key": wire.measure(
                        [lambda i=i: post(i) for i in range(200, 200 + rt_posts)]
                    ),
                    "POST /v1/generations, same key replayed": wire.measure(
                        [lambda i=i: post(i, replay=True) for i in range(200, 200 + rt_posts)]
                    ),
                }
                info["round_trips"] = rt
        ops = own_sql.choose_structure(rec.ops, "create")
        info["capture"] = {
            "operations": len(rec.ops),
            "same_shape": len(ops),
            "shapes_seen": len({o.signature() for o in rec.ops}),
            "path": "POST /v1/generations (TestClient → create_app → LoopCreate.create)",
            "product_writes_per_op (ins, upd, del)": product,
        }
    finally:
        ctx.close()

    literal = own_sql.Literals(pg.url(db, driver="postgresql"))
    scripts: dict[int, Path] = {}
    info["scripts"] = {}
    git = common.git_info()
    try:
        for t in sorted({1, n_tenants}):
            entities = [
                own_sql.choice_entity("tenant", tenant_ids, n_tenants, t),
                own_sql.text_entity("idempotency key", OWN_KEY_PREFIX, OWN_KEY_SUFFIX),
            ]
            title = (
                f"aivedio api_create: our own create transaction, captured {common.utc_now()} at commit "
                f"{(git.get('commit') or '?')[:10]}{' (dirty tree)' if git.get('dirty') else ''}\n"
                f"from POST /v1/generations (LoopCreate.create); keys spread over {t} tenant(s)"
            )
            script = own_sql.render_script(ops[0], ops[1], literal, entities, title=title)
            path = workdir / f"own-create-t{t}.sql"
            path.write_text(script.text)
            before = own_sql.settled_writes(pg, db)
            clients, per_client = 2, 5
            own_sql.run_script_n(
                pg,
                db,
                path,
                per_client,
                clients,
                {"base": 10**6 * (t + 1), "stride": 1000, "n": 0, "ts": int(time.time() * 1000)},
            )
            replay = own_sql.writes_per_op(before, own_sql.settled_writes(pg, db, before), clients * per_client)
            scripts[t] = path
            info["scripts"][str(t)] = {**script.as_dict(), "verify": own_sql.compare_writes(product, replay)}
    finally:
        literal.close()
    seg = own_sql.committed_segments(
        (info.get("round_trips") or {}).get("POST /v1/generations, new key", {}).get("sequence", [])
    )
    info["product_transaction_round_trips"] = [len(x) for x in seg]
    return OwnCreate(db, scripts, info)


def run(args: argparse.Namespace) -> int:
    quick = common.apply_quick(args, QUICK, args._defaults)
    duration = args.duration
    c1_duration = args.c1_duration or max(5, duration // 2)
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    for tool in ("pgbench", "psql", "wrk"):
        common.need_tool(tool)
    sync_commit = pg.setting("synchronous_commit")
    started = common.utc_now()
    tag = f"{time.strftime('%Y%m%d%H%M%S')}_{os.getpid()}"
    sys_db, pgb_db, own_db = f"bench_api_{tag}", f"bench_pgb_{tag}", f"bench_own_{tag}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-create-"))
    n_tenants = max(1, args.tenants)
    tenant_sets = [1] + ([n_tenants] if n_tenants > 1 else [])
    doc: dict[str, Any] = {
        "benchmark": NAME,
        "date": started,
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {
            "reps": args.reps,
            "duration_s": duration,
            "c1_duration_s": c1_duration,
            "quick": args.quick,
            "quick_changed": quick,
            "warmup_s": args.warmup,
            "wait_quiet_s": args.wait_quiet,
            "workers": args.workers,
            "server": args.server,
            "pool_size": args.pool_size,
            "clients": CLIENTS,
            "tenants": tenant_sets,
            "load_generator": "wrk (Lua: unique Idempotency-Key per request)",
            "synchronous_commit": sync_commit,
            "body_bytes": len(BODY),
            "baseline_minimal": "pgbench -n -M prepared -T D -c 16 -j 2 -f bench/sql/create_task.sql (+ -c 1 -j 1)",
            "baseline_own": "pgbench -n -M prepared -T D -c 16 -j 2 -D base=.. -D stride=.. -D n=0 -D ts=.. "
            "-f <own script captured at run time> (own scratch aivedio database)",
            "chain": "per repetition: [minimal, own 1 tenant, + c=1 of both] → API 1 tenant → [minimal, own "
            "1 tenant, own N tenants, + c=1] → API N tenants → [minimal, own N tenants]",
            "discard_rule": f"max(A,B)/min(A,B) - 1 > {common.MAX_BASELINE_DIVERGENCE}, for each baseline "
            f"pair on its own",
        },
        "targets": {"ratio": TARGET_RATIO, "floor": FLOOR_RATIO, "c1_overhead_ms": TARGET_OVERHEAD_MS},
    }
    if sync_commit != "on":
        print(f"warning: synchronous_commit is {sync_commit!r}; the headline figure must be durable", file=sys.stderr)
    api: Api | None = None
    rep_docs: list[dict[str, Any]] = []
    reps: dict[str, list[Repetition]] = {}
    code = 0
    real_stdout = sys.stdout
    _log(
        f"databases {sys_db} (aivedio, the API), {pgb_db} (minimal baseline), {own_db} (own transaction); "
        f"workdir {workdir}"
    )
    try:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            for db in (pgb_db, sys_db, own_db):
                pg.create_db(db)
            pg.psql(pgb_db, file=MINIMAL_SCRIPT.with_name("create_task_schema.sql"))
            tenant_ids, keys = prepare_system_db(pg.url(sys_db), n_tenants, workdir)
            _log(f"capturing our own create transaction in {own_db}")
            own = prepare_own(pg, own_db, n_tenants, args.pool_size, workdir, args.roundtrip_posts)
            doc["own_transaction"] = own.info
            for t, sc in own.info["scripts"].items():
                _log(
                    f"own script, {t} tenant(s): {sc['statements']} statements, {sc['round_trips']} round trips; "
                    f"replays the product's writes: {'yes' if sc['verify']['ok'] else 'NO'}"
                    + (f"; {len(sc['warnings'])} warning(s)" if sc["warnings"] else "")
                )
            api = Api(pg.url(sys_db), sys_db, keys[:1], args.workers, args.pool_size, workdir, args.server)
            api.wait_ready()
            _log(f"API up on {api.url}: {len(api.worker_pids)} workers {api.worker_pids}")
            api.wrk(CLIENTS, max(2, args.warmup))  # first contact: pools, caches, code paths

            for i in range(1, args.reps + 1):
                quiet = common.wait_for_quiet(args.wait_quiet) if args.wait_quiet else {}
                rep_doc, rep = repetition(
                    i, pg, pgb_db, own, api, keys, tenant_sets, duration, c1_duration, args.warmup
                )
                rep_doc["quiet_before"] = quiet
                rep_docs.append(rep_doc)
                for k, r in rep.items():
                    reps.setdefault(k, []).append(r)

            secondary: dict[str, Any] = {}
            sd = args.secondary_duration
            if not args.no_replay:
                if args.wait_quiet:
                    common.wait_for_quiet(args.wait_quiet)
                _log("secondary: idempotent replay (16 clients, one key)")
                secondary["replay"] = replay_point(api, pg, pgb_db, sd, args.warmup)
            if args.profile:
                _log(f"profile: py-spy {args.profile} s on {len(api.worker_pids)} workers")
                secondary["profile"] = profile_workers(api, args.profile, workdir)
            api.stop()
            gate = correctness_gate(pg, sys_db, tenant_ids, api.tally)
            for t, sc in own.info["scripts"].items():
                gate["checks"][f"own script ({t} tenant(s)) writes the rows the product writes, per table"] = sc[
                    "verify"
                ]["ok"]
            gate["ok"] = all(gate["checks"].values())
            doc.update(summary_doc(reps, rep_docs, tenant_sets), repetitions=rep_docs, secondary=secondary, gate=gate)
            doc["round_trips"] = round_trip_summary(own.info)
            if not gate["ok"]:
                code = 1
            elif not common.kept(reps.get("minimal_t1", [])):
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
            for db in (sys_db, pgb_db, own_db):
                try:
                    pg.drop_db(db)
                except BenchError as exc:
                    print(f"warning: could not drop {db}: {exc}", file=sys.stderr)
        doc["finished"] = common.utc_now()
        path = Path(args.json_out) if args.json_out else common.default_json_path(NAME)
        for t, sc in (doc.get("own_transaction") or {}).get("scripts", {}).items():
            sql_path = path.with_name(f"{path.stem}-own-t{t}.sql")
            sql_path.parent.mkdir(parents=True, exist_ok=True)
            sql_path.write_text(sc["script"])
            sc["file"] = str(sql_path)
        path = common.write_json(path, doc)
        shutil.rmtree(workdir, ignore_errors=True)
        if args.json and "error" in doc:  # still one JSON object on stdout, saying what went wrong
            real_stdout.write(json.dumps(common.json_clean(doc), default=str) + "\n")
    common.emit(args, doc, render(doc), path, real_stdout)
    return code


def repetition(
    i: int,
    pg: Postgres,
    pgb_db: str,
    own: OwnCreate,
    api: Api,
    keys: list[str],
    tenant_sets: list[int],
    duration: int,
    c1_duration: int,
    warmup: int,
) -> tuple[dict[str, Any], dict[str, Repetition]]:
    """One chain: baselines, API with 1 tenant, baselines, API with N tenants, baselines. Each API point is
    divided by the mean of the two blocks around it, the minimal and the own baseline each on their own."""
    multi = tenant_sets[-1] if len(tenant_sets) > 1 else None
    d, d1 = duration, c1_duration
    blocks: list[dict[str, Any]] = []
    _log(f"rep {i}: baselines 0 (minimal, own 1 tenant; c=16 and c=1)")
    blocks.append(
        baseline_block(
            pg, pgb_db, own, [("minimal", CLIENTS, d), ("own_t1", CLIENTS, d), ("minimal", 1, d1), ("own_t1", 1, d1)]
        )
    )
    _log(
        f"rep {i}: API, 1 tenant (minimal {blocks[0]['minimal_c16']['tps']:.0f} TPS, own "
        f"{blocks[0]['own_t1_c16']['tps']:.0f} TPS)"
    )
    apis: dict[str, Any] = {"t1": system_block(api, pg, keys[:1], d, d1, warmup)}
    points = [("minimal", CLIENTS, d), ("own_t1", CLIENTS, d)]
    if multi:
        points.append((f"own_t{multi}", CLIENTS, d))
    _log(f"rep {i}: baselines 1 (API {apis['t1']['c16']['created_per_s']:.0f} 202/s)")
    blocks.append(baseline_block(pg, pgb_db, own, points + [("minimal", 1, d1), ("own_t1", 1, d1)]))
    if multi:
        _log(f"rep {i}: API, keys spread over {multi} tenants")
        apis[f"t{multi}"] = system_block(api, pg, keys, d, 0, warmup)
        _log(f"rep {i}: baselines 2 (API {apis[f't{multi}']['c16']['created_per_s']:.0f} 202/s)")
        blocks.append(baseline_block(pg, pgb_db, own, [("minimal", CLIENTS, d), (f"own_t{multi}", CLIENTS, d)]))
    reps: dict[str, Repetition] = {}
    for k, t in enumerate(tenant_sets):
        a, b, sysp = blocks[k], blocks[k + 1], apis[f"t{t}"]
        rate = sysp["c16"]["created_per_s"]
        raw = {"tenants": t}
        reps[f"minimal_t{t}"] = Repetition(i, a["minimal_c16"]["tps"], rate, b["minimal_c16"]["tps"], raw=raw)
        reps[f"own_t{t}"] = Repetition(i, a[f"own_t{t}_c16"]["tps"], rate, b[f"own_t{t}_c16"]["tps"], raw=raw)
        m, o = reps[f"minimal_t{t}"], reps[f"own_t{t}"]
        _log(
            f"rep {i}, {t} tenant(s): API ÷ minimal {m.ratio:.3f} (baselines differ {100 * m.divergence:.1f} %"
            f"{'' if m.kept else ', DISCARDED'}), API ÷ own {o.ratio:.3f} (differ {100 * o.divergence:.1f} %"
            f"{'' if o.kept else ', DISCARDED'}), own ÷ minimal {schema_cost(m, o):.3f}"
        )
    c1 = {}
    if "c1" in apis["t1"]:
        p50 = apis["t1"]["c1"]["latency_us"]["p50"] / 1000
        for name in ("minimal", "own_t1"):
            lat = (blocks[0][f"{name}_c1"]["latency_avg_ms"] + blocks[1][f"{name}_c1"]["latency_avg_ms"]) / 2
            c1[name] = {"pgbench_latency_ms_mean": lat, "api_p50_ms": p50, "overhead_ms": p50 - lat}
    rep_doc = {"index": i, "blocks": blocks, "api": apis, "c1": c1, "ratios": {k: r.as_dict() for k, r in reps.items()}}
    return rep_doc, reps


def system_block(
    api: Api, pg: Postgres, keys: list[str], duration: int, c1_duration: int, warmup: int
) -> dict[str, Any]:
    if warmup:
        api.wrk(CLIENTS, warmup, keys=keys)
    pg.checkpoint()
    out = {"c16": api.wrk(CLIENTS, duration, keys=keys, sample_cpu=True).as_dict(), "tenants": len(keys)}
    if c1_duration:
        pg.checkpoint()
        out["c1"] = api.wrk(1, c1_duration, keys=keys).as_dict()
    return out


def schema_cost(minimal: Repetition, own: Repetition) -> float:
    """own ÷ minimal: the mean of the own baselines over the mean of the minimal ones around the same point."""
    return common.ratio((own.a + own.b) / 2, minimal.a, minimal.b)


def replay_point(api: Api, pg: Postgres, db: str, duration: int, warmup: int) -> dict[str, Any]:
    key = f"replay{secrets.token_hex(6)}"
    a = common.run_pgbench(pg, db, MINIMAL_SCRIPT, CLIENTS, duration, sample_cpu=True)
    api.wrk(CLIENTS, max(1, warmup), mode="replay", nonce=key)  # the first of these creates the task
    pg.checkpoint()
    w = api.wrk(CLIENTS, duration, mode="replay", nonce=key, sample_cpu=True)
    b = common.run_pgbench(pg, db, MINIMAL_SCRIPT, CLIENTS, duration, sample_cpu=True)
    rep = Repetition(0, a.tps, w.replayed_per_s, b.tps)
    return {
        "baseline_a": a.as_dict(),
        "system": w.as_dict(),
        "baseline_b": b.as_dict(),
        "replayed_per_s": w.replayed_per_s,
        "ratio": rep.ratio,
        "baseline_divergence": rep.divergence,
        "kept": rep.kept,
    }


def summary_doc(
    reps: dict[str, list[Repetition]], rep_docs: list[dict[str, Any]], tenant_sets: list[int]
) -> dict[str, Any]:
    def sp(values: list[float]) -> dict[str, Any] | None:
        x = common.summarize(values)
        return x.as_dict() if x else None

    out: dict[str, Any] = {}
    for t in tenant_sets:
        mins, owns = reps.get(f"minimal_t{t}", []), reps.get(f"own_t{t}", [])
        pairs = list(zip(mins, owns, strict=False))
        d = {
            "tenants": t,
            "total": len(mins),
            "kept_minimal": len(common.kept(mins)),
            "kept_own": len(common.kept(owns)),
            "kept_both": sum(1 for m, o in pairs if m.kept and o.kept),
            "ratio_vs_minimal": sp([m.ratio for m in mins if m.kept]),
            "client_path_cost": sp([o.ratio for o in owns if o.kept]),
            "schema_cost": sp([schema_cost(m, o) for m, o in pairs if m.kept and o.kept]),
            "api_created_per_s_c16": sp([m.system for m, o in pairs if m.kept or o.kept]),
            "minimal_tps_c16_mean": sp([(m.a + m.b) / 2 for m in mins if m.kept]),
            "own_tps_c16_mean": sp([(o.a + o.b) / 2 for o in owns if o.kept]),
        }
        sysps = [r["api"][f"t{t}"]["c16"] for r in rep_docs]
        keep = [m.kept or o.kept for m, o in pairs]
        d["api_p50_ms_c16"] = sp([s["latency_us"]["p50"] / 1000 for s, k in zip(sysps, keep, strict=False) if k])
        d["api_p99_ms_c16"] = sp([s["latency_us"]["p99"] / 1000 for s, k in zip(sysps, keep, strict=False) if k])
        if t == 1:
            c1s = [r["c1"] for r in rep_docs if r.get("c1")]
            km = [m.kept for m in mins]
            ko = [o.kept for o in owns]
            d["api_p50_ms_c1"] = sp([c["minimal"]["api_p50_ms"] for c, k in zip(c1s, keep, strict=False) if k])
            d["minimal_latency_ms_c1_mean"] = sp(
                [c["minimal"]["pgbench_latency_ms_mean"] for c, k in zip(c1s, km, strict=False) if k]
            )
            d["own_latency_ms_c1_mean"] = sp(
                [c["own_t1"]["pgbench_latency_ms_mean"] for c, k in zip(c1s, ko, strict=False) if k]
            )
            d["c1_overhead_vs_minimal_ms"] = sp(
                [c["minimal"]["overhead_ms"] for c, k in zip(c1s, km, strict=False) if k]
            )
            d["c1_overhead_vs_own_ms"] = sp([c["own_t1"]["overhead_ms"] for c, k in zip(c1s, ko, strict=False) if k])
        out[f"tenants_{t}"] = d
    one = out.get("tenants_1", {})
    return {
        "summary": {
            "headline": "tenants_1",
            "ratio": one.get("ratio_vs_minimal"),
            "c1_overhead_ms": one.get("c1_overhead_vs_minimal_ms"),
            **out,
        }
    }


def round_trip_summary(info: dict[str, Any]) -> dict[str, Any]:
    """Round trips per operation: counted on the wire at the API (libpq trace), and per pgbench execution of
    each script (one per command)."""
    out: dict[str, Any] = {}
    for k, v in (info.get("round_trips") or {}).items():
        out[k] = {
            "round_trips": v["round_trips_per_op"],
            "ready_for_query": v.get("ready_for_query_per_op"),
            "checkouts": v["checkouts_per_op"],
            "parse_messages": v["parse_messages_per_op"],
            "sequence": v["sequence"],
        }
    if info.get("product_transaction_round_trips"):
        out["product create transaction (BEGIN … COMMIT, on the wire)"] = {
            "round_trips": info["product_transaction_round_trips"][-1]
        }
    for t, sc in (info.get("scripts") or {}).items():
        out[f"own script, {t} tenant(s) (pgbench)"] = {"round_trips": sc["round_trips"]}
        break
    out["minimal script create_task.sql (pgbench)"] = {
        "round_trips": common.script_round_trips(MINIMAL_SCRIPT.read_text())
    }
    return out


# ------------------------------------------------------------------------------------------------ output
def render(doc: dict[str, Any]) -> str:
    m, g, cfg = doc["machine"], doc["git"], doc["config"]
    head = (
        f"api_create — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
        f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
        f"synchronous_commit={cfg['synchronous_commit']}, load generator wrk, "
        f"{cfg['workers']} uvicorn workers, {cfg['reps']} × {cfg['duration_s']} s "
        f"(c=1: {cfg['c1_duration_s']} s){' — QUICK' if cfg.get('quick') else ''}"
    )
    sm = doc.get("summary")
    if not sm:
        return "\n".join([head, "", f"no result: {doc.get('error', '?')}"])

    def cell(d: dict[str, Any] | None, digits: int = 2) -> tuple[str, str]:
        return fmt_spread(common.Spread(d["median"], d["min"], d["max"], d["n"]) if d else None, digits)

    rows = []
    for key in [k for k in sm if k.startswith("tenants_")]:
        t = sm[key]
        label = f"{t['tenants']} tenant{'s' if t['tenants'] > 1 else ''}"
        for name, metric, target, digits, kept in (
            (
                "ratio: API 202/s ÷ minimal pgbench TPS",
                "ratio_vs_minimal",
                f"≥ {TARGET_RATIO} (floor {FLOOR_RATIO})" if t["tenants"] == 1 else "",
                3,
                t["kept_minimal"],
            ),
            ("schema cost: own TPS ÷ minimal TPS", "schema_cost", "", 3, t["kept_both"]),
            ("client-path cost: API 202/s ÷ own TPS", "client_path_cost", "", 3, t["kept_own"]),
            ("API 202/s (unique keys)", "api_created_per_s_c16", "", 2, None),
            ("minimal pgbench TPS, mean(A, B)", "minimal_tps_c16_mean", "", 2, t["kept_minimal"]),
            ("own pgbench TPS, mean(A, B)", "own_tps_c16_mean", "", 2, t["kept_own"]),
            ("API p50 ms", "api_p50_ms_c16", "", 2, None),
            ("API p99 ms", "api_p99_ms_c16", "", 2, None),
            ("API p50 ms, c=1", "api_p50_ms_c1", "", 2, None),
            ("minimal pgbench avg latency ms, c=1", "minimal_latency_ms_c1_mean", "", 3, t["kept_minimal"]),
            ("own pgbench avg latency ms, c=1", "own_latency_ms_c1_mean", "", 3, t["kept_own"]),
            (
                "c=1 overhead ms (API p50 − minimal)",
                "c1_overhead_vs_minimal_ms",
                f"≤ {TARGET_OVERHEAD_MS}",
                2,
                t["kept_minimal"],
            ),
            ("c=1 overhead ms (API p50 − own)", "c1_overhead_vs_own_ms", "", 2, t["kept_own"]),
        ):
            if metric not in t:
                continue
            med, spread = cell(t[metric], digits)
            n_kept = kept if kept is not None else (t[metric] or {}).get("n", 0)
            rows.append(
                [label, name + ("" if "c=1" in name else ", c=16"), med, spread, target, f"{n_kept}/{t['total']}"]
            )
    out = [head, "", table(["tenants", "metric", "median", "spread (min – max)", "target", "kept reps"], rows)]

    per = []
    for r in doc.get("repetitions", []):
        for key, x in r["ratios"].items():
            base, t = key.rsplit("_t", 1)
            div = x["baseline_divergence"]
            per.append(
                [
                    r["index"],
                    t,
                    base,
                    fmt(x["baseline_a"]),
                    fmt(x["system"]),
                    fmt(x["baseline_b"]),
                    f"{100 * div:.1f} %" if div is not None else "—",
                    fmt(x["ratio"], 3),
                    "yes" if x["kept"] else "DISCARDED",
                ]
            )
    if per:
        out += [
            "",
            "Per repetition (each API point against the baseline blocks before and after it; c=16):",
            table(
                ["rep", "tenants", "baseline", "before TPS", "API 202/s", "after TPS", "A/B differ", "ratio", "kept"],
                per,
            ),
        ]
    c1rows = []
    for r in doc.get("repetitions", []):
        for name, c in (r.get("c1") or {}).items():
            c1rows.append(
                [r["index"], name, fmt(c["pgbench_latency_ms_mean"], 3), fmt(c["api_p50_ms"]), fmt(c["overhead_ms"])]
            )
    if c1rows:
        out += [
            "",
            "c=1 latency, 1 tenant:",
            table(["rep", "baseline", "pgbench avg ms, mean(A, B)", "API p50 ms", "overhead ms"], c1rows),
        ]

    rt = doc.get("round_trips")
    if rt:
        out += [
            "",
            "Round trips per operation (counted: libpq protocol trace at the API, one per wait for the "
            "server — a Sync, a Flush or a simple query answered; ReadyForQuery messages beside — on warm "
            "connections; pgbench: one per command of the script, a pipeline once):",
            table(
                ["operation", "round trips", "ReadyForQuery", "checkouts", "Parse msgs", "what they are"],
                [
                    [
                        k,
                        fmt(v.get("round_trips")),
                        fmt(v.get("ready_for_query")),
                        fmt(v.get("checkouts")),
                        fmt(v.get("parse_messages")),
                        ", ".join(v.get("sequence") or []),
                    ]
                    for k, v in rt.items()
                ],
            ),
        ]

    own = doc.get("own_transaction") or {}
    for t, sc in (own.get("scripts") or {}).items():
        v = sc["verify"]
        out += [
            "",
            f"Own transaction replayed by pgbench, {t} tenant(s) ({sc['statements']} statements, "
            f"{sc['round_trips']} round trips; {sc.get('file', 'script in the JSON')}): writes the rows the "
            f"product writes: {'yes' if v['ok'] else 'NO'} — per table (ins, upd, del) per create, product / "
            f"replay: "
            + "; ".join(f"{tb} {x['product']} / {x['replay']}" for tb, x in v["per_table_ins_upd_del_per_op"].items()),
            "  values: " + ", ".join(f"{k} ×{n}" for k, n in sc["how_values_vary"].items()),
        ]
        out += [f"  warning: {w}" for w in sc["warnings"]]
    if own.get("scripts"):
        first = next(iter(own["scripts"].values()))
        out += ["", "Captured transaction (statement order): " + " → ".join(first["shape"][0])]

    sec = doc.get("secondary", {})
    p = sec.get("replay")
    if p:
        out += [
            "",
            "Secondary (one repetition):",
            table(
                ["measurement", "rate", "minimal A c16", "minimal B c16", "ratio", "A/B differ"],
                [
                    [
                        "idempotent replay 202/s (one key, 16 clients)",
                        fmt(p["replayed_per_s"]),
                        fmt(p["baseline_a"]["tps"]),
                        fmt(p["baseline_b"]["tps"]),
                        fmt(p["ratio"], 3),
                        f"{100 * p['baseline_divergence']:.1f} %{'' if p['kept'] else ' (DISCARDED)'}",
                    ]
                ],
            ),
        ]

    cpu_rows = []
    for r in doc.get("repetitions", []):
        for k, blk in enumerate(r["blocks"]):
            for name, point in blk.items():
                if name.endswith("_c16"):
                    cpu_rows.append(_cpu_row(f"rep {r['index']} block {k} {name[:-4]}", point.get("cpu"), point["tps"]))
            tkey = ["t1", *[x for x in r["api"] if x != "t1"]]
            if k < len(tkey) and tkey[k] in r["api"]:
                api_p = r["api"][tkey[k]]["c16"]
                cpu_rows.append(
                    _cpu_row(f"rep {r['index']} API {tkey[k][1:]} tenant(s)", api_p.get("cpu"), api_p["created_per_s"])
                )
    if p:
        cpu_rows.append(_cpu_row("replay API", p["system"].get("cpu"), p["system"]["replayed_per_s"]))
    cpu_rows = [r for r in cpu_rows if r]
    if cpu_rows:
        out += [
            "",
            "Where the CPU goes at c=16 (cores used, sampled mid-run; CPU µs per transaction/request in "
            "brackets; 'other' is everything else on the box — other people's work on a shared machine):",
            table(
                ["point", "rate/s", "box busy", "other", "client", "API workers", "PG backends", "PG shared"], cpu_rows
            ),
        ]

    prof = sec.get("profile")
    if prof and "top_self" in prof:
        out += [
            "",
            f"py-spy --gil (Python CPU only), {prof['workers']} API workers, {prof['seconds']} s under the "
            f"c=16 creation load: {prof['samples']} samples ({prof['samples'] - prof['cpu_samples']} whose "
            f"leaf is a blocking wait dropped). Top 10 by own time:",
            table(
                ["#", "frame", "% of CPU samples"],
                [[i + 1, f["frame"], f["pct"]] for i, f in enumerate(prof["top_self"])],
            ),
            "",
            "top 10 by inclusive CPU time (thread and event-loop wrappers left out):",
            table(
                ["#", "frame", "% of CPU samples"],
                [[i + 1, f["frame"], f["pct"]] for i, f in enumerate(prof["top_inclusive"])],
            ),
            "",
            "own CPU time by package: " + ", ".join(f"{p_['package']} {p_['pct']} %" for p_ in prof["self_by_package"]),
        ]
    elif prof:
        out += ["", f"profile: {prof.get('skipped')}"]

    g = doc.get("gate")
    if g:
        out += [
            "",
            f"Correctness gate: {'PASS' if g['ok'] else 'FAIL'} — tasks {g['tasks']:,}, RESERVE rows "
            f"{g['reserve_rows']:,}, QUEUED notification outbox rows {g['queued_outbox_rows']:,}; 202 created "
            f"{g['responses_202_created']:,} + in flight when wrk stopped and committed "
            f"{g['in_flight_committed']} (of {g['in_flight_at_stop']}); 202 replayed "
            f"{g['responses_202_replayed']:,}; non-202 {g['non_202'] or 0}; socket errors "
            f"{g['socket_errors'] or 0}",
        ]
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

    return [
        label,
        fmt(rate),
        f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %",
        f"{cpu['other_cores']:.2f}",
        cell("wrk", "pgbench"),
        cell("api"),
        cell("postgres"),
        cell("pg_shared"),
    ]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
