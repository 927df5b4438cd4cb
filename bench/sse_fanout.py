"""SSE fan-out: memory per idle event stream (against.6's 20 KB) and the time one status change
takes to reach every open stream, at 1k and 10k streams on this machine.

For each point the benchmark starts a fresh API process (distributed mode: PostgreSQL, the Redis notifier) and
opens N streams on ONE task with an asyncio client in this process (raw streams, one coroutine per connection;
the fd limit is raised to its hard limit first, and the server inherits it). Memory per stream = the server's
Δ RSS ÷ N (kernel socket buffers are not in it; `sockstat` gives the box's TCP pages beside it). Fan-out: the
task moves (one transition through the executor), then the clock starts and the signal is published on the
notifier's Redis channel, as the notify worker would; the latency of a stream is the time until its client has
read the new event's `id:` line. Every woken stream re-reads the task's history, so this is the product's real
fan-out path: N reads of PostgreSQL, N writes.

Baseline (the machine's floor, measured the same way right before (A) and after (B) the system): a bare asyncio
server that holds the same N connections and writes one frame to each on the same Redis message.

    bench/run sse_fanout                    # 1k and 10k streams, 3 fan-out rounds each
    bench/run sse_fanout --quick --json     # one round per point
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    BenchError,
    Postgres,
    add_infra_args,
    add_output_args,
    apply_quick,
    default_json_path,
    emit,
    git_info,
    machine_info,
    redis_cleanup,
    table,
    utc_now,
    write_json,
)
from bench.sse_servers import SETTINGS_ENV, TRACE_ENV, settings_from

DESCRIPTION = "SSE fan-out: memory per idle stream vs the seed's 20 KB, and one change's fan-out time at 1k/10k streams"
SEED_BYTES = 20 * 1024
QUICK = {"rounds": 1}


# ------------------------------------------------------------------------------------------------- client
@dataclass
class Fanout:
    want: bytes = b""
    t0: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    expected: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def arm(self, version: int, expected: int) -> None:
        self.want, self.expected, self.arrivals, self.done = f"id: {version}\n".encode(), expected, [], asyncio.Event()
        self.t0 = time.perf_counter()

    def seen(self) -> None:
        self.arrivals.append(time.perf_counter() - self.t0)
        if len(self.arrivals) >= self.expected:
            self.done.set()


async def _stream(port: int, path: str, key: str, opened: asyncio.Event, fan: Fanout, first: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: b\r\nauthorization: Bearer {key}\r\n\r\n".encode())
    buf, want, got_first = b"", b"", False
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buf = (buf + data)[-8192:]
            if not got_first and first in buf:
                got_first = True
                opened.set()
            if fan.want and fan.want != want and fan.want in buf:
                want = fan.want
                fan.seen()
    finally:
        writer.close()


async def _measure(port: int, path: str, key: str, n: int, concurrency: int, publish: Any, server_pid: int,
                   rounds: int, next_version: Any, trace_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    fan = Fanout()
    first = b"id: 3\n"
    tasks: list[asyncio.Task[None]] = []
    gate = asyncio.Semaphore(concurrency)

    async def open_one() -> None:
        async with gate:
            opened = asyncio.Event()
            tasks.append(asyncio.create_task(_stream(port, path, key, opened, fan, first)))
            await asyncio.wait_for(opened.wait(), 120)

    # warm-up: imports, the thread pool and the connection pool are the process's, not a stream's
    warm = [asyncio.Event() for _ in range(min(20, n))]
    warmers = [asyncio.create_task(_stream(port, path, key, e, Fanout(), first)) for e in warm]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in warm)), 120)
    for t in warmers:
        t.cancel()
    await asyncio.gather(*warmers, return_exceptions=True)
    rss0 = _rss(server_pid)
    started = time.perf_counter()
    await asyncio.gather(*(open_one() for _ in range(n)))
    open_s = time.perf_counter() - started
    rss1 = _rss(server_pid)
    trace = await _trace(server_pid, trace_path)
    result: dict[str, Any] = {
        "streams": n,
        "open_s": open_s,
        "rss_before_bytes": rss0,
        "rss_open_bytes": rss1,
        "bytes_per_stream": (rss1 - rss0) / n,
        "tcp_mem_pages": _tcp_mem_pages(),
        "top_allocations": trace,
        "rounds": [],
    }
    for _ in range(rounds):
        version = await asyncio.to_thread(next_version)
        fan.arm(version, n)
        await asyncio.to_thread(publish, version)
        await asyncio.wait_for(fan.done.wait(), 600)
        a = sorted(fan.arrivals)
        result["rounds"].append(
            {"p50_s": statistics.median(a), "p99_s": a[min(len(a) - 1, int(0.99 * len(a)))], "all_s": a[-1]}
        )
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return result


async def _trace(pid: int, path: str | None) -> list[dict[str, Any]] | None:
    """The system server's top allocation sites since start-up (with --trace-memory), else None."""
    import signal

    if not path or not Path(path).parent.is_dir():
        return None
    Path(path).unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    for _ in range(600):
        if Path(path).is_file() and Path(path).stat().st_size:
            return list(json.loads(Path(path).read_text()))
        await asyncio.sleep(0.1)
    return None


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def _tcp_mem_pages() -> int | None:
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            parts = line.split()
            return int(parts[parts.index("mem") + 1])
    return None


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class Setup:
    pg: Postgres
    db: str
    prefix: str
    redis_url: str
    overrides: dict[str, Any]
    ctx: Any = None
    task_id: uuid.UUID | None = None
    key: str = ""
    flip: bool = False

    def prepare(self) -> None:
        from decimal import Decimal

        from aivedio_engine.bootstrap import build_context
        from aivedio_engine.db import migrate

        self.pg.create_db(self.db)
        self.ctx = build_context(settings_from(self.overrides))
        migrate.upgrade(self.ctx.engine)
        tenant = self.ctx.tenants.create("bench-sse", Decimal(1000))
        _, self.key = self.ctx.tenants.create_key(tenant.id)
        body = {"prompt": "a red fox running through snow", "model": "local-v1"}
        self.task_id = self.ctx.generations.create(tenant.id, "sse-1", body).task.id

    def next_version(self) -> int:
        """Move the task one step (RETRY_WAIT and back, far from any sweeper), as a worker would."""
        from datetime import timedelta

        from aivedio_engine.db import tasks
        from aivedio_engine.db.session import write_tx
        from aivedio_engine.domain.status import EventSource
        from aivedio_engine.domain.transitions import TaskEvent
        from aivedio_engine.services.transition import Change, decide_and_execute

        self.flip = not self.flip
        event = TaskEvent.RETRYABLE_FAILURE if self.flip else TaskEvent.RETRY_DUE
        now = self.ctx.clock.now()
        columns = {"next_retry_at": now + timedelta(days=1)} if self.flip else {}
        with write_tx(self.ctx.engine) as conn:
            row = tasks.read(conn, self.task_id, lock=True)
            decide_and_execute(conn, row, event, Change(EventSource.WORKER, columns=columns), now)
            return int(tasks.read(conn, self.task_id).version)

    def close(self, keep: bool) -> None:
        if self.ctx is not None:
            self.ctx.close()
        redis_cleanup(self.redis_url, self.prefix)
        if not keep:
            self.pg.drop_db(self.db)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(argv: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    import socket

    proc = subprocess.Popen([sys.executable, "-m", "bench.sse_servers", *argv, "--port", str(port)], env=env, cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server {argv[0]} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise BenchError(f"server {argv[0]} did not listen on {port}")


def _point(setup: Setup, kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    import redis

    channel = f"{setup.prefix}task-status"
    port = _free_port()
    trace_path = str(Path(args.trace_memory).resolve()) if args.trace_memory and kind == "system" else None
    if kind == "system":
        env = {**os.environ, SETTINGS_ENV: json.dumps(setup.overrides)}
        if trace_path:
            env[TRACE_ENV] = trace_path
        proc = _start(["serve-system"], env, port)
        next_version = setup.next_version
    else:
        proc = _start(["serve-baseline", "--channel", channel, "--redis-url", setup.redis_url], dict(os.environ), port)
        counter = iter(range(10**6, 10**7))
        next_version = lambda: next(counter)  # noqa: E731 - no task moves: only the frame's id matters
    client = redis.Redis.from_url(setup.redis_url)
    try:
        path = f"/v1/generations/{setup.task_id}/events"
        result = asyncio.run(
            _measure(
                port,
                path,
                setup.key,
                n,
                args.open_concurrency,
                lambda v: client.publish(channel, f"{setup.task_id} {v}"),
                proc.pid,
                args.rounds,
                next_version,
                trace_path,
            )
        )
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["kind"] = kind
    return result


def _summary(point: dict[str, Any]) -> dict[str, float]:
    rounds = point["rounds"]
    return {
        "kib_per_stream": point["bytes_per_stream"] / 1024,
        "p50_s": statistics.median(r["p50_s"] for r in rounds),
        "p99_s": statistics.median(r["p99_s"] for r in rounds),
        "all_s": statistics.median(r["all_s"] for r in rounds),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", default="1000,10000", help="stream counts, comma separated (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="fan-out rounds per point (default %(default)s)")
    parser.add_argument("--open-concurrency", type=int, default=100, help="connections opened at once (default 100)")
    parser.add_argument(
        "--trace-memory",
        default=None,
        metavar="PATH",
        help="trace the system server's allocations (slower; RSS figures then include tracemalloc's own) and "
        "keep its top allocation sites with N streams open in the JSON (PATH: a scratch file)",
    )
    add_output_args(parser, "one fan-out round per point")
    add_infra_args(parser)


def run(args: argparse.Namespace) -> int:
    defaults = {"rounds": 3}
    changed = apply_quick(args, QUICK, defaults)
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(counts) + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        raise BenchError(f"the hard fd limit is {hard}; {need} are needed for {max(counts)} streams")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(need * 2, hard)), hard))  # the servers inherit it
    tag = uuid.uuid4().hex[:8]
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    overrides: dict[str, Any] = {
        "mode": "distributed",
        "database": {"url": pg.url(f"bench_sse_{tag}"), "pool_size": 20},
        "broker": {"kind": "redis"},
        "redis": {"url": args.redis_url, "key_prefix": f"bench-sse-{tag}:"},
        "api": {
            "sse_max_streams": max(counts) + 1000,
            "sse_max_streams_per_tenant": max(counts) + 1000,
            "sse_heartbeat_s": 3600,  # no re-read but the one each signal causes
            "sse_send_timeout_s": 3600,
        },
    }
    setup = Setup(pg, f"bench_sse_{tag}", f"bench-sse-{tag}:", args.redis_url, overrides)
    doc: dict[str, Any] = {
        "name": "sse_fanout",
        "date": utc_now(),
        "machine": machine_info(),
        "git": git_info(),
        "seed_bytes_per_connection": SEED_BYTES,
        "config": {"streams": counts, "rounds": args.rounds, "quick_changed": changed},
        "points": [],
    }
    path = Path(args.json_out) if args.json_out else default_json_path("sse_fanout")
    try:
        setup.prepare()
        for n in counts:
            a = _point(setup, "baseline", n, args)
            system = _point(setup, "system", n, args)
            b = _point(setup, "baseline", n, args)
            doc["points"].append({"streams": n, "baseline_a": a, "system": system, "baseline_b": b})
    except BenchError as exc:
        doc["error"] = str(exc)
        write_json(path, doc)
        raise
    finally:
        setup.close(args.keep_dbs)
    rows = []
    for p in doc["points"]:
        s, a, b = _summary(p["system"]), _summary(p["baseline_a"]), _summary(p["baseline_b"])
        p["summary"] = {"system": s, "baseline_a": a, "baseline_b": b}
        for label, x in (("bare asyncio (A)", a), ("aivedio", s), ("bare asyncio (B)", b)):
            vs_seed = x["kib_per_stream"] * 1024 / SEED_BYTES
            rows.append(
                [
                    f"{p['streams']:,}",
                    label,
                    f"{x['kib_per_stream']:.1f} KiB ({vs_seed:.2f}× 20 KB)",
                    f"{x['p50_s'] * 1000:.0f} ms",
                    f"{x['p99_s'] * 1000:.0f} ms",
                    f"{x['all_s'] * 1000:.0f} ms",
                ]
            )
    human = table(["streams", "server", "RSS per idle stream", "fan-out p50", "p99", "all reached"], rows)
    write_json(path, doc)
    emit(args, doc, human, path, sys.stdout)
    return 0
