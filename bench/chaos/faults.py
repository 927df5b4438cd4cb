"""The fault injector: at seeded random moments, one infrastructure fault at a time.

Kinds injected from outside the processes (the sim injects the vendor's own faults, and failpoints in the
workers and relay inject storage errors and duplicate deliveries):

- `kill:<role>`: SIGKILL of one role process, which is started again at once (a supervisor's restart);
- `redis_flush`: every key under the run's prefix deleted (slots, rate limits, pub/sub state): FLUSHALL
  limited to what this run owns, since the Redis server is shared;
- `broker_kill`: every connection to the run's RabbitMQ vhost closed by the server (a broker restart as
  clients see it: sockets drop, unacked messages are redelivered);
- `pg_terminate`: `pg_terminate_backend` on every connection to the run's database.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from urllib.parse import unquote, urlsplit

import psycopg

from bench.chaos.cluster import PG_ADMIN, ROLES, Cluster

KINDS = ("kill", "redis_flush", "broker_kill", "pg_terminate")
#: relative weights: process kills are the richest fault (every role, every step), so the most frequent
WEIGHTS = (6, 1, 1, 2)


class Injector:
    def __init__(self, cluster: Cluster, seed: int, mean_gap_s: float) -> None:
        self.cluster = cluster
        self.rng = random.Random(f"chaos-faults:{seed}")
        self.mean_gap_s = mean_gap_s
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.last_fault_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-injector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        # the first round injects every kind and kills every role once, in a seeded order; then at random
        first = [f"kill:{r}" for r in sorted(ROLES)] + [k for k in KINDS if k != "kill"]
        self.rng.shuffle(first)
        while not self._stop.wait(self.rng.uniform(0.5, 1.5) * self.mean_gap_s):
            kind = first.pop(0) if first else self.rng.choices(KINDS, WEIGHTS)[0]
            try:
                name = self.inject(kind)
            except Exception as exc:  # noqa: BLE001 - an injector failure is reported, not fatal to the run
                self.errors.append(f"{kind}: {exc}")
                continue
            self.counts[name] += 1
            self.last_fault_at = time.monotonic()

    def inject(self, kind: str) -> str:
        if kind.startswith("kill"):
            role = kind.partition(":")[2] or self.rng.choice(sorted(ROLES))
            self.cluster.restart(role)
            return f"kill:{role}"
        if kind == "redis_flush":
            self.cluster._drop_redis_keys()
            return kind
        if kind == "broker_kill":
            vhost = unquote(urlsplit(self.cluster.amqp_url).path.lstrip("/"))
            exe = shutil.which("rabbitmqctl")
            if exe is None:
                raise RuntimeError("rabbitmqctl not found")
            done = subprocess.run(
                [exe, "-q", "close_all_connections", "-p", vhost, "chaos: broker restart"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip()[:300])
            return kind
        if kind == "pg_terminate":
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                    "pg_backend_pid()",
                    (self.cluster.db,),
                )
            return kind
        raise ValueError(f"unknown fault kind {kind!r}")
