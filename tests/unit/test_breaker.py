"""Provider circuit breaker: 5 consecutive failures or ≥ 50 % of the last 20 open it; a probe after 30 s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.domain.breaker import Breaker, BreakerPolicy, BreakerState, counts_as_failure
from aivedio_engine.domain.retry import ErrorClass

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def feed(b: Breaker, outcomes: str, now: datetime = T0) -> Breaker:
    """'F' failure, 'S' success."""
    for o in outcomes:
        b = b.record(o == "F", now)
    return b


def test_opens_after_five_consecutive_failures_not_four() -> None:
    assert feed(Breaker(), "FFFF").status(T0) is CLOSED
    assert feed(Breaker(), "FFFFF").status(T0) is OPEN
    assert feed(Breaker(), "FFFFSFFFF").status(T0) is CLOSED  # a success resets the streak


def test_opens_at_half_failures_over_the_last_twenty() -> None:
    # alternating: never 5 in a row, 50 % failures once the window has enough calls
    b = feed(Breaker(), "SF" * 4)  # 8 calls: below the minimum count of 10
    assert b.status(T0) is CLOSED
    b = feed(b, "S")  # 9 calls, 4 failures
    assert b.status(T0) is CLOSED
    assert feed(b, "F").status(T0) is OPEN  # 10 calls, 5 failures = 50 %


def test_ratio_counts_only_the_last_twenty() -> None:
    b = feed(Breaker(), "FFFFS" * 2)  # 8/10 failures would open it... with the streak broken each time
    assert b.status(T0) is OPEN
    old_failures = feed(Breaker(), "SFSFSFSSFS" + "S" * 20)  # early failures slide out of the window
    assert old_failures.status(T0) is CLOSED
    assert len(old_failures.recent) == 20 and sum(old_failures.recent) == 0
    nine_of_twenty = feed(Breaker(), "S" * 10 + "FFFFSFFFFS" + "F")  # the 21st call pushes out an S
    assert nine_of_twenty.status(T0) is CLOSED and sum(nine_of_twenty.recent) == 9
    assert feed(nine_of_twenty, "F").status(T0) is OPEN  # 10 of the last 20


def test_open_blocks_submits_then_half_open_allows_exactly_one_probe() -> None:
    b = feed(Breaker(), "FFFFF", at(0))
    assert not b.allows_submit(at(29.9)) and b.submit_budget(at(29.9)) == 0
    assert b.status(at(30)) is HALF and b.submit_budget(at(30)) == 1
    ok, b = b.begin_submit(at(30))
    assert ok and b.status(at(31)) is HALF
    ok2, b = b.begin_submit(at(31))
    assert not ok2 and b.submit_budget(at(31)) == 0  # one probe at a time


def test_probe_success_closes_with_a_fresh_window() -> None:
    b = feed(Breaker(), "FFFFF", at(0))
    _, b = b.begin_submit(at(30))
    b = b.on_success(at(32))
    assert b.status(at(32)) is CLOSED and b.submit_budget(at(32)) is None
    assert b.recent == () and b.consecutive == 0
    assert feed(b, "FFFF", at(33)).status(at(33)) is CLOSED  # needs 5 new failures again


def test_probe_failure_reopens_for_another_thirty_seconds() -> None:
    b = feed(Breaker(), "FFFFF", at(0))
    _, b = b.begin_submit(at(30))
    b = b.on_failure(at(35))
    assert b.status(at(35)) is OPEN and b.status(at(64.9)) is OPEN
    assert b.status(at(65)) is HALF


def test_a_probe_that_never_reports_is_replaced_after_thirty_seconds() -> None:
    b = feed(Breaker(), "FFFFF", at(0))
    _, b = b.begin_submit(at(30))
    assert not b.allows_submit(at(59))
    ok, b = b.begin_submit(at(60))
    assert ok and b.probe_started_at == at(60)


def test_stragglers_during_the_cooldown_are_ignored() -> None:
    b = feed(Breaker(), "FFFFF", at(0))
    assert b.on_success(at(10)) == b  # a call sent before opening cannot close it early
    assert b.on_failure(at(20)) == b  # nor extend the cooldown
    assert b.status(at(30)) is HALF


def test_only_provider_health_failures_count() -> None:
    assert {e for e in ErrorClass if counts_as_failure(e)} == {
        ErrorClass.PROVIDER_5XX_NOT_ACCEPTED,
        ErrorClass.CONNECT_FAILED,
        ErrorClass.SUBMIT_AMBIGUOUS,
    }
    assert not counts_as_failure(ErrorClass.PROVIDER_RATE_LIMITED)  # throttling, see throttle.py
    assert not counts_as_failure(ErrorClass.PROVIDER_REJECTED)  # a refused prompt is a healthy provider


def test_policy_is_configurable() -> None:
    b = feed(Breaker(BreakerPolicy(consecutive_failures=2, open_s=5)), "FF")
    assert b.status(T0) is OPEN and b.status(at(5)) is HALF


# --- model check --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ok", "fail", "submit"]), st.integers(0, 40)), max_size=80))
def test_breaker_matches_a_reference_model(steps: list[tuple[str, int]]) -> None:
    """A direct transcription of the rules, stepped side by side with the implementation."""
    b, now = Breaker(), T0
    state, streak, window, opened, probe = CLOSED, 0, [], None, None
    for action, dt in steps:
        now += timedelta(seconds=dt)
        if state is OPEN and now - opened >= timedelta(seconds=30):
            state = HALF
        allowed = state is CLOSED or (state is HALF and (probe is None or now - probe >= timedelta(seconds=30)))
        assert b.status(now) is state and b.allows_submit(now) is allowed
        if action == "submit":
            ok, b = b.begin_submit(now)
            assert ok is allowed
            if ok and state is HALF:
                probe = now
            continue
        failed = action == "fail"
        b = b.record(failed, now)
        if state is HALF:
            state, streak, window, opened, probe = (OPEN, 0, [], now, None) if failed else (CLOSED, 0, [], None, None)
        elif state is CLOSED:
            streak = streak + 1 if failed else 0
            window = (window + [failed])[-20:]
            if streak >= 5 or (len(window) >= 10 and sum(window) * 2 >= len(window)):
                state, streak, window, opened, probe = OPEN, 0, [], now, None
        assert b.status(now) is state
