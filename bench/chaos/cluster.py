"""The system under chaos: a private PostgreSQL database, Redis key prefix and RabbitMQ vhost, the sim vendor,
and each engine role (api, relay, two workers, scheduler, sweeper) as an OS process of its own.

Everything a run creates is removed by `Cluster.close()`, also when the run fails: the database is dropped, the
prefix's keys deleted and the vhost (with its queues) deleted, so the shared services stay as they were found.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from aivedio_engine.providers.webhooks import new_secret

SECRET = new_secret(b"chaos-run-secret-0123456789abcdef")
PG_ADMIN = os.environ.get("AIVEDIO_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("AIVEDIO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: the roles, one process each; two workers so a killed worker's messages have a live consumer
ROLES = {
    "api": "api",
    "relay": "relay",
    "worker-1": "worker",
    "worker-2": "worker",
    "scheduler": "scheduler",
    "sweeper": "sweeper",
}
#: the sim's faults: every kind its README lists that a vendor can do to us (seeded, see --seed)
SIM_FAULTS = (
    "ambiguous=0.08,reset=0.04,5xx=0.05,429=0.04,throttled=0.1,fail=0.05,dup_cb=0.25,reorder_cb=0.2,"
    "drop_cb=0.1,early_cb=0.1,redirect=0.1,cancel_too_late=0.3,latency=2ms..30ms"
)
#: failpoints armed in every worker: the object store answers with an error (a 503) or writes slowly
WORKER_FAILPOINTS = "storage.put=raise%0.06;storage.put_slow=sleep:0.4%0.1"
#: the relay dies between enqueueing a batch and committing it now and then: the broker carries duplicates
RELAY_FAILPOINTS = "relay.before_commit=raise%0.03"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _admin_url(db: str) -> str:
    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{db}"


@dataclass
class Proc:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(30)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:] if self.log.exists() else []
        code = None if self.popen is None else self.popen.poll()
        return f"--- {self.name} (exit {code}) ---\n" + "\n".join(text)


@dataclass
class Cluster:
    workdir: Path
    seed: int
    db: str = field(default_factory=lambda: f"aivedio_chaos_{uuid.uuid4().hex[:10]}")
    prefix: str = field(default_factory=lambda: f"aivedio-chaos-{uuid.uuid4().hex[:10]}:")
    api_port: int = field(default_factory=free_port)
    sim_port: int = field(default_factory=free_port)
    amqp_url: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    sim: Proc | None = None
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def db_url(self) -> str:
        return _admin_url(self.db).replace("postgresql://", "postgresql+psycopg://", 1)

    @property
    def dsn(self) -> str:
        return _admin_url(self.db)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def config(self) -> Path:
        return self.workdir / "aivedio.toml"

    # --- set-up and tear-down ------------------------------------------------------------------------------
    def open(self) -> None:
        from aivedio_engine.testing.rabbitmq import private_vhost

        self.workdir.mkdir(parents=True, exist_ok=True)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db}"')  # type: ignore[arg-type]
        self._stack.callback(self._drop_db)
        self._stack.callback(self._drop_redis_keys)
        self.amqp_url = self._stack.enter_context(private_vhost("chaos"))
        self.config.write_text(config_text(self))
        done = subprocess.run([*self.cli(), "db", "upgrade"], env=self._env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"aivedio db upgrade failed: {done.stderr[-2000:]}")

    def close(self) -> None:
        for proc in [*self.procs.values(), *([self.sim] if self.sim else [])]:
            proc.stop()
        self._stack.close()

    def _drop_db(self) -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')  # type: ignore[arg-type]

    def _drop_redis_keys(self) -> None:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            for key in client.scan_iter(match=f"{self.prefix}*", count=1000):
                client.delete(key)
        finally:
            client.close()

    # --- processes -----------------------------------------------------------------------------------------
    def cli(self) -> list[str]:
        return [sys.executable, "-m", "aivedio_cli", "--config", str(self.config)]

    def _env(self, failpoints: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        env.update(PYTHONUNBUFFERED="1", AIVEDIO_FAILPOINTS=failpoints, AIVEDIO_FAILPOINTS_SEED=str(self.seed))
        env["AIVEDIO_FAILPOINTS_LOG"] = str(self.workdir / "failpoints.log")
        return env

    def start_sim(self, faults: str = SIM_FAULTS, job_seconds: float = 1.0) -> None:
        args = [*self.cli()[:3], "sim-provider", "--port", str(self.sim_port), "--seed", str(self.seed)]
        args += ["--faults", faults, "--job-seconds", f"{job_seconds}s", "--webhook-secret", SECRET]
        self.sim = Proc("sim", args, self._env(), self.workdir / "sim.log")
        self.sim.start()

    def start_roles(self) -> None:
        for name, role in ROLES.items():
            armed = WORKER_FAILPOINTS if role == "worker" else RELAY_FAILPOINTS if role == "relay" else ""
            proc = Proc(name, [*self.cli(), "serve", "--role", role], self._env(armed), self.workdir / f"{name}.log")
            self.procs[name] = proc
            proc.start()

    def restart(self, name: str) -> None:
        """SIGKILL a role mid-flight and start it again (what a supervisor does)."""
        proc = self.procs[name]
        proc.kill()
        proc.start()

    def revive(self) -> list[str]:
        """Start any role process that died on its own (a failpoint raise can end a relay); names returned."""
        dead = [name for name, p in self.procs.items() if not p.alive()]
        for name in dead:
            self.procs[name].start()
        return dead

    def tails(self) -> str:
        return "\n".join(p.tail() for p in [*self.procs.values(), *([self.sim] if self.sim else [])])

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until the API answers /readyz: 180 s, since six processes start at once and a loaded 2-core machine
        once took longer than 60 s to bring the API up (the run then failed before any fault was injected)."""
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.api_url}/readyz", timeout=1) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"API not ready within {timeout_s}s\n{self.tails()}")


