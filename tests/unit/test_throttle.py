"""AIMD provider capacity: 429 halves (min 1), each success adds 1 up to the max, Retry-After blocks submits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.domain.throttle import Throttle, ThrottlePolicy, parse_retry_after

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_429_halves_capacity_down_to_one() -> None:
    t = Throttle.at_max(16)
    seen = []
    for i in range(6):
        t = t.on_throttled(at(i * 2))  # far enough apart to count as separate overload events
        seen.append(t.effective)
    assert seen == [8, 4, 2, 1, 1, 1]
    assert Throttle.at_max(5).on_throttled(T0).effective == 2


def test_each_success_adds_one_up_to_the_max() -> None:
    t = Throttle(max_capacity=6, effective=2)
    values = []
    for i in range(6):
        t = t.on_success(at(i))
        values.append(t.effective)
    assert values == [3, 4, 5, 6, 6, 6]


def test_one_burst_of_429s_halves_once() -> None:
    t = Throttle.at_max(64)
    for ms in range(0, 900, 100):  # eight in-flight submits rejected by the same overload, within 1 s
        t = t.on_throttled(T0 + timedelta(milliseconds=ms))
    assert t.effective == 32
    assert t.on_throttled(at(1.0)).effective == 16  # the next event, a hold period later


def test_retry_after_blocks_new_submits_until_the_instant() -> None:
    t = Throttle.at_max(8).on_throttled(T0, retry_after=20)
    assert not t.can_submit(at(19.9)) and t.capacity(at(19.9)) == 0
    assert t.can_submit(at(20)) and t.capacity(at(20)) == 4
    later = t.on_throttled(at(1), retry_after=at(5))  # an earlier instant does not shorten the block
    assert later.blocked_until == at(20)
    longer = t.on_throttled(at(2), retry_after=at(40))
    assert longer.blocked_until == at(40)


def test_retry_after_is_capped_and_nonsense_is_ignored() -> None:
    t = Throttle.at_max(4, ThrottlePolicy(max_retry_after_s=600))
    assert t.on_throttled(T0, retry_after=10**9).blocked_until == at(600)
    assert t.on_throttled(T0, retry_after=T0 + timedelta(days=30)).blocked_until == at(600)
    assert t.on_throttled(T0, retry_after=float("nan")).blocked_until is None
    assert t.on_throttled(T0, retry_after=-5).blocked_until is None
    assert t.on_throttled(T0, retry_after=T0 - timedelta(seconds=5)).blocked_until == T0


def test_successes_do_not_lift_a_pending_retry_after() -> None:
    t = Throttle.at_max(4).on_throttled(T0, retry_after=30).on_success(at(1))
    assert not t.can_submit(at(2)) and t.effective == 3


def test_config_change() -> None:
    t = Throttle.at_max(10).on_throttled(T0)  # 5
    assert t.with_max(3).effective == 3
    assert t.with_max(20).effective == 5  # grown into additively, not jumped to


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", at(120)),
        (" 0 ", T0),
        ("Sun, 01 Mar 2026 12:01:00 GMT", at(60)),
        ("Sun, 01 Mar 2026 11:00:00 GMT", T0),  # in the past: no wait
        ("soon", None),
        ("-3", None),
        ("1.5", None),
        ("", None),
        (None, None),
        ("٣", None),  # a non-ASCII digit is not delay-seconds
    ],
)
def test_parse_retry_after(header: str | None, expected: datetime | None) -> None:
    assert parse_retry_after(header, T0) == expected


def test_parse_retry_after_huge_number_does_not_overflow() -> None:
    assert parse_retry_after("9" * 40, T0) is not None


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 64), st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=60))
def test_capacity_stays_between_one_and_the_max(max_capacity: int, events: list[tuple[bool, int]]) -> None:
    t, now = Throttle.at_max(max_capacity), T0
    for throttled, dt_ms in events:
        now += timedelta(milliseconds=dt_ms)
        before = t.effective
        t = t.on_throttled(now) if throttled else t.on_success(now)
        assert 1 <= t.effective <= max_capacity
        if throttled:
            assert t.effective in (before, max(1, before // 2))
        else:
            assert t.effective == min(max_capacity, before + 1)
