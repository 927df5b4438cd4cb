"""The crash-point matrix (issue 14 item 6): one engine death at a commit boundary, a fresh engine carries on.

Every step's write transaction has two named failpoints, `<step>.before_commit` (the last statement inside the
transaction) and `<step>.after_commit` (the first one after the commit, before any after-commit work). A cell of
the matrix arms one of them with `crash@N` and drives `tasks` generations against the sim to their end:

- the death is `FailpointCrash`, a BaseException: no `except Exception` in the engine swallows it, every open
  transaction rolls back as the server would roll back a dead backend, and nothing after the point runs (no
  after-commit work, no broker ack). The driver then throws the whole AppContext away (engine, pools, slot
  store, caches) and builds a new one on the same database and clock: a restarted process;
- messages go through the real outbox relay into an in-memory queue that outlives the engine, as RabbitMQ
  outlives a worker: a message whose handler died is delivered again, an acked one is gone;
- a client creates the tasks (retrying a create that died, with the same key) and cancels every third one;
- slots live in Redis (distributed mode, a private key prefix), so a lease a death leaves behind stays there;
- the API that receives the sim's callbacks keeps its own context: a death there is a 500 the sim retries.

Some boundaries are only reached after something else went wrong; their cells first lose a message (as a
flushed broker would) or kill a send, see `PREPARE`. Afterwards the cell checks: every task terminal,
`aivedio audit` (InvariantService) 0 violations, one RESERVE per task and one SETTLE or RELEASE per terminal task,
one task per idempotency key, no duplicate paid job at the sim, no slot lease left in Redis once every task has
ended, and that the armed crash fired.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import credit_ledger, generation_tasks
from aivedio_engine.domain.status import TASK_TERMINAL, LedgerEntryType
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.errors import IllegalState
from aivedio_engine.services.invariants import InvariantService
from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointCrash
from aivedio_engine.worker.actors import spec_for
from aivedio_engine.worker.relay import Relay
from tests.support.app import FakeClock, free_port, make_context, running_api, tenant_with_key
from tests.support.redis import REDIS_URL, private_prefix
from tests.support.sim import SimHandle, running_sim, wait_until
from tests.support.webhook_receiver import running_receiver

#: every step's commit boundary (failpoint prefix) and what it commits
STEPS: dict[str, str] = {
    "create": "the task, its RESERVE and its first status notice (db/creation.py)",
    "dispatch": "QUEUED → DISPATCHING, the attempt and its submit message (services/dispatch.py)",
    "submit.claim": "attempt NEW → SENDING, before the provider call (services/submit.py)",
    "submit.record": "the provider's answer: job id bound, rejected or ambiguous (services/submit.py)",
    "poll": "a polled observation stored with its reducer message (services/sync.py)",
    "reconcile": "an ambiguous submit resolved by lookup (services/sync.py)",
    "callback": "a provider callback stored with its reducer message (services/callbacks.py)",
    "reducer": "an observation applied: task/attempt moved, fetch requested or closed (services/reducer.py)",
    "output-fetch": "the raw output recorded, OUTPUT_FETCHING → POST_PROCESSING (services/output_fetch.py)",
    "media": "derivatives recorded, POST_PROCESSING → SUCCEEDED with its SETTLE (services/media.py)",
    "webhooks.fanout": "client webhook deliveries written for a status change (services/webhooks.py)",
    "webhook": "one client webhook attempt recorded (services/webhook_delivery.py)",
    "relay": "outbox rows marked PUBLISHED after their enqueue (worker/relay.py)",
    "cancel": "a client's cancel: CANCEL_REQUESTED or CANCELED with its RELEASE (services/generations.py)",
    "cancel.provider": "the provider's cancel confirmation stored as an observation (services/sync.py)",
    "sweeper.resend": "a lost submit message written again (services/sweeper.py)",
    "sweeper.stuck_sending": "a send that never reported moved to SUBMIT_UNKNOWN (services/sweeper.py)",
    "sweeper.redrive": "a lost fetch/media request written again (services/sweeper.py)",
    "sweeper.rereduce": "a stored observation whose message was lost reduced again (services/keep_moving.py)",
}
PHASES = ("before", "after")

#: what brings a cell to boundaries a clean run never reaches: a lost first message of an actor, extra failpoints
PREPARE: dict[str, dict[str, str]] = {
    "sweeper.resend": {"lose": "submit_to_provider"},
    "sweeper.stuck_sending": {"also": "submit.claim.after_commit=crash@1"},
    "sweeper.redrive": {"lose": "fetch_output"},
    # a lost RUNNING observation is superseded by the next poll's; losing every one leaves only the sweeper
    "sweeper.rereduce": {"lose": "reduce_provider_status*"},
}
#: the sim's faults per step: every submit is ambiguous for the reconcile cell, so every task is looked up
SIM_FAULTS: dict[str, str] = {"reconcile": "ambiguous=1"}
#: where the death is a raised error instead: the API process answers 500 and the sim retries the callback
RAISES = frozenset({"callback"})
#: short, so the check for leaked slots can wait one out (the sweeper renews live leases on every round)
LEASE_TTL_S = 10


@dataclass
class CellResult:
    point: str
    tasks: int
    nth: int = 1
    crashes: int = 0
    rounds: int = 0
    hits: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Queue:
    """The broker: outlives every engine process; a message leaves it only when its handler returned."""

    def __init__(self, lose: str | None = None) -> None:
        self.messages: deque[Any] = deque()
        self.lose = lose
        self.lost = 0
        self.failures: Counter[str] = Counter()

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        every = bool(self.lose and self.lose.endswith("*"))  # "actor*": every message of it is lost
        if self.lose and message.actor_name == self.lose.rstrip("*") and (every or not self.lost):
            self.lost += 1  # a flushed broker: the relay's enqueue succeeded, the message is gone
            return message
        self.messages.append(message)
        return message

    def deliver(self, ctx: AppContext) -> int:
        """Run every queued message once; a FailpointCrash leaves it queued (unacked) and propagates."""
        done = 0
        for _ in range(len(self.messages)):
            message = self.messages[0]
            envelope = Envelope.parse(message.args[0])
            spec = spec_for(message.actor_name)
            try:
                spec.handler(ctx, envelope)
            except FailpointCrash:
                raise
            except Exception:  # noqa: BLE001 - the broker's retries, then its dead letters (the sweeper's to re-drive)
                self.failures[message.message_id] += 1
                if self.failures[message.message_id] <= spec.options["max_retries"]:
                    self.messages.rotate(-1)
                    continue
            self.messages.popleft()
            done += 1
        return done


class Engine:
    """One engine process: its own AppContext on the shared database and clock, the relay into the shared queue."""

    def __init__(self, tmp: Path, overrides: dict[str, Any], clock: FakeClock, queue: Queue) -> None:
        self.ctx = make_context(tmp / "data", clock=clock, **overrides)
        self.relay = Relay(self.ctx.engine, queue, clock)  # type: ignore[arg-type]  # enqueue is all it calls
        self.queue = queue

    def flush(self) -> None:
        for _ in range(50):
            published = self.relay.run_once()
            if not published and not self.queue.deliver(self.ctx):
                return

    def round(self) -> None:
        self.ctx.dispatcher.run_once(max_picks=200)
        self.flush()
        self.ctx.sweeper.sweep()
        self.flush()


def run_cell(tmp: Path, pg_url: str, point: str, tasks: int, *, seed: int = 7, max_rounds: int = 150) -> CellResult:
    step, _, phase = point.rpartition(".")
    result = CellResult(point, tasks, _nth(step, tasks))
    armed = f"{point}_commit={'raise' if step in RAISES else 'crash'}@{result.nth}"
    prep = PREPARE.get(step, {})
    port = free_port()
    with (
        running_sim(seed=seed, job_seconds=8, faults=SIM_FAULTS.get(step, "")) as sim,
        running_receiver() as rx,
        contextlib.contextmanager(private_prefix)("crash-matrix") as prefix,
    ):
        overrides = _settings(sim, pg_url, port if step == "callback" else None)
        overrides.update(mode="distributed", redis={"url": REDIS_URL, "key_prefix": prefix})
        clock = FakeClock()
        api_ctx = make_context(tmp / "api", clock=clock, **overrides)
        queue = Queue(prep.get("lose"))
        life = Engine(tmp, overrides, clock, queue)
        with running_api(api_ctx, port=port) if step == "callback" else contextlib.nullcontext():
            try:
                failpoints.configure(";".join(filter(None, [armed, prep.get("also")])))
                who = tenant_with_key(api_ctx, "crash-matrix", credits=100_000)
                rx.secrets.append(api_ctx.webhooks.add(who.tenant_id, rx.url, ["SUCCEEDED", "CANCELED"]).secret)
                ids = _create(api_ctx, who.tenant_id, tasks, result)
                for result.rounds in range(1, max_rounds + 1):
                    if result.rounds == 2:  # the jobs are running: the cancel reaches the provider
                        _cancel(api_ctx, who.tenant_id, ids[1::3], result)
                    try:
                        life.round()
                    except FailpointCrash:
                        result.crashes += 1
                        life = _restart(life, tmp, overrides, clock, queue)
                    if _all_terminal(life.ctx) and not queue.messages:
                        break
                    _advance(clock, sim, step == "callback")
                result.hits = failpoints.hits(f"{point}_commit")
            finally:
                failpoints.reset()
        _check(life.ctx, sim, ids, result, expect_crash=step not in RAISES)
        life.ctx.close()
        api_ctx.close()
    return result


def _settings(sim: SimHandle, pg_url: str, callback_port: int | None) -> dict[str, Any]:
    values: dict[str, Any] = {
        "database": {"url": pg_url},
        "providers": {"sim": sim.provider_settings(max_concurrency=50)},
        "default_provider": "sim",
        "polling": {"min_interval_s": 5, "max_interval_s": 10, "jitter": 0.2},
        "limits": {
            "platform_max_concurrency": 1000,
            "tenant_default_max_concurrency": 1000,
            "slot_lease_ttl_s": LEASE_TTL_S,
        },
        "media": {"inline_after_fetch_max_bytes": 0},
        "client_webhooks": {"allow_private_networks": True},
        "sweeper": {"fetch_stuck_s": 60},
    }
    if callback_port is not None:  # the sim calls each job's callback URL only when the engine gives it one
        values["api"] = {"public_base_url": f"http://127.0.0.1:{callback_port}"}
    return values


def _nth(step: str, tasks: int) -> int:
    """Die in the middle of the run, with other tasks in flight (a cell of 2 tasks dies at the first hit)."""
    if step == "cancel" or step == "cancel.provider":
        return max(1, len(range(1, tasks, 3)) // 2)
    if step.startswith("sweeper.") or step == "reconcile":
        return 1
    return max(1, tasks // 2)


def _restart(life: Engine, tmp: Path, overrides: dict[str, Any], clock: FakeClock, queue: Queue) -> Engine:
    with contextlib.suppress(Exception):  # the dead process's pools: nothing of it is used again
        life.ctx.close()
    return Engine(tmp, overrides, clock, queue)


def _advance(clock: FakeClock, sim: SimHandle, callbacks: bool) -> None:
    clock.advance(6)
    sim.advance(6)
    if callbacks:
        wait_until(lambda: sim.truth()["callbacks"]["pending"] == 0, timeout_s=30, what="sim callbacks delivered")


def _retrying(call: Any, result: CellResult) -> Any:
    """A client: a request whose server died is sent again (create with the same key, cancel as it was)."""
    for _ in range(3):
        try:
            return call()
        except FailpointCrash:
            result.crashes += 1
    raise AssertionError("a request died three times")


def _create(ctx: AppContext, tenant_id: Any, n: int, result: CellResult) -> list[Any]:
    body = {"model": "sim-v1", "duration_s": 2}
    return [
        _retrying(
            lambda i=i: ctx.generations.create(tenant_id, f"k{i}", {"prompt": f"scene {i}", **body}), result
        ).task.id
        for i in range(n)
    ]


def _cancel(ctx: AppContext, tenant_id: Any, ids: list[Any], result: CellResult) -> None:
    for task_id in ids:
        with contextlib.suppress(IllegalState):  # finished already: a 409 to the client
            _retrying(lambda t=task_id: ctx.generations.cancel(tenant_id, t), result)


def _all_terminal(ctx: AppContext) -> bool:
    with ctx.engine.connect() as conn:
        return all(s in _TERMINAL for (s,) in conn.execute(sa.select(generation_tasks.c.status)))


_TERMINAL = {s.value for s in TASK_TERMINAL}


def _check(ctx: AppContext, sim: SimHandle, ids: list[Any], result: CellResult, *, expect_crash: bool) -> None:
    problems = result.problems
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(generation_tasks.c.id, generation_tasks.c.status)).all()
        ledger = Counter(
            (r.task_id, r.entry_type)
            for r in conn.execute(sa.select(credit_ledger.c.task_id, credit_ledger.c.entry_type))
        )
    result.statuses = dict(Counter(r.status for r in rows))
    if len(rows) != len(ids) or {r.id for r in rows} != set(ids):
        problems.append(f"{len(rows)} tasks for {len(ids)} keys")
    for r in rows:
        if r.status not in _TERMINAL:
            problems.append(f"task {r.id} is {r.status}")
        if ledger[(r.id, LedgerEntryType.RESERVE.value)] != 1:
            problems.append(f"task {r.id}: {ledger[(r.id, LedgerEntryType.RESERVE.value)]} RESERVE rows")
        closing = ledger[(r.id, LedgerEntryType.SETTLE.value)] + ledger[(r.id, LedgerEntryType.RELEASE.value)]
        if r.status in _TERMINAL and closing != 1:
            problems.append(f"task {r.id} ({r.status}): {closing} SETTLE/RELEASE rows")
    report = InvariantService(ctx.engine, ctx.clock).run()
    problems += [f"audit {c.id}: {c.violations} violation(s) {c.rows[:2]}" for c in report.results if not c.ok]
    # a lease taken by a dispatcher that died before its commit was never vouched for by the database, so the
    # rebuild leaves it to its TTL (it cannot tell it from a dispatch in progress): held past the TTL is a leak
    deadline = time.monotonic() + LEASE_TTL_S + 5
    while any(ctx.slots.counts().values()) and time.monotonic() < deadline:
        time.sleep(0.25)  # Redis expires the lease on its own clock; counts() purges it then
    if any(ctx.slots.counts().values()):
        problems.append(f"slot leases held past their TTL after every task ended: {ctx.slots.counts()}")
    truth = sim.truth()
    if truth["duplicate_paid_jobs"]:
        problems.append(f"{truth['duplicate_paid_jobs']} duplicate paid job(s) at the sim")
    if result.hits < result.nth or (expect_crash and result.crashes < 1):
        problems.append(f"the crash never fired (hits {result.hits} < {result.nth}, crashes {result.crashes})")


def points() -> Iterator[str]:
    for step in STEPS:
        for phase in PHASES:
            yield f"{step}.{phase}"
