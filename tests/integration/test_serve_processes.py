"""`aivedio serve --queues` and `--processes`: worker processes that consume only their queues, supervised by
one command (several processes because one process's worker threads share a GIL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dramatiq.brokers.stub import StubBroker
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.services import intake
from aivedio_engine.worker import processes, runtime
from tests.chaos.support import (
    effects_per_task,
    inbox_count,
    insert_queued_events,
    insert_tasks,
    insert_tenant,
    install_effect_counter,
    wait_until,
)
from tests.support.redis import REDIS_URL, private_prefix


def test_parse_queues_names_the_valid_ones() -> None:
    assert runtime.parse_queues(None) is None and runtime.parse_queues("") is None
    assert runtime.parse_queues(" state, fetch ") == {"state", "fetch"}
    with pytest.raises(ValueError, match=r"unknown queue bogus \(known: dispatch, provider_io, state"):
        runtime.parse_queues("state,bogus")


def test_a_worker_given_queues_consumes_only_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}))
    monkeypatch.setattr(runtime, "setup_broker", lambda settings, c: StubBroker())
    rt = runtime.Runtime(ctx, {"worker"}, threading.Event(), queues={"state"})
    rt.start()
    try:
        assert rt.worker is not None
        assert set(rt.worker.consumers) == {"state", "state.DQ"}
    finally:
        rt.shutdown()
        ctx.close()


def test_processes_need_a_distributed_broker() -> None:
    result = CliRunner().invoke(app, ["serve", "--role", "worker", "--processes", "2"])
    assert result.exit_code == 2 and "--processes needs the worker role and a distributed broker" in result.output
    bad = CliRunner().invoke(app, ["serve", "--role", "worker", "--queues", "nope"])
    assert bad.exit_code == 2 and "unknown queue nope" in bad.output


def test_child_argv_forwards_the_configuration() -> None:
    argv = processes.child_argv("/etc/aivedio.toml", ["database.url=x", "broker.kind=redis"], "state")
    assert argv[1:] == [
        "-m",
        "aivedio_cli",
        "--config",
        "/etc/aivedio.toml",
        "--set",
        "database.url=x",
        "--set",
        "broker.kind=redis",
        "serve",
        "--role",
        "worker",
        "--queues",
        "state",
    ]


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    yield from private_prefix("procs")


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.mark.postgres
def test_three_worker_processes_share_the_queue_and_stop_together(
    pg_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    n = 300
    engine = make_engine(load_settings(overrides={"database": {"url": pg_url}}))
    migrate.upgrade(engine)
    with engine.begin() as conn:
        install_effect_counter(conn)
        tenant = insert_tenant(conn)
        tasks = insert_tasks(conn, tenant, n)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    log = tmp_path / "serve.log"
    argv = [
        sys.executable,
        "-m",
        "aivedio_cli",
        "--set",
        f"database.url={pg_url}",
        "--set",
        "mode=distributed",
        "--set",
        "broker.kind=redis",
        "--set",
        f"broker.url={REDIS_URL}",
        "--set",
        f"redis.key_prefix={redis_prefix}",
        "--set",
        "broker.worker_threads=2",
        "serve",
        "--role",
        "relay,worker",
        "--processes",
        "3",
        "--queues",
        "dispatch",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        kids = wait_until(lambda: len(_children(proc.pid)) == 2 and _children(proc.pid), 60, "two worker children")
        wait_until(
            lambda: log.read_text().count("running roles: worker") == 2 or proc.poll() is not None,
            60,
            "both children running the worker role",
        )
        with engine.begin() as conn:  # the work arrives once all three processes consume the queue
            insert_queued_events(conn, tenant, tasks)
        wait_until(
            lambda: inbox_count(engine, intake.CONSUMER_GROUP) == n or proc.poll() is not None,
            120,
            "every event consumed",
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        victim = min(kids)
        os.kill(victim, signal.SIGKILL)  # a worker process dies: the command starts another
        kids = wait_until(
            lambda: (now := _children(proc.pid)) and len(now) == 2 and victim not in now and now,
            30,
            "a replacement worker process",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not any(Path(f"/proc/{k}").exists() for k in kids)  # no child outlived the command
    assert set(effects_per_task(engine).values()) == {1}
    engine.dispose()
