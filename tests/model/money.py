"""A model-based checker of the money: generated sequences of operations over the whole engine, every invariant of
the money checked after every step.

Each sequence starts an engine of its own (embedded SQLite, or a throwaway PostgreSQL database) with the sim vendor
in the same process on the same manual clock, so advancing the clock moves the vendor's jobs, the deadlines, the
step budgets and the review SLA together. Hypothesis' `RuleBasedStateMachine` picks the steps:

  create        1–3 tenants, n 1–4 variants; a prompt the vendor fails, or one output moderation holds for review
  cancel        any task, at any point
  advance       the clock by 5 s … past the deadline, the review SLA and the step budgets, then the roles run
  review        approve or reject a held task (or leave it: the SLA passes)
  store         break the data dir's object store (every call raises) and heal it
  vendor        bills under / over / no outputs / all outputs, voids a finished job, fails jobs, ambiguous submits
  encoder       the media step's encode refuses every output or every other one (a QC finding), or fails every
                other run or every run retryably (the media step's budget runs, then a person holds it)
  callbacks     deliver the held vendor callbacks in order, reversed, duplicated, or drop them
  crash         the engine dies at a commit boundary of the next round (an armed failpoint), then restarts
  restart       stop the engine and start a new one on the same database and data dir

After every step (tests/model/invariants.py): each tenant's balance is what it was given minus its tasks' ledger
and no stripe is negative; each task has one RESERVE and, once terminal, exactly one SETTLE or RELEASE, a REFUND
only where the vendor refunded and no ADJUSTMENT that moves credits; a terminal task is charged at most
estimate ÷ n × its delivered variants unless the charge is the tenant's own decision (its cancel, its deadline
before any output existed, a person rejecting a shown output); every READY object of a SUCCEEDED task reads back
with its checksum; every billed vendor job of a closed task is an attempt's job or a recorded duplicate; and
`aivedio audit`'s ledger checks (I4.*) agree. When a sequence ends, the store heals, the vendor behaves, the clock
runs on until every task is terminal (none may be stuck), and the whole audit must pass.

The media step runs for real except the encode: `engine.stub_build_derivatives` writes each derivative's files
as ffmpeg names them, and the probe of the sim's (identical) clip is made once per process.

Run:
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/model                 # CI: a fixed seed, both dialects
    .venv/bin/python -m tests.model.money --sequences 1000 --seed 1234 [--backend postgres] [--steps 20]

A failure prints the shrunk sequence of steps and the seed; the same command with that seed replays it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.providers.sim.faults import parse_faults
from aivedio_engine.services.errors import Conflict, IllegalState, InsufficientCredits, NotFound
from aivedio_engine.services.operations import Operation
from aivedio_engine.testing import failpoints
from tests.model import engine
from tests.model.engine import DEADLINE_S, REVIEW_SLA_S, REVIEW_TERM, World
from tests.model.invariants import Model, audit_all, audit_money, violations
from tests.support.app import tenant_with_key

CREDITS = 40
#: how far one `advance` moves the clock: a poll, a job's life, past the deadline, past the review SLA, an hour
STEPS_S = (5, 20, 60, DEADLINE_S + 30, REVIEW_SLA_S + 30, 3600)
#: where `crash` stops the engine: the commit boundaries a round of the roles passes (a create's are left out: the
#: client that never got an answer retries with its key, which the model does not play)
CRASH_POINTS = (
    "dispatch.before_commit",
    "dispatch.after_commit",
    "submit.claim.after_commit",
    "submit.before_call",
    "submit.after_call",
    "submit.record.before_commit",
    "submit.record.after_commit",
    "poll.before_commit",
    "poll.after_commit",
    "reducer.before_commit",
    "reducer.after_commit",
    "consume.before_commit",
    "output_fetch.before_inline_media",
    "storage.put",
    "cancel.provider.before_commit",
    "cancel.provider.after_commit",
    "sweeper.redrive.after_commit",
    "reconcile.after_commit",
)
#: rounds the end of a sequence may take to bring every task to a terminal state
SETTLE_ROUNDS = 40


class MoneyMachine(RuleBasedStateMachine):
    #: set by `machine_for`: a context manager factory yielding the database URL (None: SQLite)
    database: Callable[[], Any] = staticmethod(engine.sqlite_database)

    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.world: World = self._stack.enter_context(engine.world(self.database))
        self.model = Model()
        self.tenants: list[uuid.UUID] = []
        self.keys = 0

    # --- steps --------------------------------------------------------------------------------------------
    @initialize(count=st.integers(1, 3))
    def tenants_(self, count: int) -> None:
        for i in range(count):
            who = tenant_with_key(self.world.ctx, f"tenant-{i}", credits=CREDITS)
            self.tenants.append(who.tenant_id)
            self.model.tenants[who.tenant_id] = Decimal(CREDITS)

    @rule(tenant=st.integers(0, 2), n=st.integers(1, 4), seconds=st.integers(1, 4))
    def create(self, tenant: int, n: int, seconds: int) -> None:
        self._create(tenant, n, seconds, "plain")

    @rule(tenant=st.integers(0, 2), n=st.integers(1, 4), seconds=st.integers(1, 4))
    def create_held_for_review(self, tenant: int, n: int, seconds: int) -> None:
        self._create(tenant, n, seconds, "review")

    @rule(tenant=st.integers(0, 2), n=st.integers(1, 4), seconds=st.integers(1, 4))
    def create_the_vendor_fails(self, tenant: int, n: int, seconds: int) -> None:
        self._create(tenant, n, seconds, "fail")

    def _create(self, tenant: int, n: int, seconds: int, kind: str) -> None:
        tenant_id = self.tenants[tenant % len(self.tenants)]
        prompt = {"plain": "a fox", "review": f"a fox to {REVIEW_TERM}", "fail": "a fox [fail]"}[kind]
        body = {"prompt": prompt, "model": "sim-v1", "duration_s": seconds, "n": n, "deadline_s": DEADLINE_S}
        self.keys += 1
        try:
            task = self.world.ctx.generations.create(tenant_id, f"k{self.keys}", body).task
        except InsufficientCredits:
            return
        self.model.tasks[task.id] = tenant_id
        self.world.work()

    @precondition(lambda self: self.model.tasks)
    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        task_id = self._pick(pick)
        try:
            self.world.ctx.generations.cancel(self.model.tasks[task_id], task_id)
        except IllegalState:
            return
        self.model.canceled.add(task_id)
        self.world.work()

    @rule(seconds=st.sampled_from(STEPS_S))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)
        self.world.work()

    @precondition(lambda self: self._in("MANUAL_REVIEW"))
    @rule(pick=st.integers(0, 50))
    def approve(self, pick: int) -> None:
        self._review(pick, approve=True)

    @precondition(lambda self: self._in("MANUAL_REVIEW"))
    @rule(pick=st.integers(0, 50))
    def reject(self, pick: int) -> None:
        self._review(pick, approve=False)

    def _review(self, pick: int, *, approve: bool) -> None:
        held = self._in("MANUAL_REVIEW")
        task_id = held[pick % len(held)]
        decide = self.world.ctx.review.approve if approve else self.world.ctx.review.reject
        try:
            decide(task_id, "rita", Operation("review " + ("approve" if approve else "reject"), "looked at it"))
        except (Conflict, NotFound):
            return
        if not approve:
            self.model.rejected.add(task_id)
        self.world.work()

    @precondition(lambda self: not self.world.store_down)
    @rule()
    def break_store(self) -> None:
        self.world.break_store()
        self.world.work()

    @precondition(lambda self: self.world.store_down)
    @rule()
    def heal_store(self) -> None:
        self.world.heal_store()
        self.world.work()

    @rule(factor=st.sampled_from([0.5, 1.0, 1.5]), outputs=st.sampled_from([None, 0, 1, 2]))
    def vendor_bills(self, factor: float, outputs: int | None) -> None:
        self.world.sim.configure(bill_factor=factor, billed_outputs=outputs)
        self.world.work()

    @rule(pick=st.integers(0, 50))
    def vendor_voids(self, pick: int) -> None:
        done = [j.id for j in self.world.sim.jobs.values() if j.status not in ("queued", "throttled", "running")]
        if done:
            self.world.sim.void(done[pick % len(done)])
        self.world.work()

    @rule(spec=st.sampled_from(["", "ambiguous=1", "5xx=1", "fail=1", "reset=1"]))
    def vendor_faults(self, spec: str) -> None:
        self.world.sim.set_faults(parse_faults(spec))
        self.world.work()

    @rule(how=st.sampled_from(["in_order", "reversed", "duplicated", "dropped", "every_other"]))
    def callbacks(self, how: str) -> None:
        held = self.world.hold.take()
        chosen = {
            "in_order": held,
            "reversed": held[::-1],
            "duplicated": [c for c in held for _ in (0, 1)],
            "dropped": [],
            "every_other": held[::2],
        }[how]
        self.world.deliver(chosen)
        self.world.work()

    @rule(mode=st.sampled_from(["ok", "fails", "every_other", "flaky", "down"]))
    def encoder(self, mode: str) -> None:
        engine.Encoder.mode = mode
        self.world.work()

    @rule(point=st.sampled_from(CRASH_POINTS))
    def crash(self, point: str) -> None:
        """The engine dies at a commit boundary of the next round (if the round gets there), then starts again."""
        failpoints.configure(f"{point}=crash@1")
        try:
            self.world.work()
        except failpoints.FailpointCrash:
            pass
        finally:
            failpoints.reset()
        self.world.restart()
        self.world.work()

    @rule()
    def restart(self) -> None:
        self.world.restart()
        self.world.work()

    # --- checks -------------------------------------------------------------------------------------------
    #: run `aivedio audit`'s ledger checks after every step (else after the last step, and beside any step whose
    #: model check fails: ledger rows and terminal states never change back, so what the audit would find
    #: mid-sequence it still finds at the end)
    audit_every_step: bool = False

    @invariant()
    def money_holds(self) -> None:
        engine.Counts.steps += 1
        found = violations(self.world, self.model)
        if found or self.audit_every_step:
            _assert_agree(found, audit_money(self.world))

    def teardown(self) -> None:
        failpoints.reset()
        try:
            if self.tenants:
                self._settle()
        finally:
            self._stack.close()

    def _settle(self) -> None:
        """The world behaves again and the clock runs on: every task must end, and every check hold."""
        w = self.world
        w.heal_store()
        w.sim.set_faults(parse_faults(""))
        w.sim.configure(bill_factor=1.0, billed_outputs=None)
        engine.Encoder.mode = "ok"
        for _ in range(SETTLE_ROUNDS):
            w.deliver(w.hold.take())
            w.work()
            if not self._open():
                break
            w.advance(60)
        open_ = self._open()
        engine.Counts.endings.update(self._endings())
        assert not open_, f"tasks not terminal after the world healed and {SETTLE_ROUNDS} minutes: {open_}"
        _assert_agree(violations(w, self.model), audit_money(w))
        everything = audit_all(w)
        assert not everything, f"aivedio audit after the sequence: {everything}"

    # --- helpers ------------------------------------------------------------------------------------------
    def _pick(self, pick: int) -> uuid.UUID:
        ids = list(self.model.tasks)
        return ids[pick % len(ids)]

    def _in(self, status: str) -> list[uuid.UUID]:
        with self.world.ctx.engine.connect() as conn:
            return list(
                conn.execute(sa.select(generation_tasks.c.id).where(generation_tasks.c.status == status)).scalars()
            )

    def _endings(self) -> list[str]:
        """Each task's path in short: its final state, and whether it was held or reviewed on the way."""
        from aivedio_engine.db.tables import task_state_events

        with self.world.ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(task_state_events.c.task_id, task_state_events.c.to_status).order_by(
                    task_state_events.c.task_id, task_state_events.c.task_version
                )
            ).all()
        path: dict[Any, list[str]] = {}
        for r in rows:
            if r.to_status is not None:
                path.setdefault(r.task_id, []).append(r.to_status)
        out = []
        for states in path.values():
            marks = [s for s in ("MANUAL_REVIEW", "SUBMIT_UNKNOWN", "CANCEL_REQUESTED") if s in states]
            out.append("/".join([states[-1], *marks]))
        return out

    def _open(self) -> dict[str, str]:
        from tests.model.invariants import TERMINAL

        with self.world.ctx.engine.connect() as conn:
            rows = conn.execute(sa.select(generation_tasks.c.id, generation_tasks.c.status)).all()
        return {str(r.id): r.status for r in rows if r.status not in TERMINAL}