def config_text(c: Cluster) -> str:
    """The chaos configuration: distributed, and every recovery schedule compressed from minutes to seconds, so
    a run quiesces within minutes of its last fault."""
    return f"""
mode = "distributed"
data_dir = "{c.workdir / "data"}"
default_provider = "sim"
[database]
url = "{c.db_url}"
pool_size = 4
[broker]
kind = "rabbitmq"
url = "{c.amqp_url}"
worker_threads = 4
[redis]
url = "{REDIS_URL}"
key_prefix = "{c.prefix}"
[api]
port = {c.api_port}
public_base_url = "{c.api_url}"
tenant_rate_limit_per_s = 1000
tenant_rate_burst = 1000
[limits]
platform_max_concurrency = 64
tenant_default_max_concurrency = 16
slot_lease_ttl_s = 15
[polling]
min_interval_s = 1
max_interval_s = 3
[sweeper]
interval_s = 1
idle_grace_s = 40
observation_stuck_s = 5
fetch_stuck_s = 15
media_stuck_s = 15
[reconcile]
lookup_after_s = [1, 3, 8]
park_after_s = 90
visibility_lag_s = 5
[retry.submit]
send_deadline_s = 2
max_attempts = 4
max_total_wait_s = 60
deadline_s = 120
base_delay_s = 1
multiplier = 2
max_delay_s = 4
[retry.query]
base_delay_s = 1
max_delay_s = 3
[retry.output_fetch]
max_attempts = 6
max_total_wait_s = 60
deadline_s = 120
base_delay_s = 1
multiplier = 2
max_delay_s = 4
[retry.media]
max_attempts = 4
max_total_wait_s = 60
deadline_s = 120
base_delay_s = 1
multiplier = 2
max_delay_s = 4
[liveness]
heartbeat_interval_s = 1
stale_after_s = 6
[providers.local]
enabled = false
[providers.sim]
adapter = "sim"
base_url = "{c.sim_url}"
allow_http_origin = true
output_hosts = ["127.0.0.1"]
max_concurrency = 32
webhook_secrets = ["{SECRET}"]
[providers.sim.models.sim-v1]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = {{ "720p" = "1" }}
"""
