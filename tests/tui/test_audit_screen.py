"""The audit screen runs the invariant checks of `aivedio audit` against a database seeded by real generations:
every check is listed, a violation made the way tests/cli/test_audit_cli.py makes them shows its offending rows,
and `r` runs the checks again."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable

from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.services.invariants import CHECKS, SKIPPED
from tests.support.balance import nudge_balance
from tests.support.seeding import Seeded
from tests.tui.conftest import drive, make_app, press, rows, status_line, type_text
from tui.screens.audit import AuditScreen


def _select(table: DataTable[Any], key: str) -> None:
    table.move_cursor(row=list(rows(table)).index(key))


def test_audit_lists_every_check_and_the_rows_of_a_violation(world: Seeded) -> None:
    boat = world.tasks["boat"]
    # I4.6: a cached balance that no longer equals the ledger sum; I9.3: TOO_LATE without a completion that won
    world.execute(nudge_balance(world.tenant_id, 5))
    world.execute(generation_tasks.update().where(generation_tasks.c.id == boat).values(cancel_outcome="TOO_LATE"))
    app, _ = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "8")
        screen = app.screen
        assert isinstance(screen, AuditScreen) and screen.audit_run is not None
        checks = screen.query_one("#checks", DataTable)
        listed = rows(checks)
        assert list(listed) == [*CHECKS, *(s.id for s in SKIPPED)]
        status = {cid: str(cells[1]) for cid, cells in listed.items()}
        assert {cid for cid, s in status.items() if s.startswith("VIOLATED")} == {"I4.6", "I9.3"}
        assert status["I4.6"] == "VIOLATED (1)" and status["I1.2"] == "ok"
        assert all(status[s.id] == "skipped" and listed[s.id][3] == s.why for s in SKIPPED)
        assert listed["I4.6"][2] == CHECKS["I4.6"].description
        assert status_line(app).startswith("2 of ") and "checks violated" in status_line(app)

        # the cursor starts on the first violated check: its offending rows are below
        offending = screen.query_one("#offending", DataTable)
        assert screen.selected_key(checks) == "I4.6"
        (row,) = rows(offending).values()
        assert str(world.tenant_id) in row and offending.border_title == "I4.6: 1 offending row(s)"
        _select(checks, "I9.3")
        await press(pilot)
        (row,) = rows(offending).values()
        assert row[0] == str(boat) and "TOO_LATE" in row
        _select(checks, "I3.1")  # skipped: why
        await press(pilot)
        assert list(rows(offending).values()) == [[next(s.why for s in SKIPPED if s.id == "I3.1")]]
        _select(checks, "I1.2")
        await press(pilot)
        assert rows(offending) == {} and offending.border_title == "I1.2 holds: no offending rows"

        # `/` narrows the last run without running the checks again
        loads = screen.loads
        await press(pilot, "slash")
        await type_text(pilot, "violated")
        await press(pilot, "enter")
        assert list(rows(checks)) == ["I4.6", "I9.3"] and screen.loads == loads
        await press(pilot, "slash", "ctrl+u", "enter")
        assert len(rows(checks)) == len(CHECKS) + len(SKIPPED)

        # repaired, `r` runs them again; showing the screen again does not
        world.execute(nudge_balance(world.tenant_id, -5))
        world.execute(generation_tasks.update().where(generation_tasks.c.id == boat).values(cancel_outcome=None))
        await press(pilot, "1", "8")
        assert screen.loads == loads and str(rows(checks)["I4.6"][1]).startswith("VIOLATED")
        await press(pilot, "r")
        assert screen.loads == loads + 1
        assert {str(cells[1]) for cid, cells in rows(checks).items() if cid in CHECKS} == {"ok"}
        assert status_line(app).startswith("all checks hold")

    drive(app, scenario)