def _assert_agree(model: list[str], audit: list[str]) -> None:
    if not model and not audit:
        return
    side = "both" if model and audit else ("the model only" if model else "aivedio audit only")
    lines = "\n  ".join([*(f"model: {m}" for m in model), *(f"audit: {a}" for a in audit)])
    raise AssertionError(f"money invariant broken ({side} says so):\n  {lines}")


def replay(database: Callable[[], Any], steps: list[tuple[str, dict[str, Any]]]) -> None:
    """A sequence the checker once shrank, replayed step by step without Hypothesis: the regression tests'
    runner. Each step is a rule's name and its arguments; the invariants run after each, then the settling end."""
    with engine.cheap_media():
        machine = machine_for(database)()
        try:
            for name, args in steps:
                getattr(machine, name)(**args)
                machine.money_holds()
        finally:
            machine.teardown()


def machine_for(database: Callable[[], Any], *, audit_every_step: bool = False) -> type[MoneyMachine]:
    attrs = {"database": staticmethod(database), "audit_every_step": audit_every_step}
    return type("MoneyMachine", (MoneyMachine,), attrs)


def run(
    database: Callable[[], Any], *, sequences: int, steps: int, seed_value: int, audit_every_step: bool = False
) -> None:
    """Run `sequences` generated sequences of at most `steps` steps; raises on the first (shrunk) failure."""
    machine = machine_for(database, audit_every_step=audit_every_step)
    config = settings(
        max_examples=sequences,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        print_blob=True,
    )
    with engine.cheap_media():
        run_state_machine_as_test(seed(seed_value)(machine), settings=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model.money", description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--audit-every-step", action="store_true", help="aivedio audit after every step (slower)")
    args = parser.parse_args(argv)
    seed_value = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"money checker: {args.sequences} sequences of <= {args.steps} steps on {args.backend}, seed {seed_value}")
    print(
        f"replay: python -m tests.model.money --sequences {args.sequences} --steps {args.steps} "
        f"--seed {seed_value} --backend {args.backend}",
        flush=True,
    )
    if args.backend == "postgres":
        from tests.conftest import _ensure_template, _template_name

        template = _template_name()
        _ensure_template(template, drop_others=False)
        database = engine.postgres_database(template)
    else:
        database = engine.sqlite_database
    started = time.monotonic()
    engine.Counts.report_every = 50
    run(
        database,
        sequences=args.sequences,
        steps=args.steps,
        seed_value=seed_value,
        audit_every_step=args.audit_every_step,
    )
    counts = engine.Counts
    wall = time.monotonic() - started
    print(f"ok: {counts.sequences} sequences, {counts.steps} steps in {wall:.0f} s, seed {seed_value}")
    print("task endings:", dict(counts.endings.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
