"""What every benchmark shares: the A-B-A bookkeeping and its statistics, PostgreSQL/pgbench helpers, the
machine and commit description, and the table/JSON output.

The rules: each repetition measures the baseline right before (A) and right after (B) the
system; the figure is system ÷ mean(A, B); a repetition whose two baselines differ by more than 10 % is
discarded; the median and the spread (min–max) of the kept repetitions are reported.

"Differ by more than 10 %" is read as max(A, B) / min(A, B) − 1 > 0.10, i.e. relative to the smaller one,
which is the stricter of the usual readings.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
SQL_DIR = REPO / "bench" / "sql"

#: a repetition whose baselines diverge by more than this is discarded
MAX_BASELINE_DIVERGENCE = 0.10


# ----------------------------------------------------------------------------------------------- statistics
def baseline_divergence(a: float, b: float) -> float:
    """max/min − 1 of the two baselines; infinite when either is not positive (a broken measurement)."""
    lo, hi = min(a, b), max(a, b)
    if not (lo > 0) or math.isnan(hi):
        return math.inf
    return hi / lo - 1.0


def baselines_agree(a: float, b: float, tolerance: float = MAX_BASELINE_DIVERGENCE) -> bool:
    """True when the repetition counts: its baselines differ by at most `tolerance` (10 % by default).

    A divergence within floating-point noise of the tolerance counts as equal to it (10.0 % is kept)."""
    return baseline_divergence(a, b) <= tolerance + 1e-12


def ratio(system: float, a: float, b: float) -> float:
    """system ÷ mean(A, B); NaN when the baselines are unusable."""
    mean = (a + b) / 2.0
    return system / mean if mean > 0 else math.nan


@dataclass(frozen=True)
class Spread:
    """Median and min–max of the kept values of one metric."""

    median: float
    lo: float
    hi: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}


def summarize(values: Iterable[float]) -> Spread | None:
    """Median and spread of the values that are numbers; None when there are none."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return None
    return Spread(statistics.median(kept), min(kept), max(kept), len(kept))


@dataclass
class Repetition:
    """One A-B-A repetition. `a`, `b` and `system` are the headline numbers (higher is better); everything
    else measured in the repetition goes into `raw`."""

    index: int
    a: float
    system: float
    b: float
    raw: dict[str, Any] = field(default_factory=dict)
    tolerance: float = MAX_BASELINE_DIVERGENCE

    @property
    def divergence(self) -> float:
        return baseline_divergence(self.a, self.b)

    @property
    def kept(self) -> bool:
        return baselines_agree(self.a, self.b, self.tolerance)

    @property
    def ratio(self) -> float:
        return ratio(self.system, self.a, self.b)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "baseline_a": self.a,
            "system": self.system,
            "baseline_b": self.b,
            "baseline_divergence": _finite(self.divergence),
            "ratio": _finite(self.ratio),
            "kept": self.kept,
            "raw": self.raw,
        }


def kept(reps: Sequence[Repetition]) -> list[Repetition]:
    return [r for r in reps if r.kept]


def summarize_kept(reps: Sequence[Repetition], metric: Callable[[Repetition], float]) -> Spread | None:
    """Median and spread of `metric` over the kept repetitions only."""
    return summarize(metric(r) for r in kept(reps))


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


# ----------------------------------------------------------------------------------------------- postgres
class BenchError(RuntimeError):
    """A benchmark could not be run (missing tool, unreachable server, failed setup)."""


