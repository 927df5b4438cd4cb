"""relay: outbox rows → valid broker messages per second, ÷ the slower of its two parts measured alone in the same
run: pgbench of the relay's own claim-and-mark SQL (one prepared statement per batch of `--batch` rows) and the
broker's own enqueue rate for the same messages (issue 16 item 8; target ≥ 0.30, and ≥ 5× `api_create`).

The product's `Relay` (worker/relay.py) runs against a private PostgreSQL database and the Redis broker under a
private key prefix, with the queue its messages route to declared. Rows are bulk-inserted with SQL (not through the
API): their content is what the relay reads, so the rate does not depend on how they were written. Every published
row is checked: it is PUBLISHED, and the broker holds exactly one message per row (message id = event id).
`bench.backlog` reuses the pieces here.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import common
from bench.common import Postgres

DESCRIPTION = "outbox relay rate ÷ min(pgbench of its claim SQL, the broker's enqueue rate); --quick, --json"
EVENT_TYPE = "generation.queued"

_FILL_SQL = """
INSERT INTO outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
                           status, target, available_at, publish_attempts, tenant_id, trace_id, created_at,
                           published_at)
SELECT gen_random_uuid(), 'generation_task', gen_random_uuid(), 3, '{event}', 1,
       jsonb_build_object('task_id', gen_random_uuid()::text, 'priority', 0),
       '{status}', '{target}', now() - interval '{age}', 0, '{tenant}', 'bench', now() - interval '{age}',
       {published}
FROM generate_series(1, {n})
"""

#: the relay's claim and mark as one statement per batch: what the database must do for `batch` rows at least
_CLAIM_SQL = """WITH c AS (
  SELECT id FROM outbox_events WHERE status = 'PENDING' AND available_at <= now()
  ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED)
UPDATE outbox_events o SET status = 'PUBLISHED', published_at = now() FROM c WHERE o.id = c.id;
"""


def add_arguments(p: Any) -> None:
    p.add_argument("--rows", type=int, default=50_000, help="outbox rows the relay publishes (default %(default)s)")
    p.add_argument("--batch", type=int, default=200, help="rows per relay transaction (the product's default)")
    p.add_argument(
        "--api-create-rate",
        type=float,
        default=286.0,
        help="creates/s of the latest api_create run, for the ≥ 5× check (default: README's c=16 figure)",
    )
    common.add_output_args(p, "10,000 rows, 4 s pgbench (< 1 min)")
    common.add_infra_args(p)


@dataclass
class System:
    """A migrated private database with one tenant, and a Redis broker under a private prefix."""

    pg: Postgres
    db: str
    tenant: uuid.UUID
    redis_url: str
    prefix: str
    workdir: Path

    @property
    def url(self) -> str:
        return self.pg.url(self.db)

    def settings(self) -> Any:
        from bench.reducer import reducer_settings

        return reducer_settings(
            self.url, pool_size=2, worker_threads=1, redis_url=self.redis_url, key_prefix=self.prefix,
            data_dir=str(self.workdir / "data"),
        )  # fmt: skip

    def fill(self, n: int, *, status: str = "PENDING", age: str = "0 seconds", chunk: int = 200_000) -> None:
        from aivedio_engine.domain.events import ROUTES, EventType

        target = ROUTES[EventType(EVENT_TYPE)].actor
        published = "now()" if status == "PUBLISHED" else "NULL"
        for start in range(0, n, chunk):
            sql = _FILL_SQL.format(
                event=EVENT_TYPE, status=status, target=target, age=age, tenant=self.tenant,
                published=published, n=min(chunk, n - start),
            )  # fmt: skip
            self.pg.psql(self.db, sql)

    def pending(self) -> int:
        return int(self.pg.scalar(self.db, "SELECT count(*) FROM outbox_events WHERE status = 'PENDING'"))

    def broker(self) -> Any:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=self.redis_url, namespace=f"{self.prefix}dramatiq", middleware=[])
        broker.declare_queue(self.queue)
        return broker

    @property
    def queue(self) -> str:
        from aivedio_engine.domain.events import ROUTES, EventType

        return str(ROUTES[EventType(EVENT_TYPE)].queue)

    def close(self, keep: bool) -> None:
        common.redis_cleanup(self.redis_url, self.prefix)
        if not keep:
            self.pg.drop_db(self.db)


def make_system(pg: Postgres, name: str, redis_url: str) -> System:
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.db import migrate

    db = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    pg.create_db(db)
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    system = System(pg, db, uuid.uuid4(), redis_url, f"bench-{name}-{uuid.uuid4().hex[:6]}:", workdir)
    ctx = build_context(system.settings())
    try:
        migrate.upgrade(ctx.engine)
        system.tenant = ctx.tenants.create(f"bench-{name}", Decimal(10) ** 9).id
    finally:
        ctx.close()
    return system


def relay_rate(system: System, rows: int, batch: int) -> dict[str, Any]:
    """Publish `rows` due rows with the product's Relay; rows/s over the drain, and the check of what it sent."""
    from aivedio_engine.clock import SystemClock
    from aivedio_engine.db.engine import make_engine
    from aivedio_engine.worker.relay import Relay

    system.fill(rows)
    system.pg.psql(system.db, "VACUUM ANALYZE outbox_events")
    engine = make_engine(system.settings())
    broker = system.broker()
    relay = Relay(engine, broker, SystemClock(), batch_size=batch)
    try:
        t0 = time.monotonic()
        published = 0
        while published < rows:
            done = relay.run_batch()
            if done.claimed == 0:
                break
            published += done.published
        elapsed = time.monotonic() - t0
        in_broker = broker.client.llen(f"{broker.namespace}:{system.queue}")
    finally:
        engine.dispose()
        broker.close()
    return {
        "rows": rows,
        "published": published,
        "left_pending": system.pending(),
        "messages_in_broker": int(in_broker),
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": published / elapsed if elapsed > 0 else float("nan"),
    }


