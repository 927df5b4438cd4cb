"""Process runtime: run the requested roles (api, relay, worker, ...) until a stop event or SIGTERM/SIGINT.

One process may hold any set of roles; in embedded mode (StubBroker) the relay and the worker must share a
process, because the in-memory broker is the only path between them. Shutdown order matters: relays stop first
(no new messages), then the Dramatiq worker finishes the messages it holds and requeues its prefetched ones (the
in-memory broker cannot: the outbox rows of what it still held go back to PENDING, `worker.undelivered`), then
the API stops. A second signal falls through to the default handler, i.e. kills the process.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

import dramatiq

from aivedio_engine.db import wakeup
from aivedio_engine.db.wakeup import Waiter
from aivedio_engine.domain.events import Queue
from aivedio_engine.domain.workflow import QueueName as StepQueue
from aivedio_engine.services.liveness import HeartbeatWriter
from aivedio_engine.worker import undelivered
from aivedio_engine.worker.actors import declare_actors
from aivedio_engine.worker.broker import setup_broker
from aivedio_engine.worker.relay import Relay

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext

log = logging.getLogger(__name__)

ROLES = ("api", "relay", "worker", "scheduler", "sweeper")
#: roles this build runs; the others are accepted (deployments can list them already) and skipped with a warning
IMPLEMENTED = frozenset(ROLES)
#: how long shutdown waits for in-flight actors before giving up on them (they are redelivered later)
WORKER_SHUTDOWN_TIMEOUT_MS = 30_000
_JOIN_TIMEOUT_S = 10.0
_SIGNAL_CHECK_S = 0.1
#: the dispatcher and poller run at least this often; a task becoming ready or a slot freed wakes them at once
SCHEDULER_INTERVAL_S = 0.5


def parse_roles(text: str) -> set[str]:
    """`"api,relay"` → {"api", "relay"}; "all" means every role. Raises ValueError on unknown or empty lists."""
    parts = {p.strip().lower() for p in text.split(",") if p.strip()}
    if not parts:
        raise ValueError("--role: give at least one of " + ", ".join((*ROLES, "all")))
    unknown = parts - set(ROLES) - {"all"}
    if unknown:
        raise ValueError(
            f"--role: unknown role {', '.join(sorted(unknown))} (choose from {', '.join((*ROLES, 'all'))})"
        )
    return set(ROLES) if "all" in parts else parts


class Runtime:
    """The started components of one process; `start()` then `shutdown()`. Tests drive it directly."""

    def __init__(
        self,
        ctx: AppContext,
        roles: Iterable[str],
        stop: threading.Event,
        *,
        api_host: str | None = None,
        api_port: int | None = None,
        queues: Iterable[str] | None = None,
        kind: str = "serve",
    ) -> None:
        self.ctx = ctx
        #: "serve", or "embedded" when a command hosts the engine; written into the heartbeat
        self.kind = kind
        self.roles = set(roles)
        #: the worker role consumes only these broker queues (None: all), so a process can be given one kind of
        #: work: engine queues (`state`, `fetch`, ...) and System B step queues (`image`, `real_video_clip`, seed
        #: 004 /) alike. A queue it is not given costs it nothing; one it is given and that is idle is a
        #: consumer waiting on the broker (RabbitMQ pushes), with no database query
        self.queues = set(queues) if queues else None
        ctx.worker_queues = None if self.queues is None else frozenset(self.queues)
        self.stop = stop
        self.api_host = api_host or ctx.settings.api.host
        self.api_port = api_port or ctx.settings.api.port
        self.broker: dramatiq.Broker | None = None
        self.worker: dramatiq.Worker | None = None
        self.relays: list[Relay] = []
        self.failed: BaseException | None = None
        self._threads: list[threading.Thread] = []
        #: per role, what it did last, in words: the heartbeat's `activity`
        self.activity: dict[str, str] = {}
        self.heartbeat: HeartbeatWriter | None = None

    def start(self) -> None:
        settings = self.ctx.settings
        self.heartbeat = self.ctx.heartbeat_writer(
            frozenset(self.roles & IMPLEMENTED), self.kind, activity=lambda: dict(self.activity)
        )
        self.heartbeat.start()
        for role in sorted(self.roles - IMPLEMENTED):
            log.warning("role %s is not available in this build yet; skipped", role)
        if self.roles & {"relay", "worker"}:
            self.broker = setup_broker(settings, self.ctx)
            declare_actors(self.broker, self.ctx)
            if settings.broker.kind == "stub" and not {"relay", "worker"} <= self.roles:
                log.warning("broker.kind=stub keeps messages in this process: run relay and worker together")
        if "worker" in self.roles:
            assert self.broker is not None
            # the CLI of Dramatiq emits this; TimeLimit starts its watchdog thread on it
            self.broker.emit_after("process_boot")
            self.worker = dramatiq.Worker(
                self.broker,
                queues=self.queues,
                worker_threads=settings.broker.worker_threads,
                worker_timeout=settings.broker.consumer_idle_timeout_ms,
            )
            self.worker.start()
            queues = ",".join(sorted(self.queues)) if self.queues else "all queues"
            self.activity["worker"] = f"consuming {queues} with {settings.broker.worker_threads} threads"
        if "relay" in self.roles:
            assert self.broker is not None
            relay = Relay(
                self.ctx.engine,
                self.broker,
                self.ctx.clock,
                wakeup=None if settings.is_postgres else self.ctx.outbox_wakeup,
                reducer_batch=settings.broker.reducer_batch,
            )
            self.relays.append(relay)
            self.activity["relay"] = "publishing the outbox"
            self._spawn("aivedio-relay", relay.run_forever, self.stop)
        if "scheduler" in self.roles:
            self._spawn("aivedio-scheduler", self._schedule_forever)
        if "sweeper" in self.roles:
            if settings.broker.kind == "stub":  # messages of a process killed hard died with its broker
                redriven = self.ctx.sweeper.redrive_lost_data_plane()
                if redriven:
                    log.info("%d fetch/media step(s) left by an earlier process driven on", redriven)
            self._spawn("aivedio-sweeper", self._loop, self._sweep, settings.sweeper.interval_s, None, "sweeper")
        if "api" in self.roles:
            self.activity["api"] = f"serving http://{self.api_host}:{self.api_port}"
            self._spawn("aivedio-api", self._serve_api)
        log.info("aivedio running roles: %s", ", ".join(sorted(self.roles & IMPLEMENTED)) or "none")

    def shutdown(self) -> None:
        self.stop.set()
        for role in self.activity:
            self.activity[role] = "stopping"
        for t in self._threads:
            if t.name == "aivedio-relay":
                t.join(_JOIN_TIMEOUT_S)
        if self.worker is not None:
            self.worker.stop(timeout=WORKER_SHUTDOWN_TIMEOUT_MS)
        if self.broker is not None:
            self.broker.close()
            self.hand_back_undelivered()
        for t in self._threads:
            t.join(_JOIN_TIMEOUT_S)
        self.stop_heartbeat()
        log.info("aivedio stopped")

    def stop_heartbeat(self) -> None:
        """The row says "stopped" (part of `shutdown`; on its own when shutdown was cut short)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def hand_back_undelivered(self) -> int:
        """In-memory broker: outbox rows of the messages it never finished → PENDING (see worker.undelivered).
        Part of `shutdown`; on its own when shutdown was cut short (a second Ctrl-C)."""
        if self.broker is None:
            return 0
        try:
            handed = undelivered.hand_back(self.ctx.engine, self.broker, self.ctx.clock.now())
        except Exception:
            log.exception("could not hand undelivered messages back to the outbox")
            return 0
        if handed:
            log.info("%d undelivered message(s) handed back to the outbox", handed)
        return handed

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        def guarded() -> None:
            try:
                target(*args)
            except BaseException as exc:  # a dead role must stop the process, not linger
                log.exception("role thread %s failed; stopping", name)
                self.failed = exc
                self.stop.set()

        t = threading.Thread(target=guarded, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _sweep(self) -> None:
        try:
            self.ctx.sweeper.sweep()
        finally:
            # running steps past their type's timeout fail with TASK_TIMEOUT, retried by the rules;
            # then the nets for lost messages: vendor steps whose generation ended, steps due long and unclaimed
            self.ctx.workflows.sweep_timeouts()
            self.ctx.workflow_runner.finish_waiting()
            self.ctx.workflows.redrive_stale()

    def _schedule(self) -> None:
        self.ctx.dispatcher.run_once()
        self.ctx.sync.poll_due()

    def _schedule_forever(self) -> None:
        waiter = Waiter(self.ctx.engine, wakeup.DISPATCH, self.ctx.dispatch_wakeup)
        try:
            self._loop(self._schedule, SCHEDULER_INTERVAL_S, waiter.wait, role="scheduler")
        finally:
            waiter.close()

    def _loop(self, step: Any, interval_s: float, wait: Any = None, role: str | None = None) -> None:
        """Run `step` every `interval_s` (or sooner, when `wait` returns early) until stopped; a failing step is
        logged and retried next tick, since the database holds all state and the next pass picks up where this
        one failed."""
        while not self.stop.is_set():
            try:
                step()
                outcome = "ok"
            except Exception as exc:  # see docstring
                log.exception("periodic step %s failed", getattr(step, "__name__", step))
                outcome = f"failed ({type(exc).__name__})"
            if role is not None and not self.stop.is_set():
                self.activity[role] = f"last pass {self.ctx.clock.now():%H:%M:%S} UTC {outcome}"
            if wait is None:
                self.stop.wait(interval_s)
            else:
                wait(interval_s)

    def _serve_api(self) -> None:
        # imported here: processes without the api role never load the HTTP stack
        from aivedio_engine.api.app import serve_api

        serve_api(self.ctx, self.api_host, self.api_port, self.stop)


def parse_queues(text: str | None) -> set[str] | None:
    """`"state,fetch"` → {"state", "fetch"}; None or "" means every queue. Broker queues and System B step queues
    (`video,ffmpeg`) may be mixed. Raises ValueError naming the valid ones."""
    if not text:
        return None
    parts = {p.strip() for p in text.split(",") if p.strip()}
    known = [q.value for q in Queue] + [q.value for q in StepQueue]
    unknown = parts - set(known)
    if unknown or not parts:
        raise ValueError(
            f"--queues: unknown queue {', '.join(sorted(unknown)) or '(none)'} (known: {', '.join(known)})"
        )
    return parts


def run(
    ctx: AppContext,
    roles: Iterable[str],
    stop: threading.Event,
    *,
    api_host: str | None = None,
    api_port: int | None = None,
    queues: Iterable[str] | None = None,
    on_tick: Callable[[], None] | None = None,
) -> int:
    """Run `roles` until `stop` is set or SIGTERM/SIGINT arrives; returns a process exit code (0 clean).
    `on_tick` runs on the main thread between signal checks (the worker supervisor watches its children)."""
    runtime = Runtime(ctx, roles, stop, api_host=api_host, api_port=api_port, queues=queues)
    received: list[int] = []
    restore = _install_signal_handlers(received)
    try:
        runtime.start()
        # The handler only appends to a list: calling Event.set() from a signal handler can deadlock if the
        # signal lands while this thread holds the event's internal lock.
        while not stop.wait(_SIGNAL_CHECK_S):
            if on_tick is not None:
                on_tick()
            if received:
                log.info("signal %s received; shutting down", signal.Signals(received[0]).name)
                stop.set()
    finally:
        runtime.shutdown()
        restore()
    return 1 if runtime.failed is not None else 0


def _install_signal_handlers(received: list[int]) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in signals}

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)  # a second signal kills

    for s in signals:
        signal.signal(s, handler)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