@dataclass(frozen=True)
class Postgres:
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    admin_db: str = "postgres"

    def url(self, db: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{self.user}@{self.host}:{self.port}/{db}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PGHOST": self.host, "PGPORT": str(self.port), "PGUSER": self.user}

    def psql(self, db: str, sql: str | None = None, file: Path | None = None) -> str:
        cmd = [need_tool("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", db]
        cmd += ["-c", sql] if sql is not None else ["-f", str(file)]
        res = subprocess.run(cmd, env=self.env(), capture_output=True, text=True)
        if res.returncode != 0:
            raise BenchError(f"psql failed on {db}: {res.stderr.strip()[:500]}")
        return res.stdout.strip()

    def scalar(self, db: str, sql: str) -> str:
        out = self.psql(db, sql)
        return out.splitlines()[-1].strip() if out else ""

    def create_db(self, name: str) -> None:
        self.psql(self.admin_db, f'CREATE DATABASE "{name}"')

    def drop_db(self, name: str) -> None:
        self.psql(self.admin_db, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def checkpoint(self) -> None:
        self.psql(self.admin_db, "CHECKPOINT")

    def setting(self, name: str, db: str | None = None) -> str:
        return self.psql(db or self.admin_db, f"SHOW {name}")


@dataclass(frozen=True)
class PgbenchResult:
    clients: int
    duration_s: int
    tps: float
    latency_avg_ms: float
    transactions: int
    failed: int
    cpu: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)
_LAT = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)
_TX = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


def parse_pgbench(output: str, clients: int, duration_s: int, cpu: dict[str, float] | None = None) -> PgbenchResult:
    tps, lat, tx = _TPS.search(output), _LAT.search(output), _TX.search(output)
    if not (tps and lat and tx):
        raise BenchError(f"cannot read pgbench output:\n{output[-1000:]}")
    failed = _FAILED.search(output)
    return PgbenchResult(
        clients,
        duration_s,
        float(tps.group(1)),
        float(lat.group(1)),
        int(tx.group(1)),
        int(failed.group(1)) if failed else 0,
        cpu or {},
    )


def run_pgbench(
    pg: Postgres,
    db: str,
    script: Path,
    clients: int,
    duration_s: int,
    sample_cpu: bool = False,
    defines: dict[str, Any] | None = None,
) -> PgbenchResult:
    """`pgbench -n -M prepared -T D -c C -j (1 or 2) [-D k=v ...] -f script db`, after a CHECKPOINT
    (B.4). With sample_cpu, `cpu` holds the cores used by pgbench, its backends,
    PostgreSQL's shared processes and everything else, over the middle of the run."""
    pg.checkpoint()
    jobs = 1 if clients == 1 else 2
    cmd = [need_tool("pgbench"), "-n", "-M", "prepared", "-T", str(duration_s), "-c", str(clients), "-j", str(jobs)]
    for k, v in (defines or {}).items():
        cmd += ["-D", f"{k}={v}"]
    cmd += ["-f", str(script), db]
    sampler = None
    if sample_cpu:
        sampler = CpuSampler({"pgbench": lambda pid, comm, cmd_: comm == "pgbench", **postgres_groups([db])})
    res, cpu = sampled_run(cmd, duration_s, sampler, env=pg.env())
    if res.returncode != 0:
        raise BenchError(f"pgbench failed ({res.returncode}): {res.stderr.strip()[-800:]}")
    result = parse_pgbench(res.stdout, clients, duration_s, cpu)
    if result.failed:
        raise BenchError(f"pgbench reported {result.failed} failed transactions")
    return result


def need_tool(name: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)), None
    )
    if path is None:
        hint = " (apt-get install -y wrk)" if name == "wrk" else ""
        raise BenchError(f"{name} not found on PATH{hint}")
    return path


# --------------------------------------------------------------------------------------- machine / commit
def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
    try:
        meminfo = Path("/proc/meminfo").read_text()
        kb = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo).group(1))  # type: ignore[union-attr]
        info["memory_gib"] = round(kb / 1024 / 1024, 1)
    except (OSError, AttributeError):
        pass
    try:
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        if cpu:
            info["cpu"] = cpu.group(1).strip()
    except OSError:
        pass
    return info


def git_info() -> dict[str, Any]:
    """Commit and whether the tree has uncommitted changes; read-only (no index refresh)."""

    def git(*args: str) -> str:
        res = subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO, capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------- output
def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def fmt_spread(s: Spread | None, digits: int = 2) -> tuple[str, str]:
    if s is None:
        return "—", "—"
    return fmt(s.median, digits), f"{fmt(s.lo, digits)} – {fmt(s.hi, digits)}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (pastes straight into the README)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def default_json_path(name: str) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return RESULTS_DIR / f"{name}-{stamp}.json"