def claim_baseline(system: System, batch: int, duration_s: int) -> dict[str, Any]:
    """pgbench of the claim-and-mark statement alone, on enough PENDING rows that it never runs dry."""
    script = system.workdir / "claim.sql"
    script.write_text(_CLAIM_SQL.format(batch=batch))
    # a generous supply: a fast box claims ~100k rows/s; what is left over is checked below
    supply = max(200_000, 60_000 * duration_s)
    system.fill(supply)
    system.pg.psql(system.db, "VACUUM ANALYZE outbox_events")
    result = common.run_pgbench(system.pg, system.db, script, clients=1, duration_s=duration_s)
    left = system.pending()
    return {
        "tps": result.tps,
        "rows_per_s": result.tps * batch,
        "supply": supply,
        "left_pending": left,
        "ran_dry": left == 0,
    }


def enqueue_baseline(system: System, n: int) -> dict[str, Any]:
    """The broker's own enqueue rate for the relay's kind of message, one at a time as the relay sends them."""
    import dramatiq

    from aivedio_engine.domain.events import ROUTES, EventType

    broker = system.broker()
    route = ROUTES[EventType(EVENT_TYPE)]
    try:
        t0 = time.monotonic()
        for _ in range(n):
            body = {"event_id": str(uuid.uuid4()), "event_type": EVENT_TYPE, "payload": {"priority": 0}}
            broker.enqueue(dramatiq.Message(queue_name=system.queue, actor_name=route.actor, args=(body,), kwargs={},
                                            options={}))  # fmt: skip
        elapsed = time.monotonic() - t0
    finally:
        broker.close()
    return {"messages": n, "elapsed_s": round(elapsed, 3), "messages_per_s": n / elapsed if elapsed else float("nan")}


def run(args: Any) -> int:
    common.apply_quick(args, {"rows": 10_000, "duration": 4}, {"rows": 50_000, "duration": 20})
    pg = Postgres(args.pg_host, args.pg_port, args.pg_user, args.pg_admin_db)
    doc: dict[str, Any] = {"benchmark": "relay", "machine": common.machine_info(), "git": common.git_info(),
                           "started_at": common.utc_now(), "rows": args.rows, "batch": args.batch}  # fmt: skip
    system = make_system(pg, "relay", args.redis_url)
    try:
        doc["relay"] = relay_rate(system, args.rows, args.batch)
        common.redis_cleanup(system.redis_url, system.prefix)
        doc["enqueue"] = enqueue_baseline(system, min(args.rows, 20_000))
        common.redis_cleanup(system.redis_url, system.prefix)
        doc["claim"] = claim_baseline(system, args.batch, args.duration)
    finally:
        system.close(args.keep_dbs)
    r, e, c = doc["relay"], doc["enqueue"], doc["claim"]
    slower = min(e["messages_per_s"], c["rows_per_s"])
    doc["ratio"] = r["rows_per_s"] / slower
    doc["vs_api_create"] = r["rows_per_s"] / args.api_create_rate
    gates = {
        "every row published": r["published"] == r["rows"] and r["left_pending"] == 0,
        "one message per row": r["messages_in_broker"] == r["rows"],
        "claim baseline never ran dry": not c["ran_dry"],
    }
    doc["gates"] = gates
    human = common.table(
        ["figure", "value", "target"],
        [
            ["relay rows/s", common.fmt(r["rows_per_s"], 0), ""],
            ["broker enqueue msgs/s (alone)", common.fmt(e["messages_per_s"], 0), ""],
            ["pgbench claim rows/s (alone)", common.fmt(c["rows_per_s"], 0), ""],
            ["relay ÷ slower part", common.fmt(doc["ratio"]), "≥ 0.30"],
            [f"relay ÷ api_create ({args.api_create_rate:g}/s)", common.fmt(doc["vs_api_create"], 1), "≥ 5"],
            *[[f"gate: {k}", "ok" if v else "FAILED", ""] for k, v in gates.items()],
        ],
    )
    path = Path(args.json_out) if args.json_out else common.default_json_path("relay")
    common.write_json(path, doc)
    import sys

    common.emit(args, doc, human, path, sys.stdout)
    return 0 if all(gates.values()) else 1
