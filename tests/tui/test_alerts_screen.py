"""The alerts screen against alerts the engine raised (`db.alerts.raise_alert`, the engine's own output) beside
work seeded by real generations: Enter on the overview's open alert opens it here, `k` acknowledges the
highlighted alert, Space marks several and `x` resolves them in one audited change; read-only refuses."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from textual.pilot import Pilot
from textual.widgets import DataTable

from aivedio_engine.db.alerts import Rule, raise_alert
from aivedio_engine.db.tables import alerts
from aivedio_engine.domain.status import AlertSeverity
from tests.support.seeding import Seeded
from tests.tui.conftest import OPERATOR, drive, make_app, press, rows, status_line, type_text
from tui.screens.alerts import MARK, AlertsScreen
from tui.screens.overview import OverviewScreen
from tui.widgets import ConfirmModal

RAISED = [  # oldest first: (rule, severity, subject task name or None, message)
    (Rule.DUPLICATE_PROVIDER_JOB, AlertSeverity.CRITICAL, "boat", "two jobs at sim for one request key"),
    (Rule.SUBMIT_UNKNOWN_PARKED, AlertSeverity.WARNING, "fox1", "waited 10m for a lookup; parked for a human"),
    (Rule.QUEUE_BACKLOG, AlertSeverity.INFO, None, "14 tasks queued, the oldest for 97s"),
]


def _raise(world: Seeded) -> list[uuid.UUID]:
    """The RAISED alerts, a minute apart; their ids newest first (the screen's order)."""
    for rule, severity, subject, message in RAISED:
        world.advance(60)
        with world.ctx.engine.begin() as conn:
            raise_alert(
                conn,
                rule,
                severity,
                dedup_key=f"test:{rule.value}",
                message=message,
                now=world.ctx.clock.now(),
                subject_type="task" if subject else None,
                subject_id=str(world.tasks[subject]) if subject else None,
            )
    return [r.id for r in world.all(sa.select(alerts.c.id).order_by(alerts.c.raised_at.desc()))]


def _alert(world: Seeded, alert_id: uuid.UUID) -> Any:
    return world.one(sa.select(alerts).where(alerts.c.id == alert_id))


def test_acknowledge_one_then_mark_two_and_resolve_both(world: Seeded) -> None:
    backlog, parked, duplicate = _raise(world)
    app, toasts = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        # the overview's open alerts hold the focus; Enter opens the highlighted one on the Alerts screen
        overview = app.screen
        assert isinstance(overview, OverviewScreen)
        assert list(rows(overview.query_one("#alerts", DataTable))) == [str(backlog), str(parked), str(duplicate)]
        assert rows(overview.query_one("#figures", DataTable))["alerts"][1] == "3"
        await press(pilot, "down", "enter")
        screen = app.screen
        assert isinstance(screen, AlertsScreen)
        table = screen.query_one("#alerts", DataTable)
        listed = rows(table)
        assert list(listed) == [str(backlog), str(parked), str(duplicate)]
        assert screen.selected_key(table) == str(parked)
        assert [str(c) for c in listed[str(parked)][2:6]] == [
            "warning",
            "submit_unknown_parked",
            "OPEN",
            f"task {world.tasks['fox1']}",
        ]

        # k: the highlighted alert
        await press(pilot, "k")
        modal = app.screen
        assert isinstance(modal, ConfirmModal)
        lines = str(modal.query_one("#confirm-lines").render())
        assert lines.startswith("1 alert(s) will be acknowledged:") and str(parked) in lines
        await type_text(pilot, "INC-5 looking at fox1")
        await press(pilot, "enter")
        assert app.screen is screen
        row = _alert(world, parked)
        assert (row.status, row.acknowledged_by) == ("ACKNOWLEDGED", OPERATOR) and row.acknowledged_at is not None
        (ack,) = world.audit_rows("tui alerts acknowledge")
        assert (ack.actor, ack.reason, ack.outcome, ack.affected_ids) == (
            OPERATOR,
            "INC-5 looking at fox1",
            "acknowledged",
            [str(parked)],
        )
        assert "acknowledged 1 alert(s)" in toasts.text()
        assert [str(c) for c in rows(table)[str(parked)][4:8:3]] == ["ACKNOWLEDGED", OPERATOR]  # still unresolved

        # Space marks the highlighted row and moves down: two presses from the top mark the two newest
        table.move_cursor(row=0)
        await press(pilot, "space", "space")
        assert screen.marked == {str(backlog), str(parked)}
        assert [str(cells[0]) for cells in rows(table).values()] == [MARK, MARK, ""]
        assert "2 marked" in status_line(app)
        await press(pilot, "up", "space")  # a toggle: unmarked (and down again)
        assert screen.marked == {str(backlog)}
        await press(pilot, "up", "space")
        assert screen.marked == {str(backlog), str(parked)}
        assert screen.selected_key(table) == str(duplicate)  # x acts on the marks, not the cursor

        await press(pilot, "x")
        lines = str(app.screen.query_one("#confirm-lines").render())
        assert lines.startswith("2 alert(s) will be resolved (the marked ones):")
        assert str(backlog) in lines and str(parked) in lines and str(duplicate) not in lines
        await type_text(pilot, "INC-5 fixed")
        await press(pilot, "enter")
        assert {_alert(world, i).status for i in (backlog, parked)} == {"RESOLVED"}
        assert _alert(world, duplicate).status == "OPEN"
        (resolve,) = world.audit_rows("tui alerts resolve")
        assert (resolve.actor, resolve.reason, resolve.outcome) == (OPERATOR, "INC-5 fixed", "resolved")
        assert sorted(resolve.affected_ids) == sorted([str(backlog), str(parked)])
        assert resolve.args == {"ids": [str(backlog), str(parked)]}
        assert list(rows(table)) == [str(duplicate)] and screen.marked == set()
        assert "resolved 2 alert(s)" in toasts.text()

        # the filter reaches the service's status: resolved ones are still there
        await press(pilot, "slash")
        await type_text(pilot, "status:resolved")
        await press(pilot, "enter")
        assert set(rows(table)) == {str(backlog), str(parked)}

        # the overview only counts OPEN alerts now
        await press(pilot, "1")
        assert list(rows(overview.query_one("#alerts", DataTable))) == [str(duplicate)]

    drive(app, scenario)


def test_cancel_keeps_the_marks_and_readonly_refuses(world: Seeded) -> None:
    ids = _raise(world)
    app, toasts = make_app(world.ctx, readonly=True)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "9")
        screen = app.screen
        assert isinstance(screen, AlertsScreen)
        await press(pilot, "space")  # marking changes nothing, so it works read-only
        assert screen.marked == {str(ids[0])}
        await press(pilot, "k", "x")  # disabled
        assert app.screen is screen
        assert {d for _, d in screen.help_keys()} >= {"Mark/unmark (moves down)"}
        assert not {"Acknowledge", "Resolve"} & {d for _, d in screen.help_keys()}
        screen.action_resolve()
        await press(pilot)
        assert ("error", "read-only session: tui alerts resolve refused") in toasts

        app.readonly = False  # (the same screen, writable) Esc on the confirmation keeps the marks
        await press(pilot, "x")
        assert isinstance(app.screen, ConfirmModal)
        await press(pilot, "escape")
        assert app.screen is screen and screen.marked == {str(ids[0])}

    drive(app, scenario)
    assert {_alert(world, i).status for i in ids} == {"OPEN"}
    assert world.audit_rows("tui alerts resolve") == [] and world.audit_rows("tui alerts acknowledge") == []
