"""Fetch prioritization by remaining URL lifetime: expiring outputs go to the urgent fetch route."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aivedio_engine.domain.events import (
    BY_ACTOR,
    ROUTES,
    URGENT_FETCH,
    EventType,
    Queue,
    fetch_route,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
NORMAL = ROUTES[EventType.FETCH_REQUESTED]


def test_an_output_expiring_within_the_window_is_urgent() -> None:
    assert fetch_route([NOW + timedelta(minutes=5)], NOW, 900) is URGENT_FETCH
    assert fetch_route([NOW + timedelta(seconds=900)], NOW, 900) is URGENT_FETCH
    assert fetch_route([NOW - timedelta(seconds=1)], NOW, 900) is URGENT_FETCH  # already expired: refresh fast


def test_the_first_expiry_of_several_outputs_decides() -> None:
    assert fetch_route([NOW + timedelta(hours=2), NOW + timedelta(minutes=1)], NOW, 900) is URGENT_FETCH
    assert fetch_route([NOW + timedelta(hours=2), None], NOW, 900) is NORMAL


def test_long_lived_or_unknown_expiry_is_ordinary() -> None:
    assert fetch_route([NOW + timedelta(hours=1)], NOW, 900) is NORMAL
    assert fetch_route([None], NOW, 900) is NORMAL
    assert fetch_route([], NOW, 900) is NORMAL


def test_urgent_route_has_its_own_queue_and_runs_first() -> None:
    assert URGENT_FETCH.queue is Queue.FETCH_URGENT and URGENT_FETCH.queue is not NORMAL.queue
    assert URGENT_FETCH.priority < NORMAL.priority  # Dramatiq: lower numbers run first
    assert BY_ACTOR[URGENT_FETCH.actor] is URGENT_FETCH and BY_ACTOR[NORMAL.actor] is NORMAL


def test_both_fetch_routes_are_consumed_by_the_same_handler() -> None:
    from dramatiq.brokers.stub import StubBroker

    from aivedio_engine.worker.actors import declare_actors

    declared = declare_actors(StubBroker(), ctx=None)  # type: ignore[arg-type]
    urgent, normal = declared[URGENT_FETCH.actor], declared[NORMAL.actor]
    assert (urgent.queue_name, urgent.priority) == ("fetch_urgent", 0)
    assert (normal.queue_name, normal.priority) == ("fetch", 10)
    assert urgent.fn.__module__ == normal.fn.__module__ and urgent.options == normal.options
