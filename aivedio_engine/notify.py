"""Task status signals for the SSE streams: "task X may have changed", and nothing more.

A signal never carries state. A stream that wakes re-reads the task's state event history, so ordering, dedup
and the tenant check all come from the database; a lost signal costs latency, not correctness, because streams
also re-read on every heartbeat. That is why both notifiers may drop signals rather than block or fail a caller
that is only trying to wake someone up.

Publishers are worker threads (the `signal_status_changed` actor, the workflow service); waiters are asyncio tasks
in the API's event loop. The bridge between the two is `loop.call_soon_threadsafe`, the one thread-safe way into a
running loop. Publishing never raises and never waits long: nothing durable (client webhooks, workflow steps)
hangs on it, and a signal Redis did not take is logged and counted (`aivedio_sse_signals_dropped_total`).

- `InProcessNotifier` (embedded mode): worker and API share the process, so publish is a direct fan-out.
- `RedisNotifier` (distributed mode): publish is a Redis PUBLISH on one channel; each API process keeps ONE
  subscriber connection (opened on the first stream, not at start-up, so worker processes never hold one) and
  fans out in process. After a reconnect every waiter is woken, since signals sent during the gap are lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from aivedio_engine.observability.metrics import SSE_SIGNALS_DROPPED

if TYPE_CHECKING:
    import redis

    from aivedio_engine.config import Settings

log = logging.getLogger(__name__)


class Subscription:
    """One waiter's latch for one task. Create it inside the running event loop, before reading the history, so
    a change committed between that read and the next `wait()` still wakes it."""

    def __init__(self, fanout: _Fanout, task_id: uuid.UUID) -> None:
        self.task_id = task_id
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._fanout = fanout
        #: the fan-out's signal number for this task when the last wait() returned True (see `_Fanout`)
        self.woken_seq = 0
        fanout.add(self)

    def signal(self) -> None:
        """Thread-safe: may be called from any thread, including the loop's own."""
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop is closed: its streams are gone, nobody is left to wake
            self.close()

    async def wait(self, timeout: float) -> bool:
        """True when signalled since the last wait (the latch is then reset), False after `timeout` seconds."""
        try:
            # a timeout scope rather than wait_for: no extra task per idle stream (thousands of them wait here)
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        # cleared before the caller re-reads, so a signal arriving during that read is kept for the next wait
        self._event.clear()
        self.woken_seq = self._fanout.signalled(self.task_id)
        return True

    def current_seq(self) -> int:
        """The newest signal number of this process: a read that starts after this call sees every change whose
        signal has a number up to it (signals are published after their commit)."""
        return self._fanout.seq()

    def close(self) -> None:
        self._fanout.remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Fanout:
    """task id → live subscriptions of this process.

    Every signal gets a number from one process-wide counter, and each task with subscribers remembers the number
    of its latest signal. A stream woken by signal k may use any read of the task that started once the counter
    was at k or later, so all the streams of one task woken together can share one database read
    (`services.notifications`) instead of each making its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[uuid.UUID, set[Subscription]] = {}
        self._seq = 0
        self._signalled: dict[uuid.UUID, int] = {}

    def add(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.setdefault(sub.task_id, set()).add(sub)

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.task_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.task_id]
                    self._signalled.pop(sub.task_id, None)

    def seq(self) -> int:
        with self._lock:
            return self._seq

    def signalled(self, task_id: uuid.UUID) -> int:
        """The number of the task's latest signal (the current number if none is remembered: the safe side)."""
        with self._lock:
            return self._signalled.get(task_id, self._seq)

    def signal(self, task_id: uuid.UUID) -> None:
        with self._lock:
            targets = list(self._subs.get(task_id, ()))
            if targets:
                # numbered before any latch is set: a woken stream always finds this number (or a later one)
                self._seq += 1
                self._signalled[task_id] = self._seq
        # signalled outside the lock: a closed loop makes signal() call remove(), which takes the lock
        for sub in targets:
            sub.signal()

    def signal_all(self) -> None:
        with self._lock:
            targets = [s for subs in self._subs.values() for s in subs]
            self._seq += 1
            for task_id in self._subs:
                self._signalled[task_id] = self._seq
        for sub in targets:
            sub.signal()

    def count(self, task_id: uuid.UUID | None = None) -> int:
        with self._lock:
            if task_id is not None:
                return len(self._subs.get(task_id, ()))
            return sum(len(s) for s in self._subs.values())


class Notifier(Protocol):
    def publish(self, task_id: uuid.UUID, version: int) -> None:
        """Signal that `task_id` reached `version`; callable from any thread. Never raises: a signal that cannot be
        sent is dropped, since the streams also re-read on every heartbeat."""

    def subscribe(self, task_id: uuid.UUID) -> Subscription:
        """A latch woken by every later `publish` for `task_id` (from any process sharing the backend).
        Must be called from a coroutine running in the loop that will wait on it."""

    def subscribers(self, task_id: uuid.UUID | None = None) -> int:
        """Live subscriptions in this process (for one task, or all): for tests and the operations surface."""

    def close(self) -> None: ...


