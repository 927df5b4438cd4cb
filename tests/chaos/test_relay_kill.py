"""A relay SIGKILLed mid-batch loses nothing and doubles no effect (PostgreSQL + RabbitMQ or Redis, real processes).

Two `aivedio serve --role relay` and two `--role worker` processes share 5,000 `generation.queued` events. Relay A
claims rows next to relay B's locked batch, then kills itself (failpoint `relay.after_enqueue=kill@137`) after
enqueueing 137 messages of its batch but before committing them as PUBLISHED, so relay B publishes those rows
again: the broker really carries duplicates.

Counting is done outside the code under test: enqueues and duplicate deliveries through the failpoint hit log
(one O_APPEND line per hit, written before a kill), task updates through a database trigger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import generation_tasks, inbox_dedup
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services import intake
from tests.chaos.support import (
    count,
    effects_per_task,
    inbox_count,
    insert_queued_events,
    insert_tasks,
    insert_tenant,
    install_effect_counter,
    outbox_statuses,
    wait_until,
)
from tests.support.rabbitmq import private_amqp_url
from tests.support.redis import REDIS_URL, private_prefix

#: the whole run is bounded; on timeout the fixtures still kill every subprocess and clean Redis
pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

N = 5_000
KILL_AT = 137


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} (exit {self.popen.poll()}) ---\n" + "\n".join(text)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    yield from private_prefix("chaos")


@pytest.fixture(params=["rabbitmq", "redis"])
def broker_url(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[tuple[str, str]]:
    """Both distributed brokers carry the duplicates: RabbitMQ (push, a private vhost) and Redis (the prefix)."""
    if request.param == "redis":
        yield "redis", REDIS_URL
    else:
        yield from (("rabbitmq", url) for url in private_amqp_url("chaos"))


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait(10)


def test_killed_relay_mid_batch_loses_nothing_and_doubles_no_effect(
    pg_url: str, redis_prefix: str, broker_url: tuple[str, str], procs: list[Proc], tmp_path: Path
) -> None:
    # Given 5,000 QUEUED tasks with one pending generation.queued event each, and a trigger counting task updates
    engine = make_engine(load_settings(overrides={"database": {"url": pg_url}}))
    migrate.upgrade(engine)
    with engine.begin() as conn:
        install_effect_counter(conn)
        tenant = insert_tenant(conn)
        tasks = insert_tasks(conn, tenant, N)
        insert_queued_events(conn, tenant, tasks)

    hits_log = tmp_path / "failpoint-hits.log"
    cli = [
        sys.executable,
        "-m",
        "aivedio_cli",
        "--set",
        f"database.url={pg_url}",
        "--set",
        "mode=distributed",
        "--set",
        f"broker.kind={broker_url[0]}",
        "--set",
        f"broker.url={broker_url[1]}",
        "--set",
        f"redis.key_prefix={redis_prefix}",
        "--set",
        "broker.worker_threads=4",
        "serve",
        "--role",
    ]

    def start(name: str, role: str, failpoints: str) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        env.update(AIVEDIO_FAILPOINTS=failpoints, AIVEDIO_FAILPOINTS_LOG=str(hits_log), PYTHONUNBUFFERED="1")
        proc = Proc(name, [*cli, role], env, tmp_path)
        procs.append(proc)
        return proc

    def hits() -> Counter[tuple[int, str]]:
        lines = hits_log.read_text().splitlines() if hits_log.exists() else []
        return Counter((int(pid), name) for pid, name, _ in (line.split() for line in lines))

    # When relay A dies after enqueueing part of a claimed batch, while relay B and two workers run.
    # B holds each claimed batch for 0.4 s (≈ 10 s for all rows), and A starts once B is publishing, so A
    # always finds rows to claim next to B's locked ones, whatever the start-up time of a process under load.
    def total(name: str) -> int:
        return sum(v for (_, hit), v in hits().items() if hit == name)

    started = time.monotonic()
    workers = [start(f"worker-{i}", "worker", "consume.duplicate=count") for i in (1, 2)]
    relay_b = start("relay-b", "relay", "relay.after_claim=sleep:0.4;relay.after_enqueue=count")
    try:
        wait_until(lambda: hits()[(relay_b.popen.pid, "relay.after_enqueue")] > 0, 60, "relay B to publish", 0.1)
        relay_a = start("relay-a", "relay", f"relay.after_enqueue=kill@{KILL_AT}")
        wait_until(lambda: relay_a.popen.poll() is not None, 60, "relay A to kill itself", 0.1)
        wait_until(lambda: inbox_count(engine, intake.CONSUMER_GROUP) == N, 90, f"{N} inbox rows", 0.1)
        wait_until(lambda: outbox_statuses(engine) == {OutboxStatus.PUBLISHED.value: N}, 30, "every row PUBLISHED")
        # every extra message must be delivered and recognised as a duplicate before we look at the effects
        wait_until(
            lambda: total("consume.duplicate") == total("relay.after_enqueue") - N,
            60,
            "each extra message to be deduplicated",
            0.1,
        )
        elapsed = time.monotonic() - started
    except AssertionError:
        print("\n".join(p.tail() for p in procs))
        raise

    # Then relay A really died mid-batch, after enqueueing, and relay B republished what A had not committed
    assert relay_a.popen.returncode == -signal.SIGKILL, relay_a.tail()
    assert hits()[(relay_a.popen.pid, "relay.after_enqueue")] == KILL_AT
    extra = total("relay.after_enqueue") - N
    assert extra > 0, "the broker never carried a duplicate: the test proved nothing"
    # each task was updated exactly once, and each event has exactly one inbox row
    effects = effects_per_task(engine)
    assert len(effects) == N and set(effects.values()) == {1}
    assert count(engine, generation_tasks, generation_tasks.c.next_action_at.is_(None)) == 0
    assert count(engine, inbox_dedup, inbox_dedup.c.result_digest == "ready") == N

    # And the survivors shut down cleanly on SIGTERM
    for p in (relay_b, *workers):
        p.popen.send_signal(signal.SIGTERM)
    for p in (relay_b, *workers):
        try:
            assert p.popen.wait(20) == 0, p.tail()
        except subprocess.TimeoutExpired:
            pytest.fail(f"{p.name} did not stop within 20 s of SIGTERM\n{p.tail()}")

    print(
        f"\nchaos: {N} events, relay A killed after {KILL_AT} enqueues, {extra} duplicate messages delivered "
        f"and deduplicated, all consumed {elapsed:.1f}s after the first process started"
    )
    engine.dispose()
