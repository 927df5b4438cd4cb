"""The token bucket (pure, time injected), the in-process store, the Redis-down fallback and the tier cap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.domain.admission import PriorityTier, capped_tier
from aivedio_engine.domain.ratelimit import Bucket, Rate, Verdict, take
from aivedio_engine.ratelimit.fallback import FallbackBucketStore
from aivedio_engine.ratelimit.memory import MemoryBucketStore


def admitted(rate: Rate, times: list[float]) -> int:
    bucket: Bucket | None = None
    n = 0
    for now in times:
        verdict, bucket = take(bucket, rate, now)
        n += verdict.allowed
    return n


def test_a_full_bucket_admits_burst_at_once_then_the_rate() -> None:
    rate = Rate(per_s=2, burst=5)
    assert admitted(rate, [100.0] * 20) == 5
    # hammered every 10 ms for 10 s: burst + rate * T
    assert admitted(rate, [100 + i / 100 for i in range(1001)]) == 5 + 2 * 10


def test_a_refusal_says_when_the_next_token_is_there_and_is_right() -> None:
    rate = Rate(per_s=4, burst=1)
    ok, bucket = take(None, rate, 10.0)
    assert ok == Verdict(True, 0.0, 0.0)
    no, bucket = take(bucket, rate, 10.1)
    assert not no.allowed and no.retry_after_s == pytest.approx(0.15)
    early, bucket = take(bucket, rate, 10.1 + no.retry_after_s - 0.01)
    assert not early.allowed
    on_time, _ = take(bucket, rate, 10.1 + no.retry_after_s)
    assert on_time.allowed


def test_idle_time_refills_only_up_to_the_burst() -> None:
    rate = Rate(per_s=10, burst=3)
    bucket = take(None, rate, 0.0)[1]
    assert admitted(rate, [0.0] * 2 + [3600.0] * 10) == 2 + 3
    assert take(bucket, rate, 3600.0)[1].tokens == 2  # 3 after the idle hour, minus this one


def test_a_clock_stepping_back_mints_no_tokens_and_counts_no_second_twice() -> None:
    rate = Rate(per_s=1, burst=1)
    _, bucket = take(None, rate, 100.0)
    refused, bucket = take(bucket, rate, 50.0)  # stepped back 50 s
    assert not refused.allowed and bucket.at == 100.0
    assert not take(bucket, rate, 100.5)[0].allowed
    assert take(bucket, rate, 101.0)[0].allowed


@settings(max_examples=60, deadline=None)
@given(
    per_s=st.floats(0.1, 50),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_no_window_ever_admits_more_than_burst_plus_rate_times_its_length(
    per_s: float, burst: int, gaps: list[float]
) -> None:
    rate, bucket, now = Rate(per_s, burst), None, 0.0
    times: list[float] = []
    for gap in gaps:
        now += gap
        verdict, bucket = take(bucket, rate, now)
        if verdict.allowed:
            times.append(now)
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + per_s * (times[j] - times[i]) + 1e-6


def test_rate_share_keeps_at_least_one_request() -> None:
    assert Rate(10, 100).share(0.25) == Rate(2.5, 25)
    assert Rate(1, 2).share(0.25) == Rate(0.25, 1.0)
    with pytest.raises(ValueError):
        Rate(0, 1)
    assert Rate(2, 10).refill_s() == 5


def test_memory_store_keeps_one_bucket_per_key() -> None:
    store, rate = MemoryBucketStore(), Rate(1, 2)
    assert [store.take("a", rate, 0).allowed for _ in range(3)] == [True, True, False]
    assert store.take("b", rate, 0).allowed  # another tenant's bucket is full
    assert store.take("a", rate, 1.0).allowed


class FlakyStore:
    """A shared store that fails while `down`; counts the calls that reached it."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0
        self.inner = MemoryBucketStore()

    def take(self, key: str, rate: Rate, now: float) -> Verdict:
        self.calls += 1
        if self.down:
            raise ConnectionError("redis down")
        return self.inner.take(key, rate, now)


def test_fallback_limits_each_process_to_its_share_while_the_store_is_down_and_returns_to_it() -> None:
    primary = FlakyStore()
    store = FallbackBucketStore(primary, share=0.25, errors=(ConnectionError,), retry_s=1.0)
    rate = Rate(per_s=8, burst=20)
    assert store.take("t", rate, 0.0).allowed and not store.degraded

    primary.down = True
    # the first call finds it down; then 20 × 0.25 = 5 requests at once and 8 × 0.25 = 2/s, per process
    burst = [store.take("t", rate, 1.0).allowed for _ in range(10)]
    assert sum(burst) == 5 and store.degraded
    calls = primary.calls
    assert [store.take("t", rate, 1.5).allowed for _ in range(3)] == [True, False, False]  # 0.5 s × 2/s
    assert primary.calls == calls  # not retried within retry_s: no timeout per request
    steady = sum(store.take("t", rate, 2.0 + i / 100).allowed for i in range(300))  # 3 s more
    assert abs(steady - 2 * 3) <= 1

    primary.down = False
    assert store.take("t", rate, 10.0).allowed and not store.degraded
    assert primary.calls > calls


def test_a_request_never_gets_a_better_tier_than_its_tenant() -> None:
    assert capped_tier(0, 2) == 2  # absent: the tenant's tier
    assert capped_tier(1, 2) == 2  # asked for better: capped
    assert capped_tier(4, 2) == 4  # a worse tier may be asked for
    assert capped_tier(1, 1) == 1
    assert capped_tier(0, 0) == PriorityTier.PAID  # a row from before migration 0012
    assert all(capped_tier(r, t) >= t for r in range(6) for t in range(1, 6))