def json_clean(x: Any) -> Any:
    """The document with every non-finite float as null, so it is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    return x


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_clean(doc), indent=2, default=str) + "\n")
    return path


def add_output_args(p: Any, quick_help: str) -> None:
    """--quick and --json, for the benchmarks that support them."""
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (every ratio, baseline and count) on stdout; the table goes to stderr",
    )


def apply_quick(args: Any, quick: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """With --quick, set every option of `quick` that is still at its default (an option given on the command
    line wins). Returns what was changed."""
    changed = {}
    if getattr(args, "quick", False):
        for k, v in quick.items():
            if getattr(args, k) == defaults.get(k):
                setattr(args, k, v)
                changed[k] = v
    return changed


def emit(args: Any, doc: dict[str, Any], human: str, path: Path, out: Any) -> None:
    """The human table (stdout, or stderr with --json) and, with --json, the document on `out` (stdout)."""
    if getattr(args, "json", False):
        print(human, file=sys.stderr)
        print(f"\nJSON: {path}", file=sys.stderr)
        out.write(json.dumps(json_clean(doc), default=str) + "\n")
        out.flush()
    else:
        print(human)
        print(f"\nJSON: {path}")


def script_round_trips(text: str) -> int:
    """Round trips of one execution of a pgbench script: one per SQL command (ended by ';' outside a string
    literal, or by \\gset / \\aset), a \\startpipeline … \\endpipeline block counting once: pgbench sends a
    command and waits for its result before the next. Commands inside \\if branches all count."""
    n, in_pipe, quoted, pending = 0, False, False, False
    for line in text.splitlines():
        s = line.strip()
        if not quoted and (not s or s.startswith("--")):
            continue
        if not quoted and s.startswith("\\"):
            word = s.split()[0]
            if word in ("\\gset", "\\aset") and pending:
                n, pending = n + (0 if in_pipe else 1), False
            elif word == "\\startpipeline":
                in_pipe = True
            elif word == "\\endpipeline":
                in_pipe, n = False, n + 1
            continue
        for ch in line:
            if ch == "'":
                quoted = not quoted
            elif ch == ";" and not quoted:
                if pending:
                    n += 0 if in_pipe else 1
                pending = False
            elif not ch.isspace() and not quoted:
                pending = True
            elif quoted:
                pending = True
        if not quoted and pending and (s.endswith("\\gset") or s.endswith("\\aset")):
            n, pending = n + (0 if in_pipe else 1), False
    return n


# ---------------------------------------------------------------------------------------------- CPU usage
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _box_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole box since boot, from /proc/stat."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return (total - idle) / _CLK_TCK, total / _CLK_TCK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


Matcher = Callable[[int, str, str], bool]  # (pid, comm, cmdline) -> belongs to the group


class CpuSampler:
    """Cores used over a window by named groups of processes, and by everything else on the box ("other":
    whole-box busy time minus the groups — on a shared machine, other people's work).

    Each group is a predicate over (pid, comm, cmdline); a process counts in the first group that matches. A
    process born inside the window counts from zero (a worker's pool opening PostgreSQL backends mid-run: their
    CPU had gone to "other" before); one that ends inside it is lost, so sample the middle of a run.
    Linux /proc only; a no-op elsewhere."""

    def __init__(self, groups: dict[str, Matcher]) -> None:
        self._groups = groups
        self._start: dict[str, dict[int, float]] = {}
        #: every process alive at the start, matched or not: one absent here was born inside the window
        self._alive0: set[int] = set()
        self._box0 = (0.0, 0.0)
        self._t0 = 0.0

    def _snapshot(self) -> dict[str, dict[int, float]]:
        snap: dict[str, dict[int, float]] = {name: {} for name in self._groups}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            pid = int(d.name)
            comm, cmd = _comm(pid), None
            for name, match in self._groups.items():
                if cmd is None:
                    cmd = _cmdline(pid)
                if match(pid, comm, cmd):
                    cpu = _proc_cpu_s(pid)
                    if cpu is not None:
                        snap[name][pid] = cpu
                    break
        return snap

    def start(self) -> None:
        if not Path("/proc/stat").exists():
            return
        self._alive0 = {int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()}
        self._start = self._snapshot()
        self._box0 = _box_cpu()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        """`<group>_cores` for each group, `other_cores`, `box_busy_fraction` (1.0 = all cores busy), `window_s`."""
        if not self._start:
            return {}
        end, box1 = self._snapshot(), _box_cpu()
        window = time.monotonic() - self._t0
        out: dict[str, float] = {}
        for name, procs in end.items():
            before = self._start.get(name, {})
            used = sum(c - before.get(p, c if p in self._alive0 else 0.0) for p, c in procs.items())
            out[f"{name}_cores"] = round(used / window, 3)
        busy, total = box1[0] - self._box0[0], box1[1] - self._box0[1]
        ncpu = os.cpu_count() or 1
        busy_cores = busy / total * ncpu if total > 0 else math.nan
        out["other_cores"] = round(busy_cores - sum(out.values()), 3)
        out["box_busy_fraction"] = round(busy / total, 3) if total > 0 else math.nan
        out["window_s"] = round(window, 2)
        return out


def postgres_groups(dbs: Sequence[str]) -> dict[str, Matcher]:
    """Backends of the benchmark's databases, and the server's shared processes (WAL writer, checkpointer...).
    Backends of other databases fall into "other"."""
    return {
        "postgres": lambda pid, comm, cmd: comm == "postgres" and any(f" {db} " in cmd for db in dbs),
        "pg_shared": lambda pid, comm, cmd: comm == "postgres" and "(" not in cmd,
    }


def sampled_run(
    cmd: list[str], duration_s: float, sampler: CpuSampler | None, **popen: Any
) -> tuple[subprocess.CompletedProcess[str], dict[str, float]]:
    """Run `cmd` (which runs for `duration_s`), sampling CPU from 1 s after the start to 1 s before the end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    cpu: dict[str, float] = {}
    try:
        if sampler is not None and duration_s >= 4:
            time.sleep(1)
            sampler.start()
            time.sleep(duration_s - 2)
            cpu = sampler.stop()
        out, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), cpu


