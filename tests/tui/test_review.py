"""The review queue against outputs really held for review (moderation hook `media.review_prompt_terms` in the
full pipeline): the card shows the output's probe facts and thumbnail, claim/approve/reject go through the review
service with an audit row, and a read-only session changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Label

from aivedio_engine.db.tables import assets
from aivedio_engine.services.operations import Operation
from tests.support.seeding import Seeded
from tests.tui.conftest import OPERATOR, drive, make_app, press, rows, type_text
from tui.screens.review import ReviewScreen
from tui.screens.tasks import TasksScreen
from tui.widgets import ConfirmModal


def _select(table: DataTable[Any], key: str) -> None:
    table.move_cursor(row=list(rows(table)).index(key))


def test_claim_then_approve_and_reject_with_a_reason(world: Seeded) -> None:
    fox1, fox2 = world.review_item("fox1"), world.review_item("fox2")
    raw = world.one(assets.select().where(assets.c.id == world.task("fox1").output_asset_id))
    app, toasts = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "3")
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        table = screen.query_one("#review", DataTable)
        assert set(rows(table)) == {str(fox1.id), str(fox2.id)}
        _select(table, str(fox1.id))
        await press(pilot)  # (settles the card's worker)

        card = str(screen.query_one("#review-card").render())
        assert f"{raw.duration_ms / 1000:.2f} s" in card and f"{raw.width}x{raw.height}" in card
        assert "KiB" in card or " B " in card
        facts = screen.facts[fox1.id]
        assert (facts.duration_ms, facts.size_bytes, facts.width, facts.height) == (
            raw.duration_ms,
            raw.size_bytes,
            raw.width,
            raw.height,
        )
        assert facts.thumbnail and Path(facts.thumbnail).is_file()  # a real file in the fs object store

        # claim: a confirmation (a reason is optional for a claim), then the lease is ours
        await press(pilot, "c")
        assert isinstance(app.screen, ConfirmModal)
        await press(pilot, "enter")
        assert app.screen is screen
        assert world.review_item("fox1").claimed_by == OPERATOR
        assert rows(table)[str(fox1.id)][1:3] == ["claimed", OPERATOR]
        (claim,) = world.audit_rows("tui review claim")
        assert (claim.actor, claim.reason, claim.affected_ids) == (OPERATOR, None, [str(fox1.id)])

        # approve: no reason, no change; then with one
        await press(pilot, "a")
        modal = app.screen
        assert isinstance(modal, ConfirmModal)
        await press(pilot, "enter")
        assert app.screen is modal and "reason is required" in str(modal.query_one("#confirm-error", Label).render())
        assert world.task("fox1").status == "MANUAL_REVIEW"
        await type_text(pilot, "looks fine")
        await press(pilot, "enter")
        assert app.screen is screen
        assert world.task("fox1").status == "SUCCEEDED"
        (approve,) = world.audit_rows("tui review approve")
        assert (approve.actor, approve.reason, approve.outcome, approve.dry_run) == (
            OPERATOR,
            "looks fine",
            "approved",
            False,
        )
        assert approve.affected_ids == [str(fox1.id), str(world.tasks["fox1"])]
        assert "approved" in toasts.text() and "SUCCEEDED" in toasts.text()
        assert set(rows(table)) == {str(fox2.id)}  # refreshed: decided items leave the queue

        # reject the other one (unclaimed: deciding claims it implicitly)
        await press(pilot, "x")
        await type_text(pilot, "gore")
        await press(pilot, "enter")
        assert world.task("fox2").status == "FAILED_FINAL"
        assert [r.reason for r in world.audit_rows("tui review reject")] == ["gore"]
        assert rows(table) == {} and "no open review items" in str(screen.query_one("#review-card").render())

    drive(app, scenario)


def test_escape_cancels_and_a_refused_decision_is_shown(world: Seeded) -> None:
    item = world.review_item("fox1").id
    app, toasts = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "3")
        screen = app.screen
        _select(screen.query_one("#review", DataTable), str(item))
        await press(pilot, "x")
        await type_text(pilot, "changed my mind")
        await press(pilot, "escape")  # cancel: nothing happens
        assert app.screen is screen and world.task("fox1").status == "MANUAL_REVIEW"
        assert world.audit_rows("tui review reject") == [] and "cancelled" in toasts.text()

        # another reviewer took the item meanwhile: the service refuses and the operator is told why
        world.ctx.review.claim(item, "bob", Operation("review claim", None, actor="bob"))
        await press(pilot, "a")
        await type_text(pilot, "ok")
        await press(pilot, "enter")
        assert world.task("fox1").status == "MANUAL_REVIEW"
        assert any(s == "error" and m.startswith(f"review item {item} is claimed by bob") for s, m in toasts)
        assert world.audit_rows("tui review approve") == []  # the refusal rolled its transaction back
        assert rows(screen.query_one("#review", DataTable))[str(item)][1:3] == ["claimed", "bob"]

    drive(app, scenario)


def test_readonly_refuses_every_mutation(world: Seeded) -> None:
    app, toasts = make_app(world.ctx, readonly=True)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "3")
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        await press(pilot, "c", "a", "x")  # the keys are disabled: no confirmation opens
        assert app.screen is screen
        footer_keys = {b.binding.action for b in screen.active_bindings.values() if b.enabled}
        assert not footer_keys & {"claim", "approve", "reject"}
        assert "Approve" not in "".join(d for _, d in screen.help_keys())

        # reached some other way (a future palette command, a plugin), the one mutation path still refuses
        screen.action_approve()
        await press(pilot)
        assert app.screen is screen
        assert ("error", "read-only session: tui review approve refused") in toasts

        await press(pilot, "2")
        tasks = app.screen
        assert isinstance(tasks, TasksScreen)
        await press(pilot, "x")
        assert app.screen is tasks
        tasks.action_cancel()
        await press(pilot)
        assert ("error", "read-only session: tui tasks cancel refused") in toasts
        assert "READ-ONLY" in app.sub_title

    drive(app, scenario)
    assert world.task("fox1").status == world.task("fox2").status == "MANUAL_REVIEW"
    assert world.review_item("fox1").state == "PENDING"
    for command in ("tui review claim", "tui review approve", "tui review reject", "tui tasks cancel"):
        assert world.audit_rows(command) == []
