"""SVG snapshots of five screens at a fixed size, rendered from a fixed dataset (tests/tui/fixture_data.py).
Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and review the SVGs."""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot

from tests.tui.conftest import settle
from tests.tui.fixture_data import FixtureData
from tui.app import AivedioApp

SIZE = (130, 34)


def _app() -> AivedioApp:
    return AivedioApp(FixtureData(), operator="alice@ops", refresh_s=None)  # type: ignore[arg-type]


def test_overview(snap_compare: Any) -> None:
    assert snap_compare(_app(), terminal_size=SIZE, run_before=settle)


def test_tasks_filtered(snap_compare: Any) -> None:
    async def filtered(pilot: Pilot[Any]) -> None:
        await pilot.press("2")
        await settle(pilot)
        await pilot.press("slash", *"acme", "enter")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=filtered)


def test_review_queue_with_the_output_card(snap_compare: Any) -> None:
    async def review(pilot: Pilot[Any]) -> None:
        await pilot.press("3")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=review)


def test_audit_with_a_violated_check_and_its_rows(snap_compare: Any) -> None:
    async def audit(pilot: Pilot[Any]) -> None:
        await pilot.press("8")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=audit)


def test_alerts_with_a_marked_row(snap_compare: Any) -> None:
    async def alerts(pilot: Pilot[Any]) -> None:
        await pilot.press("9")
        await settle(pilot)
        await pilot.press("space")
        await settle(pilot)

    assert snap_compare(_app(), terminal_size=SIZE, run_before=alerts)