def box_busy(window_s: float = 2.0) -> float:
    """Fraction of the box's CPU busy over the next `window_s` seconds (NaN without /proc)."""
    if not Path("/proc/stat").exists():
        return math.nan
    b0, t0 = _box_cpu()
    time.sleep(window_s)
    b1, t1 = _box_cpu()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else math.nan


def wait_for_quiet(max_wait_s: float, busy_below: float = 0.25, window_s: float = 2.0) -> dict[str, float]:
    """On a shared machine: wait (at most `max_wait_s`) until the box is less than `busy_below` busy.
    Returns the last busy fraction seen and the seconds waited."""
    start = time.monotonic()
    busy = box_busy(window_s)
    while busy >= busy_below and time.monotonic() - start < max_wait_s:
        busy = box_busy(window_s)
    return {"busy_fraction": round(busy, 3), "waited_s": round(time.monotonic() - start, 1)}


def redis_cleanup(redis_url: str, prefix: str) -> int:
    """Delete every key under a benchmark's private prefix; returns how many went."""
    import redis

    r = redis.Redis.from_url(redis_url)
    n = 0
    try:
        batch = []
        for key in r.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                n += r.delete(*batch)
                batch = []
        if batch:
            n += r.delete(*batch)
    finally:
        r.close()
    return n


def add_infra_args(p: Any) -> None:
    """The options every benchmark that starts the system shares: the shared-box wait and where PostgreSQL and
    Redis are."""
    p.add_argument(
        "--wait-quiet",
        type=int,
        default=0,
        metavar="S",
        help="before each repetition, wait up to S seconds for the box to be < 25 %% busy (shared box)",
    )
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    p.add_argument("--pg-admin-db", default="postgres", help="database to connect to for CREATE/DROP DATABASE")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the benchmark databases at the end")
