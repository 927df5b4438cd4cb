"""The SlotStore contract, run against the in-process store and real Redis.

Expiry is driven by the injected clock for the memory store and by a 200 ms TTL for Redis, waiting on the
condition "the lease is gone" (never a blind sleep). FLUSHALL runs only against a private redis-server.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from aivedio_engine.slots.base import Lease, SlotStore
from aivedio_engine.slots.memory import MemorySlotStore
from aivedio_engine.slots.redis import RedisSlotStore
from tests.contract import FakeClock, private_redis, shared_redis, wait_until

SHORT = 0.2  # seconds; the Redis TTL that tests let expire
MID = 1.0  # for a lease that must survive a few calls before the test extends it, even on a loaded machine
LONG = 30.0


@dataclass
class Harness:
    kind: str
    make: Callable[[], SlotStore]
    clock: FakeClock | None = None
    #: what the database would report as the largest fence it has seen (fence_floor callback)
    db_floor: int = 0
    wipe: Callable[[], None] | None = None
    store: SlotStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = self.make()

    def expire(self, lease: Lease, ttl: float = SHORT) -> None:
        """Let `lease` (acquired with `ttl`) run out."""
        if self.clock is not None:
            self.clock.advance(ttl + 0.001)
        wait_until(lambda: not self.store.is_current(lease), 5, f"{lease.token} to expire")

    def lose_everything(self) -> None:
        """Redis: FLUSHALL on the private server. Memory: the process restarted, a new empty store."""
        if self.wipe is not None:
            self.wipe()
        else:
            self.store = self.make()


def _memory() -> Iterator[Harness]:
    clock = FakeClock()
    h: Harness
    h = Harness("memory", lambda: MemorySlotStore(clock, fence_floor=lambda: h.db_floor), clock)
    yield h


def _redis_shared() -> Iterator[Harness]:
    client = shared_redis()
    prefix = f"aivedio-test:{uuid.uuid4().hex[:10]}:"
    h: Harness
    h = Harness("redis", lambda: RedisSlotStore(client, key_prefix=prefix, fence_floor=lambda: h.db_floor))
    try:
        yield h
    finally:
        RedisSlotStore(client, key_prefix=prefix).delete_all()
        client.close()


def _redis_private() -> Iterator[Harness]:
    with private_redis() as client:
        h: Harness
        h = Harness(
            "redis",
            lambda: RedisSlotStore(client, key_prefix="aivedio:", fence_floor=lambda: h.db_floor),
            wipe=client.flushall,
        )
        yield h


@pytest.fixture(params=["memory", "redis"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from (_memory() if request.param == "memory" else _redis_shared())


@pytest.fixture(params=["memory", "redis"])
def flushable(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from (_memory() if request.param == "memory" else _redis_private())


def chain(
    tenant: str = "t1", *, platform: int = 10, tenant_limit: int = 10, provider: int = 10, model: int = 10
) -> list[tuple[str, int]]:
    return [("platform", platform), (f"tenant:{tenant}", tenant_limit), ("provider:p", provider), ("model:p/m", model)]


# --- acquire / release --------------------------------------------------------------------------------------


def test_acquire_takes_a_slot_in_every_scope_and_release_frees_them(harness: Harness) -> None:
    s = harness.store
    lease = s.acquire(chain(), "a1", LONG)
    assert lease is not None and lease.holder == "a1" and lease.scopes == tuple(n for n, _ in chain())
    assert lease.token == f"{lease.fence}:a1"
    assert s.counts() == {"platform": 1, "tenant:t1": 1, "provider:p": 1, "model:p/m": 1}
    assert s.is_current(lease)
    assert s.release(lease) is True
    assert s.counts() == {}
    assert not s.is_current(lease)
    assert s.release(lease) is False  # twice: nothing left to free


def test_release_many_frees_each_live_lease_in_one_call_and_only_those(harness: Harness) -> None:
    """A batch of reduced events ends many attempts: their slots go back in one exchange with the store."""
    s = harness.store
    leases = [s.acquire(chain(), f"a{i}", LONG) for i in range(3)]
    assert all(lease is not None for lease in leases)
    live = [lease for lease in leases if lease is not None]
    assert s.release(live[0]) is True  # already freed: counted as not live below
    assert s.counts()["provider:p"] == 2
    assert s.release_many(live) == 2
    assert s.counts() == {}
    assert s.release_many(live) == 0 and s.release_many([]) == 0


def test_a_full_inner_scope_refuses_and_takes_nothing_in_the_outer_ones(harness: Harness) -> None:
    s = harness.store
    assert s.acquire(chain("t1", tenant_limit=1), "a1", LONG) is not None
    assert s.acquire(chain("t1", tenant_limit=1), "a2", LONG) is None
    # atomic: the refused acquire left no slot behind in platform or provider
    assert s.counts() == {"platform": 1, "tenant:t1": 1, "provider:p": 1, "model:p/m": 1}
    assert s.acquire(chain("t2", tenant_limit=1), "a3", LONG) is not None  # another tenant has room
    assert s.acquire(chain("t3", provider=2), "a4", LONG) is None  # provider p is now full


@pytest.mark.parametrize("tight", [0, 1, 2, 3], ids=["platform", "tenant", "provider", "model"])
def test_each_nested_limit_is_enforced(harness: Harness, tight: int) -> None:
    c = [(name, 2 if i == tight else 10) for i, (name, _) in enumerate(chain())]
    got = [harness.store.acquire(c, f"h{n}", LONG) for n in range(3)]
    assert [g is not None for g in got] == [True, True, False]


def test_fences_strictly_increase(harness: Harness) -> None:
    s = harness.store
    fences = []
    roomy = chain(platform=100, tenant_limit=100, provider=100, model=100)
    for n in range(50):
        lease = s.acquire(roomy, f"h{n}", LONG)
        assert lease is not None
        fences.append(lease.fence)
        if n % 2:
            s.release(lease)
    assert all(a < b for a, b in zip(fences, fences[1:], strict=False))
    assert s.current_fence() == fences[-1]


# --- expiry and fencing -------------------------------------------------------------------------------------


def test_an_expired_holder_can_neither_renew_nor_release_the_newer_holders_slot(harness: Harness) -> None:
    s = harness.store
    one = chain(provider=1)
    old = s.acquire(one, "paused", SHORT)
    assert old is not None
    harness.expire(old)  # the holder is paused past its TTL (GC, SIGSTOP, partition)
    new = s.acquire(one, "fresh", LONG)
    assert new is not None and new.fence > old.fence  # a stale fence is visibly older
    assert s.renew(old, LONG) is False
    assert s.release(old) is False
    assert s.is_current(new) and not s.is_current(old)
    assert s.counts()["provider:p"] == 1  # the old release freed nothing
    assert s.acquire(one, "third", LONG) is None  # so the limit still holds
    # the same holder name does not help a stale lease either: a re-acquire gets a new fence and token
    assert s.release(new)
    again = s.acquire(one, "paused", LONG)
    assert again is not None and again.token != old.token
    assert s.release(old) is False and s.is_current(again)


def test_renew_extends_a_live_lease(harness: Harness) -> None:
    s = harness.store
    lease = s.acquire(chain(), "worker", MID)
    witness = s.acquire(chain("other"), "witness", MID)
    assert lease is not None and witness is not None
    assert s.renew(lease, LONG) is True
    harness.expire(witness, MID)  # more than the original TTL has passed
    assert s.is_current(lease)
    assert s.counts()["platform"] == 1


def test_a_lease_rebuilt_from_its_database_row_can_be_released(harness: Harness) -> None:
    s = harness.store
    lease = s.acquire(chain(), "attempt-1", LONG)
    assert lease is not None
    from_row = Lease.of("attempt-1", lease.fence, [n for n, _ in chain()])
    assert from_row == lease
    assert s.release(Lease.of("attempt-1", lease.fence - 1, lease.scopes)) is False  # a stale row frees nothing
    assert s.release(from_row) is True and s.counts() == {}


# --- concurrency --------------------------------------------------------------------------------------------


def test_limits_hold_under_concurrent_acquirers(harness: Harness) -> None:
    """8 threads × 200 acquire/release cycles; the test counts holders itself, and samples the store too."""
    s = harness.store
    limits = {"platform": 5, "tenant:t0": 3, "tenant:t1": 3, "provider:p": 4, "model:p/m": 4}
    holding: Counter[str] = Counter()
    max_seen: Counter[str] = Counter()
    store_max: Counter[str] = Counter()
    fences: dict[int, list[int]] = {i: [] for i in range(8)}
    refused = [0] * 8
    lock = threading.Lock()
    barrier = threading.Barrier(9)
    done = threading.Event()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        c = [(n, limits[n]) for n in ("platform", f"tenant:t{i % 2}", "provider:p", "model:p/m")]
        rnd = random.Random(i)
        barrier.wait()
        try:
            cycles = 0
            while cycles < 200:
                lease = s.acquire(c, f"w{i}-{cycles}", LONG)
                if lease is None:
                    refused[i] += 1
                    time.sleep(rnd.random() * 0.0005)  # back off, not synchronization
                    continue
                with lock:
                    for scope in lease.scopes:
                        holding[scope] += 1
                        max_seen[scope] = max(max_seen[scope], holding[scope])
                fences[i].append(lease.fence)
                time.sleep(rnd.random() * 0.0003)  # hold the slot a moment so holders overlap
                with lock:  # before release: our count never runs ahead of the store's
                    for scope in lease.scopes:
                        holding[scope] -= 1
                assert s.release(lease)
                cycles += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    def sampler() -> None:
        barrier.wait()
        while not done.is_set():
            for scope, n in s.counts().items():
                store_max[scope] = max(store_max[scope], n)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    watcher = threading.Thread(target=sampler)
    for t in [*threads, watcher]:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    watcher.join(10)
    assert not errors, errors
    for scope, limit in limits.items():
        assert max_seen[scope] <= limit, (scope, max_seen[scope], limit)
        assert store_max[scope] <= limit, (scope, store_max[scope], limit)
    assert max_seen["platform"] >= 3 and sum(refused) > 0  # there was real contention to survive
    all_fences = [f for fs in fences.values() for f in fs]
    assert len(all_fences) == 1600 and len(set(all_fences)) == 1600  # every grant its own fence
    assert all(all(a < b for a, b in zip(fs, fs[1:], strict=False)) for fs in fences.values())
    assert s.counts() == {}
    print(
        f"\n[{harness.kind}] max concurrent holders {dict(max_seen)} store samples {dict(store_max)}"
        f" refused {sum(refused)} fences {min(all_fences)}..{max(all_fences)}"
    )


# --- rebuild (the reconciler's side) ------------------------------------------------------------------------


def active_for(holders: dict[str, str]) -> dict[str, list[str]]:
    """holder → tenant, all on provider p / model p/m: the scope → holders map the reconciler builds."""
    out: dict[str, list[str]] = {}
    for holder, tenant in holders.items():
        for scope, _ in chain(tenant):
            out.setdefault(scope, []).append(holder)
    return out


def test_rebuild_keeps_and_refreshes_leases_the_database_vouches_for(harness: Harness) -> None:
    s = harness.store
    lease = s.acquire(chain(), "att-1", MID)
    witness = s.acquire(chain("w"), "witness", MID)
    assert lease is not None and witness is not None
    report = s.rebuild(active_for({"att-1": "t1"}), ttl_s=LONG)
    assert (report.kept, report.dropped, report.added) == (1, 0, ())
    harness.expire(witness, MID)  # the acquire TTL has passed; the rebuild's refresh keeps the slot
    assert s.is_current(lease)
    assert s.renew(lease, LONG)  # the original holder still owns it: same token


def test_rebuild_drops_ended_attempts_but_not_fresh_acquires(harness: Harness) -> None:
    s = harness.store
    ended = s.acquire(chain(), "ended", LONG)
    fresh = s.acquire(chain(), "fresh", LONG)  # acquired, its transaction not committed yet
    assert ended is not None and fresh is not None
    s.rebuild(active_for({"ended": "t1"}), ttl_s=LONG)  # the database now vouches for "ended"
    report = s.rebuild({}, ttl_s=LONG)  # ...and then it ended, its release missed
    assert report.dropped == 1
    assert not s.is_current(ended) and s.is_current(fresh)
    assert s.counts()["platform"] == 1


def test_rebuild_recreates_a_lost_lease_with_a_newer_fence(harness: Harness) -> None:
    s = harness.store
    one = chain(provider=1)
    old = s.acquire(one, "att-9", SHORT)
    assert old is not None
    harness.expire(old)  # sweeper late, dispatcher paused: the lease ran out while the job still runs
    report = s.rebuild(active_for({"att-9": "t1"}), ttl_s=LONG, fence_floor=old.fence)
    assert len(report.added) == 1
    (new,) = report.added
    assert new.holder == "att-9" and new.fence > old.fence and new.scopes == old.scopes
    assert report.counts["provider:p"] == 1
    assert s.acquire(one, "intruder", LONG) is None  # the running job holds the provider's only slot
    assert s.renew(old, LONG) is False and s.release(old) is False
    assert s.is_current(new)
    report = s.rebuild(active_for({"att-9": "t1"}), ttl_s=LONG)
    assert (report.kept, report.added) == (1, ())  # idempotent
    assert s.release(Lease.of("att-9", new.fence, new.scopes)) is True


def test_rebuild_may_exceed_a_limit_and_then_admission_waits(harness: Harness) -> None:
    s = harness.store
    s.rebuild(active_for({"a": "t1", "b": "t1", "c": "t1"}), ttl_s=LONG)  # the database is the truth
    assert s.counts()["tenant:t1"] == 3
    assert s.acquire(chain("t1", tenant_limit=2), "d", LONG) is None


def test_seed_fence_never_lowers_the_counter(harness: Harness) -> None:
    s = harness.store
    first = s.acquire(chain(), "h", LONG)
    assert first is not None
    assert s.seed_fence(first.fence + 100) == first.fence + 100
    assert s.seed_fence(5) == first.fence + 100
    nxt = s.acquire(chain(), "h2", LONG)
    assert nxt is not None and nxt.fence == first.fence + 101


# --- losing the store (Redis FLUSHALL / process restart) ----------------------------------------------------


def test_after_losing_everything_acquire_works_and_fences_keep_growing(flushable: Harness) -> None:
    h = flushable
    before = [h.store.acquire(chain(), f"pre{n}", LONG) for n in range(3)]
    assert all(before)
    top = max(lease.fence for lease in before if lease)
    h.db_floor = top - 1  # the database saw all but the last fence issued
    h.lose_everything()
    assert h.store.counts() == {} and h.store.current_fence() == 0
    after = h.store.acquire(chain(), "post", LONG)
    assert after is not None
    assert after.fence > top  # the reseed gap covers fences the database never saw
    assert not any(h.store.is_current(lease) for lease in before if lease)


def test_after_losing_everything_rebuild_restores_counts_and_limits_hold(flushable: Harness) -> None:
    h = flushable
    c = chain("t1", tenant_limit=2)
    held = [h.store.acquire(c, f"att-{n}", LONG) for n in range(2)]
    assert all(held) and h.store.acquire(c, "att-x", LONG) is None
    expected = h.store.counts()
    h.db_floor = max(x.fence for x in held if x)  # the attempts recorded their fences
    h.lose_everything()
    assert h.store.acquire(chain("t9"), "probe", LONG) is not None  # meanwhile another tenant dispatches
    report = h.store.rebuild(active_for({"att-0": "t1", "att-1": "t1"}), ttl_s=LONG, fence_floor=h.db_floor)
    assert len(report.added) == 2
    counts = h.store.counts()
    assert counts["tenant:t1"] == expected["tenant:t1"] == 2
    assert counts["platform"] == 3
    assert h.store.acquire(c, "att-y", LONG) is None  # the limit holds right after the rebuild
    assert all(lease.fence > max(x.fence for x in held if x) for lease in report.added)
