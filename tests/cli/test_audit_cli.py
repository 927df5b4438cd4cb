"""`aivedio audit` against databases filled by running real generations: a clean run holds every invariant (exit
0); then each kind of violation is made by one targeted UPDATE/INSERT (or by dropping the constraint that would
refuse it) and must be reported with the offending row (exit 1)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.clock import new_id
from aivedio_engine.config import AlertSettings, ModelSettings
from aivedio_engine.db.tables import (
    assets,
    callback_rejections,
    credit_ledger,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    provider_events,
    review_items,
    task_attempts,
    task_state_events,
)
from aivedio_engine.services.callbacks import CallbackUnauthorized
from aivedio_engine.services.invariants import CHECKS, SKIPPED
from aivedio_engine.storage.keys import TENANTS_PREFIX
from tests.support.app import tenant_with_key
from tests.support.balance import nudge_balance
from tests.support.seeding import Seeded

SKIPPED_IDS = {"I1.1", "I3.1", "I3.2", "I3.3", "I4.7", "I7.1", "I7.3", "I8.1"}


def audit(s: Seeded, *args: str) -> tuple[int, dict[str, Any]]:
    result = s.cli("audit", "--json", *args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def violated(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {c["id"]: c["rows"] for c in report["checks"] if c["status"] == "violated"}


def test_a_clean_run_of_real_tasks_holds_every_invariant(seeder: Callable[..., Seeded]) -> None:
    s = seeder(
        {"ok1": "scene one", "ok2": "scene two", "fox1": "a fox", "fox2": "two foxes"}, duplicate_every=3, run=False
    )  # every third event is delivered twice, as a broker may
    s.create("cx", "canceled before dispatch")
    s.ctx.generations.cancel(s.tenant_id, s.tasks["cx"])
    s.run()
    assert s.cli("review", "approve", str(s.tasks["fox1"]), "--reason", "ok", "--yes").exit_code == 0
    assert s.cli("review", "reject", str(s.tasks["fox2"]), "--reason", "no", "--yes").exit_code == 0
    s.sim.set_faults("fail=1")
    s.create("bad", "the provider fails this one")
    s.run()
    s.driver.pump.run()  # deliver the notifications of the review decisions too
    assert {n: s.task(n).status for n in s.tasks} == {
        "ok1": "SUCCEEDED",
        "ok2": "SUCCEEDED",
        "fox1": "SUCCEEDED",
        "fox2": "FAILED_FINAL",
        "cx": "CANCELED",
        "bad": "FAILED_FINAL",
    }

    code, report = audit(s)

    assert code == 0 and report["ok"] is True, violated(report)
    assert [c["id"] for c in report["checks"]] == list(CHECKS)
    assert all(c["status"] == "ok" and c["violations"] == 0 and c["rows"] == [] for c in report["checks"])
    assert {k["id"] for k in report["skipped"]} == SKIPPED_IDS and all(k["why"] for k in report["skipped"])
    text = s.cli("audit")
    assert text.exit_code == 0 and "all checks hold" in text.stdout and "I3.1" in text.stdout


# --- violations ------------------------------------------------------------------------------------------------
# Each corruption breaks one invariant on purpose and returns a value the report's rows for that check must hold.
# Some invariants are backed by a constraint the database enforces; those cases first drop it (PostgreSQL DDL;
# SQLite cannot drop a table's inline UNIQUE, so those run on PostgreSQL only — the check is the same SQL).

Corruption = Callable[[Seeded, "World"], str]


class World:
    """Handles on the seeded rows the corruptions aim at."""

    def __init__(self, s: Seeded) -> None:
        self.s = s
        self.now = s.ctx.clock.now()
        self.old = self.now - timedelta(hours=2)  # well past the default 15 min grace
        self.other = tenant_with_key(s.ctx, "other", credits=10).tenant_id

    def id(self, name: str) -> uuid.UUID:
        return self.s.tasks[name]

    def attempt(self, name: str) -> Any:
        return self.s.one(sa.select(task_attempts).where(task_attempts.c.task_id == self.id(name)))

    def derivative(self, name: str, kind: str) -> Any:
        raw = self.s.task(name).output_asset_id
        return self.s.one(sa.select(assets).where(assets.c.parent_asset_id == raw, assets.c.kind == kind))

    def event(self, name: str, from_status: str, to_status: str) -> Any:
        e = task_state_events.c
        return self.s.one(
            sa.select(task_state_events).where(
                e.task_id == self.id(name),
                e.outcome == "applied",
                e.from_status == from_status,
                e.to_status == to_status,
            )
        )

    def outbox(self, event_type: str, name: str | None = None, skip: int = 0) -> Any:
        o = outbox_events.c
        stmt = sa.select(outbox_events).where(o.event_type == event_type, o.status == "PUBLISHED")
        if name is not None:
            stmt = stmt.where(o.aggregate_id == self.id(name))
        return self.s.all(stmt.order_by(o.id))[skip]

    def provider_event(self, skip: int) -> Any:
        return self.s.all(sa.select(provider_events).order_by(provider_events.c.id))[skip]

    def ledger(self, **values: Any) -> uuid.UUID:
        row_id = new_id()
        self.s.execute(credit_ledger.insert().values(id=row_id, created_by="test", created_at=self.now, **values))
        return row_id

    def copy(self, table: sa.Table, row: Any, **changes: Any) -> None:
        self.s.execute(table.insert().values({**row._asdict(), "id": new_id(), **changes}))


def upd(table: sa.Table, row_id: Any, **values: Any) -> Any:
    return table.update().where(table.c.id == row_id).values(**values)


def i1_2(s: Seeded, w: World) -> str:
    s.execute("ALTER TABLE generation_tasks DROP CONSTRAINT uq_generation_tasks_tenant_id_client_idempotency_key")
    s.execute(upd(generation_tasks, w.id("ok2"), client_idempotency_key="ok1"))
    return "ok1"


def i2_1(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("q1"), updated_at=w.old, next_action_at=None))
    return str(w.id("q1"))


def i2_2(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("q2"), parked_reason="needs a human, but nobody was told"))
    return str(w.id("q2"))


def i2_3(s: Seeded, w: World) -> str:
    s.execute(review_items.update().where(review_items.c.task_id == w.id("fox")).values(state="APPROVED"))
    return str(w.id("fox"))


def i3_4(s: Seeded, w: World) -> str:
    s.execute("DROP INDEX uq_task_attempts_one_in_flight")
    a = w.attempt("ok1")
    s.execute(upd(task_attempts, a.id, submit_state="RUNNING"))
    w.copy(
        task_attempts,
        a,
        attempt_no=2,
        provider_request_key=a.provider_request_key + "-2",
        provider_job_id=None,
        submit_state="RUNNING",
    )
    return str(w.id("ok1"))


def i3_5(s: Seeded, w: World) -> str:
    # a job recorded as a closed attempt's duplicate whose platform cost was never booked
    w.copy(
        task_attempts,
        w.attempt("ok4"),
        task_id=w.id("q1"),
        provider_request_key=w.attempt("ok4").provider_request_key + "-late",
        provider_job_id="job_late_unbooked",
        submit_state="FAILED_BEFORE_ACCEPT",
    )
    return "job_late_unbooked"


def i4_1(s: Seeded, w: World) -> str:
    s.execute("ALTER TABLE credit_ledger DROP CONSTRAINT uq_credit_ledger_business_key")
    key = f"reserve:{w.id('ok1')}"
    w.ledger(tenant_id=s.tenant_id, entry_type="ADJUSTMENT", amount=0, business_key=key)
    return key


def i4_2(s: Seeded, w: World) -> str:
    w.ledger(
        tenant_id=s.tenant_id,
        task_id=w.id("ok3"),
        entry_type="RESERVE",
        amount=0,
        business_key=f"reserve-again:{w.id('ok3')}",
    )
    return str(w.id("ok3"))


def i4_3(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("ok4"), actual_cost=generation_tasks.c.actual_cost + 1))
    return str(w.id("ok4"))


def i4_4(s: Seeded, w: World) -> str:
    w.ledger(tenant_id=w.other, entry_type="ADJUSTMENT", amount=-1000, business_key="adjustment:overdraw")
    return str(w.other)


def i4_5(s: Seeded, w: World) -> str:
    return str(
        w.ledger(
            tenant_id=w.other,
            task_id=w.id("ok1"),
            entry_type="ADJUSTMENT",
            amount=0,
            business_key="adjustment:wrong-tenant",
        )
    )


def i4_6(s: Seeded, w: World) -> str:
    s.execute(nudge_balance(s.tenant_id, 5))
    return str(s.tenant_id)


def i4_8(s: Seeded, w: World) -> str:
    # the vendor billed a fraction of a second, yet the task was charged the full estimate
    s.execute(upd(task_attempts, w.attempt("ok4").id, billed_seconds=Decimal("0.5")))
    return str(w.id("ok4"))


def i4_9(s: Seeded, w: World) -> str:
    # ok2's only variant never got its thumbnail, a required derivative: nothing delivered, yet fully charged
    s.execute(upd(assets, w.derivative("ok2", "THUMBNAIL").id, status="FAILED", ready_at=None))
    return str(w.id("ok2"))


def i5_1(s: Seeded, w: World) -> str:
    e = task_state_events.c
    s.execute(task_state_events.delete().where(e.task_id == w.id("ok2"), e.task_version == 4))
    return str(w.id("ok2"))


def i5_2(s: Seeded, w: World) -> str:
    s.execute(upd(task_state_events, w.event("ok3", "DISPATCHING", "SUBMITTED").id, from_status="QUEUED"))
    return str(w.id("ok3"))


def i5_3(s: Seeded, w: World) -> str:
    s.execute(upd(task_state_events, w.event("cx", "QUEUED", "CANCELED").id, from_status="EXPIRED"))
    return str(w.id("cx"))


def i5_4(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("ok4"), version=generation_tasks.c.version + 1))
    return str(w.id("ok4"))


def i5_5(s: Seeded, w: World) -> str:
    s.execute("ALTER TABLE task_state_events DROP CONSTRAINT uq_task_state_events_source_source_event_id")
    event = w.event("ok1", "POST_PROCESSING", "SUCCEEDED")
    w.copy(task_state_events, event, outcome="duplicate")
    return str(event.source_event_id)


def i6_1(s: Seeded, w: World) -> str:
    row = w.outbox("task.status.changed", skip=0)
    s.execute(upd(outbox_events, row.id, status="PENDING", available_at=w.old))
    return str(row.id)


def i6_2(s: Seeded, w: World) -> str:
    row = w.outbox("task.status.changed", skip=1)
    s.execute(upd(outbox_events, row.id, status="DEAD", last_error="gave up"))
    return str(row.id)


def i6_3(s: Seeded, w: World) -> str:
    row = w.outbox("provider.status.observed", "ok1")  # creation writes no generation.queued row any more
    s.execute(upd(outbox_events, row.id, published_at=w.old))
    s.execute(inbox_dedup.delete().where(inbox_dedup.c.event_id == row.id))
    return str(row.id)


def i6_4(s: Seeded, w: World) -> str:
    s.execute("ALTER TABLE task_attempts DROP CONSTRAINT uq_task_attempts_task_id_attempt_no")
    a = w.attempt("ok2")
    w.copy(
        task_attempts,
        a,
        provider_request_key=a.provider_request_key + "-again",
        provider_job_id=None,
        submit_state="FAILED",
    )
    return str(w.id("ok2"))


def i6_5(s: Seeded, w: World) -> str:
    s.execute("DROP INDEX uq_assets_raw_output")
    raw = s.one(sa.select(assets).where(assets.c.id == s.task("ok3").output_asset_id))
    w.copy(assets, raw, object_key=raw.object_key + ".copy")
    return str(w.id("ok3"))


def i7_2(s: Seeded, w: World) -> str:
    # a fence counter re-created below what it had issued (a flushed Redis re-seeded from nothing): the retry of
    # ok3 was granted a fence lower than its first attempt's, so a paused first holder would pass the fence guard
    first = w.attempt("ok3")
    retry = new_id()
    w.copy(
        task_attempts,
        first,
        id=retry,
        attempt_no=2,
        provider_request_key=first.provider_request_key + "-retry",
        provider_job_id=None,
        submit_state="FAILED",
        fencing_token=first.fencing_token - 1,
    )
    return str(retry)


def i8_3(s: Seeded, w: World) -> str:
    thumb = w.derivative("ok1", "THUMBNAIL")
    s.execute(upd(assets, thumb.id, object_key=f"tenants/{w.other}/assets/{thumb.id}/thumb.jpg"))
    return str(thumb.id)


def i8_4(s: Seeded, w: World) -> str:
    proxy = w.derivative("ok2", "PROXY")
    s.execute(upd(assets, proxy.id, checksum_value=None))
    return str(proxy.id)


def i8_2(s: Seeded, w: World) -> str:
    # what a fetch that died between its upload and its commit leaves behind; the scan is what lists the store
    key = f"{TENANTS_PREFIX}{s.tenant_id}/outputs/lost-{uuid.uuid4().hex}.mp4"
    s.ctx.storage.put_stream(key, [b"\x00" * 64], "video/mp4", 1024)
    # written an hour ago by the engine's (fake) clock: the scan's grace is measured on that clock, and a loaded
    # machine lets real time (the file's mtime) run ahead of it, which made the object look newer than the scan
    path = s.ctx.storage.local_path(key)
    assert path is not None
    old = (s.ctx.clock.now() - timedelta(hours=1)).timestamp()
    os.utime(path, (old, old))
    s.ctx.storage_scanner.scan(grace_s=0)
    return key


def i9_1(s: Seeded, w: World) -> str:
    raw = s.task("ok3").output_asset_id
    s.execute(
        assets.update()
        .where(assets.c.parent_asset_id == raw, assets.c.kind.in_(["PROXY", "HLS"]))
        .values(status="FAILED")
    )
    return str(w.id("ok3"))


def i9_2(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("q3"), deadline_at=w.old))
    return str(w.id("q3"))


def i9_3(s: Seeded, w: World) -> str:
    s.execute(upd(generation_tasks, w.id("ok1"), cancel_outcome="TOO_LATE"))
    return str(w.id("ok1"))


def i10_1(s: Seeded, w: World) -> str:
    row = w.provider_event(0)
    s.execute(upd(provider_events, row.id, dedup_key=row.dedup_key + "-lost", received_at=w.old))
    return str(row.id)


def i10_2(s: Seeded, w: World) -> str:
    row = w.provider_event(1)
    s.execute(upd(provider_events, row.id, orphan=True, matched_attempt_id=None, expires_at=w.old))
    return str(row.id)


def i10_4(s: Seeded, w: World) -> str:
    # twenty forged callbacks an hour ago, and no alert: the rule never ran, or missed them
    s.execute(
        callback_rejections.insert().values(
            id=new_id(),
            provider="forged-provider",
            reason="signature",
            window_start=w.old,
            failures=20,
            first_at=w.old,
            last_at=w.old,
            detail="no matching signature",
        )
    )
    return "forged-provider"


def i2_4(s: Seeded, w: World) -> str:
    # issue 14's leak: the task took its job's success, the attempt stayed RUNNING (and kept its slot)
    attempt = w.attempt("ok2")
    s.execute(upd(task_attempts, attempt.id, submit_state="RUNNING", updated_at=w.old))
    return str(attempt.id)


def i2_5(s: Seeded, w: World) -> str:
    # waiting to be retried, with no retry time, no message and no alert: nothing will ever move it
    s.execute(
        upd(
            generation_tasks, w.id("q1"), status="RETRY_WAIT", updated_at=w.old, next_action_at=None, next_retry_at=None
        )
    )
    return str(w.id("q1"))


def i7_4(s: Seeded, w: World) -> str:
    # the task is past its provider step (held for review), its attempt still ACKED: the slot rebuild keeps it
    attempt = w.attempt("fox")
    s.execute(upd(task_attempts, attempt.id, submit_state="ACKED", updated_at=w.old))
    return str(attempt.id)


def i10_3(s: Seeded, w: World) -> str:
    # a stored observation whose message was lost, newer than anything applied to its task
    row = w.provider_event(2)
    task_id = s.one(sa.select(task_attempts.c.task_id).where(task_attempts.c.id == row.matched_attempt_id)).task_id
    e = task_state_events.c
    s.execute(
        task_state_events.update()
        .where(e.task_id == task_id, e.source.in_(["callback", "polling"]))
        .values(created_at=w.old)
    )
    s.execute(
        upd(
            provider_events,
            row.id,
            dedup_key=row.dedup_key + "-never-reduced",
            received_at=w.now - timedelta(minutes=30),
        )
    )
    return str(row.id)


#: check id → (corruption, needs PostgreSQL DDL)
CORRUPTIONS: dict[str, tuple[Corruption, bool]] = {
    "I1.2": (i1_2, True),
    "I2.1": (i2_1, False),
    "I2.2": (i2_2, False),
    "I2.3": (i2_3, False),
    "I2.4": (i2_4, False),
    "I2.5": (i2_5, False),
    "I3.4": (i3_4, False),
    "I3.5": (i3_5, False),
    "I4.1": (i4_1, True),
    "I4.2": (i4_2, False),
    "I4.3": (i4_3, False),
    "I4.4": (i4_4, False),
    "I4.5": (i4_5, False),
    "I4.6": (i4_6, False),
    "I4.8": (i4_8, False),
    "I4.9": (i4_9, False),
    "I5.1": (i5_1, False),
    "I5.2": (i5_2, False),
    "I5.3": (i5_3, False),
    "I5.4": (i5_4, False),
    "I5.5": (i5_5, True),
    "I6.1": (i6_1, False),
    "I6.2": (i6_2, False),
    "I6.3": (i6_3, False),
    "I6.4": (i6_4, True),
    "I6.5": (i6_5, False),
    "I7.2": (i7_2, False),
    "I7.4": (i7_4, False),
    "I8.2": (i8_2, False),
    "I8.3": (i8_3, False),
    "I8.4": (i8_4, False),
    "I9.1": (i9_1, False),
    "I9.2": (i9_2, False),
    "I9.3": (i9_3, False),
    "I10.1": (i10_1, False),
    "I10.2": (i10_2, False),
    "I10.3": (i10_3, False),
    "I10.4": (i10_4, False),
}


def test_every_check_has_a_corruption_that_proves_it_fires() -> None:
    assert set(CORRUPTIONS) == set(CHECKS)
    assert not SKIPPED_IDS & set(CHECKS) and {k.id for k in SKIPPED} == SKIPPED_IDS


def test_each_kind_of_violation_is_reported_with_its_offending_row(
    seeder: Callable[..., Seeded], database_url: str | None
) -> None:
    s = seeder(
        {"ok1": "scene one", "ok2": "scene two", "ok3": "scene three", "ok4": "scene four", "fox": "a fox"}, run=False
    )
    s.create("cx", "canceled before dispatch")
    s.ctx.generations.cancel(s.tenant_id, s.tasks["cx"])
    s.run()
    for name in ("q1", "q2", "q3"):  # created after the run: they stay QUEUED
        s.create(name, f"queued {name}")
    assert audit(s)[0] == 0  # the same world before the corruptions is clean
    world = World(s)
    pg = database_url is not None
    expected = {cid: fn(s, world) for cid, (fn, ddl) in CORRUPTIONS.items() if pg or not ddl}

    code, report = audit(s)

    assert code == 1 and report["ok"] is False
    found = violated(report)
    missing = {cid: marker for cid, marker in expected.items() if marker not in json.dumps(found.get(cid, []))}
    assert missing == {}, {cid: found.get(cid) for cid in missing}
    for cid in expected:
        check = next(c for c in report["checks"] if c["id"] == cid)
        assert check["violations"] >= 1 and check["rows"], check

    text = s.cli("audit", "--limit", "1")
    assert text.exit_code == 1
    assert "VIOLATED" in text.stdout and expected["I9.3"] in text.stdout and "checks violated" in text.stdout

    only_code, only = audit(s, "--check", "I9.3", "--check", "I1.1")
    assert only_code == 1 and [c["id"] for c in only["checks"]] == ["I9.3"]
    assert [k["id"] for k in only["skipped"]] == ["I1.1"]


def test_grace_decides_when_a_quiet_row_counts_as_stuck(seeder: Callable[..., Seeded]) -> None:
    s = seeder({}, run=False)
    s.create("q", "waiting")
    s.execute(upd(generation_tasks, s.tasks["q"], next_action_at=None))
    s.advance(600)  # ten quiet minutes: within the default grace, past a 5 min one

    assert audit(s)[0] == 0
    code, report = audit(s, "--grace", "300")
    assert code == 1 and str(s.tasks["q"]) in json.dumps(violated(report)["I2.1"])


def test_unknown_check_ids_and_a_negative_grace_are_usage_errors(seeder: Callable[..., Seeded]) -> None:
    s = seeder({}, run=False)
    bad = s.cli("audit", "--check", "I99")
    assert bad.exit_code == 2 and "unknown check id(s): I99" in bad.stderr
    assert s.cli("audit", "--grace", "-1").exit_code == 2


# --- checks that once could not fail ---------------------------------------------------------------------------
# Each breaks one invariant in an otherwise clean world and runs the whole audit: it must fail naming that check
# alone.


def only_violation(s: Seeded) -> tuple[str, list[dict[str, Any]]]:
    code, report = audit(s)
    found = violated(report)
    assert code == 1 and len(found) == 1, found
    [(check_id, rows)] = found.items()
    text = s.cli("audit")
    assert text.exit_code == 1 and check_id in text.stdout and "VIOLATED" in text.stdout
    return check_id, rows


def test_a_fence_granted_to_two_attempts_fails_the_audit(seeder: Callable[..., Seeded]) -> None:
    s = seeder({"a": "scene a", "b": "scene b"})
    assert audit(s)[0] == 0
    w = World(s)
    first, second = w.attempt("a"), w.attempt("b")
    assert first.fencing_token is not None and second.fencing_token != first.fencing_token
    s.execute(upd(task_attempts, second.id, fencing_token=first.fencing_token))

    check_id, rows = only_violation(s)

    assert check_id == "I7.2"
    assert {r["attempt_id"] for r in rows} == {str(first.id), str(second.id)}


def test_a_charge_for_more_outputs_than_were_delivered_fails_the_audit(seeder: Callable[..., Seeded]) -> None:
    three_outputs = ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": 1}, max_outputs=3)
    s = seeder({"one": "scene one"}, run=False, provider={"models": {"sim-v1": three_outputs}})
    s.tasks["three"] = s.ctx.generations.create(
        s.tenant_id, "three-variants", {"prompt": "three variants", "model": "sim-v1", "duration_s": 2, "n": 3}
    ).task.id
    s.run()
    assert s.task("three").status == "SUCCEEDED"
    assert audit(s)[0] == 0  # every variant delivered, every credit earned
    w = World(s)
    a = assets.c
    variants = s.all(sa.select(a.id).where(a.task_id == w.id("three"), a.kind == "RAW_OUTPUT").order_by(a.output_index))
    assert len(variants) == 3
    # two of the three variants never became playable: the task kept the price of three
    s.execute(
        assets.update()
        .where(a.parent_asset_id.in_([v.id for v in variants[1:]]), a.profile == "hls")
        .values(status="FAILED", ready_at=None)
    )

    code, report = audit(s)
    found = violated(report)
    # off the settlement table too (a success is charged at most its delivered outputs), but I4.9 names the cause
    assert code == 1 and set(found) == {"I4.8", "I4.9"}, found
    text = s.cli("audit")
    assert text.exit_code == 1 and "I4.9" in text.stdout and "VIOLATED" in text.stdout
    [row] = found["I4.9"]
    assert row["task_id"] == str(w.id("three")) and row["delivered"] == 1 and row["requested"] == 3
    assert Decimal(str(row["charged"])) == Decimal(str(row["estimated_cost"])) > Decimal(str(row["allowed"]))


def forge_callbacks(s: Seeded, count: int) -> None:
    for _ in range(count):
        with pytest.raises(CallbackUnauthorized):
            s.ctx.callbacks.receive("sim", {"webhook-id": "msg_1"}, b"{}")


def test_failed_callback_verifications_past_the_rate_without_an_alert_fail_the_audit(
    seeder: Callable[..., Seeded],
) -> None:
    limit = AlertSettings().callback_verify_failures
    s = seeder({"one": "scene one"})
    forge_callbacks(s, limit)
    s.ctx.alert_evaluator.evaluate_now()  # the sweeper's alert pass saw them: an alert for the provider
    s.advance(1200)
    assert audit(s)[0] == 0
    forge_callbacks(s, limit - 1)  # below the rate: counted, nothing owed
    s.advance(1200)
    assert audit(s)[0] == 0

    forge_callbacks(s, limit)  # no alert pass runs before the grace is over
    s.advance(1200)

    check_id, rows = only_violation(s)

    assert check_id == "I10.4"
    [row] = rows
    assert row["provider"] == "sim" and row["failures"] == limit
