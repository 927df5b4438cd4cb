"""The distributed deployment of `bench/e2e/system.py` with a `TcpProxy` in front of every dependency.

api, scheduler + sweeper, relay and worker run as separate `aivedio serve` processes; PostgreSQL (a private
database), Redis (a private key prefix), RabbitMQ (a private vhost), moto S3 and the sim provider's API are each
reached through their own proxy, so a row takes one of them away with `cut()` and never touches the shared
server. The harness itself reads the database, the bucket and the sim's truth directly. The sim's API and its
outputs are both served through its proxy under the name `localhost`, which the worker resolves through
`bench.degrade.worker`'s switchable resolver (`bench/degrade/sim.py` says why)."""

from __future__ import annotations

import secrets
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from aivedio_engine.testing.tcpproxy import TcpProxy
from bench.common import BenchError
from bench.e2e.system import Proc, System, _free_port, _wait_http

#: the queues a separate media worker consumes (the media row); every other worker consumes all the rest
MEDIA_QUEUES = ("media",)

#: how quickly a stalled step is re-driven in the harness (the shipped 900 s would make every recovery 15 min);
#: reported in the JSON so a recovery time is read against it
DATA_PLANE_STUCK_S = 20


def _via(proxy: TcpProxy, url: str) -> str:
    """`url` with its host:port replaced by the proxy's."""
    u = urlparse(url)
    netloc = f"{proxy.host}:{proxy.port}"
    if u.username:
        netloc = f"{u.username}:{u.password}@{netloc}" if u.password else f"{u.username}@{netloc}"
    return urlunparse(u._replace(netloc=netloc))


def _upstream(url: str, default_port: int) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname or "127.0.0.1", u.port or default_port


@dataclass
class DegradeSystem(System):
    proxies: dict[str, TcpProxy] = field(default_factory=dict)
    direct_db_url: str = ""
    direct_s3_url: str = ""
    direct_sim_url: str = ""
    #: a row's own set-up (`Row.setup`): `media_worker` (the media queue in a process of its own), `sim_faults`
    #: (the sim's --faults) and `replace` (configuration text → replacement)
    setup: dict[str, object] = field(default_factory=dict)
    media_restarts: int = 0

    @property
    def dns_flag(self) -> Path:
        return self.workdir / "dns-failing"

    def start(self) -> None:
        self.direct_db_url = self.db_url
        self.proxies["postgres"] = TcpProxy(_upstream(self.db_url, 5432))
        self.proxies["redis"] = TcpProxy(_upstream(self.redis_url, 6379))
        self.proxies["broker"] = TcpProxy(_upstream(self.broker_url, 5672))
        self.db_url = _via(self.proxies["postgres"], self.db_url)
        self.redis_url = _via(self.proxies["redis"], self.redis_url)
        self.broker_url = _via(self.proxies["broker"], self.broker_url)
        super().start()
        if self.setup.get("media_worker"):
            self.start_media()

    def _worker_argv(self, cli: list[str], queues: str | None) -> list[str]:
        argv = [sys.executable, "-m", "bench.degrade.worker", str(self.dns_flag), *cli[3:], "worker"]
        return [*argv, "--queues", queues] if queues else argv

    def start_media(self) -> None:
        """The media worker (the media row's "media cluster"): `aivedio serve --role worker --queues media`."""
        assert self.config_path is not None
        cli = [sys.executable, "-m", "aivedio_cli", "--config", str(self.config_path), "serve", "--role"]
        log = self.workdir / f"media-{self.media_restarts}.log"
        self.procs["media"] = Proc("aivedio serve worker --queues media", self._worker_argv(cli, "media"), log)

    def kill_media(self) -> None:
        """The media cluster down: the media worker killed outright (a crash, not a drain), so the messages it held
        go back to the broker only when its connection drops, and nothing consumes the media queue until
        `start_media`."""
        proc = self.procs.pop("media")
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(timeout=30)
        proc.stop()  # closes its log
        self.media_restarts += 1

    def _worker(self, cli: list[str]) -> tuple[str, list[str]]:
        # the fetcher's resolver fails every lookup while the flag file exists (the DNS row)
        if not self.setup.get("media_worker"):
            return "aivedio serve worker", self._worker_argv(cli, None)
        # every queue but media: media messages wait in the broker for the media worker (a fetch does not run the
        # media step inline on a worker that does not consume the media queue: `media.inline_after_fetch_max_bytes`)
        from aivedio_engine.domain.events import Queue
        from aivedio_engine.domain.workflow import QueueName as StepQueue

        rest = [q.value for q in (*Queue, *StepQueue) if q.value not in MEDIA_QUEUES]
        return "aivedio serve worker (all but media)", self._worker_argv(cli, ",".join(rest))

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
        self.proxies["provider"] = TcpProxy(("127.0.0.1", sim_port))
        # API and CDN both through the proxy, under a name: see bench/degrade/sim.py
        self.sim_url = f"http://localhost:{self.proxies['provider'].port}"
        sim = [sys.executable, "-m", "bench.degrade.sim", self.sim_url, "--port", str(sim_port)]
        sim += ["--job-seconds", f"{self.job_seconds:g}", "--webhook-secret", secret, "--seed", "1"]
        if self.setup.get("sim_faults"):
            sim += ["--faults", str(self.setup["sim_faults"])]
        self.procs["sim"] = Proc("aivedio sim-provider", sim, self.workdir / "sim.log")
        self.direct_s3_url, self.direct_sim_url = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{sim_port}"
        _wait_http(self.direct_s3_url + "/", self.procs["moto"], what="moto_server")
        _wait_http(self.direct_sim_url + "/_sim/truth", self.procs["sim"], what="the sim provider")
        self.s3_url = self.direct_s3_url
        self.s3_client().create_bucket(Bucket=self.bucket)
        self.proxies["storage"] = TcpProxy(("127.0.0.1", s3_port))
        self.s3_url = self.proxies["storage"].url("http")
        return secret

    def _extra_config(self) -> str:
        # appended tables only: _config() already wrote [sweeper]-free TOML
        return f"""
[sweeper]
fetch_stuck_s = {DATA_PLANE_STUCK_S}
media_stuck_s = {DATA_PLANE_STUCK_S}
"""

    def _config(self, secret: str) -> str:
        # the sim's API and CDN are `localhost`, resolved by the fetcher (the DNS row) and behind the proxy
        text = super()._config(secret).replace('output_hosts = ["127.0.0.1"]', 'output_hosts = ["localhost"]')
        replace: dict[str, str] = self.setup.get("replace", {})  # type: ignore[assignment]
        for old, new in replace.items():
            if old not in text:
                raise BenchError(f"row set-up: {old!r} is not in the harness configuration")
            text = text.replace(old, new)
        return text

    def sim_truth(self) -> dict[str, object]:
        import json
        import urllib.request

        with urllib.request.urlopen(self.direct_sim_url + "/_sim/truth", timeout=30) as r:  # noqa: S310 - loopback
            return dict(json.loads(r.read()))

    def direct_s3(self) -> object:
        saved, self.s3_url = self.s3_url, self.direct_s3_url
        try:
            return self.s3_client()
        finally:
            self.s3_url = saved

    def stop(self) -> None:
        for p in self.proxies.values():
            p.restore()  # the engine shuts down cleanly only if it can reach what it talks to
        super().stop()
        if "media" in self.procs:
            self.procs["media"].stop()
        for p in self.proxies.values():
            p.close()