class InProcessNotifier:
    """Embedded mode: publishers and streams share the process."""

    def __init__(self) -> None:
        self._fanout = _Fanout()

    def publish(self, task_id: uuid.UUID, version: int) -> None:
        self._fanout.signal(task_id)

    def subscribe(self, task_id: uuid.UUID) -> Subscription:
        return Subscription(self._fanout, task_id)

    def subscribers(self, task_id: uuid.UUID | None = None) -> int:
        return self._fanout.count(task_id)

    def close(self) -> None:
        pass


class RedisNotifier:
    """Distributed mode: `PUBLISH {prefix}task-status "<task id> <version>"`; one listener thread per process.

    One channel for all tasks (rather than one per task) keeps a single SUBSCRIBE for the life of the process:
    no subscribe/unsubscribe traffic per stream, and status changes are a handful per task, so every API process
    receiving all of them is cheap.
    """

    #: how long the listener blocks per read; bounds how quickly close() is noticed
    POLL_S = 1.0
    #: a PUBLISH gives up after this long (connect, then answer): a signal is worth no more than that
    PUBLISH_TIMEOUT_S = 2.0

    def __init__(
        self, client: redis.Redis, key_prefix: str, *, retry_s: float = 1.0, publisher: redis.Redis | None = None
    ) -> None:
        self.channel = f"{key_prefix}task-status"
        self._client = client
        #: a client of its own, with a read timeout the subscriber's idle connection must not have
        self._publisher = publisher or client
        self._retry_s = retry_s
        self._fanout = _Fanout()
        self._stop = threading.Event()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: set while the listener holds a confirmed subscription (tests and health checks wait on it)
        self.listening = threading.Event()

    @classmethod
    def from_url(cls, url: str, key_prefix: str, **kwargs: Any) -> RedisNotifier:
        import redis

        # health checks keep an idle subscriber connection from being silently dropped by a middlebox
        client = redis.Redis.from_url(url, socket_connect_timeout=2, health_check_interval=30)
        publisher = redis.Redis.from_url(
            url, socket_connect_timeout=cls.PUBLISH_TIMEOUT_S, socket_timeout=cls.PUBLISH_TIMEOUT_S
        )
        return cls(client, key_prefix, publisher=publisher, **kwargs)

    def publish(self, task_id: uuid.UUID, version: int) -> None:
        import redis

        try:
            self._publisher.publish(self.channel, f"{task_id} {version}")
        except (redis.RedisError, OSError) as exc:
            # dropped, not retried: the streams re-read on their heartbeat, and every stream of a listener that
            # lost Redis too re-reads once it has subscribed again
            SSE_SIGNALS_DROPPED.inc()
            log.warning("notifier: signal for %s v%d dropped, Redis unavailable: %r", task_id, version, exc)

    def subscribe(self, task_id: uuid.UUID) -> Subscription:
        self.start()
        return Subscription(self._fanout, task_id)

    def subscribers(self, task_id: uuid.UUID | None = None) -> int:
        return self._fanout.count(task_id)

    def start(self) -> None:
        """Start the listener thread if it is not running; later calls are no-ops."""
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._listen, name="aivedio-notify", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.POLL_S * 3)
        self._client.close()
        if self._publisher is not self._client:
            self._publisher.close()

    def _listen(self) -> None:
        import redis

        confirmed_before = False
        while not self._stop.is_set():
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=self.POLL_S)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        # a second confirmation means a reconnect (ours below, or redis-py's own retry): signals
                        # published during the gap are lost, so every stream re-reads
                        if confirmed_before:
                            self._fanout.signal_all()
                        confirmed_before = True
                        self.listening.set()
                    elif message["type"] == "message":
                        self._dispatch(message["data"])
            except Exception as exc:  # noqa: BLE001 - a dead listener would silently slow every stream to heartbeats
                level = logging.WARNING if isinstance(exc, (redis.RedisError, OSError)) else logging.ERROR
                log.log(level, "notifier: Redis subscription lost (%r); retrying in %.1fs", exc, self._retry_s)
                self.listening.clear()
                self._stop.wait(self._retry_s)
            finally:
                try:
                    pubsub.close()
                except (redis.RedisError, OSError):
                    pass
        self.listening.clear()

    def _dispatch(self, data: bytes | str) -> None:
        text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
        try:
            task_id = uuid.UUID(text.split(" ", 1)[0])
        except ValueError:
            log.warning("notifier: ignoring malformed message %r", text[:80])
            return
        self._fanout.signal(task_id)


def build_notifier(settings: Settings) -> Notifier:
    """Embedded mode: in process; distributed mode: Redis pub/sub (redis is only imported when used)."""
    if settings.mode == "distributed":
        return RedisNotifier.from_url(settings.redis.url, key_prefix=settings.redis.key_prefix)
    return InProcessNotifier()


__all__ = ["InProcessNotifier", "Notifier", "RedisNotifier", "Subscription", "build_notifier"]
