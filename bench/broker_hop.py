"""broker_hop: how long a message waits between `enqueue` and the start of its actor, at idle, per broker kind,
and how much broker traffic an idle worker process makes.

Issue: the Redis broker's idle consumer polls with back-off up to `worker_timeout` (100 ms), so every hop of a
task waited 46 ms at p50. RabbitMQ pushes deliveries to a consumer blocked on its socket. This runs the product's
own broker factory (`worker.broker.setup_broker`) and a Dramatiq worker with the product's thread count and
timeout, enqueues one message at a time at idle (each after the previous one ran, with a random pause), and
records the actor's start − the enqueue time. Idle traffic: Redis `INFO commandstats` calls, RabbitMQ frames
received by the server on the worker's connections (`rabbitmqctl list_connections recv_cnt`), over an idle window.
No baseline applies (a hop is not a database operation): the figures are absolute, p50/p90/p99 over N samples.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench import common

DESCRIPTION = "enqueue → actor latency at idle and idle broker traffic, per broker kind (redis, rabbitmq)"


def add_arguments(p: Any) -> None:
    p.add_argument("--kinds", default="rabbitmq,redis", help="broker kinds to measure (default %(default)s)")
    p.add_argument("--samples", type=int, default=300, help="messages per kind (default %(default)s)")
    p.add_argument("--idle-window", type=float, default=10.0, help="seconds of idle traffic counted (default 10)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    common.add_output_args(p, "60 samples and a 5 s idle window per kind (< 1 min)")


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _redis_calls(url: str) -> int:
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def _rabbit_frames(vhost: str) -> int:
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "vhost", "recv_cnt"], capture_output=True, text=True, check=True
    ).stdout
    total = 0
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[0] == vhost and parts[1].isdigit():
            total += int(parts[1])
    return total


def _measure(kind: str, url: str, samples: int, idle_window: float, prefix: str, redis_url: str) -> dict[str, Any]:
    import dramatiq

    from aivedio_engine.config import load_settings
    from aivedio_engine.worker.broker import setup_broker

    settings = load_settings(
        overrides={"broker": {"kind": kind, "url": url}, "redis": {"url": redis_url, "key_prefix": prefix}}
    )
    broker = setup_broker(settings, ctx=None)
    lat: list[float] = []
    ran = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="hop", max_retries=0, actor_name="bench_hop")
    def hop(sent_ns: int) -> None:
        lat.append((time.time_ns() - sent_ns) / 1e6)
        ran.set()

    worker = dramatiq.Worker(
        broker, worker_threads=settings.broker.worker_threads, worker_timeout=settings.broker.consumer_idle_timeout_ms
    )
    worker.start()
    try:
        hop.send(time.time_ns())  # warm-up: connections, queue declarations
        if not ran.wait(30):
            raise common.BenchError(f"{kind}: the warm-up message never ran")
        lat.clear()
        rng = random.Random(7)
        for _ in range(samples):
            ran.clear()
            time.sleep(rng.uniform(0.02, 0.08))  # idle: the consumer has gone back to waiting
            hop.send(time.time_ns())
            if not ran.wait(10):
                raise common.BenchError(f"{kind}: a message did not run within 10 s")
        time.sleep(0.5)
        if kind == "redis":
            before = _redis_calls(redis_url)
            time.sleep(idle_window)
            idle = (_redis_calls(redis_url) - before) / idle_window
            unit = "redis commands/s (whole server)"
        else:
            vhost = url.rsplit("/", 1)[1]
            from urllib.parse import unquote

            before = _rabbit_frames(unquote(vhost))
            time.sleep(idle_window)
            idle = (_rabbit_frames(unquote(vhost)) - before) / idle_window
            unit = "AMQP frames/s received from this process"
    finally:
        worker.stop()
        broker.close()
    return {
        "kind": kind,
        "samples": len(lat),
        "p50_ms": statistics.median(lat),
        "p90_ms": _percentile(lat, 0.9),
        "p99_ms": _percentile(lat, 0.99),
        "max_ms": max(lat),
        "idle_traffic_per_s": idle,
        "idle_traffic_unit": unit,
        "worker_threads": settings.broker.worker_threads,
        "consumer_idle_timeout_ms": settings.broker.consumer_idle_timeout_ms,
    }


def run(args: Any) -> int:
    import uuid

    from aivedio_engine.testing.rabbitmq import private_vhost

    changed = common.apply_quick(args, {"samples": 60, "idle_window": 5.0}, {"samples": 300, "idle_window": 10.0})
    results = []
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        prefix = f"bench-hop-{uuid.uuid4().hex[:8]}:"
        if kind == "rabbitmq":
            with private_vhost("bench-hop") as url:
                results.append(_measure(kind, url, args.samples, args.idle_window, prefix, args.redis_url))
        elif kind == "redis":
            try:
                results.append(_measure(kind, args.redis_url, args.samples, args.idle_window, prefix, args.redis_url))
            finally:
                common.redis_cleanup(args.redis_url, prefix)
        else:
            raise common.BenchError(f"unknown broker kind {kind!r} (known: rabbitmq, redis)")
    doc = {
        "benchmark": "broker_hop",
        "date": common.utc_now(),
        "machine": common.machine_info(),
        "git": common.git_info(),
        "config": {"samples": args.samples, "idle_window_s": args.idle_window, "quick_changed": changed},
        "results": results,
    }
    human = common.table(
        ["broker", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms", "idle traffic/s", "unit"],
        [
            [
                r["kind"],
                r["samples"],
                common.fmt(r["p50_ms"]),
                common.fmt(r["p90_ms"]),
                common.fmt(r["p99_ms"]),
                common.fmt(r["max_ms"]),
                common.fmt(r["idle_traffic_per_s"], 1),
                r["idle_traffic_unit"],
            ]
            for r in results
        ],
    )
    path = common.write_json(Path(args.json_out) if args.json_out else common.default_json_path("broker_hop"), doc)
    import sys

    common.emit(args, doc, human, path, sys.stdout)
    return 0
