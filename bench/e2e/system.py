"""The distributed deployment under test, started fresh for the run and stopped by its own pids: moto S3, the sim
provider and one `aivedio serve` process per role group (api; scheduler + sweeper; relay; worker), so the CPU of
each group is its own. The worker runs under `bench.e2e.probe`, which records every message's enqueue and actor
start times for the hop figures."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from bench.common import BenchError
from bench.e2e.model import INITIAL_CREDITS


# ------------------------------------------------------------------------------------------- processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}


class Proc:
    """A child process of the benchmark with its log file; stopped by its own pid only."""

    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=common.REPO, env=_clean_env(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 40) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def _wait_http(url: str, proc: Proc, timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc.check()
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                if r.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"{what or url} not ready after {timeout_s:.0f} s:\n{proc.tail()}")


@dataclass
class System:
    """Everything started for the run; `stop()` ends exactly what was started."""

    workdir: Path
    db: str
    db_url: str
    redis_url: str
    key_prefix: str
    job_seconds: float
    worker_threads: int
    pool_size: int
    broker_kind: str = "rabbitmq"
    broker_url: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    api_port: int = 0
    api_url: str = ""
    sim_url: str = ""
    s3_url: str = ""
    bucket: str = "aivedio-bench"
    tenant_id: Any = None
    api_key: str = ""
    config_path: Path | None = None

    @property
    def hops_path(self) -> Path:
        return self.workdir / "hops.tsv"

    def start(self) -> None:
        secret = self._start_sim_and_moto()
        self.api_port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.config_path = self.workdir / "aivedio.toml"
        self.config_path.write_text(self._config(secret) + self._extra_config())
        self._prepare_db()
        cli = [sys.executable, "-m", "aivedio_cli", "--config", str(self.config_path), "serve", "--role"]
        # one process per role group: the CPU of each is its own (the runtime allows any split in distributed mode)
        self.procs["api"] = Proc("aivedio serve api", [*cli, "api"], self.workdir / "api.log")
        self.procs["scheduler"] = Proc(
            "aivedio serve scheduler,sweeper", [*cli, "scheduler,sweeper"], self.workdir / "scheduler.log"
        )
        self.procs["relay"] = Proc("aivedio serve relay", [*cli, "relay"], self.workdir / "relay.log")
        label, worker = self._worker(cli)
        self.procs["worker"] = Proc(label, worker, self.workdir / "worker.log")
        _wait_http(self.api_url + "/readyz", self.procs["api"], what="the API")
        time.sleep(1.5)  # the worker declares its queues and the relay starts listening
        self.check()

    def _worker(self, cli: list[str]) -> tuple[str, list[str]]:
        """The worker process: `aivedio serve worker` wrapped in the hop probe (a subclass may wrap it otherwise)."""
        probe = [sys.executable, "-m", "bench.e2e.probe", str(self.hops_path), *cli[3:], "worker"]
        return "aivedio serve worker (hop probe)", probe

    def _extra_config(self) -> str:
        """TOML tables appended to the configuration (none here)."""
        return ""

    def _start_sim_and_moto(self) -> str:
        from aivedio_engine.providers.webhooks import new_secret

        secret = new_secret(secrets.token_bytes(32))
        s3_port, sim_port = _free_port(), _free_port()
        moto = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        if not Path(moto).exists():
            raise BenchError("moto_server not found (pip install 'moto[server]')")
        self.procs["moto"] = Proc(
            "moto_server", [moto, "-H", "127.0.0.1", "-p", str(s3_port)], self.workdir / "moto.log"
        )
        self.procs["sim"] = Proc(
            "aivedio sim-provider",
            [
                sys.executable,
                "-m",
                "aivedio_cli",
                "sim-provider",
                "--port",
                str(sim_port),
                "--job-seconds",
                f"{self.job_seconds:g}",
                "--webhook-secret",
                secret,
                "--seed",
                "1",
            ],
            self.workdir / "sim.log",
        )
        self.s3_url, self.sim_url = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{sim_port}"
        _wait_http(self.s3_url + "/", self.procs["moto"], what="moto_server")
        _wait_http(self.sim_url + "/_sim/truth", self.procs["sim"], what="the sim provider")
        self.s3_client().create_bucket(Bucket=self.bucket)
        return secret

    def s3_client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.s3_url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )

    def _config(self, secret: str) -> str:
        return f"""
mode = "distributed"
data_dir = "{self.workdir / "data"}"
default_provider = "sim"
[database]
url = "{self.db_url}"
pool_size = {self.pool_size}
[broker]
kind = "{self.broker_kind}"
url = "{self.broker_url or self.redis_url}"
worker_threads = {self.worker_threads}
consumer_idle_timeout_ms = 100
[redis]
url = "{self.redis_url}"
key_prefix = "{self.key_prefix}"
[storage]
kind = "s3"
bucket = "{self.bucket}"
endpoint_url = "{self.s3_url}"
region = "us-east-1"
access_key_id = "bench"
secret_access_key = "bench"
[api]
host = "127.0.0.1"
port = {self.api_port}
public_base_url = "{self.api_url}"
tenant_rate_limit_per_s = 1e9
tenant_rate_burst = 1000000000
[limits]
platform_max_concurrency = 1024
tenant_default_max_concurrency = 1024
[providers.local]
enabled = false
[providers.sim]
adapter = "sim"
base_url = "{self.sim_url}"
allow_http_origin = true
output_hosts = ["127.0.0.1"]
max_concurrency = 1024
webhook_secrets = ["{secret}"]
[providers.sim.models.sim-v1]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = {{ "720p" = "1" }}
"""

    def _prepare_db(self) -> None:
        from aivedio_engine.bootstrap import build_context
        from aivedio_engine.config import load_settings
        from aivedio_engine.db import migrate

        ctx = build_context(load_settings(str(self.config_path)))
        try:
            migrate.upgrade(ctx.engine)
            tenant = ctx.tenants.create("bench-e2e", INITIAL_CREDITS)
            self.tenant_id = tenant.id
            self.api_key = ctx.tenants.create_key(tenant.id)[1]
        finally:
            ctx.close()

    def check(self) -> None:
        for p in self.procs.values():
            p.check()

    def sim_truth(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.sim_url + "/_sim/truth", timeout=30) as r:  # noqa: S310 - loopback
            return json.loads(r.read())

    def stop(self) -> None:
        # the engine first (it still talks to the others while it shuts down), then the sim and moto
        for name in ("api", "scheduler", "relay", "worker", "sim", "moto"):
            if name in self.procs:
                self.procs[name].stop()

    def log_tails(self) -> dict[str, str]:
        return {name: p.tail(15) for name, p in self.procs.items()}
